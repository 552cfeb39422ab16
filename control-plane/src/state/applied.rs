//! What applying a log entry did, and its event as subscribers receive it. An inserted
//! entry is shared with the state machine rather than copied, and the event is encoded
//! once for every subscriber, straight from it: an entry used to be copied on the Raft
//! thread for its event, beside the copy the state machine keeps, then copied and encoded
//! again for each subscriber.

use std::sync::Arc;

use bytes::{BufMut, Bytes};
use hasten_proto::EncodedEvent;
use hasten_proto::v1::{CacheEntry, applied_command};
use parking_lot::Mutex;
use prost::encoding::{self, WireType};

/// Field numbers of `CommittedEvent`, `AppliedCommand` and `StoredEntry` in
/// `proto/hasten/v1/control.proto`, for the encoding below.
const EVENT_INDEX: u32 = 1;
const EVENT_APPLIED: u32 = 2;
const EVENT_STATE: u32 = 3;
const APPLIED_INSERTED: u32 = 1;
const APPLIED_REMOVED: u32 = 4;
const STORED_ID: u32 = 1;
const STORED_ENTRY: u32 = 2;

/// What one command did (`AppliedCommand`).
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub kind: Option<AppliedKind>,
    /// Entries removed by the command, as in `AppliedCommand::removed`.
    pub removed: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AppliedKind {
    /// A new entry, the one the state machine holds.
    Inserted { id: u64, entry: Arc<CacheEntry> },
    /// Everything else (rare: configuration, corpus updates, shard maps, pools).
    Other(applied_command::Kind),
}

impl Applied {
    /// `to_proto().encoded_len()`, without the copy.
    fn encoded_len(&self) -> usize {
        let kind = match &self.kind {
            Some(AppliedKind::Inserted { id, entry }) => {
                stored_field_len(APPLIED_INSERTED, *id, entry)
            }
            Some(AppliedKind::Other(kind)) => kind.encoded_len(),
            None => 0,
        };
        kind + encoding::uint64::encoded_len_packed(APPLIED_REMOVED, &self.removed)
    }

    /// `to_proto().encode_raw(buf)`, without the copy.
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match &self.kind {
            Some(AppliedKind::Inserted { id, entry }) => {
                encode_stored_field(APPLIED_INSERTED, *id, entry, buf);
            }
            Some(AppliedKind::Other(kind)) => kind.encode(buf),
            None => {}
        }
        encoding::uint64::encode_packed(APPLIED_REMOVED, &self.removed, buf);
    }
}

/// The encoded length of a `StoredEntry { id, entry }` field numbered `tag`.
pub(super) fn stored_field_len(tag: u32, id: u64, entry: &CacheEntry) -> usize {
    let stored = stored_len(id, entry);
    encoding::key_len(tag) + encoding::encoded_len_varint(stored as u64) + stored
}

/// Encodes `StoredEntry { id, entry }` as the field numbered `tag`, as prost would encode
/// a copy of it.
pub(super) fn encode_stored_field(tag: u32, id: u64, entry: &CacheEntry, buf: &mut impl BufMut) {
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(stored_len(id, entry) as u64, buf);
    if id != 0 {
        encoding::uint64::encode(STORED_ID, &id, buf);
    }
    encoding::message::encode(STORED_ENTRY, entry, buf);
}

/// The encoded length of `StoredEntry { id, entry }`'s fields.
fn stored_len(id: u64, entry: &CacheEntry) -> usize {
    let id = if id == 0 {
        0
    } else {
        encoding::uint64::encoded_len(STORED_ID, &id)
    };
    id + encoding::message::encoded_len(STORED_ENTRY, entry)
}

/// The fields of `CommittedEvent { index, state }` before the state's own bytes (`state_len`
/// of them, appended by the caller).
pub(super) fn encode_state_event_head(index: u64, state_len: usize, buf: &mut Vec<u8>) {
    if index != 0 {
        encoding::uint64::encode(EVENT_INDEX, &index, buf);
    }
    encoding::encode_key(EVENT_STATE, WireType::LengthDelimited, buf);
    encoding::encode_varint(state_len as u64, buf);
}

/// The event of one applied log entry (`CommittedEvent` without a state). The first
/// subscriber to send it encodes it, beside the Raft thread (encoding there, as the entry is
/// applied, made the 8,000/s lag p50 1.5-2x longer on 2 cores), and the decoded form goes:
/// the events kept for subscribers then hold one compact copy.
#[derive(Debug)]
pub struct EntryEvent {
    pub index: u64,
    form: Mutex<EventForm>,
}

#[derive(Debug)]
enum EventForm {
    Applied(Vec<Applied>),
    Encoded(EncodedEvent),
}

impl EntryEvent {
    pub fn new(index: u64, applied: Vec<Applied>) -> Self {
        Self {
            index,
            form: Mutex::new(EventForm::Applied(applied)),
        }
    }

    /// An event that applied nothing: a leader's snapshot installed up to `index`.
    pub fn empty(index: u64) -> Self {
        Self::new(index, Vec::new())
    }

    /// The event as subscribers receive it, encoded on the first call only.
    pub fn encoded(&self) -> EncodedEvent {
        let mut form = self.form.lock();
        let encoded = match &*form {
            EventForm::Encoded(encoded) => return encoded.clone(),
            EventForm::Applied(applied) => encode(self.index, applied),
        };
        *form = EventForm::Encoded(encoded.clone());
        encoded
    }
}

/// The encoding of `CommittedEvent { index, applied }`, straight from the shared entries.
fn encode(index: u64, applied: &[Applied]) -> EncodedEvent {
    let lengths: Vec<usize> = applied.iter().map(Applied::encoded_len).collect();
    let mut buf = Vec::with_capacity(
        encoding::uint64::encoded_len(EVENT_INDEX, &index)
            + lengths
                .iter()
                .map(|len| {
                    encoding::key_len(EVENT_APPLIED)
                        + encoding::encoded_len_varint(*len as u64)
                        + len
                })
                .sum::<usize>(),
    );
    if index != 0 {
        encoding::uint64::encode(EVENT_INDEX, &index, &mut buf);
    }
    for (applied, len) in applied.iter().zip(lengths) {
        encoding::encode_key(EVENT_APPLIED, WireType::LengthDelimited, &mut buf);
        encoding::encode_varint(len as u64, &mut buf);
        applied.encode_raw(&mut buf);
    }
    EncodedEvent::from_encoded(Bytes::from(buf))
}

/// The wire forms as prost builds them, copying every entry: what [`EntryEvent::encoded`]
/// is checked against.
#[cfg(test)]
pub(super) mod copied {
    use hasten_proto::v1::{
        AppliedCommand, CacheEntry, CommittedEvent, StoredEntry, applied_command,
    };

    use super::{Applied, AppliedKind};

    impl Applied {
        pub fn to_proto(&self) -> AppliedCommand {
            let kind = self.kind.as_ref().map(|kind| match kind {
                AppliedKind::Inserted { id, entry } => {
                    applied_command::Kind::Inserted(StoredEntry {
                        id: *id,
                        entry: Some(CacheEntry::clone(entry)),
                    })
                }
                AppliedKind::Other(kind) => kind.clone(),
            });
            AppliedCommand {
                kind,
                removed: self.removed.clone(),
            }
        }
    }

    /// The `CommittedEvent` of the entry at `index` that applied `applied`.
    pub fn event(index: u64, applied: &[Applied]) -> CommittedEvent {
        CommittedEvent {
            index,
            applied: applied.iter().map(Applied::to_proto).collect(),
            state: None,
        }
    }
}
