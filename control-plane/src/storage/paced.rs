//! Large file writes and removals done in small steps, so that the Raft log's `fdatasync`
//! never waits behind megabytes of other I/O. The members' logs and snapshots share a disk
//! (on ext4, one journal): a snapshot's single 8 MB `fsync` held every node's log sync for
//! its whole 15-20 ms, and unlinking a 64 MiB segment (its blocks freed, and discarded where
//! the disk is mounted with `discard`) held them at 20-55 ms for 130 ms (`perf trace`,
//! docs/benchmarks/control-plane.md). RocksDB paces its files for the same reason (`bytes_per_sync`, and
//! deletion by truncation in chunks).

use std::fs::File;
use std::io::{self, Seek as _, Write as _};
use std::path::Path;
use std::time::Duration;

/// Bytes written before their write-back is started (and the previous step's awaited).
const WRITE_STEP: usize = 1024 * 1024;
/// Bytes a removal frees at a time, and the pause after each step, in which the log's
/// next sync commits the freeing on its own.
const REMOVE_STEP: u64 = 2 * 1024 * 1024;
const REMOVE_PAUSE: Duration = Duration::from_millis(5);

/// Appends `data` to `file` and makes the file durable (`fsync`), starting the write-back
/// of each step as it is written and waiting for the one before it: at most two steps are
/// ever in flight, and the final `fsync` has only the metadata left to commit.
pub fn write_synced(file: &mut File, data: &[u8]) -> io::Result<()> {
    let mut offset = file.stream_position()?;
    let mut previous: Option<(u64, u64)> = None;
    for step in data.chunks(WRITE_STEP) {
        file.write_all(step)?;
        let len = step.len() as u64;
        start_write_back(file, offset, len)?;
        if let Some((at, len)) = previous {
            await_write_back(file, at, len)?;
        }
        previous = Some((offset, len));
        offset += len;
    }
    file.sync_all()
}

/// Removes the file at `path` by truncating it a step at a time before unlinking it.
/// Whatever reads the directory must not mind a half-truncated file there after a crash:
/// callers first rename the file out of its readers' way. A file that has other names
/// (hard links) is only unlinked: truncating it would empty them too.
pub fn remove(path: &Path) -> io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    if !has_other_names(&file.metadata()?) {
        shrink(&file, 0)?;
    }
    drop(file);
    std::fs::remove_file(path)
}

/// Truncates `file` to `len` a step at a time (nothing happens to a file no longer than
/// that).
pub fn shrink(file: &File, len: u64) -> io::Result<()> {
    let mut at = file.metadata()?.len();
    if at <= len {
        return Ok(());
    }
    while at > len + REMOVE_STEP {
        at -= REMOVE_STEP;
        file.set_len(at)?;
        std::thread::sleep(REMOVE_PAUSE);
    }
    file.set_len(len)
}

#[cfg(unix)]
fn has_other_names(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    metadata.nlink() > 1
}

/// Without link counts, nothing is truncated.
#[cfg(not(unix))]
fn has_other_names(_metadata: &std::fs::Metadata) -> bool {
    true
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn sync_file_range(file: &File, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Ok(());
    };
    // SAFETY: sync_file_range takes no pointers; the descriptor is open for `file`'s life.
    if unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn start_write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE)
}

#[cfg(target_os = "linux")]
fn await_write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(
        file,
        offset,
        len,
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    )
}

/// Elsewhere the final `fsync` does all the work.
#[cfg(not(target_os = "linux"))]
fn start_write_back(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn await_write_back(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_write_appends_every_byte_after_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let mut file = File::create(&path).unwrap();
        file.write_all(b"head").unwrap();
        let data: Vec<u8> = (0..3 * WRITE_STEP + 17).map(|i| (i % 251) as u8).collect();
        write_synced(&mut file, &data).unwrap();
        let read = std::fs::read(&path).unwrap();
        assert_eq!(&read[..4], b"head");
        assert!(
            read[4..] == data[..],
            "the file differs from what was written"
        );
    }

    #[test]
    fn a_paced_removal_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, vec![7u8; (2 * REMOVE_STEP + 5) as usize]).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
        assert!(remove(&path).is_err(), "a missing file is an error");
    }

    #[test]
    fn a_shrunk_file_keeps_its_head_and_loses_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let data: Vec<u8> = (0..3 * REMOVE_STEP + 11).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let keep = REMOVE_STEP as usize / 2 + 3;
        shrink(&file, keep as u64).unwrap();
        shrink(&file, keep as u64 + 100).unwrap();
        assert!(std::fs::read(&path).unwrap() == data[..keep]);
    }

    #[test]
    fn a_file_with_another_name_is_unlinked_not_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept");
        let other = dir.path().join("other");
        let data = vec![9u8; (3 * REMOVE_STEP) as usize];
        std::fs::write(&kept, &data).unwrap();
        std::fs::hard_link(&kept, &other).unwrap();
        remove(&other).unwrap();
        assert!(!other.exists());
        assert!(
            std::fs::read(&kept).unwrap() == data,
            "removing one name emptied the other"
        );
    }
}
