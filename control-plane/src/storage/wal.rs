//! The Raft log's write-ahead log: entries, hard state and configuration appended as
//! checksummed records to segment files, made durable with one `fdatasync` per
//! [`WriteAheadLog::sync`], and kept in memory from the last snapshot on (raft-rs reads the
//! log's tail on every step; etcd's WAL and `MemoryStorage` split the work the same way).
//!
//! A segment starts with the current hard state and configuration, so that dropping older
//! segments never loses either; a compaction retires whole segments whose entries the
//! snapshot covers, instead of removing keys one by one, and their files are reused for
//! later segments ([`segment`]). On open, the segments are replayed in order; the last one
//! ends where its records stop checking (a crash mid-write, or a reused file's old records)
//! and is closed there, any other must end with its closing record, or it is corruption and
//! refused.

use std::path::{Path, PathBuf};

use raft::prelude::{ConfState, Entry, HardState};

use super::paced;
use record::{CONF_STATE, END, ENTRY, Format, HARD_STATE, LogState, RESET};
use segment::{ActiveSegment, FREE_EXTENSION, FreeSegments, REMOVING_EXTENSION, segment_path};

mod record;
mod segment;

/// Size at which the active segment is closed and a new one started.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// What can go wrong with the log's files.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the Raft log segment {path} is damaged at byte {offset} ({reason}), before its end: \
         restore the node from a backup, or recover it as docs/operations.md's \"Recovering a \
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

/// Syncs a directory, so that a file created, renamed or removed in it survives a crash.
pub(super) fn sync_directory(dir: &Path) -> Result<(), WalError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("syncing directory", dir))
}

/// A closed segment: its sequence number and the highest entry index written to it.
#[derive(Debug)]
struct Segment {
    seq: u64,
    last_index: u64,
}

/// What [`WriteAheadLog::compact`] took out of the log: segment files to retire and entries
/// to free, both left to the caller so that neither has to happen on the Raft thread.
#[derive(Debug)]
pub struct Compacted {
    pub segments: Vec<PathBuf>,
    pub entries: Vec<Entry>,
    free: FreeSegments,
}

impl Compacted {
    /// Keeps the segment files for reuse, or deletes them (beside the node: deleting a
    /// 64 MiB file took ~160 ms here).
    pub fn retire(self) -> Result<(), WalError> {
        self.free.retire(&self.segments)
    }
}

/// The Raft log of one node: durable on disk, served from memory.
#[derive(Debug)]
pub struct WriteAheadLog {
    dir: PathBuf,
    state: LogState,
    closed: Vec<Segment>,
    active: ActiveSegment,
    free: FreeSegments,
    /// Records appended since the last sync, written and synced together.
    pending: Vec<u8>,
    segment_bytes: u64,
}

impl WriteAheadLog {
    /// Opens the log in `dir` (created when absent) and replays it; entries up to
    /// `snapshot_index` are covered by the snapshot and dropped.
    pub fn open(dir: &Path, snapshot_index: u64, segment_bytes: u64) -> Result<Self, WalError> {
        std::fs::create_dir_all(dir).map_err(io_error("creating", dir))?;
        let mut seqs = Vec::new();
        let free = FreeSegments::default();
        for item in std::fs::read_dir(dir).map_err(io_error("listing", dir))? {
            let item = item.map_err(io_error("listing", dir))?;
            let path = item.path();
            let extension = path.extension().and_then(|e| e.to_str());
            if extension == Some(REMOVING_EXTENSION) {
                std::fs::remove_file(&path).map_err(io_error("removing", &path))?;
            } else if extension == Some(FREE_EXTENSION) {
                free.push(path);
            } else if let Some(seq) = item
                .file_name()
                .to_str()
                .and_then(|name| name.strip_suffix(".wal"))
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
            let replay = state.replay(&path, seq, &bytes)?;
            let is_last = Some(seq) == last;
            if let Some((offset, reason)) = &replay.stopped {
                // A closed segment ends with its closing record (or, before reuse, where
                // the file does); only the last may stop anywhere else.
                if !is_last {
                    return Err(WalError::Corrupt {
                        path,
                        offset: *offset,
                        reason: reason.clone(),
                    });
                }
                tracing::info!(
                    segment = %path.display(),
                    offset,
                    %reason,
                    "the Raft log's records end before its last segment's file does (a reused \
                     file's old records, or a write cut short by a crash); closing the segment \
                     there"
                );
            } else if !is_last && replay.format == Format::Salted && !replay.closed {
                return Err(WalError::Corrupt {
                    path,
                    offset: replay.valid_len,
                    reason: "the segment ends without its closing record".to_string(),
                });
            }
            if is_last && !replay.closed {
                match replay.format {
                    // Written on only when nothing follows its records: a record of an
                    // unsynced write could, and would then be read after the new ones.
                    Format::Salted if replay.stopped.is_none() || replay.valid_len == 0 => {
                        active = Some(ActiveSegment::reopen(
                            dir,
                            seq,
                            replay.valid_len,
                            replay.last_index,
                            &state,
                            &free,
                        )?);
                        continue;
                    }
                    Format::Salted => segment::close_after(&path, seq, replay.valid_len)?,
                    // Older segments have no closing record: one is cut where it stops.
                    Format::Unsalted => segment::cut_after(&path, replay.valid_len)?,
                }
            }
            closed.push(Segment {
                seq,
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
            None => {
                let seq = closed.last().map_or(1, |s| s.seq + 1);
                ActiveSegment::create(dir, seq, &state, &free)?
            }
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            state,
            closed,
            active,
            free,
            pending: Vec::new(),
            segment_bytes,
        })
    }

    /// Appends entries (in memory at once, on disk at the next [`Self::sync`]), replacing any
    /// existing suffix from the first new index.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), WalError> {
        for entry in entries {
            record::encode_message(&mut self.pending, self.active.seq, ENTRY, entry);
            self.active.last_index = self.active.last_index.max(entry.index);
            self.state
                .push_entry(entry.clone())
                .map_err(|reason| WalError::Corrupt {
                    path: self.active.path(&self.dir),
                    offset: self.active.len,
                    reason: format!("appending: {reason}"),
                })?;
        }
        Ok(())
    }

    pub fn set_hard_state(&mut self, state: &HardState) {
        if *state != self.state.hard_state {
            record::encode_message(&mut self.pending, self.active.seq, HARD_STATE, state);
            self.state.hard_state = state.clone();
        }
    }

    pub fn set_conf_state(&mut self, state: &ConfState) {
        record::encode_message(&mut self.pending, self.active.seq, CONF_STATE, state);
        self.state.conf_state = state.clone();
    }

    /// Forgets every entry: a snapshot from the leader replaces the log.
    pub fn reset(&mut self) {
        record::encode_record(&mut self.pending, self.active.seq, RESET, &[]);
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
        let full = self.active.len + self.pending.len() as u64 >= self.segment_bytes;
        if full {
            record::encode_record(&mut self.pending, self.active.seq, END, &[]);
        }
        self.active.write(&self.dir, &self.pending, durable)?;
        self.pending.clear();
        if full {
            if !durable {
                self.active.sync(&self.dir)?;
            }
            self.closed.push(Segment {
                seq: self.active.seq,
                last_index: self.active.last_index,
            });
            self.active =
                ActiveSegment::create(&self.dir, self.active.seq + 1, &self.state, &self.free)?;
        }
        Ok(())
    }

    /// Drops the entries up to `index` (a durable snapshot covers them) and returns the
    /// oldest closed segments that hold nothing after it, for [`Compacted::retire`] beside
    /// the node; a segment left by a crash before it is retired only replays entries the
    /// snapshot covers.
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
        Compacted {
            segments,
            entries,
            free: self.free.clone(),
        }
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
