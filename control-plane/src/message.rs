//! What reaches a Raft node: the requests of clients, peers and the transport, and the
//! errors a node answers with. Both the node and its transports speak these, so they live
//! apart from either.

use std::time::Duration;

use hasten_proto::v1::{ControlCommand, NodeStatus};
use raft::prelude::{Message, SnapshotMetadata};
use tokio::sync::oneshot;

use crate::state::{AdmissionError, CommandError, StateView};
use crate::storage::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid proposal")]
    Invalid(#[from] CommandError),
    #[error("proposal refused")]
    NotAdmitted(#[from] AdmissionError),
    #[error("no leader is known yet; retry shortly")]
    NoLeader,
    #[error("the proposal was dropped by Raft; retry")]
    Dropped(#[source] raft::Error),
    /// Leadership moved while the proposal waited for its commit: it may have been lost
    /// with the old leader's uncommitted log (TiKV's raftstore answers such proposals
    /// "stale command" the same way).
    #[error(
        "leadership changed before the proposal committed (now term {term}, leader {leader}); \
         retry: an entry's origin sequence makes a retry apply once"
    )]
    Stale { term: u64, leader: u64 },
    #[error("membership change refused: {0}")]
    Membership(String),
    #[error("membership change refused by Raft")]
    ConfChange(#[source] raft::Error),
    #[error("storage")]
    Store(#[from] StoreError),
    #[error("the control-plane node is shutting down")]
    ShuttingDown,
    #[error("cannot start the Raft node's thread")]
    Thread(#[source] std::io::Error),
}

/// The reply to a proposal or membership change: the log index it committed at.
pub type CommitReply = oneshot::Sender<Result<u64, NodeError>>;

/// A snapshot of the state machine written to disk beside the node.
#[derive(Debug)]
pub struct StoredSnapshot {
    /// `None` when a newer snapshot (the leader's) was stored meanwhile.
    pub meta: Option<SnapshotMetadata>,
    pub bytes: usize,
    /// From taking the state to the file being durable.
    pub took: Duration,
}

pub enum NodeRequest {
    Propose {
        commands: Vec<ControlCommand>,
        reply: CommitReply,
    },
    /// Raft messages from peers.
    Step(Vec<Message>),
    /// A peer did not take a message.
    Unreachable(u64),
    SnapshotSent {
        to: u64,
        delivered: bool,
    },
    Status(oneshot::Sender<NodeStatus>),
    /// The whole replicated state, shared between the callers of one applied index.
    State(oneshot::Sender<StateView>),
    ChangeMember {
        add: bool,
        id: u64,
        address: String,
        reply: CommitReply,
    },
    /// The node's own snapshot is on disk (or failed to be): the log before it can go.
    SnapshotStored(Result<StoredSnapshot, StoreError>),
}
