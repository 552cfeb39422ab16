//! The control plane's client API (gRPC): proposals, the committed stream, snapshots,
//! status and membership.

use display_full_error::DisplayFullErrorExt;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use hasten_proto::EncodedEvent;
use hasten_proto::encoded_events::control_plane_server::ControlPlane;
use hasten_proto::v1::{
    ControlState, MemberRequest, NodeStatus, ProposeReply, ProposeRequest, SnapshotRequest,
    StatusRequest, SubscribeRequest,
};
use tokio::sync::{broadcast, mpsc, watch};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::node::{NodeError, NodeHandle};
use crate::state::{AdmissionError, StateView};

/// Committed events queued per subscriber before the stream waits for it (gRPC flow
/// control then slows the sender rather than memory growing).
const SUBSCRIBER_BUFFER: usize = 256;

/// Kept events read per step while a subscriber catches up.
const CATCH_UP_BATCH: usize = 256;

pub struct ControlPlaneService {
    node: NodeHandle,
    propose_timeout: Duration,
    /// Turns true when the node shuts down: every subscriber's stream then ends, so that
    /// the server can finish and its subscribers move to another node at once.
    stopping: watch::Receiver<bool>,
}

impl ControlPlaneService {
    pub fn new(
        node: NodeHandle,
        propose_timeout: Duration,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            node,
            propose_timeout,
            stopping,
        }
    }
}

fn status_of(err: NodeError) -> Status {
    match err {
        NodeError::Invalid(_) | NodeError::NotAdmitted(AdmissionError::Misfit { .. }) => {
            Status::invalid_argument(err.to_string_full())
        }
        NodeError::NotAdmitted(AdmissionError::UnknownCorpus { .. }) => {
            Status::failed_precondition(err.to_string_full())
        }
        NodeError::NoLeader
        | NodeError::Dropped(_)
        | NodeError::Stale { .. }
        | NodeError::ShuttingDown => Status::unavailable(err.to_string_full()),
        NodeError::Membership(_) | NodeError::ConfChange(_) => {
            Status::failed_precondition(err.to_string_full())
        }
        NodeError::Store(_) | NodeError::Thread(_) => Status::internal(err.to_string_full()),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<EncodedEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ControlPlane for ControlPlaneService {
    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let commands = request.into_inner().commands;
        let span = tracing::debug_span!("propose", commands = commands.len());
        let proposed = tokio::time::timeout(self.propose_timeout, self.node.propose(commands))
            .instrument(span)
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "not committed within {} ms (leader change or no quorum); retry: an \
                     entry's origin sequence makes a retry apply once",
                    self.propose_timeout.as_millis()
                ))
            })?;
        let index = proposed.map_err(status_of)?;
        Ok(Response::new(ProposeReply {
            index,
            leader_address: self.node.leader_elsewhere(),
        }))
    }

    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let request = request.into_inner();
        let (sender, events) = mpsc::channel(SUBSCRIBER_BUFFER);
        let node = self.node.clone();
        let mut stopping = self.stopping.clone();
        let span = tracing::info_span!("subscriber", who = %request.subscriber);
        tokio::spawn(
            async move {
                tracing::info!(from = request.from_index, "subscribed");
                let subscribers = node.metrics().subscribers.clone();
                subscribers.inc();
                let ended = tokio::select! {
                    streamed = stream_events(node, request.from_index, &sender) => streamed.err(),
                    _ = stopping.wait_for(|stop| *stop) => {
                        Some(Status::unavailable("the control-plane node is shutting down; subscribe to another"))
                    }
                };
                if let Some(status) = ended {
                    let _ = sender.send(Err(status)).await;
                }
                subscribers.dec();
                tracing::info!("subscription ended");
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(events),
        )))
    }

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<ControlState>, Status> {
        let state = self.node.state().await.map_err(status_of)?;
        Ok(Response::new(owned_state(state).await?))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<NodeStatus>, Status> {
        Ok(Response::new(self.node.status().await.map_err(status_of)?))
    }

    async fn add_node(
        &self,
        request: Request<MemberRequest>,
    ) -> Result<Response<NodeStatus>, Status> {
        let member = request.into_inner();
        if member.id == 0 || member.address.is_empty() {
            return Err(Status::invalid_argument(
                "a new member needs a non-zero id and its peer address",
            ));
        }
        self.change_member(true, member).await
    }

    async fn remove_node(
        &self,
        request: Request<MemberRequest>,
    ) -> Result<Response<NodeStatus>, Status> {
        self.change_member(false, request.into_inner()).await
    }
}

impl ControlPlaneService {
    async fn change_member(
        &self,
        add: bool,
        member: MemberRequest,
    ) -> Result<Response<NodeStatus>, Status> {
        tokio::time::timeout(
            self.propose_timeout,
            self.node.change_member(add, member.id, member.address),
        )
        .await
        .map_err(|_| Status::deadline_exceeded("membership change not committed in time"))?
        .map_err(status_of)?;
        Ok(Response::new(self.node.status().await.map_err(status_of)?))
    }
}

/// The whole state for one response. Copying thousands of entries takes milliseconds, so it
/// runs on the blocking pool rather than on a worker serving others.
async fn owned_state(view: StateView) -> Result<ControlState, Status> {
    tokio::task::spawn_blocking(move || view.into_state())
        .await
        .map_err(|err| {
            Status::internal(format!("copying the state failed: {}", err.display_full()))
        })
}

/// The event that replaces a subscriber's whole state, encoded on the blocking pool (tens
/// of megabytes for a full cache).
async fn state_event(view: StateView) -> Result<EncodedEvent, Status> {
    tokio::task::spawn_blocking(move || view.into_event())
        .await
        .map_err(|err| {
            Status::internal(format!("encoding the state failed: {}", err.display_full()))
        })
}

/// Sends the committed events from `from_index` on: first what the node still keeps, then live
/// events; the whole state instead when the events needed were compacted away.
async fn stream_events(
    node: NodeHandle,
    from_index: u64,
    sender: &mpsc::Sender<Result<EncodedEvent, Status>>,
) -> Result<(), Status> {
    // Subscribe to live events before reading stored ones, so none falls in between.
    let mut live = node.subscribe_events();
    let storage = node.storage().clone();
    let mut next = from_index.max(1);
    // Live events are read from the broadcast alone once the kept ones are sent; those are
    // read again only after this subscriber lagged behind the broadcast buffer.
    let mut caught_up = false;
    loop {
        if !caught_up {
            if next <= storage.events_floor() {
                let state = node.state().await.map_err(status_of)?;
                let index = state.applied_index();
                if sender.send(Ok(state_event(state).await?)).await.is_err() {
                    return Ok(());
                }
                next = index + 1;
                continue;
            }
            // The floor may have risen past `next` since it was read above (the events kept
            // are bounded in bytes): then the whole state, never the events after a gap.
            let Some(stored) = storage.events_from(next, CATCH_UP_BATCH) else {
                continue;
            };
            if !stored.is_empty() {
                for event in stored {
                    next = event.index + 1;
                    if sender.send(Ok(event.encoded())).await.is_err() {
                        return Ok(());
                    }
                }
                continue;
            }
            caught_up = true;
        }
        match live.recv().await {
            // This node installed a leader's snapshot: the events it covers were never
            // applied here, so the subscriber gets the whole state instead.
            Ok(_) if next <= storage.events_floor() => caught_up = false,
            Ok(event) if event.index >= next => {
                next = event.index + 1;
                if sender.send(Ok(event.encoded())).await.is_err() {
                    return Ok(());
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => caught_up = false,
            Err(broadcast::error::RecvError::Closed) => {
                return Err(Status::unavailable("the control-plane node stopped"));
            }
        }
    }
}
