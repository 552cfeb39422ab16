//! Raft messages between control-plane nodes over tonic gRPC.
//!
//! Each peer has its own bounded outbox, drained by one long-lived client stream
//! (`RaftPeer/Stream`): batches go out as soon as they are queued, in order, with no
//! answer to wait for, where one call per batch kept the next batch waiting for the last
//! one's round trip. Snapshots, whose delivery Raft must be told of, go one call each
//! (`RaftPeer/Deliver`), as does everything to a peer that does not know `Stream` (an older
//! version during a rolling upgrade). A full outbox drops rather than blocks the node; a
//! failed stream or delivery is reported to Raft as an unreachable peer, and Raft resends
//! what was lost. The peer tasks run on the process's main runtime, never on the node's
//! own thread.

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use hasten_proto::auth::BearerToken;
use hasten_proto::control;
use hasten_proto::control::ControlAccess;
use hasten_proto::v1::raft_peer_client::RaftPeerClient;
use hasten_proto::v1::raft_peer_server::RaftPeer;
use hasten_proto::v1::{RaftDelivered, RaftMessages};
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::Transport;
use crate::message::NodeRequest;

/// Messages queued per peer: a few rounds of heartbeats and appends; a peer that cannot
/// take them is behind or gone, and Raft resends what it missed.
const PEER_OUTBOX: usize = 1024;

/// Messages sent to a peer in one batch.
const MESSAGES_PER_DELIVERY: usize = 64;

/// Wait before opening a failed peer's stream again, doubled per failure up to
/// [`MAX_REOPEN_WAIT`]; a stream that lasted [`STABLE_STREAM`] starts the count over.
/// Messages wait in the outbox meanwhile, so the longest wait stays under a heartbeat
/// interval (300 ms by default): a peer that restarts is fed again within it.
const FIRST_REOPEN_WAIT: Duration = Duration::from_millis(10);
const MAX_REOPEN_WAIT: Duration = Duration::from_millis(200);
const STABLE_STREAM: Duration = Duration::from_secs(1);

type PeerClient = RaftPeerClient<InterceptedService<Channel, BearerToken>>;

struct Peer {
    address: String,
    /// None for this node itself.
    link: Option<PeerLink>,
}

struct PeerLink {
    outbox: mpsc::Sender<Message>,
    /// For snapshots, one call each.
    client: PeerClient,
}

/// Outbound Raft traffic of one node over gRPC.
pub struct GrpcTransport {
    me: u64,
    peers: HashMap<u64, Peer>,
    node: mpsc::Sender<NodeRequest>,
    access: ControlAccess,
    /// Where the peer tasks run.
    runtime: Handle,
}

impl GrpcTransport {
    /// Reaches `members` with `access` (mutual TLS, the shared token), from tasks on
    /// `runtime`; delivery failures are reported to `node`.
    pub fn new(
        me: u64,
        members: BTreeMap<u64, String>,
        node: mpsc::Sender<NodeRequest>,
        access: ControlAccess,
        runtime: Handle,
    ) -> Self {
        let mut network = Self {
            me,
            peers: HashMap::new(),
            node,
            access,
            runtime,
        };
        for (id, address) in members {
            network.add(id, address);
        }
        network
    }

    fn link(&self, to: u64, address: &str) -> Option<PeerLink> {
        let endpoint = match control::endpoint(address, self.access.tls.as_ref()) {
            Ok(endpoint) => endpoint,
            Err(err) => {
                tracing::error!(to, %address, error = %err.display_full(), "invalid peer address; messages to it are dropped");
                return None;
            }
        };
        // The channel connects on first use; a runtime context is needed to create it.
        let _entered = self.runtime.enter();
        let client =
            RaftPeerClient::with_interceptor(endpoint.connect_lazy(), self.access.bearer())
                .max_decoding_message_size(control::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(control::MAX_MESSAGE_BYTES);
        let (outbox, queue) = mpsc::channel(PEER_OUTBOX);
        self.runtime.spawn(stream_to(
            to,
            address.to_string(),
            client.clone(),
            queue,
            self.node.clone(),
        ));
        Some(PeerLink { outbox, client })
    }
}

impl Transport for GrpcTransport {
    fn address(&self, id: u64) -> Option<String> {
        self.peers.get(&id).map(|p| p.address.clone())
    }

    fn add(&mut self, id: u64, address: String) {
        if self.peers.get(&id).is_some_and(|p| p.address == address) {
            return;
        }
        let link = if id == self.me {
            None
        } else {
            self.link(id, &address)
        };
        self.peers.insert(id, Peer { address, link });
    }

    fn remove(&mut self, id: u64) {
        self.peers.remove(&id);
    }

    fn send(&self, messages: Vec<Message>) {
        for message in messages {
            let to = message.to;
            let Some(link) = self.peers.get(&to).and_then(|p| p.link.as_ref()) else {
                tracing::debug!(to, "raft message for an unknown peer dropped");
                continue;
            };
            if message.get_msg_type() == MessageType::MsgSnapshot {
                self.runtime.spawn(deliver_snapshot(
                    to,
                    link.client.clone(),
                    message,
                    self.node.clone(),
                ));
            } else if link.outbox.try_send(message).is_err() {
                let _ = self.node.try_send(NodeRequest::Unreachable(to));
            }
        }
    }
}

/// Sends a snapshot in a call of its own and tells Raft whether it arrived.
async fn deliver_snapshot(
    to: u64,
    mut client: PeerClient,
    message: Message,
    node: mpsc::Sender<NodeRequest>,
) {
    let delivered = match message.write_to_bytes() {
        Ok(bytes) => client
            .deliver(RaftMessages {
                messages: vec![bytes],
            })
            .await
            .map_err(|status| status.to_string()),
        Err(err) => Err(err.to_string_full()),
    };
    if let Err(err) = &delivered {
        tracing::warn!(to, error = %err, "snapshot delivery failed; Raft sends another");
    }
    let _ = node
        .send(NodeRequest::SnapshotSent {
            to,
            delivered: delivered.is_ok(),
        })
        .await;
}

/// The outbox of one peer as a stream of batches: whatever is queued when the stream is
/// polled, up to [`MESSAGES_PER_DELIVERY`]. Shared by the calls made one after the other
/// (a failed stream is opened again on the same queue); `closed` turns true once the node
/// dropped the outbox.
struct Outbox {
    queue: Arc<Mutex<mpsc::Receiver<Message>>>,
    closed: Arc<AtomicBool>,
}

impl Stream for Outbox {
    type Item = RaftMessages;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RaftMessages>> {
        let mut queue = self.queue.lock();
        // The node dropped this peer (removed, or moved to another address): what is still
        // queued was meant for a member that no longer is. A removed node that comes back
        // empty on the same address must not get the heartbeats queued while it was down,
        // whose commit index its empty log cannot hold (raft-rs stops it).
        if queue.is_closed() {
            self.closed.store(true, Ordering::Release);
            return Poll::Ready(None);
        }
        let mut messages = Vec::new();
        while messages.len() < MESSAGES_PER_DELIVERY {
            match queue.poll_recv(cx) {
                Poll::Ready(Some(message)) => match message.write_to_bytes() {
                    Ok(bytes) => messages.push(bytes),
                    Err(err) => {
                        tracing::error!(error = %err.display_full(), "unencodable raft message dropped")
                    }
                },
                Poll::Ready(None) => {
                    self.closed.store(true, Ordering::Release);
                    break;
                }
                Poll::Pending => break,
            }
        }
        if !messages.is_empty() {
            Poll::Ready(Some(RaftMessages { messages }))
        } else if self.closed.load(Ordering::Acquire) {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

/// Keeps one stream open to peer `to` and feeds it from `queue`, until the node drops the
/// outbox; a failed stream is reported to Raft and opened again after a pause.
async fn stream_to(
    to: u64,
    address: String,
    mut client: PeerClient,
    queue: mpsc::Receiver<Message>,
    node: mpsc::Sender<NodeRequest>,
) {
    let queue = Arc::new(Mutex::new(queue));
    let closed = Arc::new(AtomicBool::new(false));
    let mut wait = FIRST_REOPEN_WAIT;
    while !closed.load(Ordering::Acquire) && !queue.lock().is_closed() {
        let opened = Instant::now();
        let outbox = Outbox {
            queue: Arc::clone(&queue),
            closed: Arc::clone(&closed),
        };
        match client.stream(outbox).await {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(to, %address, "peer has no message stream (an older version); one call per batch");
                return deliver_each(to, address, client, queue, node).await;
            }
            Err(status) => {
                tracing::debug!(to, %address, %status, "raft stream to peer failed");
                let _ = node.send(NodeRequest::Unreachable(to)).await;
                if opened.elapsed() >= STABLE_STREAM {
                    wait = FIRST_REOPEN_WAIT;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_REOPEN_WAIT);
            }
        }
    }
}

/// One call per batch, each answered before the next: for peers without `Stream`.
async fn deliver_each(
    to: u64,
    address: String,
    mut client: PeerClient,
    queue: Arc<Mutex<mpsc::Receiver<Message>>>,
    node: mpsc::Sender<NodeRequest>,
) {
    let closed = Arc::new(AtomicBool::new(false));
    let mut outbox = Outbox { queue, closed };
    while let Some(batch) = futures::StreamExt::next(&mut outbox).await {
        if let Err(status) = client.deliver(batch).await {
            tracing::debug!(to, %address, %status, "raft delivery failed");
            let _ = node.send(NodeRequest::Unreachable(to)).await;
        }
    }
}

/// The receiving side: decodes peers' messages and steps the node with them.
pub struct RaftPeerService {
    node: mpsc::Sender<NodeRequest>,
}

impl RaftPeerService {
    pub fn new(node: mpsc::Sender<NodeRequest>) -> Self {
        Self { node }
    }
}

/// Decodes a batch of peers' messages.
fn decode(batch: &RaftMessages) -> Result<Vec<Message>, Status> {
    batch
        .messages
        .iter()
        .map(|bytes| Message::parse_from_bytes(bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| {
            Status::invalid_argument(format!("undecodable raft message: {}", err.display_full()))
        })
}

impl RaftPeerService {
    async fn step(&self, messages: Vec<Message>) -> Result<(), Status> {
        self.node
            .send(NodeRequest::Step(messages))
            .await
            .map_err(|_| Status::unavailable("the control-plane node is shutting down"))
    }
}

#[tonic::async_trait]
impl RaftPeer for RaftPeerService {
    async fn deliver(
        &self,
        request: Request<RaftMessages>,
    ) -> Result<Response<RaftDelivered>, Status> {
        self.step(decode(request.get_ref())?).await?;
        Ok(Response::new(RaftDelivered {}))
    }

    async fn stream(
        &self,
        request: Request<Streaming<RaftMessages>>,
    ) -> Result<Response<RaftDelivered>, Status> {
        let mut batches = request.into_inner();
        while let Some(batch) = batches.message().await? {
            self.step(decode(&batch)?).await?;
        }
        Ok(Response::new(RaftDelivered {}))
    }
}

#[cfg(test)]
mod tests;
