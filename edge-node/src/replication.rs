//! The edge's link to the control plane: fallback results go out as proposals, and the
//! committed stream comes back and is applied in order to the cache, its inverted index and
//! the cache channel.
//!
//! An edge with a control plane does not cache its own fallbacks directly: they return
//! through the log like everyone else's, so every edge applies the same events in the same
//! order (and nothing twice). While the control plane is away the edge keeps serving from
//! the cache it has; proposals wait in a bounded queue and the stream resumes from the
//! last applied index.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hasten_core::DocId;
use hasten_proto::control;
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{
    CacheEntry, CommittedEvent, ControlCommand, ProposeRequest, StoredEntry, SubscribeRequest,
    applied_command, control_command,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::engine::{CacheReplication, CloudSearch, ReplicatedEntry, RetrievalEngine};
use crate::tenants::Tenant;

/// Fallback results waiting to be proposed. At the paper's fallback rates an edge makes a
/// few hundred a second; this covers several seconds of control-plane unavailability
/// before the oldest are dropped (the cache stays correct, just less warm).
const PROPOSAL_QUEUE: usize = 4096;

/// Entries sent in one `Propose` (one Raft log entry).
const ENTRIES_PER_PROPOSAL: usize = 256;

/// First wait before reconnecting or re-proposing; doubles up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// What the edge reports about its link.
#[derive(Debug, Default)]
pub struct LinkStatus {
    applied_index: AtomicU64,
    subscribed: AtomicBool,
    proposed: AtomicU64,
    dropped: AtomicU64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct LinkReport {
    pub applied_index: u64,
    pub subscribed: bool,
    pub proposed: u64,
    pub dropped: u64,
}

impl LinkStatus {
    pub fn report(&self) -> LinkReport {
        LinkReport {
            applied_index: self.applied_index.load(Ordering::Relaxed),
            subscribed: self.subscribed.load(Ordering::Relaxed),
            proposed: self.proposed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The proposing half; the engine hands it fallback results.
pub struct ControlPlaneLink {
    origin: String,
    next_seq: AtomicU64,
    proposals: mpsc::Sender<CacheEntry>,
    status: Arc<LinkStatus>,
    endpoints: Vec<String>,
    /// Mutual TLS toward the control plane, when the deployment has a CA.
    tls: Option<MutualTls>,
}

impl ControlPlaneLink {
    /// Starts the proposer for `endpoints` (control-plane gRPC addresses, host:port),
    /// reached over mutual TLS with `tls`. `edge_id` names this edge in proposals; a
    /// start-time suffix keeps sequence numbers of a restarted edge from colliding with
    /// those of its previous run.
    pub fn start(edge_id: &str, endpoints: Vec<String>, tls: Option<MutualTls>) -> Arc<Self> {
        let boot = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let (proposals, queue) = mpsc::channel(PROPOSAL_QUEUE);
        let link = Arc::new(Self {
            origin: format!("{edge_id}/{boot}"),
            next_seq: AtomicU64::new(1),
            proposals,
            status: Arc::new(LinkStatus::default()),
            endpoints,
            tls,
        });
        tokio::spawn(propose_loop(
            link.endpoints.clone(),
            link.tls.clone(),
            queue,
            Arc::clone(&link.status),
        ));
        link
    }

    pub fn status(&self) -> Arc<LinkStatus> {
        Arc::clone(&self.status)
    }

    /// Starts applying the committed stream to `engine`.
    pub fn follow<C: CloudSearch>(&self, engine: Arc<RetrievalEngine<C>>) {
        tokio::spawn(subscribe_loop(
            self.endpoints.clone(),
            self.tls.clone(),
            self.origin.clone(),
            engine,
            Arc::clone(&self.status),
        ));
    }
}

impl CacheReplication for ControlPlaneLink {
    fn propose(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        query: &[f32],
        document_ids: Vec<DocId>,
    ) {
        let entry = CacheEntry {
            tenant: tenant.as_str().to_string(),
            origin: self.origin.clone(),
            origin_seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            text,
            vector: query.to_vec(),
            document_ids,
            entity_hint: None,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        if self.proposals.try_send(entry).is_err() {
            self.status.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "control-plane proposal queue full; a fallback result is not replicated"
            );
        }
    }
}

async fn connect(
    address: &str,
    tls: Option<&MutualTls>,
) -> Result<ControlPlaneClient<Channel>, tonic::transport::Error> {
    let channel = control::endpoint(address, tls)?.connect().await?;
    Ok(ControlPlaneClient::new(channel)
        .max_decoding_message_size(control::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(control::MAX_MESSAGE_BYTES))
}

/// Proposes queued entries in batches, in order, retrying each batch on the next endpoint
/// until it commits (a retried entry is applied once: its origin sequence is known).
async fn propose_loop(
    endpoints: Vec<String>,
    tls: Option<MutualTls>,
    mut queue: mpsc::Receiver<CacheEntry>,
    status: Arc<LinkStatus>,
) {
    let mut turn = 0usize;
    let mut client: Option<ControlPlaneClient<Channel>> = None;
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < ENTRIES_PER_PROPOSAL {
            match queue.try_recv() {
                Ok(entry) => batch.push(entry),
                Err(_) => break,
            }
        }
        let commands: Vec<ControlCommand> = batch
            .into_iter()
            .map(|entry| ControlCommand {
                kind: Some(control_command::Kind::Insert(entry)),
            })
            .collect();
        let count = commands.len() as u64;
        let mut wait = FIRST_RETRY;
        loop {
            if client.is_none() {
                let endpoint = &endpoints[turn % endpoints.len()];
                match connect(endpoint, tls.as_ref()).await {
                    Ok(connected) => client = Some(connected),
                    Err(err) => tracing::debug!(%endpoint, %err, "control plane unreachable"),
                }
            }
            if let Some(connected) = client.as_mut() {
                let proposal = ProposeRequest {
                    commands: commands.clone(),
                };
                match connected.propose(proposal).await {
                    Ok(_) => {
                        status.proposed.fetch_add(count, Ordering::Relaxed);
                        break;
                    }
                    Err(err) if err.code() == tonic::Code::InvalidArgument => {
                        tracing::error!(%err, "the control plane refused cache entries");
                        break;
                    }
                    Err(err) => {
                        tracing::debug!(%err, "proposal failed; retrying");
                        client = None;
                    }
                }
            }
            turn += 1;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
    }
}

/// Follows the committed stream from the last applied index, reconnecting (to the next
/// endpoint) whenever it breaks.
async fn subscribe_loop<C: CloudSearch>(
    endpoints: Vec<String>,
    tls: Option<MutualTls>,
    origin: String,
    engine: Arc<RetrievalEngine<C>>,
    status: Arc<LinkStatus>,
) {
    let mut wait = FIRST_RETRY;
    for endpoint in endpoints.iter().cycle() {
        let from_index = status.applied_index.load(Ordering::Relaxed) + 1;
        match stream_from(
            endpoint,
            tls.as_ref(),
            &origin,
            from_index,
            &engine,
            &status,
            &mut wait,
        )
        .await
        {
            Ok(()) => tracing::info!(%endpoint, "control-plane stream ended; reconnecting"),
            Err(err) => tracing::info!(%endpoint, %err, "control-plane stream lost; reconnecting"),
        }
        status.subscribed.store(false, Ordering::Relaxed);
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_RETRY);
    }
}

async fn stream_from<C: CloudSearch>(
    endpoint: &str,
    tls: Option<&MutualTls>,
    origin: &str,
    from_index: u64,
    engine: &RetrievalEngine<C>,
    status: &LinkStatus,
    wait: &mut Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = connect(endpoint, tls).await?;
    let mut stream = client
        .subscribe(SubscribeRequest {
            from_index,
            subscriber: origin.to_string(),
        })
        .await?
        .into_inner();
    status.subscribed.store(true, Ordering::Relaxed);
    tracing::info!(%endpoint, from_index, "following the control plane");
    while let Some(event) = stream.message().await? {
        *wait = FIRST_RETRY;
        if event.index < status.applied_index.load(Ordering::Relaxed) + 1 && event.state.is_none() {
            continue;
        }
        apply(engine, event, status);
    }
    Ok(())
}

fn replicated(stored: StoredEntry) -> Option<ReplicatedEntry> {
    let entry = stored.entry?;
    Some(ReplicatedEntry {
        id: stored.id,
        tenant: if entry.tenant.is_empty() {
            Tenant::default_tenant()
        } else {
            Tenant::new(&entry.tenant)
        },
        text: entry.text,
        vector: entry.vector,
        document_ids: entry.document_ids,
    })
}

/// Applies one committed event: the whole state when the stream had to restart from it,
/// then each command's removals and insertion.
pub fn apply<C: CloudSearch>(
    engine: &RetrievalEngine<C>,
    event: CommittedEvent,
    status: &LinkStatus,
) {
    if let Some(state) = event.state {
        engine.apply_replicated(&engine.cached_ids(), None);
        if let Some(config) = state.config.filter(|c| c.tau > 0.0) {
            engine.set_tau(config.tau);
        }
        let entries = state.entries.len();
        for stored in state.entries {
            engine.apply_replicated(&[], replicated(stored));
        }
        tracing::info!(
            index = state.applied_index,
            entries,
            "installed the control plane's state"
        );
    }
    for command in event.applied {
        let entry = match command.kind {
            Some(applied_command::Kind::Inserted(stored)) => replicated(stored),
            Some(applied_command::Kind::Config(config)) => {
                if config.tau > 0.0 {
                    engine.set_tau(config.tau);
                    tracing::info!(
                        tau = config.tau,
                        "homology threshold changed by the control plane"
                    );
                }
                None
            }
            Some(applied_command::Kind::ShardMap(_)) | None => None,
        };
        engine.apply_replicated(&command.removed, entry);
    }
    status.applied_index.store(event.index, Ordering::Relaxed);
}
