//! The Raft log's write-ahead log: entries, hard state and configuration appended as
//! checksummed records to segment files, made durable with one `fdatasync` per
//! [`WriteAheadLog::sync`], and kept in memory from the last snapshot on (raft-rs reads the
//! log's tail on every step; etcd's WAL and `MemoryStorage` split the work the same way).
//!
//! A segment starts with the current hard state and configuration, so that dropping older
//! segments never loses either; a compaction deletes whole segments whose entries the
//! snapshot covers, instead of removing keys one by one. On open, the segments are replayed
//! in order; a record cut short at the end of the last segment (a crash mid-write) is
//! truncated away, anywhere else it is corruption and refused.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState};

use super::paced;

/// Size at which the active segment is closed and a new one started.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Record header: payload length (u32 LE), CRC-32 of kind and payload (u32 LE), kind (u8).
const HEADER_BYTES: usize = 9;

const ENTRY: u8 = 1;
const HARD_STATE: u8 = 2;
const CONF_STATE: u8 = 3;
/// A snapshot from the leader replaced the log: replay forgets every entry before it.
const RESET: u8 = 4;

/// A compacted segment being removed (replay skips it; open deletes it).
const REMOVING_EXTENSION: &str = "removing";

/// What can go wrong with the log's files.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the Raft log segment {path} is damaged at byte {offset} ({reason}), before its end: \
         restore the node from a backup, or recover it as the README's \"Recovering a \
         control-plane node\" says (it catches up from the others)"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// Maps an i/o error to [`WalError::Io`] naming what was done to which file.
pub(super) fn io_error(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> WalError {
    let path = path.to_path_buf();
    move |source| WalError::Io {
        action,
        path,
        source,
    }
}

/// A closed segment: its sequence number and the highest entry index written to it.
#[derive(Debug)]
struct Segment {
    seq: u64,
    last_index: u64,
}

/// The segment being appended to.
#[derive(Debug)]
struct ActiveSegment {
    seq: u64,
    file: File,
    len: u64,
    last_index: u64,
}

/// What the log holds, rebuilt by replay and kept current by appends.
#[derive(Debug, Default)]
struct LogState {
    /// Entries after the snapshot point, in index order.
    entries: VecDeque<Entry>,
    hard_state: HardState,
    conf_state: ConfState,
}

/// What [`WriteAheadLog::compact`] took out of the log: segment files to delete and entries
/// to free, both left to the caller so that neither has to happen on the Raft thread.
#[derive(Debug)]
pub struct Compacted {
    pub segments: Vec<PathBuf>,
    pub entries: Vec<Entry>,
}

/// Deletes segments [`WriteAheadLog::compact`] left behind: renamed out of replay's way
/// first (a crash mid-removal leaves a file [`WriteAheadLog::open`] deletes), then
/// truncated step by step ([`paced::remove`]).
pub fn remove_segments(segments: &[PathBuf]) -> Result<(), WalError> {
    let Some(dir) = segments.first().and_then(|p| p.parent()) else {
        return Ok(());
    };
    let mut removing = Vec::with_capacity(segments.len());
    for path in segments {
        let to = path.with_extension(REMOVING_EXTENSION);
        std::fs::rename(path, &to).map_err(io_error("renaming", path))?;
        removing.push(to);
    }
    sync_directory(dir)?;
    for path in removing {
        paced::remove(&path).map_err(io_error("removing", &path))?;
    }
    Ok(())
}

/// What replaying one segment found.
struct Replay {
    /// Where a record is cut short or fails its checksum, and how.
    torn: Option<(u64, String)>,
    /// The highest entry index in the segment.
    last_index: u64,
    /// Length of the segment's valid prefix.
    valid_len: u64,
}

/// The Raft log of one node: durable on disk, served from memory.
#[derive(Debug)]
pub struct WriteAheadLog {
    dir: PathBuf,
    state: LogState,
    closed: Vec<Segment>,
    active: ActiveSegment,
    /// Records appended since the last sync, written and synced together.
    pending: Vec<u8>,
    segment_bytes: u64,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

fn encode_record(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(payload);
    // A payload over 4 GiB cannot occur: raft-rs bounds entries far below it.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

fn encode_message(out: &mut Vec<u8>, kind: u8, message: &impl protobuf::Message) {
    // Encoding into memory fails only on a message too large for protobuf (2 GiB).
    let payload = message.write_to_bytes().unwrap_or_default();
    encode_record(out, kind, &payload);
}

/// Syncs a directory, so that a file created, renamed or removed in it survives a crash.
pub(super) fn sync_directory(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("syncing directory", dir))
}

impl LogState {
    /// Applies one segment's records.
    fn replay(&mut self, path: &Path, bytes: &[u8]) -> Result<Replay, WalError> {
        let mut offset = 0usize;
        let mut last_index = 0;
        let corrupt = |offset: usize, reason: String| WalError::Corrupt {
            path: path.to_path_buf(),
            offset: offset as u64,
            reason,
        };
        while offset < bytes.len() {
            let torn = |reason: &str| Replay {
                torn: Some((offset as u64, reason.to_string())),
                last_index,
                valid_len: offset as u64,
            };
            let Some(header) = bytes.get(offset..offset + HEADER_BYTES) else {
                return Ok(torn("a header cut short"));
            };
            let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let kind = header[8];
            let start = offset + HEADER_BYTES;
            let Some(payload) = bytes.get(start..start + len) else {
                return Ok(torn("a record cut short"));
            };
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&[kind]);
            hasher.update(payload);
            if hasher.finalize() != crc {
                return Ok(torn("checksum mismatch"));
            }
            match kind {
                ENTRY => {
                    let entry = Entry::parse_from_bytes(payload)
                        .map_err(|err| corrupt(offset, format!("entry: {err}")))?;
                    last_index = last_index.max(entry.index);
                    self.push_entry(entry)
                        .map_err(|reason| corrupt(offset, reason))?;
                }
                HARD_STATE => {
                    self.hard_state = HardState::parse_from_bytes(payload)
                        .map_err(|err| corrupt(offset, format!("hard state: {err}")))?;
                }
                CONF_STATE => {
                    self.conf_state = ConfState::parse_from_bytes(payload)
                        .map_err(|err| corrupt(offset, format!("configuration: {err}")))?;
                }
                RESET => self.entries.clear(),
                other => return Err(corrupt(offset, format!("unknown record kind {other}"))),
            }
            offset = start + len;
        }
        Ok(Replay {
            torn: None,
            last_index,
            valid_len: offset as u64,
        })
    }

    /// Adds an entry, replacing any it overwrites (a new leader's log winning over
    /// uncommitted entries).
    fn push_entry(&mut self, entry: Entry) -> Result<(), String> {
        while self.entries.back().is_some_and(|e| e.index >= entry.index) {
            self.entries.pop_back();
        }
        if let Some(last) = self.entries.back()
            && last.index + 1 != entry.index
        {
            return Err(format!(
                "entry {} follows entry {}: a gap in the log",
                entry.index, last.index
            ));
        }
        self.entries.push_back(entry);
        Ok(())
    }
}

impl ActiveSegment {
    /// Creates segment `seq`, headed by the current hard state and configuration.
    fn create(dir: &Path, seq: u64, state: &LogState) -> Result<Self, WalError> {
        let path = segment_path(dir, seq);
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io_error("creating", &path))?;
        let mut header = Vec::new();
        encode_message(&mut header, HARD_STATE, &state.hard_state);
        encode_message(&mut header, CONF_STATE, &state.conf_state);
        file.write_all(&header)
            .and_then(|()| file.sync_data())
            .map_err(io_error("writing", &path))?;
        sync_directory(dir)?;
        Ok(Self {
            seq,
            file,
            len: header.len() as u64,
            last_index: 0,
        })
    }
}

impl WriteAheadLog {
    /// Opens the log in `dir` (created when absent) and replays it; entries up to
    /// `snapshot_index` are covered by the snapshot and dropped.
    pub fn open(dir: &Path, snapshot_index: u64, segment_bytes: u64) -> Result<Self, WalError> {
        std::fs::create_dir_all(dir).map_err(io_error("creating", dir))?;
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir).map_err(io_error("listing", dir))? {
            let item = item.map_err(io_error("listing", dir))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let path = item.path();
            if path.extension().is_some_and(|e| e == REMOVING_EXTENSION) {
                std::fs::remove_file(&path).map_err(io_error("removing", &path))?;
                continue;
            }
            if let Some(seq) = name
                .strip_suffix(".wal")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let mut state = LogState::default();
        let mut closed = Vec::new();
        let mut active = None;
        let last = seqs.last().copied();
        for seq in seqs {
            let path = segment_path(dir, seq);
            let bytes = std::fs::read(&path).map_err(io_error("reading", &path))?;
            let replay = state.replay(&path, &bytes)?;
            if let Some((offset, reason)) = replay.torn {
                if Some(seq) != last {
                    return Err(WalError::Corrupt {
                        path,
                        offset,
                        reason,
                    });
                }
                tracing::warn!(
                    segment = %path.display(),
                    offset,
                    %reason,
                    "the Raft log ends in a record cut short (a crash while writing it); truncating it"
                );
            }
            if Some(seq) != last {
                closed.push(Segment {
                    seq,
                    last_index: replay.last_index,
                });
                continue;
            }
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io_error("opening", &path))?;
            if replay.valid_len < bytes.len() as u64 {
                file.set_len(replay.valid_len)
                    .and_then(|()| file.sync_all())
                    .map_err(io_error("truncating", &path))?;
            }
            active = Some(ActiveSegment {
                seq,
                file,
                len: replay.valid_len,
                last_index: replay.last_index,
            });
        }
        while state
            .entries
            .front()
            .is_some_and(|e| e.index <= snapshot_index)
        {
            state.entries.pop_front();
        }
        let active = match active {
            Some(active) => active,
            None => ActiveSegment::create(dir, 1, &state)?,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            state,
            closed,
            active,
            pending: Vec::new(),
            segment_bytes,
        })
    }

    /// Appends entries (in memory at once, on disk at the next [`Self::sync`]), replacing any
    /// existing suffix from the first new index.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), WalError> {
        for entry in entries {
            encode_message(&mut self.pending, ENTRY, entry);
            self.active.last_index = self.active.last_index.max(entry.index);
            self.state
                .push_entry(entry.clone())
                .map_err(|reason| WalError::Corrupt {
                    path: segment_path(&self.dir, self.active.seq),
                    offset: self.active.len,
                    reason: format!("appending: {reason}"),
                })?;
        }
        Ok(())
    }

    pub fn set_hard_state(&mut self, state: &HardState) {
        if *state != self.state.hard_state {
            encode_message(&mut self.pending, HARD_STATE, state);
            self.state.hard_state = state.clone();
        }
    }

    pub fn set_conf_state(&mut self, state: &ConfState) {
        encode_message(&mut self.pending, CONF_STATE, state);
        self.state.conf_state = state.clone();
    }

    /// Forgets every entry: a snapshot from the leader replaces the log.
    pub fn reset(&mut self) {
        encode_record(&mut self.pending, RESET, &[]);
        self.state.entries.clear();
    }

    /// Writes what was appended since the last call and waits until it is on disk
    /// (`fdatasync`); starts a new segment when the active one is full.
    pub fn sync(&mut self) -> Result<(), WalError> {
        self.write(true)
    }

    /// Writes what was appended since the last call to the file, synced to disk only when
    /// `durable`: a process crash keeps it either way, a power loss only when synced.
    pub fn write(&mut self, durable: bool) -> Result<(), WalError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = segment_path(&self.dir, self.active.seq);
        self.active
            .file
            .write_all(&self.pending)
            .and_then(|()| {
                if durable {
                    self.active.file.sync_data()
                } else {
                    Ok(())
                }
            })
            .map_err(io_error("writing", &path))?;
        self.active.len += self.pending.len() as u64;
        self.pending.clear();
        if self.active.len >= self.segment_bytes {
            if !durable {
                self.active
                    .file
                    .sync_data()
                    .map_err(io_error("writing", &path))?;
            }
            self.closed.push(Segment {
                seq: self.active.seq,
                last_index: self.active.last_index,
            });
            self.active = ActiveSegment::create(&self.dir, self.active.seq + 1, &self.state)?;
        }
        Ok(())
    }

    /// Drops the entries up to `index` (a durable snapshot covers them) and returns the
    /// oldest closed segments that hold nothing after it, for [`remove_segments`]: deleting
    /// 64 MiB files took ~160 ms here, too long for the node's thread, and a segment left
    /// by a crash before its deletion only replays entries the snapshot covers.
    pub fn compact(&mut self, index: u64) -> Compacted {
        let covered = self.state.entries.partition_point(|e| e.index <= index);
        let entries = self.state.entries.drain(..covered).collect();
        // Only a prefix of segments goes, so that replay never sees a gap.
        let obsolete = self
            .closed
            .iter()
            .take_while(|s| s.last_index <= index)
            .count();
        let segments = self
            .closed
            .drain(..obsolete)
            .map(|segment| segment_path(&self.dir, segment.seq))
            .collect();
        Compacted { segments, entries }
    }

    pub fn hard_state(&self) -> &HardState {
        &self.state.hard_state
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.state.conf_state
    }

    /// Index of the last entry held, if any.
    pub fn last_index(&self) -> Option<u64> {
        self.state.entries.back().map(|e| e.index)
    }

    pub fn is_empty(&self) -> bool {
        self.state.entries.is_empty()
    }

    /// The entry at `index`, if held.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let first = self.state.entries.front()?.index;
        let position = usize::try_from(index.checked_sub(first)?).ok()?;
        self.state.entries.get(position)
    }

    /// Entries in `[low, high)` that are held, in order.
    pub fn entries(&self, low: u64, high: u64) -> impl Iterator<Item = &Entry> {
        let first = self.state.entries.front().map_or(low, |e| e.index);
        let from = usize::try_from(low.saturating_sub(first)).unwrap_or(usize::MAX);
        self.state
            .entries
            .iter()
            .skip(from)
            .take_while(move |e| e.index < high)
    }

    /// Segment files on disk, for tests and status.
    pub fn segments(&self) -> usize {
        self.closed.len() + 1
    }
}

#[cfg(test)]
mod tests;
