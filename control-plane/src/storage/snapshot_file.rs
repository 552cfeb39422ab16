//! The state-machine snapshot on disk: one file, replaced atomically (written beside,
//! synced, renamed, directory synced), checksummed so that a damaged one is refused.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::prelude::SnapshotMetadata;

use super::wal::{WalError, io_error, sync_directory};

const MAGIC: &[u8; 8] = b"HSNAP001";
/// Magic, CRC-32 of what follows it (u32 LE), metadata length (u32 LE).
const HEADER_BYTES: usize = 16;

/// The snapshot file of the store in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("raft-snapshot")
}

fn corrupt(path: &Path, reason: impl Into<String>) -> WalError {
    WalError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        reason: reason.into(),
    }
}

/// Replaces the snapshot of the store in `dir`; durable when this returns.
pub fn write(dir: &Path, meta: &SnapshotMetadata, data: &[u8]) -> Result<(), WalError> {
    let target = path(dir);
    let partial = dir.join("raft-snapshot.partial");
    let meta = meta
        .write_to_bytes()
        .map_err(|err| corrupt(&target, format!("encoding its metadata: {err}")))?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&(meta.len() as u32).to_le_bytes());
    crc.update(&meta);
    crc.update(data);
    let mut file = File::create(&partial).map_err(io_error("creating", &partial))?;
    file.write_all(MAGIC)
        .and_then(|()| file.write_all(&crc.finalize().to_le_bytes()))
        .and_then(|()| file.write_all(&(meta.len() as u32).to_le_bytes()))
        .and_then(|()| file.write_all(&meta))
        .and_then(|()| file.write_all(data))
        .and_then(|()| file.sync_all())
        .map_err(io_error("writing", &partial))?;
    std::fs::rename(&partial, &target).map_err(io_error("renaming", &partial))?;
    sync_directory(dir)
}

/// The snapshot of the store in `dir`, if it has one.
pub fn read(dir: &Path) -> Result<Option<(SnapshotMetadata, Vec<u8>)>, WalError> {
    let path = path(dir);
    let mut bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error("reading", &path)(source)),
    };
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err(corrupt(&path, "not a snapshot file (bad header)"));
    }
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if crc32fast::hash(&bytes[12..]) != crc {
        return Err(corrupt(&path, "checksum mismatch"));
    }
    let meta_len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    let Some(meta) = bytes.get(HEADER_BYTES..HEADER_BYTES + meta_len) else {
        return Err(corrupt(&path, "metadata cut short"));
    };
    let meta = SnapshotMetadata::parse_from_bytes(meta)
        .map_err(|err| corrupt(&path, format!("metadata: {err}")))?;
    let data = bytes.split_off(HEADER_BYTES + meta_len);
    Ok(Some((meta, data)))
}
