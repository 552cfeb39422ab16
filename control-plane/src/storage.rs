//! Raft's log, hard state, configuration and snapshots, persisted in sled.
//!
//! Keys are big-endian indexes, so sled's ordered iteration is log order. Writes are
//! buffered by sled until [`RaftStorage::flush`], which the node calls once per Raft
//! `Ready` before sending any message that depends on them (persist before send).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

/// What can go wrong with the node's data directory.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
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
         backup, or recover the node as the README's \"Recovering a control-plane node\" \
         says (it catches up from the others)"
    )]
    Corrupted { dir: String, detail: String },
    #[error(
        "corrupt record {key} in {tree}: {reason}; the store is damaged: restore it from a \
         backup, or recover the node as the README's \"Recovering a control-plane node\" says"
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
const HARD_STATE: &[u8] = b"hard_state";
const CONF_STATE: &[u8] = b"conf_state";
const SNAPSHOT_META: &[u8] = b"snapshot_meta";
const SNAPSHOT_DATA: &[u8] = b"snapshot_data";
const EVENTS_FLOOR: &[u8] = b"events_floor";

/// Compacted keys removed per step of [`RaftStorage::discard_compacted`]: ~5 ms of work here.
pub const DISCARD_SLICE: usize = 256;

/// The node's sled database: Raft's log and metadata, and the committed events edges
/// subscribe to.
#[derive(Clone)]
pub struct RaftStorage {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    events: sled::Tree,
    members: sled::Tree,
    /// The last snapshot's metadata, kept in memory: Raft asks for its index and term on
    /// every `term`/`first_index` call, far too often to read and decode from sled.
    snapshot: Arc<RwLock<SnapshotMetadata>>,
    /// The hard state, kept in memory as well: the commit index advances on most `Ready`s,
    /// and reading and decoding it from sled each time to update one field was wasted work.
    hard_state: Arc<RwLock<HardState>>,
    /// Events up to this index were discarded; a subscriber that needs one of them gets
    /// the whole state instead. Read on every subscriber step, so kept in memory too.
    events_floor: Arc<AtomicU64>,
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
                || source.to_string().contains("could not acquire lock") =>
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
        let storage = Self {
            log: db.open_tree("raft_log")?,
            events: db.open_tree("committed_events")?,
            members: db.open_tree("members")?,
            meta,
            db,
            snapshot: Arc::default(),
            hard_state: Arc::default(),
            events_floor: Arc::default(),
        };
        if let Some(snapshot) = storage.read_proto(SNAPSHOT_META)? {
            *storage.snapshot.write() = snapshot;
        }
        if let Some(hard_state) = storage.read_proto(HARD_STATE)? {
            *storage.hard_state.write() = hard_state;
        }
        if let Some(floor) = storage.meta.get(EVENTS_FLOOR)? {
            storage
                .events_floor
                .store(index_of(&floor), Ordering::Release);
        }
        Ok(storage)
    }

    /// Whether the node has never stored any Raft state.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.meta.get(HARD_STATE)?.is_none()
            && self.meta.get(CONF_STATE)?.is_none()
            && self.log.is_empty())
    }

    fn read_proto<M: protobuf::Message>(
        &self,
        name: &'static [u8],
    ) -> Result<Option<M>, StoreError> {
        match self.meta.get(name)? {
            None => Ok(None),
            Some(bytes) => {
                M::parse_from_bytes(&bytes)
                    .map(Some)
                    .map_err(|err| StoreError::Corrupt {
                        tree: "raft_meta",
                        key: String::from_utf8_lossy(name).into_owned(),
                        reason: err.to_string(),
                    })
            }
        }
    }

    fn write_proto(
        &self,
        name: &'static [u8],
        message: &impl protobuf::Message,
    ) -> Result<(), StoreError> {
        let bytes = message
            .write_to_bytes()
            .map_err(|err| StoreError::Corrupt {
                tree: "raft_meta",
                key: String::from_utf8_lossy(name).into_owned(),
                reason: err.to_string(),
            })?;
        self.meta.insert(name, bytes)?;
        Ok(())
    }

    pub fn hard_state(&self) -> HardState {
        self.hard_state.read().clone()
    }

    pub fn conf_state(&self) -> Result<ConfState, StoreError> {
        Ok(self.read_proto(CONF_STATE)?.unwrap_or_default())
    }

    pub fn snapshot_metadata(&self) -> SnapshotMetadata {
        self.snapshot.read().clone()
    }

    /// Index and term of the last snapshot (0, 0 before any).
    pub fn snapshot_point(&self) -> (u64, u64) {
        let snapshot = self.snapshot.read();
        (snapshot.index, snapshot.term)
    }

    fn set_snapshot(&self, meta: &SnapshotMetadata, data: &[u8]) -> Result<(), StoreError> {
        self.write_proto(SNAPSHOT_META, meta)?;
        self.meta.insert(SNAPSHOT_DATA, data)?;
        *self.snapshot.write() = meta.clone();
        Ok(())
    }

    /// The state machine as of the last snapshot, when there is one.
    pub fn snapshot_data(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.meta.get(SNAPSHOT_DATA)?.map(|b| b.to_vec()))
    }

    pub fn set_hard_state(&self, state: &HardState) -> Result<(), StoreError> {
        self.write_proto(HARD_STATE, state)?;
        *self.hard_state.write() = state.clone();
        Ok(())
    }

    pub fn set_conf_state(&self, state: &ConfState) -> Result<(), StoreError> {
        self.write_proto(CONF_STATE, state)
    }

    /// Records the commit index in the hard state (raft-rs reports commit advances that
    /// come without a new hard state in its light ready).
    pub fn set_commit(&self, commit: u64) -> Result<(), StoreError> {
        let mut state = self.hard_state();
        if state.commit < commit {
            state.commit = commit;
            self.set_hard_state(&state)?;
        }
        Ok(())
    }

    /// Appends entries, replacing any existing suffix from the first new index (a new
    /// leader overwriting uncommitted entries).
    pub fn append(&self, entries: &[Entry]) -> Result<(), StoreError> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        for old in self.log.range(key(first.index)..) {
            let (k, _) = old?;
            batch.remove(k);
        }
        for entry in entries {
            let bytes = entry.write_to_bytes().map_err(|err| StoreError::Corrupt {
                tree: "raft_log",
                key: entry.index.to_string(),
                reason: err.to_string(),
            })?;
            batch.insert(&key(entry.index), bytes);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    /// Installs a snapshot from the leader: the log before it is discarded.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let meta = snapshot.get_metadata();
        self.set_snapshot(meta, snapshot.get_data())?;
        self.set_conf_state(meta.get_conf_state())?;
        let mut state = self.hard_state();
        state.commit = state.commit.max(meta.index);
        state.term = state.term.max(meta.term);
        self.set_hard_state(&state)?;
        // Events up to the snapshot have a gap here (what the snapshot skipped): none can
        // be served.
        self.raise_events_floor(meta.index)?;
        while self.discard_compacted(DISCARD_SLICE)? > 0 {}
        Ok(())
    }

    /// Stores a snapshot of the local state machine at `index`: the log up to it, and the
    /// events up to `retain_events` entries before it, are no longer served. They are
    /// removed from disk by [`RaftStorage::discard_compacted`].
    pub fn compact(
        &self,
        index: u64,
        term: u64,
        data: Vec<u8>,
        retain_events: u64,
    ) -> Result<(), StoreError> {
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.conf_state()?);
        self.set_snapshot(&meta, &data)?;
        self.raise_events_floor(index.saturating_sub(retain_events))
    }

    /// Removes up to `limit` of the log entries and events that compaction left behind;
    /// returns how many it removed. Nothing reads them any more, so this runs beside the
    /// node (sled is concurrent), a slice at a time: removing ~10,000 keys per tree at once
    /// takes ~0.2 s of CPU here, which stalled replication.
    pub fn discard_compacted(&self, limit: usize) -> Result<usize, StoreError> {
        let log = Self::remove_through(&self.log, self.snapshot_point().0, limit)?;
        let events = Self::remove_through(&self.events, self.events_floor(), limit - log)?;
        Ok(log + events)
    }

    fn raise_events_floor(&self, index: u64) -> Result<(), StoreError> {
        if index > self.events_floor() {
            self.meta.insert(EVENTS_FLOOR, &key(index))?;
            self.events_floor.store(index, Ordering::Release);
        }
        Ok(())
    }

    fn remove_through(tree: &sled::Tree, index: u64, limit: usize) -> Result<usize, StoreError> {
        let mut batch = sled::Batch::default();
        let mut removed = 0;
        for old in tree.range(..=key(index)).keys().take(limit) {
            batch.remove(old?);
            removed += 1;
        }
        tree.apply_batch(batch)?;
        Ok(removed)
    }

    /// Events up to this index were discarded (0 before any compaction).
    pub fn events_floor(&self) -> u64 {
        self.events_floor.load(Ordering::Acquire)
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

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Keeps the committed event of `index` for subscribers that resume.
    pub fn record_event(&self, event: &hasten_proto::v1::CommittedEvent) -> Result<(), StoreError> {
        self.events
            .insert(key(event.index), event.encode_to_vec())?;
        Ok(())
    }

    /// Committed events from `from` on, in order, at most `limit`.
    pub fn events_from(
        &self,
        from: u64,
        limit: usize,
    ) -> Result<Vec<hasten_proto::v1::CommittedEvent>, StoreError> {
        let mut events = Vec::new();
        for item in self.events.range(key(from)..).take(limit) {
            let (k, bytes) = item?;
            let event =
                hasten_proto::v1::CommittedEvent::decode(bytes.as_ref()).map_err(|err| {
                    StoreError::Corrupt {
                        tree: "committed_events",
                        key: index_of(&k).to_string(),
                        reason: err.to_string(),
                    }
                })?;
            events.push(event);
        }
        Ok(events)
    }

    fn raft_last_index(&self) -> Result<u64, StoreError> {
        match self.log.last()? {
            Some((k, _)) => Ok(index_of(&k)),
            None => Ok(self.snapshot_point().0),
        }
    }

    fn entry(&self, index: u64) -> Result<Option<Entry>, StoreError> {
        match self.log.get(key(index))? {
            None => Ok(None),
            Some(bytes) => {
                Entry::parse_from_bytes(&bytes)
                    .map(Some)
                    .map_err(|err| StoreError::Corrupt {
                        tree: "raft_log",
                        key: index.to_string(),
                        reason: err.to_string(),
                    })
            }
        }
    }
}

impl raft::Storage for RaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state(),
            self.conf_state().map_err(raft_store_error)?,
        ))
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
        let last = self.raft_last_index().map_err(raft_store_error)?;
        if high > last + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut entries = Vec::with_capacity((high - low) as usize);
        for item in self.log.range(key(low)..key(high)) {
            let (k, bytes) = item.map_err(raft_store_error)?;
            let entry = Entry::parse_from_bytes(&bytes).map_err(|err| {
                raft_store_error(StoreError::Corrupt {
                    tree: "raft_log",
                    key: index_of(&k).to_string(),
                    reason: err.to_string(),
                })
            })?;
            entries.push(entry);
        }
        raft::util::limit_size(&mut entries, max_size.into());
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
        match self.entry(idx).map_err(raft_store_error)? {
            Some(entry) => Ok(entry.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_point().0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.raft_last_index().map_err(raft_store_error)
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let meta = self.snapshot_metadata();
        if meta.index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut snapshot = Snapshot::default();
        snapshot.set_data(
            self.snapshot_data()
                .map_err(raft_store_error)?
                .unwrap_or_default()
                .into(),
        );
        snapshot.set_metadata(meta);
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_reopens_for_its_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node");
        drop(RaftStorage::open(&path, 3).unwrap());
        drop(RaftStorage::open(&path, 3).unwrap());
        let err = RaftStorage::open(&path, 4).err().unwrap();
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
        assert!(err.to_string().contains("notes.txt"), "{err}");
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
        let message = err.map(|e| e.to_string()).unwrap_or_default();
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
}
