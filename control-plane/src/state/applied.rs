//! What applying a log entry did, as subscribers are told it: [`CommittedEvent`] with each
//! inserted entry shared with the state machine rather than copied. An entry used to be
//! copied on the Raft thread for its event, beside the copy the state machine keeps; the
//! wire form is now made beside the Raft thread, once per event.

use std::sync::Arc;

use hasten_proto::v1::{AppliedCommand, CacheEntry, CommittedEvent, StoredEntry, applied_command};

/// What one command did ([`AppliedCommand`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub kind: Option<AppliedKind>,
    /// Entries removed by the command, as in [`AppliedCommand::removed`].
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
    pub fn to_proto(&self) -> AppliedCommand {
        let kind = self.kind.as_ref().map(|kind| match kind {
            AppliedKind::Inserted { id, entry } => applied_command::Kind::Inserted(StoredEntry {
                id: *id,
                entry: Some(CacheEntry::clone(entry)),
            }),
            AppliedKind::Other(kind) => kind.clone(),
        });
        AppliedCommand {
            kind,
            removed: self.removed.clone(),
        }
    }
}

/// The event of one applied log entry ([`CommittedEvent`] without a state).
#[derive(Debug, Clone, PartialEq)]
pub struct EntryEvent {
    pub index: u64,
    pub applied: Vec<Applied>,
}

impl EntryEvent {
    /// An event that applied nothing: a leader's snapshot installed up to `index`.
    pub fn empty(index: u64) -> Self {
        Self {
            index,
            applied: Vec::new(),
        }
    }

    pub fn to_proto(&self) -> CommittedEvent {
        CommittedEvent {
            index: self.index,
            applied: self.applied.iter().map(Applied::to_proto).collect(),
            state: None,
        }
    }
}
