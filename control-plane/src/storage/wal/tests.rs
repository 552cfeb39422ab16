use std::os::unix::fs::FileExt as _;

use proptest::prelude::*;
use protobuf::Message as _;

use super::*;

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("entry {index} of term {term}").into_bytes().into(),
        ..Default::default()
    }
}

fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    range.map(|i| entry(i, term)).collect()
}

fn held(log: &WriteAheadLog) -> Vec<(u64, u64)> {
    log.entries(0, u64::MAX)
        .map(|e| (e.index, e.term))
        .collect()
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".wal"))
        })
        .count()
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

#[test]
fn entries_and_states_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    log.append(&entries(1..=100, 1)).unwrap();
    log.set_hard_state(&hard_state(1, 2, 90));
    log.set_conf_state(&ConfState {
        voters: vec![1, 2, 3],
        ..Default::default()
    });
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(held(&log), (1..=100).map(|i| (i, 1)).collect::<Vec<_>>());
    assert_eq!(log.entry(42).unwrap().data, entry(42, 1).data);
    assert_eq!(
        log.segments(),
        1,
        "a segment that ends cleanly is written on"
    );
    assert_eq!(*log.hard_state(), hard_state(1, 2, 90));
    assert_eq!(log.conf_state().voters, vec![1, 2, 3]);
}

#[test]
fn what_was_not_synced_is_not_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    log.append(&entries(1..=5, 1)).unwrap();
    log.sync().unwrap();
    log.append(&entries(6..=9, 1)).unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(log.last_index(), Some(5));
}

#[test]
fn an_overwritten_suffix_stays_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    log.append(&entries(1..=10, 1)).unwrap();
    log.sync().unwrap();
    log.append(&entries(6..=8, 2)).unwrap();
    log.sync().unwrap();
    let expected: Vec<(u64, u64)> = (1..=5)
        .map(|i| (i, 1))
        .chain((6..=8).map(|i| (i, 2)))
        .collect();
    assert_eq!(held(&log), expected);
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(held(&log), expected);
}

#[test]
fn a_record_cut_short_at_the_end_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    log.append(&entries(1..=3, 1)).unwrap();
    log.sync().unwrap();
    log.append(&entries(4..=4, 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    // A crash in the middle of writing entry 4.
    let path = segment_path(dir.path(), 1);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(log.last_index(), Some(3));
    // The log goes on after the cut, and the cut part never comes back.
    log.append(&entries(4..=5, 2)).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(held(&log), vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
}

#[test]
fn damage_before_the_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, 512).unwrap();
    for i in 1..=40 {
        log.append(&entries(i..=i, 1)).unwrap();
        log.sync().unwrap();
    }
    assert!(log.segments() > 2, "segments: {}", log.segments());
    drop(log);
    let first = segment_path(dir.path(), 1);
    let mut bytes = std::fs::read(&first).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(&first, bytes).unwrap();
    let err = WriteAheadLog::open(dir.path(), 0, 512).unwrap_err();
    assert!(
        matches!(&err, WalError::Corrupt { path, .. } if *path == first),
        "{err}"
    );
}

#[test]
fn a_closed_segment_cut_before_its_closing_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, 512).unwrap();
    for i in 1..=40 {
        log.append(&entries(i..=i, 1)).unwrap();
        log.sync().unwrap();
    }
    drop(log);
    // Whole records are missing, the file ends cleanly after one: only the missing closing
    // record tells.
    let first = segment_path(dir.path(), 1);
    let mut bytes = std::fs::read(&first).unwrap();
    let mut state = LogState::default();
    let replay = state.replay(&first, 1, &bytes).unwrap();
    assert!(replay.closed);
    let end_record = 9;
    bytes.truncate(replay.valid_len as usize - end_record);
    std::fs::write(&first, bytes).unwrap();
    let err = WriteAheadLog::open(dir.path(), 0, 512).unwrap_err();
    assert!(
        matches!(&err, WalError::Corrupt { path, .. } if *path == first),
        "{err}"
    );
}

/// Entries 1..=200 of term 3, each synced with the commit index one behind it.
fn append_200_synced_one_by_one(log: &mut WriteAheadLog) {
    for i in 1..=200 {
        log.append(&entries(i..=i, 3)).unwrap();
        log.set_hard_state(&hard_state(3, 1, i - 1));
        log.sync().unwrap();
    }
}

#[test]
fn compaction_retires_covered_segments_and_keeps_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, 1024).unwrap();
    log.set_conf_state(&ConfState {
        voters: vec![1, 2, 3],
        ..Default::default()
    });
    append_200_synced_one_by_one(&mut log);
    let before = segment_files(dir.path());
    assert!(before > 5, "segments: {before}");
    let retired = log.compact(150);
    let count = retired.segments.len();
    retired.retire().unwrap();
    let after = segment_files(dir.path());
    assert!(after < before / 2, "segments {before} -> {after}");
    let free = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some(FREE_EXTENSION.as_ref()))
        .count();
    assert_eq!(free, count.min(8), "{count} segments retired");
    assert_eq!(log.entries(0, u64::MAX).next().map(|e| e.index), Some(151));
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 150, 1024).unwrap();
    assert_eq!(held(&log), (151..=200).map(|i| (i, 3)).collect::<Vec<_>>());
    assert_eq!(*log.hard_state(), hard_state(3, 1, 199));
    assert_eq!(log.conf_state().voters, vec![1, 2, 3]);
}

#[test]
fn a_segment_removal_cut_short_by_a_crash_is_finished_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, 1024).unwrap();
    append_200_synced_one_by_one(&mut log);
    let covered = log.compact(150).segments;
    drop(log);
    // The crash: the first covered segment renamed and cut mid-record, the rest untouched.
    let removing = covered[0].with_extension(REMOVING_EXTENSION);
    std::fs::rename(&covered[0], &removing).unwrap();
    let len = std::fs::metadata(&removing).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&removing)
        .unwrap()
        .set_len(len / 2 + 3)
        .unwrap();
    let log = WriteAheadLog::open(dir.path(), 150, 1024).unwrap();
    assert_eq!(held(&log), (151..=200).map(|i| (i, 3)).collect::<Vec<_>>());
    assert_eq!(*log.hard_state(), hard_state(3, 1, 199));
    assert!(
        !removing.exists(),
        "the half-removed segment is left on disk"
    );
}

/// Entry `index` of term 3, all of one size (index below 128), so that a reused file's old
/// records line up with the new ones: only their salt tells them apart.
fn even_entry(index: u64) -> Entry {
    Entry {
        index,
        term: 3,
        data: format!("{index:08}").into_bytes().into(),
        ..Default::default()
    }
}

/// Fills segments of `segment_bytes` with entries 1..=100, one per sync, compacts and
/// retires all of them, then writes entries 101..=100+`then`: the active segment is a
/// reused file then.
fn a_log_in_reused_files(dir: &Path, segment_bytes: u64, then: u64) -> WriteAheadLog {
    let mut log = WriteAheadLog::open(dir, 0, segment_bytes).unwrap();
    log.set_hard_state(&hard_state(3, 1, 0));
    for i in 1..=100 {
        log.append(&[even_entry(i)]).unwrap();
        log.sync().unwrap();
    }
    log.compact(100).retire().unwrap();
    let files = std::fs::read_dir(dir).unwrap().count();
    for i in 101..=100 + then {
        log.append(&[even_entry(i)]).unwrap();
        log.sync().unwrap();
    }
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        files,
        "new segments were started in new files, not in retired ones"
    );
    log
}

fn evens(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, u64)> {
    range.map(|i| (i, 3)).collect()
}

#[test]
fn a_reused_segment_replays_only_its_own_records() {
    let dir = tempfile::tempdir().unwrap();
    // 8 entries fill a segment, so the reused files hold old entries past the new ones.
    let log = a_log_in_reused_files(dir.path(), 400, 10);
    assert_eq!(held(&log), evens(101..=110));
    drop(log);
    let mut log = WriteAheadLog::open(dir.path(), 100, 400).unwrap();
    assert_eq!(held(&log), evens(101..=110));
    // Written after reopening (in the next segment), and read back again.
    log.append(&entries(111..=112, 4)).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 100, 400).unwrap();
    let mut expected = evens(101..=110);
    expected.extend([(111, 4), (112, 4)]);
    assert_eq!(held(&log), expected);
}

#[test]
fn a_write_cut_short_by_a_crash_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = a_log_in_reused_files(dir.path(), 4096, 3);
    let (seq, active, len) = (log.active.seq, log.active.path(dir.path()), log.active.len);
    drop(log);
    // A crash while writing entries 104 and 105 together: 105 reached the disk, half of 104
    // did not.
    let mut torn = Vec::new();
    record::encode_message(&mut torn, seq, ENTRY, &even_entry(104));
    let first = torn.len();
    record::encode_message(&mut torn, seq, ENTRY, &even_entry(105));
    torn[first / 2..first].fill(0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap()
        .write_all_at(&torn, len)
        .unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 100, 4096).unwrap();
    assert_eq!(log.last_index(), Some(103));
    // A new leader's entry 104, as long as the lost one: the unsynced 105 after it must not
    // come back.
    log.append(&[Entry {
        term: 4,
        ..even_entry(104)
    }])
    .unwrap();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 100, 4096).unwrap();
    let mut expected = evens(101..=103);
    expected.push((104, 4));
    assert_eq!(held(&log), expected);
}

#[test]
fn opening_keeps_a_reused_segment_whole_and_goes_on_in_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let log = a_log_in_reused_files(dir.path(), 400, 10);
    let (seq, reused) = (log.active.seq, log.active.path(dir.path()));
    let reused_len = std::fs::metadata(&reused).unwrap().len();
    assert!(
        reused_len > log.active.len,
        "the active segment is not a reused file"
    );
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    drop(log);
    let mut log = WriteAheadLog::open(dir.path(), 100, 400).unwrap();
    assert_eq!(held(&log), evens(101..=110));
    assert_eq!(
        std::fs::metadata(&reused).unwrap().len(),
        reused_len,
        "the reused file was cut, freeing its blocks"
    );
    assert_eq!(log.active.seq, seq + 1);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        files,
        "the next segment was started in a new file, not a free one"
    );
    log.append(&entries(111..=111, 4)).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 100, 400).unwrap();
    let mut expected = evens(101..=110);
    expected.push((111, 4));
    assert_eq!(held(&log), expected);
}

#[test]
fn a_log_written_before_salted_records_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    // Format 1: checksums without the segment number, no closing record.
    let unsalted = |out: &mut Vec<u8>, kind: u8, payload: &[u8]| {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[kind]);
        crc.update(payload);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc.finalize().to_le_bytes());
        out.push(kind);
        out.extend_from_slice(payload);
    };
    for (seq, range) in [(1, 1..=4), (2, 5..=9)] {
        let mut bytes = Vec::new();
        unsalted(
            &mut bytes,
            HARD_STATE,
            &hard_state(2, 1, 3).write_to_bytes().unwrap(),
        );
        unsalted(
            &mut bytes,
            CONF_STATE,
            &ConfState::default().write_to_bytes().unwrap(),
        );
        for e in entries(range, 2) {
            unsalted(&mut bytes, ENTRY, &e.write_to_bytes().unwrap());
        }
        std::fs::write(segment_path(dir.path(), seq), bytes).unwrap();
    }
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(held(&log), (1..=9).map(|i| (i, 2)).collect::<Vec<_>>());
    assert_eq!(*log.hard_state(), hard_state(2, 1, 3));
    log.append(&entries(10..=10, 2)).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    assert_eq!(held(&log), (1..=10).map(|i| (i, 2)).collect::<Vec<_>>());
    assert_eq!(
        segment_files(dir.path()),
        3,
        "the old last segment is written to no more"
    );
}

#[test]
fn a_reset_forgets_the_entries_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = WriteAheadLog::open(dir.path(), 0, SEGMENT_BYTES).unwrap();
    log.append(&entries(1..=10, 1)).unwrap();
    log.sync().unwrap();
    // A leader's snapshot at 5: the stale 6..=10 must not come back at replay.
    log.reset();
    log.sync().unwrap();
    drop(log);
    let log = WriteAheadLog::open(dir.path(), 5, SEGMENT_BYTES).unwrap();
    assert!(log.is_empty(), "{:?}", held(&log));
}

/// One step of a random workload.
#[derive(Clone, Debug)]
enum Step {
    /// Appends `count` entries from `back` entries before the end (overwriting them).
    Append {
        back: u64,
        count: u64,
    },
    Sync,
    /// Compacts up to this fraction (per mille) of the synced log.
    Compact(u64),
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..4, 1u64..6).prop_map(|(back, count)| Step::Append { back, count }),
        3 => Just(Step::Sync),
        1 => (0u64..1000).prop_map(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The log equals a plain vector of what was synced, across overwrites, compactions,
    /// segment rotations and reopenings.
    #[test]
    fn the_log_matches_a_plain_model(steps in proptest::collection::vec(step(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let segment_bytes = 700;
        let mut log = WriteAheadLog::open(dir.path(), 0, segment_bytes).unwrap();
        // Model: (index, term) of every entry after the snapshot, as written and as synced.
        let mut written: Vec<(u64, u64)> = Vec::new();
        let mut synced: Vec<(u64, u64)> = Vec::new();
        let mut snapshot = 0u64;
        let mut term = 1u64;
        for step in steps {
            match step {
                Step::Append { back, count } => {
                    let last = written.last().map_or(snapshot, |e| e.0);
                    // Never overwrite what a snapshot covers.
                    let first = last.saturating_sub(back).max(snapshot) + 1;
                    term += 1;
                    let new = entries(first..=first + count - 1, term);
                    log.append(&new).unwrap();
                    written.retain(|e| e.0 < first);
                    written.extend(new.iter().map(|e| (e.index, e.term)));
                }
                Step::Sync => {
                    log.sync().unwrap();
                    synced = written.clone();
                }
                Step::Compact(per_mille) => {
                    log.sync().unwrap();
                    synced = written.clone();
                    let Some(last) = synced.last().map(|e| e.0) else { continue };
                    let index = snapshot + (last - snapshot) * per_mille / 1000;
                    log.compact(index).retire().unwrap();
                    snapshot = snapshot.max(index);
                    synced.retain(|e| e.0 > snapshot);
                    written = synced.clone();
                }
                Step::Reopen => {
                    drop(log);
                    log = WriteAheadLog::open(dir.path(), snapshot, segment_bytes).unwrap();
                    written = synced.clone();
                }
            }
            prop_assert_eq!(held(&log), written.clone());
        }
    }
}
