//! A node's data directory: Raft's log, hard state and configuration in a write-ahead log
//! of its own ([`wal`]), the state-machine snapshot in a file ([`snapshot_file`]), and in
//! sled what sled does well: the members' addresses and the node's id. The committed events
//! subscribers resume from are kept in memory ([`events`]).
//!
//! Raft's writes are buffered until [`RaftStorage::flush`], which the node calls once per
//! Raft `Ready` before sending any message that depends on them (persist before send): one
//! write and one `fdatasync`, so nothing is acknowledged before it is on disk on a quorum.
//! sled is not synced per `Ready` (its own flusher writes every 500 ms): it holds members'
//! addresses, which the configuration and the log's membership changes repeat.
//! sled 0.34's flush is not a durability barrier anyway (`sync_file_range`, and large
//! values go to blob files that are never synced), which is why the log left it.

pub mod events;
mod paced;
pub mod snapshot_file;
pub mod wal;

use display_full_error::DisplayFullErrorExt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

use events::EventLog;
pub use wal::WalError;
use wal::WriteAheadLog;

use crate::state::EntryEvent;

/// What can go wrong with the node's data directory.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Log(#[from] WalError),
    #[error(
        "another process holds the control-plane store in {dir} (sled's lock on its `db` \
         file): is a node still running on this directory? Stop it, or let it finish \
         exiting, then start this one"
    )]
    Locked {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the control-plane store in {dir} is unreadable ({detail}): restore it from a \
         backup, or recover the node as docs/operations.md's \"Recovering a control-plane node\" \
         says (it catches up from the others)"
    )]
    Corrupted { dir: String, detail: String },
    #[error(
        "corrupt record {key} in {tree}: {reason}; the store is damaged: restore it from a \
         backup, or recover the node as docs/operations.md's \"Recovering a control-plane node\" says"
    )]
    Corrupt {
        tree: &'static str,
        key: String,
        reason: String,
    },
    #[error(
        "the data directory {dir} holds files that are not a control-plane store ({found}); \
         refusing to use it: point data_dir at an empty directory or at this node's store"
    )]
    NotAStore { dir: String, found: String },
    #[error(
        "the control-plane store in {dir} is damaged: sled opened it but it holds no node id \
         (a corrupt or truncated store, or one reset by sled); refusing to start on it rather \
         than lose what it held. Restore it from a backup, or remove the directory and let the \
         node rejoin the group (it catches up from the leader)"
    )]
    Damaged { dir: String },
    #[error(
        "the data directory {dir} belongs to control-plane node {found}, not node {expected}; \
         point this node at its own directory"
    )]
    ForeignNode {
        dir: String,
        found: u64,
        expected: u64,
    },
}

/// sled's page cache. Its default (1 GiB) made each node's resident memory exceed 1 GB under
/// a replication benchmark; reads here are the log's recent tail and the events subscribers
/// catch up on, which a small cache serves.
const SLED_CACHE_BYTES: u64 = 64 * 1024 * 1024;

const NODE_ID: &[u8] = b"node_id";

/// Files sled keeps in every store it made.
const SLED_FILES: [&str; 2] = ["conf", "db"];

/// Whether `dir` is new (absent or empty); refuses a directory that holds anything but a
/// sled store, so that a mistyped path never becomes a store on top of someone's files.
fn check_directory(dir: &Path) -> Result<bool, StoreError> {
    let entries: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(err) => return Err(StoreError::Sled(sled::Error::Io(err))),
    };
    if entries.is_empty() {
        return Ok(true);
    }
    if SLED_FILES.iter().all(|f| entries.iter().any(|e| e == f)) {
        return Ok(false);
    }
    let mut found: Vec<&str> = entries.iter().map(String::as_str).take(5).collect();
    found.sort_unstable();
    Err(StoreError::NotAStore {
        dir: dir.display().to_string(),
        found: found.join(", "),
    })
}
/// Where sled held the committed events and their floor before they moved to memory;
/// removed when a store of that layout opens.
const OLD_EVENTS_TREE: &str = "committed_events";
const OLD_EVENTS_FLOOR: &[u8] = b"events_floor";

/// The write-ahead log's directory inside the data directory.
const WAL_DIR: &str = "raft-wal";

/// What a compaction took out of the node's store: the log's obsolete segments and
/// entries, and the events no longer served.
#[derive(Debug)]
pub struct Compaction {
    log: wal::Compacted,
    /// The snapshot a leader's snapshot replaced (a node's own snapshots remove theirs
    /// beside).
    replaced: Option<snapshot_file::Replaced>,
    /// Held only to be freed where [`Compaction::discard`] runs.
    _events: Vec<Arc<EntryEvent>>,
}

impl Compaction {
    /// Retires the obsolete segment files and frees the rest (beside the node: neither
    /// belongs on the Raft thread).
    pub fn discard(self) -> Result<(), WalError> {
        self.log.retire()?;
        self.replaced
            .map_or(Ok(()), snapshot_file::Replaced::remove)
    }
}

/// A node's store: the Raft log, the snapshot, and the committed events edges subscribe to.
#[derive(Clone)]
pub struct RaftStorage {
    dir: PathBuf,
    db: sled::Db,
    log: Arc<RwLock<WriteAheadLog>>,
    members: sled::Tree,
    events: Arc<EventLog>,
    /// The snapshot point the log is compacted to, kept in memory: Raft asks for its index
    /// and term on every `term`/`first_index` call. The file may already hold a newer
    /// snapshot (written beside the node) until the node compacts the log to it.
    snapshot: Arc<RwLock<SnapshotMetadata>>,
    /// Serialises snapshot file writes (the node's own, beside it, and a leader's) and
    /// holds the index of the one on disk, which never goes back.
    snapshot_file: Arc<parking_lot::Mutex<u64>>,
    /// Raft asked for a snapshot for a member the stored one predates (a node added after
    /// it, whose restore would refuse it): the node takes a new one at once.
    snapshot_wanted: Arc<AtomicBool>,
}

/// Whether `id` is a member (voter or learner, either side of a joint change) in `conf`.
fn is_member(conf: &ConfState, id: u64) -> bool {
    [
        &conf.voters,
        &conf.learners,
        &conf.voters_outgoing,
        &conf.learners_next,
    ]
    .iter()
    .any(|ids| ids.contains(&id))
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn index_of(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

/// What failing to open `dir` means: another process holding it, damaged data, or another
/// sled error.
fn opening_error(dir: &Path, err: sled::Error) -> StoreError {
    let dir = dir.display().to_string();
    match err {
        // sled reports its lock as an i/o error of its own wording (sled 0.34).
        sled::Error::Io(source)
            if source.kind() == std::io::ErrorKind::WouldBlock
                || source.to_string_full().contains("could not acquire lock") =>
        {
            StoreError::Locked { dir, source }
        }
        sled::Error::Corruption { at, .. } => StoreError::Corrupted {
            dir,
            detail: format!(
                "damaged data at log offset {}",
                at.map_or_else(|| "unknown".to_string(), |at| at.lid().to_string())
            ),
        },
        sled::Error::Unsupported(reason) => StoreError::Corrupted {
            dir,
            detail: reason,
        },
        other => StoreError::Sled(other),
    }
}

fn raft_store_error(err: impl std::error::Error + Send + Sync + 'static) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(err)))
}

impl RaftStorage {
    /// Opens (or creates) the data directory of node `node_id`. A directory written by
    /// another node is refused.
    pub fn open(dir: &Path, node_id: u64) -> Result<Self, StoreError> {
        let fresh = check_directory(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
            .map_err(|err| opening_error(dir, err))?;
        let meta = db.open_tree("raft_meta")?;
        match meta.get(NODE_ID)? {
            Some(found) => {
                let found = index_of(&found);
                if found != node_id {
                    return Err(StoreError::ForeignNode {
                        dir: dir.display().to_string(),
                        found,
                        expected: node_id,
                    });
                }
            }
            None if fresh => {
                meta.insert(NODE_ID, &key(node_id))?;
                db.flush()?;
            }
            None => {
                return Err(StoreError::Damaged {
                    dir: dir.display().to_string(),
                });
            }
        }
        let snapshot = match snapshot_file::read(dir)? {
            Some((meta, _)) => meta,
            None => SnapshotMetadata::default(),
        };
        let mut log = WriteAheadLog::open(&dir.join(WAL_DIR), snapshot.index, wal::SEGMENT_BYTES)?;
        if log.hard_state().commit < snapshot.index {
            // A snapshot holds committed entries only; the commit index recorded after it
            // may not have been synced (see `persist`).
            let mut hard_state = log.hard_state().clone();
            hard_state.commit = snapshot.index;
            log.set_hard_state(&hard_state);
        }
        if db
            .tree_names()
            .iter()
            .any(|name| name.as_ref() == OLD_EVENTS_TREE.as_bytes())
        {
            db.drop_tree(OLD_EVENTS_TREE)?;
            meta.remove(OLD_EVENTS_FLOOR)?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            log: Arc::new(RwLock::new(log)),
            members: db.open_tree("members")?,
            db,
            snapshot_file: Arc::new(parking_lot::Mutex::new(snapshot.index)),
            events: Arc::new(EventLog::new(snapshot.index)),
            snapshot: Arc::new(RwLock::new(snapshot)),
            snapshot_wanted: Arc::default(),
        })
    }

    /// Whether the node has never stored any Raft state.
    pub fn is_empty(&self) -> bool {
        let log = self.log.read();
        *log.hard_state() == HardState::default()
            && *log.conf_state() == ConfState::default()
            && log.is_empty()
            && self.snapshot_point() == (0, 0)
    }

    pub fn hard_state(&self) -> HardState {
        self.log.read().hard_state().clone()
    }

    pub fn conf_state(&self) -> ConfState {
        self.log.read().conf_state().clone()
    }

    /// Index and term of the last snapshot (0, 0 before any).
    pub fn snapshot_point(&self) -> (u64, u64) {
        let snapshot = self.snapshot.read();
        (snapshot.index, snapshot.term)
    }

    /// Writes a snapshot file unless the one on disk is as new or newer; `None` when it did
    /// not write, else the snapshot it replaced, to be removed. Runs beside the node for its
    /// own snapshots: the log is compacted to it afterwards, on the node's thread
    /// ([`RaftStorage::compact_to`]).
    pub fn store_snapshot(
        &self,
        meta: &SnapshotMetadata,
        data: &[u8],
    ) -> Result<Option<snapshot_file::Replaced>, StoreError> {
        let mut on_disk = self.snapshot_file.lock();
        if meta.index <= *on_disk {
            return Ok(None);
        }
        let replaced = snapshot_file::write(&self.dir, meta, data)?;
        *on_disk = meta.index;
        Ok(Some(replaced))
    }

    /// Whether Raft asked for a newer snapshot than the stored one since the last call.
    pub fn take_snapshot_request(&self) -> bool {
        self.snapshot_wanted.swap(false, Ordering::AcqRel)
    }

    /// The snapshot on disk (metadata and state), when there is one.
    pub fn stored_snapshot(&self) -> Result<Option<(SnapshotMetadata, Vec<u8>)>, StoreError> {
        let _writing = self.snapshot_file.lock();
        Ok(snapshot_file::read(&self.dir)?)
    }

    pub fn set_hard_state(&self, state: &HardState) {
        self.log.write().set_hard_state(state);
    }

    pub fn set_conf_state(&self, state: &ConfState) {
        self.log.write().set_conf_state(state);
    }

    /// Records the commit index in the hard state (raft-rs reports commit advances that
    /// come without a new hard state in its light ready).
    pub fn set_commit(&self, commit: u64) {
        let mut log = self.log.write();
        if log.hard_state().commit < commit {
            let mut state = log.hard_state().clone();
            state.commit = commit;
            log.set_hard_state(&state);
        }
    }

    /// Appends entries, replacing any existing suffix from the first new index (a new
    /// leader overwriting uncommitted entries).
    pub fn append(&self, entries: &[Entry]) -> Result<(), StoreError> {
        Ok(self.log.write().append(entries)?)
    }

    /// Installs a snapshot from the leader: the log before it is discarded. Returns the
    /// files it made obsolete, for [`Compaction::discard`] beside the node.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<Compaction, StoreError> {
        let meta = snapshot.get_metadata();
        let replaced = self.store_snapshot(meta, snapshot.get_data())?;
        *self.snapshot.write() = meta.clone();
        let log = {
            let mut log = self.log.write();
            log.reset();
            log.set_conf_state(meta.get_conf_state());
            let mut state = log.hard_state().clone();
            state.commit = state.commit.max(meta.index);
            state.term = state.term.max(meta.term);
            log.set_hard_state(&state);
            log.sync()?;
            log.compact(meta.index)
        };
        // Events up to the snapshot have a gap here (what the snapshot skipped): none can
        // be served.
        let events = self.events.raise_floor(meta.index);
        Ok(Compaction {
            log,
            replaced,
            _events: events,
        })
    }

    /// Compacts to a snapshot already on disk: the log up to it is dropped, and the events
    /// before it are no longer served but for the last `retain_events` of them holding at
    /// most `retain_bytes`. Returns what was taken out, for [`Compaction::discard`] beside
    /// the node.
    pub fn compact_to(
        &self,
        meta: &SnapshotMetadata,
        retain_events: u64,
        retain_bytes: u64,
    ) -> Compaction {
        *self.snapshot.write() = meta.clone();
        let log = self.log.write().compact(meta.index);
        let floor = self
            .events
            .retention_floor(meta.index, retain_events, retain_bytes);
        let events = self.events.raise_floor(floor);
        Compaction {
            log,
            replaced: None,
            _events: events,
        }
    }

    /// Events up to this index are not served (the snapshot point at start).
    pub fn events_floor(&self) -> u64 {
        self.events.floor()
    }

    /// Records a member's address (membership changes carry it).
    pub fn set_member(&self, id: u64, address: &str) -> Result<(), StoreError> {
        self.members.insert(key(id), address.as_bytes())?;
        Ok(())
    }

    pub fn remove_member(&self, id: u64) -> Result<(), StoreError> {
        self.members.remove(key(id))?;
        Ok(())
    }

    /// Known members' addresses by node id.
    pub fn members(&self) -> Result<BTreeMap<u64, String>, StoreError> {
        let mut members = BTreeMap::new();
        for item in self.members.iter() {
            let (k, address) = item?;
            members.insert(index_of(&k), String::from_utf8_lossy(&address).into_owned());
        }
        Ok(members)
    }

    /// Makes every Raft write so far durable: one write and one `fdatasync` of the log.
    pub fn flush(&self) -> Result<(), StoreError> {
        Ok(self.log.write().sync()?)
    }

    /// Writes the Raft writes so far to the log, synced only when `durable`. raft-rs says a
    /// `Ready` needs no sync when it holds no entries, no snapshot and no hard-state change
    /// but the commit index (`Ready::must_sync`, etcd's `MustSync`): a commit index lost to a
    /// power cut is learned again from the leader.
    pub fn persist(&self, durable: bool) -> Result<(), StoreError> {
        Ok(self.log.write().write(durable)?)
    }

    /// Makes sled's writes so far durable too (membership and the founding configuration,
    /// written rarely).
    pub fn flush_all(&self) -> Result<(), StoreError> {
        self.flush()?;
        self.db.flush()?;
        Ok(())
    }

    /// Keeps the committed event of a newly applied entry (of `bytes` payload) for
    /// subscribers that resume, the events kept holding at most `budget` bytes.
    pub fn record_event(&self, event: Arc<EntryEvent>, bytes: u64, budget: u64) {
        self.events.record(event, bytes, budget);
    }

    /// Committed events from `from` on, in order, at most `limit`; `None` when `from` is
    /// under the events floor (the caller sends the whole state instead).
    pub fn events_from(&self, from: u64, limit: usize) -> Option<Vec<Arc<EntryEvent>>> {
        self.events.resume_from(from, limit)
    }

    fn raft_last_index(&self) -> u64 {
        self.log
            .read()
            .last_index()
            .unwrap_or_else(|| self.snapshot_point().0)
    }
}

impl raft::Storage for RaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state(), self.conf_state()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let first = self.snapshot_point().0 + 1;
        if low < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.raft_last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max_size = max_size.into();
        let mut entries = Vec::with_capacity((high - low) as usize);
        let mut size = 0u64;
        let log = self.log.read();
        if low < high && log.entry(low).is_none() {
            // Compacted between the check above and taking the log.
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        for entry in log.entries(low, high) {
            // raft-rs's limit: always at least one entry, then as many as fit.
            size += u64::from(entry.compute_size());
            if !entries.is_empty() && max_size.is_some_and(|max| size > max) {
                break;
            }
            entries.push(entry.clone());
        }
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let (snapshot_index, snapshot_term) = self.snapshot_point();
        if idx == snapshot_index {
            return Ok(snapshot_term);
        }
        if idx < snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.log.read().entry(idx) {
            Some(entry) => Ok(entry.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_point().0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.raft_last_index())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        // The file's own metadata: it may be newer than the point the log is compacted to.
        let stored = self.stored_snapshot().map_err(raft_store_error)?;
        let usable = |meta: &SnapshotMetadata| {
            meta.index >= request_index
                && (is_member(meta.get_conf_state(), to) || !is_member(&self.conf_state(), to))
        };
        let Some((meta, data)) = stored.filter(|(meta, _)| usable(meta)) else {
            // raft-rs asks again at the next heartbeat; by then the node has taken one.
            self.snapshot_wanted.store(true, Ordering::Release);
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        };
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        snapshot.set_metadata(meta);
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens a store just dropped. sled's background flusher may hold the directory's lock
    /// for a moment after the drop returns (seen once on a loaded 2-core machine), so a
    /// `Locked` refusal is retried for up to two seconds.
    fn reopen(path: &Path, node: u64) -> Result<RaftStorage, StoreError> {
        for _ in 0..40 {
            match RaftStorage::open(path, node) {
                Err(StoreError::Locked { .. }) => {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                opened => return opened,
            }
        }
        RaftStorage::open(path, node)
    }

    #[test]
    fn a_store_reopens_for_its_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node");
        drop(RaftStorage::open(&path, 3).unwrap());
        drop(reopen(&path, 3).unwrap());
        let err = reopen(&path, 4).err().unwrap();
        assert!(
            matches!(
                err,
                StoreError::ForeignNode {
                    found: 3,
                    expected: 4,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_directory_of_other_files_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let err = RaftStorage::open(dir.path(), 1).err().unwrap();
        assert!(err.to_string_full().contains("notes.txt"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "the store wrote into a foreign directory");
    }

    #[test]
    fn a_corrupted_store_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node");
        drop(RaftStorage::open(&path, 1).unwrap());
        // Overwrite sled's files with garbage, as a bad disk or a bad copy would.
        for file in SLED_FILES {
            std::fs::write(path.join(file), vec![0xA5u8; 4096]).unwrap();
        }
        let err = RaftStorage::open(&path, 1).err();
        assert!(
            matches!(
                err,
                Some(StoreError::Damaged { .. } | StoreError::Corrupted { .. })
            ),
            "a corrupted store opened, or its error says nothing: {err:?}"
        );
        let message = err.map(|e| e.to_string_full()).unwrap_or_default();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message.contains("Recovering a control-plane node") || message.contains("rejoin"),
            "{message}"
        );
    }

    #[test]
    fn a_store_held_by_another_process_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node");
        let held = RaftStorage::open(&path, 1).unwrap();
        let err = RaftStorage::open(&path, 1).err();
        let message = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(matches!(err, Some(StoreError::Locked { .. })), "{err:?}");
        assert!(
            message.contains("another process") && message.contains(&path.display().to_string()),
            "{message}"
        );
        drop(held);
        RaftStorage::open(&path, 1).unwrap();
    }

    /// The node's own snapshot, written beside it, never replaces a newer one (a leader's
    /// installed meanwhile), and the log is compacted only when the node says so.
    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        use raft::Storage as _;
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(&dir.path().join("node"), 1).unwrap();
        let entries: Vec<Entry> = (1..=30)
            .map(|index| Entry {
                index,
                term: 1,
                ..Default::default()
            })
            .collect();
        storage.append(&entries).unwrap();
        storage.flush().unwrap();
        let meta = |index| SnapshotMetadata {
            index,
            term: 1,
            ..Default::default()
        };
        let replaced = storage.store_snapshot(&meta(20), b"at 20").unwrap();
        replaced.expect("written").remove().unwrap();
        // Written but not yet compacted to: the log still serves from 1.
        assert_eq!(storage.first_index().unwrap(), 1);
        assert_eq!(storage.snapshot(15, 2).unwrap().get_metadata().index, 20);
        assert!(
            storage
                .store_snapshot(&meta(10), b"at 10")
                .unwrap()
                .is_none()
        );
        let (on_disk, data) = storage.stored_snapshot().unwrap().unwrap();
        assert_eq!((on_disk.index, data.as_slice()), (20, b"at 20".as_slice()));
        storage.compact_to(&meta(20), 0, 0).discard().unwrap();
        assert_eq!(storage.first_index().unwrap(), 21);
        assert_eq!(storage.term(25).unwrap(), 1);
        assert!(matches!(
            storage.entries(15, 25, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
    }

    /// A node added after the stored snapshot would refuse it (it is not in its
    /// configuration): Raft gets "temporarily unavailable" and the node is asked for a new one.
    #[test]
    fn a_snapshot_older_than_a_new_member_is_not_sent_to_it() {
        use raft::Storage as _;
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(&dir.path().join("node"), 1).unwrap();
        let founders = ConfState {
            voters: vec![1, 2, 3],
            ..Default::default()
        };
        let mut meta = SnapshotMetadata {
            index: 20,
            term: 1,
            ..Default::default()
        };
        meta.set_conf_state(founders.clone());
        storage.set_conf_state(&founders);
        let replaced = storage.store_snapshot(&meta, b"at 20").unwrap();
        replaced.expect("written").remove().unwrap();
        assert_eq!(storage.snapshot(0, 3).unwrap().get_metadata().index, 20);
        assert!(!storage.take_snapshot_request());
        // Node 4 joins after the snapshot.
        storage.set_conf_state(&ConfState {
            voters: vec![1, 2, 3, 4],
            ..Default::default()
        });
        assert!(matches!(
            storage.snapshot(0, 4),
            Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable
            ))
        ));
        assert!(storage.take_snapshot_request());
        assert!(!storage.take_snapshot_request());
        // A node that is no member at all gets what there is.
        assert_eq!(storage.snapshot(0, 9).unwrap().get_metadata().index, 20);
    }
}
