//! Raft messages between control-plane nodes over tonic gRPC.
//!
//! Each peer has its own sender task and bounded outbox, so a slow or dead peer delays
//! nobody else. A full outbox drops rather than blocks the node; a failed delivery is
//! reported to Raft as an unreachable peer. The sender tasks run on the process's main
//! runtime, never on the node's own thread.

use std::collections::{BTreeMap, HashMap};

use hasten_proto::control;
use hasten_proto::control::ControlAccess;
use hasten_proto::v1::raft_peer_client::RaftPeerClient;
use hasten_proto::v1::raft_peer_server::RaftPeer;
use hasten_proto::v1::{RaftDelivered, RaftMessages};
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::Transport;
use crate::message::NodeRequest;

/// Messages queued per peer: a few rounds of heartbeats and appends; a peer that cannot
/// take them is behind or gone, and Raft resends what it missed.
const PEER_OUTBOX: usize = 1024;

/// Messages sent to a peer in one RPC.
const MESSAGES_PER_DELIVERY: usize = 64;

struct Peer {
    address: String,
    outbox: Option<mpsc::Sender<Message>>,
}

/// Outbound Raft traffic of one node over gRPC.
pub struct GrpcTransport {
    me: u64,
    peers: HashMap<u64, Peer>,
    node: mpsc::Sender<NodeRequest>,
    access: ControlAccess,
    /// Where the sender tasks run.
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
}

impl Transport for GrpcTransport {
    fn address(&self, id: u64) -> Option<String> {
        self.peers.get(&id).map(|p| p.address.clone())
    }

    fn add(&mut self, id: u64, address: String) {
        if self.peers.get(&id).is_some_and(|p| p.address == address) {
            return;
        }
        let outbox = (id != self.me).then(|| {
            let (outbox, queue) = mpsc::channel(PEER_OUTBOX);
            self.runtime.spawn(deliver(
                id,
                address.clone(),
                self.access.clone(),
                queue,
                self.node.clone(),
            ));
            outbox
        });
        self.peers.insert(id, Peer { address, outbox });
    }

    fn remove(&mut self, id: u64) {
        self.peers.remove(&id);
    }

    fn send(&self, messages: Vec<Message>) {
        for message in messages {
            let to = message.to;
            let Some(outbox) = self.peers.get(&to).and_then(|p| p.outbox.as_ref()) else {
                tracing::debug!(to, "raft message for an unknown peer dropped");
                continue;
            };
            let snapshot = message.get_msg_type() == MessageType::MsgSnapshot;
            if outbox.try_send(message).is_err() {
                let report = if snapshot {
                    NodeRequest::SnapshotSent {
                        to,
                        delivered: false,
                    }
                } else {
                    NodeRequest::Unreachable(to)
                };
                let _ = self.node.try_send(report);
            }
        }
    }
}

async fn deliver(
    to: u64,
    address: String,
    access: ControlAccess,
    mut queue: mpsc::Receiver<Message>,
    node: mpsc::Sender<NodeRequest>,
) {
    let endpoint = match control::endpoint(&address, access.tls.as_ref()) {
        Ok(endpoint) => endpoint,
        Err(err) => {
            tracing::error!(to, %address, %err, "invalid peer address; messages to it are dropped");
            return;
        }
    };
    let mut client = RaftPeerClient::with_interceptor(endpoint.connect_lazy(), access.bearer())
        .max_decoding_message_size(control::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(control::MAX_MESSAGE_BYTES);
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < MESSAGES_PER_DELIVERY {
            match queue.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        let snapshot = batch
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        let messages: Vec<Vec<u8>> = batch
            .iter()
            .filter_map(|m| m.write_to_bytes().ok())
            .collect();
        let delivered = client.deliver(RaftMessages { messages }).await;
        if let Err(status) = &delivered {
            tracing::debug!(to, %address, %status, "raft delivery failed");
            let _ = node.send(NodeRequest::Unreachable(to)).await;
        }
        if snapshot {
            let _ = node
                .send(NodeRequest::SnapshotSent {
                    to,
                    delivered: delivered.is_ok(),
                })
                .await;
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

#[tonic::async_trait]
impl RaftPeer for RaftPeerService {
    async fn deliver(
        &self,
        request: Request<RaftMessages>,
    ) -> Result<Response<RaftDelivered>, Status> {
        let messages = request
            .into_inner()
            .messages
            .iter()
            .map(|bytes| Message::parse_from_bytes(bytes))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| Status::invalid_argument(format!("undecodable raft message: {err}")))?;
        self.node
            .send(NodeRequest::Step(messages))
            .await
            .map_err(|_| Status::unavailable("the control-plane node is shutting down"))?;
        Ok(Response::new(RaftDelivered {}))
    }
}
