//! The edge's link to the control plane: fallback results go out as proposals, and the
//! committed stream comes back and is applied in order to the tenants' caches ([`apply`]).
//!
//! An edge with a control plane does not cache its own fallbacks directly: they return
//! through the log like everyone else's, so every edge applies the same events in the same
//! order (and nothing twice). While the control plane is away the edge keeps serving from
//! the cache it has; proposals wait in a bounded queue and the stream resumes from the
//! last applied index.

pub mod apply;

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hasten_core::DocId;
use hasten_core::retry::RetryDelays;
use hasten_proto::control::{self, ControlAccess, ControlClient, FollowStatus};
use hasten_proto::v1::{CacheEntry, ControlCommand, CorpusFacts, ProposeRequest, control_command};
use hasten_worker_api::kv::KvPool;
use tokio::sync::mpsc;

use crate::fallback::CloudSearch;
use crate::retrieval::{CacheReplication, RetrievalEngine};
use crate::tenants::Tenant;

/// Fallback results waiting to be proposed. At the paper's fallback rates an edge makes a
/// few hundred a second; this covers several seconds of control-plane unavailability
/// before the oldest are dropped (the cache stays correct, just less warm).
const PROPOSAL_QUEUE: usize = 4096;

/// Entries sent in one `Propose` (one Raft log entry); public for benchmarks that batch
/// a peer system's writes the same way.
pub const ENTRIES_PER_PROPOSAL: usize = 256;

/// First wait before re-proposing; doubles up to `MAX_RETRY`, with jitter.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Longest a proposal waits for its answer before the next node is tried: above a node's
/// own propose timeout (5 s by default), so a live node always answers first; a node that
/// hangs is left after this.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(6);

/// What this edge's corpus is, as it registers it with the control plane (which then
/// accepts only entries that fit it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusIdentity {
    pub version: String,
    pub dimension: usize,
    pub max_document_id: u64,
}

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
    corpus: CorpusIdentity,
    proposals: mpsc::Sender<CacheEntry>,
    status: Arc<LinkStatus>,
    endpoints: Vec<String>,
    /// How this edge proves itself to the control plane.
    access: ControlAccess,
}

impl ControlPlaneLink {
    /// Starts the proposer for `endpoints` (control-plane gRPC addresses, host:port),
    /// reached with `access`. `edge_id` names this edge in proposals; a
    /// start-time suffix keeps sequence numbers of a restarted edge from colliding with
    /// those of its previous run. The edge's `corpus` is registered before any entry is
    /// proposed, and entries are proposed under its version.
    pub fn start(
        edge_id: &str,
        corpus: CorpusIdentity,
        endpoints: Vec<String>,
        access: ControlAccess,
    ) -> Arc<Self> {
        let boot = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let (proposals, queue) = mpsc::channel(PROPOSAL_QUEUE);
        let link = Arc::new(Self {
            origin: format!("{edge_id}/{boot}"),
            next_seq: AtomicU64::new(1),
            corpus,
            proposals,
            status: Arc::new(LinkStatus::default()),
            endpoints,
            access,
        });
        let proposer = Proposer::new(link.endpoints.clone(), link.access.clone());
        tokio::spawn(propose_loop(
            proposer,
            registration(&link.corpus),
            queue,
            Arc::clone(&link.status),
        ));
        link
    }

    pub fn status(&self) -> Arc<LinkStatus> {
        Arc::clone(&self.status)
    }

    /// Starts applying the committed stream to `engine`'s caches and threshold, and, with
    /// `kv_pool` (the pool's `namespace/name` and the edge's KV backend), its operator's
    /// assignments to the backend's workers.
    pub fn follow<C: CloudSearch>(
        &self,
        engine: Arc<RetrievalEngine<C>>,
        kv_pool: Option<(String, Arc<KvPool>)>,
    ) {
        tokio::spawn(control::follow(
            self.endpoints.clone(),
            self.access.clone(),
            self.origin.clone(),
            Arc::clone(&self.status.stream),
            move |event| {
                let assignments = kv_pool
                    .as_ref()
                    .map(|(name, _)| apply::kv_pool_workers(&event, name))
                    .unwrap_or_default();
                apply::apply(&engine, event);
                if let Some((name, pool)) = &kv_pool {
                    for workers in assignments {
                        follow_assignment(name, pool, &workers);
                    }
                }
            },
        ));
    }
}

/// Moves the KV backend to an assignment's workers; an assignment without any (no ready
/// worker) keeps the current ones, which are then tried as down.
fn follow_assignment(name: &str, pool: &KvPool, workers: &[String]) {
    if workers.is_empty() {
        tracing::warn!(
            pool = name,
            "the KV pool has no ready worker; keeping the current ones"
        );
        return;
    }
    match pool.set_workers(workers) {
        Ok(true) => tracing::info!(
            pool = name,
            ?workers,
            "KV workers changed by the pool's assignment"
        ),
        Ok(false) => {}
        Err(error) => {
            tracing::error!(pool = name, error = %error.display_full(), "KV pool assignment refused")
        }
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
            corpus_version: self.corpus.version.clone(),
        };
        if self.proposals.try_send(entry).is_err() {
            self.status.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "control-plane proposal queue full; a fallback result is not replicated"
            );
        }
    }
}

/// The command that registers `corpus`.
fn registration(corpus: &CorpusIdentity) -> ControlCommand {
    ControlCommand {
        kind: Some(control_command::Kind::RegisterCorpus(CorpusFacts {
            corpus_version: corpus.version.clone(),
            dimension: u32::try_from(corpus.dimension).unwrap_or(u32::MAX),
            max_document_id: corpus.max_document_id,
        })),
    }
}

/// How one proposal ended.
enum Proposed {
    Committed,
    /// Refused for good (invalid, or not fitting the registered corpus).
    Refused(tonic::Status),
}

/// Sends proposals to the control plane, one node at a time, moving on to the next node
/// when one fails, refuses for now, or does not answer within [`PROPOSE_DEADLINE`]. A
/// follower that commits a proposal names the leader, and later proposals go there: a
/// follower forwards each proposal to the leader, one more network hop before its commit.
struct Proposer {
    endpoints: Vec<String>,
    access: ControlAccess,
    turn: usize,
    client: Option<ControlClient>,
    /// Where `client` is connected.
    connected_to: String,
    /// The leader a node named, tried before the configured endpoints.
    leader: Option<String>,
    /// A named leader this edge could not reach (another network, say): not followed
    /// again until a node names another.
    unreachable_leader: Option<String>,
}

impl Proposer {
    fn new(endpoints: Vec<String>, access: ControlAccess) -> Self {
        Self {
            endpoints,
            access,
            turn: 0,
            client: None,
            connected_to: String::new(),
            leader: None,
            unreachable_leader: None,
        }
    }

    /// Proposes `commands` until they commit or are refused for good. A retried proposal
    /// is applied once: every entry carries its origin sequence.
    async fn propose(&mut self, commands: &[ControlCommand]) -> Proposed {
        let mut waits = RetryDelays::new(FIRST_RETRY, MAX_RETRY);
        loop {
            if self.client.is_none() {
                let endpoint = match &self.leader {
                    Some(leader) => leader.clone(),
                    None => self.endpoints[self.turn % self.endpoints.len()].clone(),
                };
                match control::connect(&endpoint, &self.access).await {
                    Ok(connected) => {
                        self.client = Some(connected);
                        self.connected_to = endpoint;
                    }
                    Err(err) => {
                        tracing::debug!(%endpoint, error = %err.display_full(), "control plane unreachable");
                        if self.leader.take().is_some() {
                            self.unreachable_leader = Some(endpoint);
                            continue;
                        }
                    }
                }
            }
            if let Some(connected) = self.client.as_mut() {
                let proposal = ProposeRequest {
                    commands: commands.to_vec(),
                };
                match tokio::time::timeout(PROPOSE_DEADLINE, connected.propose(proposal)).await {
                    Ok(Ok(reply)) => {
                        self.follow_leader(reply.into_inner().leader_address);
                        return Proposed::Committed;
                    }
                    Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                        return Proposed::Refused(status);
                    }
                    Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
                        tracing::warn!(%status, "the control plane refused this edge's token; retrying");
                        self.client = None;
                    }
                    Ok(Err(status)) => {
                        tracing::debug!(%status, "proposal failed; retrying");
                        self.client = None;
                    }
                    Err(_) => {
                        tracing::warn!(
                            deadline = ?PROPOSE_DEADLINE,
                            "a control-plane node did not answer a proposal; trying the next"
                        );
                        self.client = None;
                    }
                }
            }
            // The leader may have moved: back to the configured nodes, which name the next.
            self.leader = None;
            self.turn += 1;
            tokio::time::sleep(waits.next_delay()).await;
        }
    }

    /// Sends the next proposals to `leader` (a node's answer) unless already there, or it
    /// was found unreachable.
    fn follow_leader(&mut self, leader: String) {
        if leader.is_empty()
            || leader == self.connected_to
            || self.unreachable_leader.as_ref() == Some(&leader)
        {
            return;
        }
        tracing::debug!(%leader, "proposing to the leader from now on");
        self.unreachable_leader = None;
        self.leader = Some(leader);
        self.client = None;
    }
}

/// Registers the edge's corpus, then proposes queued entries in batches, in order.
async fn propose_loop(
    mut proposer: Proposer,
    registration: ControlCommand,
    mut queue: mpsc::Receiver<CacheEntry>,
    status: Arc<LinkStatus>,
) {
    if let Proposed::Refused(status) = proposer.propose(&[registration]).await {
        tracing::error!(%status, "the control plane refused this edge's corpus; its entries will be refused too");
    }
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
        match proposer.propose(&commands).await {
            Proposed::Committed => {
                status.proposed.fetch_add(count, Ordering::Relaxed);
            }
            Proposed::Refused(refusal) => {
                status.dropped.fetch_add(count, Ordering::Relaxed);
                tracing::error!(%refusal, entries = count, "the control plane refused cache entries");
            }
        }
    }
}
