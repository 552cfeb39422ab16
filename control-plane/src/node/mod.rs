//! The Raft node: one loop on its own thread owns the `RawNode`, the storage and the state
//! machine.
//!
//! The loop blocks by design (the log's fdatasync, snapshot encoding, applying large
//! batches), so it runs on a dedicated thread with its own single-threaded runtime, as Qdrant
//! runs its consensus, and never holds up the tokio workers that serve clients and peers. Clients,
//! peers and the ticker reach it only through a bounded channel of [`NodeRequest`]s
//! (backpressure, no shared mutable state). Each turn the loop takes one request, then
//! whatever else is already queued (so concurrent proposals are appended and replicated
//! together), and handles Raft's `Ready`: persist entries and hard state, fdatasync, then send,
//! then apply what committed and answer the proposers. A proposal still waiting when
//! leadership moves is answered at once with [`NodeError::Stale`].

use display_full_error::DisplayFullErrorExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hasten_proto::v1::{ControlCommand, ControlState, NodeStatus};
use prost::Message as _;
use raft::RawNode;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use driver::{NodeFeeds, RaftNode};

pub use crate::message::{CommitReply, NodeError, NodeRequest};
use crate::metrics::NodeMetrics;
use crate::state::{CacheStateMachine, EntryEvent, StateView, validate};
use crate::storage::{RaftStorage, StoreError};
use crate::transport::Transport;

/// Requests queued for the node before senders wait: enough for a burst of proposals
/// from many edges while a `Ready` is being persisted, small enough that a stalled node
/// pushes back on its callers instead of buffering without bound.
pub const NODE_QUEUE: usize = 1024;

/// Committed events kept for live subscribers that fall behind; beyond it they re-read
/// the node's kept events. An event can carry a whole proposal batch (megabytes), so the
/// buffer is short.
const EVENT_BUFFER: usize = 64;

/// Tunables of a node.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub id: u64,
    pub tick: Duration,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Log entries kept before the state machine is snapshotted and the log truncated.
    pub max_log_entries: u64,
    /// Payload bytes of applied log entries kept before the same: an entry batches up to
    /// hundreds of cache entries, so a count alone does not bound the disk.
    pub max_log_bytes: u64,
    /// Committed events kept behind a compaction point for resuming subscribers.
    pub retained_events: u64,
}

/// Handle to a running node.
#[derive(Clone)]
pub struct NodeHandle {
    requests: mpsc::Sender<NodeRequest>,
    events: broadcast::Sender<Arc<EntryEvent>>,
    /// The leader's address while another node leads, else empty.
    leader_elsewhere: watch::Receiver<String>,
    storage: RaftStorage,
    metrics: NodeMetrics,
    /// Turns true when the node's loop has ended, for whatever reason.
    stopped: watch::Receiver<bool>,
}

impl NodeHandle {
    pub fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    pub async fn request(&self, request: NodeRequest) -> Result<(), NodeError> {
        self.requests
            .send(request)
            .await
            .map_err(|_| NodeError::ShuttingDown)
    }

    pub async fn propose(&self, commands: Vec<ControlCommand>) -> Result<u64, NodeError> {
        validate(&commands)?;
        let (reply, answer) = oneshot::channel();
        self.request(NodeRequest::Propose { commands, reply })
            .await?;
        answer.await.map_err(|_| NodeError::ShuttingDown)?
    }

    pub async fn status(&self) -> Result<NodeStatus, NodeError> {
        let (reply, answer) = oneshot::channel();
        self.request(NodeRequest::Status(reply)).await?;
        answer.await.map_err(|_| NodeError::ShuttingDown)
    }

    /// The whole replicated state as of the node's applied index, its entries shared with
    /// the node until [`StateView::into_state`] copies them.
    pub async fn state(&self) -> Result<StateView, NodeError> {
        let (reply, answer) = oneshot::channel();
        self.request(NodeRequest::State(reply)).await?;
        answer.await.map_err(|_| NodeError::ShuttingDown)
    }

    pub async fn change_member(
        &self,
        add: bool,
        id: u64,
        address: String,
    ) -> Result<u64, NodeError> {
        let (reply, answer) = oneshot::channel();
        self.request(NodeRequest::ChangeMember {
            add,
            id,
            address,
            reply,
        })
        .await?;
        answer.await.map_err(|_| NodeError::ShuttingDown)?
    }

    /// The leader's address while another node leads (empty when this node leads or no
    /// leader is known): where a proposer saves the forwarding hop.
    pub fn leader_elsewhere(&self) -> String {
        self.leader_elsewhere.borrow().clone()
    }

    pub fn subscribe_events(&self) -> broadcast::Receiver<Arc<EntryEvent>> {
        self.events.subscribe()
    }

    pub fn storage(&self) -> &RaftStorage {
        &self.storage
    }

    pub fn requests(&self) -> mpsc::Sender<NodeRequest> {
        self.requests.clone()
    }

    /// Resolves once the node's loop has ended (a storage failure, or a panic in Raft): the
    /// process must not go on answering as if it were a member.
    pub async fn stopped(&self) {
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|done| *done).await;
    }
}

/// Marks the node stopped when dropped: at the end of its loop, or while a panic unwinds
/// its thread.
struct StopSignal(watch::Sender<bool>);

impl Drop for StopSignal {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

/// Logs why the Raft loop died, and how to recover when the cause is known: raft-rs stops a
/// node whose log is behind what the group already committed (`to_commit ... is out of
/// range`), which is what a lost or rolled-back data directory looks like.
fn report_panic(id: u64, panic: &(dyn std::any::Any + Send)) {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    if message.contains("out of range") {
        tracing::error!(
            node = id,
            %message,
            "this node's log is behind what the group committed: its data directory was lost or \
             restored from an older copy. It cannot rejoin as it is: remove it from the group \
             (RemoveNode on the leader), empty its data directory, start it with `join = true` and \
             add it back (AddNode); see docs/operations.md, \"Recovering a control-plane node\""
        );
    } else {
        tracing::error!(node = id, %message, "the Raft node failed");
    }
}

/// Opens the node's storage, restores its state machine and starts its loop on a thread of
/// its own. `transport` makes the node's way to its peers from the members it knows and the
/// node's request queue (where deliveries report failures).
///
/// `initial_members` bootstraps a new cluster (every founding node lists the same set);
/// a node joining an existing cluster passes none and waits for the leader to add it.
/// Called from within the process's tokio runtime.
pub fn start<T: Transport>(
    settings: NodeSettings,
    storage: RaftStorage,
    initial_members: &BTreeMap<u64, String>,
    join: bool,
    metrics: NodeMetrics,
    transport: impl FnOnce(BTreeMap<u64, String>, mpsc::Sender<NodeRequest>) -> T,
) -> Result<NodeHandle, NodeError> {
    if storage.is_empty() && !join {
        let conf = raft::prelude::ConfState {
            voters: initial_members.keys().copied().collect(),
            ..Default::default()
        };
        storage.set_conf_state(&conf);
        for (id, address) in initial_members {
            storage.set_member(*id, address)?;
        }
        storage.flush_all()?;
    }
    // Addresses from the configuration win over those recorded by past membership changes:
    // a redeployed node may have moved.
    let mut members = storage.members()?;
    members.extend(initial_members.iter().map(|(id, a)| (*id, a.clone())));
    let state = match storage.stored_snapshot()? {
        Some((_, data)) if !data.is_empty() => {
            let decoded =
                ControlState::decode(data.as_slice()).map_err(|err| StoreError::Corrupt {
                    tree: "raft_meta",
                    key: "raft-snapshot".into(),
                    reason: err.to_string_full(),
                })?;
            CacheStateMachine::from_state(decoded)
        }
        _ => CacheStateMachine::default(),
    };
    let config = raft::Config {
        id: settings.id,
        election_tick: settings.election_ticks,
        heartbeat_tick: settings.heartbeat_ticks,
        applied: state.applied_index(),
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 256,
        check_quorum: true,
        pre_vote: true,
        ..raft::Config::default()
    };
    config.validate().map_err(NodeError::ConfChange)?;
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let raw = RawNode::new(&config, storage.clone(), &logger).map_err(NodeError::ConfChange)?;
    let (requests, queue) = mpsc::channel(NODE_QUEUE);
    let (events, _) = broadcast::channel(EVENT_BUFFER);
    let (leader, leader_elsewhere) = watch::channel(String::new());
    let (stop_signal, stopped) = watch::channel(false);
    let peers = transport(members, requests.clone());
    let id = settings.id;
    let node = RaftNode::new(
        settings,
        raw,
        state,
        peers,
        NodeFeeds {
            events: events.clone(),
            leader,
        },
        metrics.clone(),
        requests.downgrade(),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(NodeError::Thread)?;
    std::thread::Builder::new()
        .name(format!("raft-node-{id}"))
        .spawn(move || {
            let _stopped = StopSignal(stop_signal);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.block_on(node.run(queue));
            }));
            if let Err(panic) = ran {
                report_panic(id, panic.as_ref());
            }
        })
        .map_err(NodeError::Thread)?;
    Ok(NodeHandle {
        requests,
        events,
        leader_elsewhere,
        storage,
        metrics,
        stopped,
    })
}

mod beside;
mod driver;
#[cfg(test)]
mod tests;
