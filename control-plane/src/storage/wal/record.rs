//! The log's records and their replay.
//!
//! A record is a header (payload length u32 LE, CRC-32 u32 LE, kind u8) and its payload. The
//! CRC covers the segment's sequence number, the kind and the payload: a reused segment
//! still holds its previous life's records after the new ones, and those, salted with
//! another number, never pass for this segment's. A segment ends either with an [`END`]
//! record (it was closed) or at the first record that does not check (the last segment,
//! where writing stopped). Segments written before the salt (format 1) check without it
//! and end where the file does.

use std::collections::VecDeque;
use std::path::Path;

use protobuf::Message;
use raft::prelude::{ConfState, Entry, HardState};

use super::WalError;

const HEADER_BYTES: usize = 9;

pub(super) const ENTRY: u8 = 1;
pub(super) const HARD_STATE: u8 = 2;
pub(super) const CONF_STATE: u8 = 3;
/// A snapshot from the leader replaced the log: replay forgets every entry before it.
pub(super) const RESET: u8 = 4;
/// The segment was closed here; what follows is not part of it.
pub(super) const END: u8 = 5;

fn checksum(salt: Option<u64>, kind: u8, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    if let Some(seq) = salt {
        crc.update(&seq.to_le_bytes());
    }
    crc.update(&[kind]);
    crc.update(payload);
    crc.finalize()
}

/// Appends a record of segment `seq` to `out`.
pub(super) fn encode_record(out: &mut Vec<u8>, seq: u64, kind: u8, payload: &[u8]) {
    // A payload over 4 GiB cannot occur: raft-rs bounds entries far below it.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&checksum(Some(seq), kind, payload).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

pub(super) fn encode_message(out: &mut Vec<u8>, seq: u64, kind: u8, message: &impl Message) {
    // Encoding into memory fails only on a message too large for protobuf (2 GiB).
    let payload = message.write_to_bytes().unwrap_or_default();
    encode_record(out, seq, kind, &payload);
}

/// How a segment's records are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// Before reuse: no salt, and the segment ends where the file does.
    Unsalted,
    Salted,
}

/// What replaying one segment found.
#[derive(Debug)]
pub(super) struct Replay {
    pub format: Format,
    /// Whether the segment ends with an [`END`] record.
    pub closed: bool,
    /// Why replay stopped before the file's end, if it did without an [`END`] record: a
    /// record cut short, one that fails its checksum, or a reused segment's old records.
    pub stopped: Option<(u64, String)>,
    /// The highest entry index in the segment.
    pub last_index: u64,
    /// Length of the segment's records, its [`END`] record included.
    pub valid_len: u64,
}

/// A record read from a segment, checked.
struct Record<'a> {
    kind: u8,
    payload: &'a [u8],
    len: usize,
}

/// The record at the start of `bytes`, or why there is none.
fn read_record(bytes: &[u8], salt: Option<u64>) -> Result<Record<'_>, &'static str> {
    let Some(header) = bytes.get(..HEADER_BYTES) else {
        return Err("a header cut short");
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let kind = header[8];
    let Some(payload) = bytes.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Err("a record cut short");
    };
    if checksum(salt, kind, payload) != crc {
        return Err("checksum mismatch");
    }
    Ok(Record {
        kind,
        payload,
        len: HEADER_BYTES + len,
    })
}

/// What the log holds, rebuilt by replay and kept current by appends.
#[derive(Debug, Default)]
pub(super) struct LogState {
    /// Entries after the snapshot point, in index order.
    pub entries: VecDeque<Entry>,
    pub hard_state: HardState,
    pub conf_state: ConfState,
}

impl LogState {
    /// Applies segment `seq`'s records.
    pub fn replay(&mut self, path: &Path, seq: u64, bytes: &[u8]) -> Result<Replay, WalError> {
        let corrupt = |offset: usize, reason: String| WalError::Corrupt {
            path: path.to_path_buf(),
            offset: offset as u64,
            reason,
        };
        // A segment starts with a record; the one that checks tells the format.
        let format = if read_record(bytes, None).is_ok() && read_record(bytes, Some(seq)).is_err() {
            Format::Unsalted
        } else {
            Format::Salted
        };
        let salt = (format == Format::Salted).then_some(seq);
        let mut offset = 0usize;
        let mut last_index = 0;
        while offset < bytes.len() {
            let record = match read_record(&bytes[offset..], salt) {
                Ok(record) => record,
                Err(reason) => {
                    return Ok(Replay {
                        format,
                        closed: false,
                        stopped: Some((offset as u64, reason.to_string())),
                        last_index,
                        valid_len: offset as u64,
                    });
                }
            };
            match record.kind {
                ENTRY => {
                    let entry = Entry::parse_from_bytes(record.payload)
                        .map_err(|err| corrupt(offset, format!("entry: {err}")))?;
                    last_index = last_index.max(entry.index);
                    self.push_entry(entry)
                        .map_err(|reason| corrupt(offset, reason))?;
                }
                HARD_STATE => {
                    self.hard_state = HardState::parse_from_bytes(record.payload)
                        .map_err(|err| corrupt(offset, format!("hard state: {err}")))?;
                }
                CONF_STATE => {
                    self.conf_state = ConfState::parse_from_bytes(record.payload)
                        .map_err(|err| corrupt(offset, format!("configuration: {err}")))?;
                }
                RESET => self.entries.clear(),
                END => {
                    return Ok(Replay {
                        format,
                        closed: true,
                        stopped: None,
                        last_index,
                        valid_len: (offset + record.len) as u64,
                    });
                }
                other => return Err(corrupt(offset, format!("unknown record kind {other}"))),
            }
            offset += record.len;
        }
        Ok(Replay {
            format,
            closed: false,
            stopped: None,
            last_index,
            valid_len: offset as u64,
        })
    }

    /// Adds an entry, replacing any it overwrites (a new leader's log winning over
    /// uncommitted entries).
    pub fn push_entry(&mut self, entry: Entry) -> Result<(), String> {
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
