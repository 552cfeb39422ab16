//! Moves a store written before the write-ahead log (Raft's log, hard state, configuration
//! and snapshot in sled) to the current layout, once, at open: an upgraded node keeps
//! everything it had acknowledged.

use std::path::Path;

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, SnapshotMetadata};

use super::wal::{self, WriteAheadLog};
use super::{StoreError, snapshot_file};

const LOG_TREE: &str = "raft_log";
const HARD_STATE: &[u8] = b"hard_state";
const CONF_STATE: &[u8] = b"conf_state";
const SNAPSHOT_META: &[u8] = b"snapshot_meta";
const SNAPSHOT_DATA: &[u8] = b"snapshot_data";

fn corrupt(key: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        tree: "raft_meta",
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

fn read<M: protobuf::Message>(
    meta: &sled::Tree,
    key: &'static [u8],
) -> Result<Option<M>, StoreError> {
    match meta.get(key)? {
        None => Ok(None),
        Some(bytes) => M::parse_from_bytes(&bytes)
            .map(Some)
            .map_err(|err| corrupt(&String::from_utf8_lossy(key), err)),
    }
}

/// Migrates the sled-held Raft state of the store in `dir` into a write-ahead log at
/// `wal_dir`, when the store has such state and no log yet. The log is built beside and
/// renamed into place, then sled's copy is removed: a crash at any point leaves either the
/// old layout (migrated again) or the new one.
pub(super) fn from_sled(dir: &Path, db: &sled::Db, wal_dir: &Path) -> Result<(), StoreError> {
    let building = dir.join("raft-wal.migrating");
    if building.exists() {
        std::fs::remove_dir_all(&building).map_err(wal::io_error("removing", &building))?;
    }
    let meta = db.open_tree("raft_meta")?;
    if wal_dir.exists() {
        return Ok(());
    }
    let old_log = db.open_tree(LOG_TREE)?;
    let hard_state: Option<HardState> = read(&meta, HARD_STATE)?;
    let conf_state: Option<ConfState> = read(&meta, CONF_STATE)?;
    let snapshot: Option<SnapshotMetadata> = read(&meta, SNAPSHOT_META)?;
    if hard_state.is_none() && conf_state.is_none() && snapshot.is_none() && old_log.is_empty() {
        return Ok(());
    }
    if let Some(snapshot) = &snapshot {
        let data = meta
            .get(SNAPSHOT_DATA)?
            .map(|d| d.to_vec())
            .unwrap_or_default();
        snapshot_file::write(dir, snapshot, &data)?.remove()?;
    }
    let snapshot_index = snapshot.as_ref().map_or(0, |s| s.index);
    let mut log = WriteAheadLog::open(&building, snapshot_index, wal::SEGMENT_BYTES)?;
    let mut entries = Vec::new();
    for item in old_log.range(snapshot_index.saturating_add(1).to_be_bytes()..) {
        let (key, bytes) = item?;
        let entry = Entry::parse_from_bytes(&bytes).map_err(|err| StoreError::Corrupt {
            tree: "raft_log",
            key: format!("{key:?}"),
            reason: err.to_string(),
        })?;
        entries.push(entry);
    }
    log.append(&entries)?;
    log.set_hard_state(&hard_state.unwrap_or_default());
    log.set_conf_state(&conf_state.unwrap_or_default());
    log.sync()?;
    drop(log);
    std::fs::rename(&building, wal_dir).map_err(wal::io_error("renaming", &building))?;
    wal::sync_directory(dir)?;
    tracing::info!(
        entries = entries.len(),
        snapshot_index,
        "moved the Raft log from sled to its write-ahead log"
    );
    db.drop_tree(LOG_TREE)?;
    for key in [HARD_STATE, CONF_STATE, SNAPSHOT_META, SNAPSHOT_DATA] {
        meta.remove(key)?;
    }
    db.flush()?;
    Ok(())
}
