//! The edge's link to the control plane: fallback results go out as proposals, and the
//! committed stream comes back and is applied in order to the tenants' caches ([`apply`]).
//!
//! An edge with a control plane does not cache its own fallbacks directly: they return
//! through the log like everyone else's, so every edge applies the same events in the same
//! order (and nothing twice). While the control plane is away the edge keeps serving from
//! the cache it has; proposals wait in a bounded queue and the stream resumes from the
//! last applied index.

pub mod apply;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hasten_core::DocId;
use hasten_proto::control::{self, FollowStatus};
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{CacheEntry, ControlCommand, ProposeRequest, control_command};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::fallback::CloudSearch;
use crate::retrieval::{CacheReplication, RetrievalEngine};
use crate::tenants::Tenant;

/// Fallback results waiting to be proposed. At the paper's fallback rates an edge makes a
/// few hundred a second; this covers several seconds of control-plane unavailability
/// before the oldest are dropped (the cache stays correct, just less warm).
const PROPOSAL_QUEUE: usize = 4096;

/// Entries sent in one `Propose` (one Raft log entry).
const ENTRIES_PER_PROPOSAL: usize = 256;

/// First wait before re-proposing; doubles up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// What the edge reports about its link.
#[derive(Debug, Default)]
pub struct LinkStatus {
    stream: Arc<FollowStatus>,
    proposed: AtomicU64,
    dropped: AtomicU64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkReport {
    pub applied_index: u64,
    pub subscribed: bool,
    pub proposed: u64,
    pub dropped: u64,
}

impl LinkStatus {
    pub fn report(&self) -> LinkReport {
        LinkReport {
            applied_index: self.stream.applied_index(),
            subscribed: self.stream.subscribed(),
            proposed: self.proposed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The proposing half; the engine hands it fallback results.
pub struct ControlPlaneLink {
    origin: String,
    next_seq: AtomicU64,
    corpus_version: String,
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
    /// those of its previous run. Entries are proposed under `corpus_version`, the
    /// edge's bundle's.
    pub fn start(
        edge_id: &str,
        corpus_version: &str,
        endpoints: Vec<String>,
        tls: Option<MutualTls>,
    ) -> Arc<Self> {
        let boot = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let (proposals, queue) = mpsc::channel(PROPOSAL_QUEUE);
        let link = Arc::new(Self {
            origin: format!("{edge_id}/{boot}"),
            next_seq: AtomicU64::new(1),
            corpus_version: corpus_version.to_string(),
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

    /// Starts applying the committed stream to `engine`'s caches and threshold.
    pub fn follow<C: CloudSearch>(&self, engine: Arc<RetrievalEngine<C>>) {
        tokio::spawn(control::follow(
            self.endpoints.clone(),
            self.tls.clone(),
            self.origin.clone(),
            Arc::clone(&self.status.stream),
            move |event| apply::apply(&engine, event),
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
            corpus_version: self.corpus_version.clone(),
        };
        if self.proposals.try_send(entry).is_err() {
            self.status.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "control-plane proposal queue full; a fallback result is not replicated"
            );
        }
    }
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
                match control::connect(endpoint, tls.as_ref()).await {
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
