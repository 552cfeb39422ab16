//! The state-machine snapshot on disk: one file, replaced atomically (written beside,
//! synced, renamed, directory synced), checksummed so that a damaged one is refused.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::prelude::SnapshotMetadata;

use super::paced;
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

/// The snapshot a [`write`] replaced, kept under another name so that the rename freed
/// nothing; [`Replaced::remove`] frees it in steps, wherever that may take its time.
#[derive(Debug)]
#[must_use = "the replaced snapshot stays on disk until removed"]
pub struct Replaced(Option<PathBuf>);

impl Replaced {
    pub fn remove(self) -> Result<(), WalError> {
        self.0.map_or(Ok(()), |path| remove_replaced(&path))
    }
}

/// Removes a replaced snapshot in steps; gone already is fine (the next [`write`] and the
/// last one's caller may both come for it).
fn remove_replaced(path: &Path) -> Result<(), WalError> {
    match paced::remove(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("removing", path)(err))
        }
        _ => Ok(()),
    }
}

/// Replaces the snapshot of the store in `dir`; durable when this returns. The data goes
/// to disk in steps ([`paced::write_synced`]).
pub fn write(dir: &Path, meta: &SnapshotMetadata, data: &[u8]) -> Result<Replaced, WalError> {
    let target = path(dir);
    let partial = dir.join("raft-snapshot.partial");
    let replaced = dir.join("raft-snapshot.replaced");
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
        .and_then(|()| paced::write_synced(&mut file, data))
        .map_err(io_error("writing", &partial))?;
    // Left by a crash before its removal, or not yet removed by the caller of the last
    // write. After a crash between the link and the rename it is a second name of the
    // snapshot in force, which `paced::remove` then only unlinks.
    remove_replaced(&replaced)?;
    // Where links are not supported the rename frees the replaced file at once.
    let keeps_replaced = std::fs::hard_link(&target, &replaced).is_ok();
    std::fs::rename(&partial, &target).map_err(io_error("renaming", &partial))?;
    sync_directory(dir)?;
    Ok(Replaced(keeps_replaced.then_some(replaced)))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(index: u64) -> SnapshotMetadata {
        SnapshotMetadata {
            index,
            term: 2,
            ..Default::default()
        }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_replaced_snapshot_leaves_only_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &meta(5), &vec![1u8; 3 << 20])
            .unwrap()
            .remove()
            .unwrap();
        let newer: Vec<u8> = (0..(5 << 20) + 9).map(|i| (i % 253) as u8).collect();
        write(dir.path(), &meta(9), &newer)
            .unwrap()
            .remove()
            .unwrap();
        let (read_meta, data) = read(dir.path()).unwrap().unwrap();
        assert_eq!(read_meta.index, 9);
        assert!(
            data == newer,
            "the snapshot read differs from the one written"
        );
        assert_eq!(files(dir.path()), ["raft-snapshot"]);
    }

    #[test]
    fn a_crash_between_the_link_and_the_rename_loses_no_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let first = vec![3u8; 5 << 20];
        write(dir.path(), &meta(5), &first)
            .unwrap()
            .remove()
            .unwrap();
        // The crash: the snapshot in force linked as the replaced one, not yet renamed over.
        std::fs::hard_link(path(dir.path()), dir.path().join("raft-snapshot.replaced")).unwrap();
        std::fs::write(dir.path().join("raft-snapshot.partial"), b"cut short").unwrap();
        assert_eq!(read(dir.path()).unwrap().unwrap().1, first);
        let replaced = write(dir.path(), &meta(9), b"second").unwrap();
        let kept = std::fs::read(dir.path().join("raft-snapshot.replaced")).unwrap();
        assert!(
            kept.ends_with(&first),
            "the snapshot that was in force was emptied on the way"
        );
        replaced.remove().unwrap();
        assert_eq!(read(dir.path()).unwrap().unwrap().1, b"second");
        assert_eq!(files(dir.path()), ["raft-snapshot"]);
    }

    #[test]
    fn a_replaced_snapshot_left_by_a_crash_goes_with_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &meta(5), b"first")
            .unwrap()
            .remove()
            .unwrap();
        std::fs::write(
            dir.path().join("raft-snapshot.replaced"),
            b"left by a crash",
        )
        .unwrap();
        let replaced = write(dir.path(), &meta(9), b"second").unwrap();
        let kept = std::fs::read(dir.path().join("raft-snapshot.replaced")).unwrap();
        assert!(
            kept.ends_with(b"first"),
            "the file kept is not the snapshot just replaced"
        );
        replaced.remove().unwrap();
        assert_eq!(read(dir.path()).unwrap().unwrap().1, b"second");
        assert_eq!(files(dir.path()), ["raft-snapshot"]);
    }
}
