//! Segment files: the one being written, and the compacted ones kept for reuse.
//!
//! Appending to a file changes its size, so every `fdatasync` of an appended log also
//! commits the file system's journal, and on a disk shared by several members each commit
//! waits for the others'. Writing over blocks a file already holds commits no metadata:
//! `bench/fsync-probe.py` measured `fdatasync` at p50 0.35-0.50 ms into written space
//! against 0.61-0.84 ms appending (3 writers on this disk). So compacted segments are
//! reused as new ones (PostgreSQL's WAL and RocksDB's `recycle_log_file_num` do the same),
//! and unlinking them, which freed and discarded 64 MiB at a time, mostly goes too.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::{self, CONF_STATE, END, HARD_STATE, LogState};
use super::{WalError, io_error, paced, sync_directory};

/// Most compacted segments kept for reuse (512 MiB of 64 MiB segments).
const MAX_FREE_SEGMENTS: usize = 8;

/// Cuts the file at `path` after its first `len` bytes (step by step: the file may be a
/// segment long).
pub(super) fn cut_after(path: &Path, len: u64) -> Result<(), WalError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| {
            paced::shrink(&file, len)?;
            file.sync_all()
        })
        .map_err(io_error("truncating", path))
}

/// Closes segment `seq` after its first `len` bytes with a closing record, synced. What
/// follows them (a reused file's old records, or a write cut short by a crash) is never
/// read again, and the file keeps its blocks for its next reuse, where cutting it off would
/// free them (paced: 31 pauses of 5 ms for a 64 MiB file, at every start).
pub(super) fn close_after(path: &Path, seq: u64, len: u64) -> Result<(), WalError> {
    let mut end = Vec::new();
    record::encode_record(&mut end, seq, END, &[]);
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| {
            file.write_all_at(&end, len)?;
            file.sync_data()
        })
        .map_err(io_error("closing", path))
}

/// A compacted segment kept for reuse (open lists them again after a restart).
pub(super) const FREE_EXTENSION: &str = "free";
/// A compacted segment being removed (replay skips it; open deletes it).
pub(super) const REMOVING_EXTENSION: &str = "removing";

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

/// Compacted segment files ready for reuse, shared by the node's thread (which takes them)
/// and the thread a compaction is discarded on (which gives them).
#[derive(Clone, Debug, Default)]
pub(super) struct FreeSegments(Arc<parking_lot::Mutex<Vec<PathBuf>>>);

impl FreeSegments {
    pub fn push(&self, path: PathBuf) {
        self.0.lock().push(path);
    }

    fn take(&self) -> Option<PathBuf> {
        self.0.lock().pop()
    }

    fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// Keeps the compacted `segments` for reuse and deletes what would make more free files
    /// than `segments` holds (or [`MAX_FREE_SEGMENTS`]): a compaction retires the segments
    /// written since the last one, and about as many are started before the next, so the
    /// log's files never take more disk than they did before the compaction. Files are
    /// renamed out of replay's way first (one being removed when a crash comes is deleted
    /// at open, one kept for reuse is listed again), and deleted step by step
    /// ([`paced::remove`]).
    pub fn retire(&self, segments: &[PathBuf]) -> Result<(), WalError> {
        let Some(dir) = segments.first().and_then(|p| p.parent()) else {
            return Ok(());
        };
        let kept = segments
            .len()
            .min(MAX_FREE_SEGMENTS)
            .saturating_sub(self.len());
        let mut free = Vec::with_capacity(kept);
        let mut removing = Vec::with_capacity(segments.len() - kept);
        for (i, path) in segments.iter().enumerate() {
            let (to, list) = if i < kept {
                (path.with_extension(FREE_EXTENSION), &mut free)
            } else {
                (path.with_extension(REMOVING_EXTENSION), &mut removing)
            };
            std::fs::rename(path, &to).map_err(io_error("renaming", path))?;
            list.push(to);
        }
        sync_directory(dir)?;
        for path in free {
            self.push(path);
        }
        for path in removing {
            paced::remove(&path).map_err(io_error("removing", &path))?;
        }
        Ok(())
    }
}

/// The segment being appended to. Writes go at `len`, not at the file's end: a reused file
/// holds old records beyond it.
#[derive(Debug)]
pub(super) struct ActiveSegment {
    pub seq: u64,
    file: File,
    pub len: u64,
    pub last_index: u64,
}

impl ActiveSegment {
    /// Starts segment `seq`, headed by the current hard state and configuration, in a free
    /// segment file when there is one. The head is durable before the file takes the
    /// segment's name, so a crash leaves either a free file or a segment with its head.
    pub fn create(
        dir: &Path,
        seq: u64,
        state: &LogState,
        free: &FreeSegments,
    ) -> Result<Self, WalError> {
        let path = segment_path(dir, seq);
        let mut head = Vec::new();
        record::encode_message(&mut head, seq, HARD_STATE, &state.hard_state);
        record::encode_message(&mut head, seq, CONF_STATE, &state.conf_state);
        let (file, written) = match free.take() {
            Some(reused) => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&reused)
                    .map_err(io_error("opening", &reused))?;
                (file, reused)
            }
            None => {
                let file = OpenOptions::new()
                    .create_new(true)
                    .write(true)
                    .open(&path)
                    .map_err(io_error("creating", &path))?;
                (file, path.clone())
            }
        };
        file.write_all_at(&head, 0)
            .and_then(|()| file.sync_data())
            .map_err(io_error("writing", &written))?;
        if written != path {
            std::fs::rename(&written, &path).map_err(io_error("renaming", &written))?;
        }
        sync_directory(dir)?;
        Ok(Self {
            seq,
            file,
            len: head.len() as u64,
            last_index: 0,
        })
    }

    /// Goes on writing segment `seq` after its first `len` bytes, which are the whole file
    /// (the caller closes a segment with anything after its records instead: see
    /// [`close_after`]).
    pub fn reopen(
        dir: &Path,
        seq: u64,
        len: u64,
        last_index: u64,
        state: &LogState,
        free: &FreeSegments,
    ) -> Result<Self, WalError> {
        let path = segment_path(dir, seq);
        if len == 0 {
            // A crash before the segment's head was written: start it again.
            std::fs::remove_file(&path).map_err(io_error("removing", &path))?;
            return Self::create(dir, seq, state, free);
        }
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_error("opening", &path))?;
        Ok(Self {
            seq,
            file,
            len,
            last_index,
        })
    }

    pub fn path(&self, dir: &Path) -> PathBuf {
        segment_path(dir, self.seq)
    }

    /// Writes `bytes` after the segment's records, synced to disk when `durable`.
    pub fn write(&mut self, dir: &Path, bytes: &[u8], durable: bool) -> Result<(), WalError> {
        self.file
            .write_all_at(bytes, self.len)
            .and_then(|()| {
                if durable {
                    self.file.sync_data()
                } else {
                    Ok(())
                }
            })
            .map_err(io_error("writing", &self.path(dir)))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    pub fn sync(&self, dir: &Path) -> Result<(), WalError> {
        self.file
            .sync_data()
            .map_err(io_error("writing", &self.path(dir)))
    }
}
