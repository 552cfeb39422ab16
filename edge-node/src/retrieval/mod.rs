//! The edge's retrieval: HaS (two-channel draft, exact re-rank, homology validation, and
//! the exact fallback to the cloud whose result is cached), and the baselines HaS is
//! measured against, behind one interface so that they run on the same machinery.
//!
//! A retrieval has two parts. [`RetrievalEngine::answer_locally`] is CPU work that never
//! waits on the network (the exact-repeat lookup, encoding, the draft and its validation):
//! callers run it on a blocking thread. When it cannot answer, it hands back a
//! [`PendingFallback`], and [`RetrievalEngine::fall_back`] asks the cloud asynchronously.
//!
//! Validation works at a fixed depth, whatever k a request asks for: the draft's best
//! `validation_depth` documents (the paper's k = 10) are compared with cached queries'
//! best `validation_depth` documents, and every fallback caches exactly that many. At
//! k <= 4 a threshold on k itself would let one shared document accept a draft, and entries
//! cached at k = 50 would cast five times the votes of others.

mod baselines;
mod draft;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::DocId;
use hasten_core::encoder::EncoderError;
use hasten_core::index::IndexError;
use serde::{Deserialize, Serialize};

use crate::caches::{CacheError, TenantCaches};
use crate::fallback::{CloudDocument, CloudError, CloudSearch};
use crate::has::{FuzzyChannel, HomologyValidator, QueryId, ValidationRules};
use crate::lookup::LookupKind;
use crate::tenants::Tenant;

/// How the edge answers a query.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum RetrievalPolicy {
    /// Homology-aware speculative retrieval.
    #[default]
    Has,
    /// Every query goes to the cloud; nothing is cached (the baseline).
    CloudOnly,
    /// The fuzzy channel's re-ranked candidates, never validated, never the cloud (the
    /// paper's "ANNS on the edge").
    EdgeIvf,
    /// Reuse a cached result only for an identical query text.
    ExactCache,
    /// Reuse the nearest cached query's result when its cosine similarity reaches the
    /// semantic threshold (GPTCache, RedisVL, Proximity).
    SemanticCache,
}

impl RetrievalPolicy {
    /// Whether fallback results are cached under this policy.
    pub fn caches(self) -> bool {
        matches!(self, Self::Has | Self::ExactCache | Self::SemanticCache)
    }

    /// Whether the policy drafts from the fuzzy channel.
    pub fn drafts(self) -> bool {
        matches!(self, Self::Has | Self::EdgeIvf)
    }

    /// The query lookup a cache keeps under this policy; HaS keeps the semantic one only
    /// for hybrid validation.
    pub fn lookup(self, hybrid: bool) -> LookupKind {
        match self {
            Self::ExactCache => LookupKind::ExactText,
            Self::SemanticCache => LookupKind::Semantic,
            Self::Has if hybrid => LookupKind::Semantic,
            Self::Has | Self::CloudOnly | Self::EdgeIvf => LookupKind::None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cloud fallback failed")]
    Cloud(#[from] CloudError),
    #[error("edge index failure")]
    Index(#[from] IndexError),
    #[error("encoding the query failed")]
    Encode(#[from] EncoderError),
    #[error("edge cache")]
    Cache(#[from] CacheError),
    #[error("{0}")]
    Misconfigured(&'static str),
    /// A search a blocking thread handed to the runtime ended without its answer (the
    /// runtime is shutting down).
    #[error("the search task ended without an answer")]
    TaskLost,
}

/// What to retrieve for: a question's text, or a ready (L2-normalised) query vector.
#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    Text(String),
    Vector(Vec<f32>),
}

/// One retrieval as the engine receives it.
#[derive(Clone, Debug)]
pub struct RetrievalRequest {
    pub tenant: Tenant,
    pub query: Query,
    pub k: usize,
    /// When the client stops waiting; a fallback gets what remains of it.
    pub deadline: Option<Instant>,
    /// Record where an HaS draft came from ([`DraftTrace`]).
    pub trace: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Fallback,
}

/// Time spent in each stage that ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimings {
    pub encode: Option<Duration>,
    pub cache_channel: Option<Duration>,
    pub fuzzy_channel: Option<Duration>,
    pub merge: Option<Duration>,
    pub validation: Option<Duration>,
    pub cloud: Option<Duration>,
    pub cache_update: Option<Duration>,
    pub total: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RetrievedDocument {
    pub id: DocId,
    pub title: String,
    pub text: String,
    pub score: f32,
}

/// The cached query an acceptance was decided through.
#[derive(Clone, Debug, PartialEq)]
pub struct MatchedQuery {
    pub id: QueryId,
    /// Its text, when it was asked as text. Another user's question: front ends show it
    /// only where the operator allows.
    pub text: Option<String>,
    pub shared_documents: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Retrieval {
    pub documents: Vec<RetrievedDocument>,
    pub outcome: Outcome,
    /// The score the acceptance was decided on: homology (shared documents / validation
    /// depth) for HaS, cosine similarity for the semantic cache, 1 for an exact repeat, 0
    /// otherwise.
    pub homology_score: f64,
    pub matched_query: Option<MatchedQuery>,
    pub timings: StageTimings,
    /// Where the HaS draft came from, when the request asked and HaS drafted.
    pub draft_trace: Option<DraftTrace>,
}

/// Where an HaS draft came from, accepted or not: what an evaluation needs to tell which
/// stage lost a passage (a channel that never found it, the exact re-rank that cut it, or
/// a validation by a cached query about something else).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTrace {
    /// The draft's best k after the exact re-rank: what an acceptance serves.
    pub draft: Vec<DocId>,
    /// Each channel's candidates, before the re-rank.
    pub cache_channel: Vec<DocId>,
    pub fuzzy_channel: Vec<DocId>,
    /// The cached query with the most votes, whether or not they reached τ.
    pub best_match: Option<TracedMatch>,
}

/// A cached query as a draft trace shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedMatch {
    pub id: QueryId,
    pub text: Option<String>,
    pub shared_documents: usize,
    /// The documents its cloud answer cached, best first.
    pub documents: Vec<DocId>,
}

/// Tunables of the engine. Defaults are the HaS paper's.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    pub policy: RetrievalPolicy,
    pub tau: f64,
    /// Candidates fetched from the fuzzy channel before the exact re-rank (the reference
    /// fetches 5 x k = 50).
    pub fuzzy_candidates: usize,
    /// Candidates fetched from the cache channel (PQ codes) before the exact re-rank.
    pub cache_candidates: usize,
    /// Cosine similarity at which the semantic cache reuses a cached result.
    pub semantic_threshold: f32,
    /// Whether the fuzzy channel's documents take part in homology validation (off: the
    /// paper's ablation that validates on cache-channel documents alone).
    pub fuzzy_in_validation: bool,
    /// Whether the fuzzy channel's documents join the served draft (off: the paper's
    /// ablation that serves accepted drafts from the cache channel alone).
    pub fuzzy_in_draft: bool,
    /// What a draft must show beyond its votes.
    pub validation: ValidationRules,
    /// Whether an accepted draft is re-ranked together with the validating query's cached
    /// documents before it is served.
    pub draft_with_matched: bool,
    /// Hybrid validation (`Some(sigma)`): only cached queries at least sigma similar to the
    /// query vote, and a query whose nearest cached query reaches `semantic_threshold` is
    /// accepted whatever the votes, served from the draft re-ranked with that query's
    /// documents. `None`: homology alone (the paper).
    pub hybrid_similarity: Option<f32>,
}

/// What the local part of a retrieval decided.
#[derive(Debug)]
pub enum LocalAnswer {
    Answered(Retrieval),
    /// The cloud must answer.
    NeedsCloud(PendingFallback),
}

/// A retrieval waiting for the cloud, with what the local part learnt.
#[derive(Debug)]
pub struct PendingFallback {
    tenant: Tenant,
    vector: Vec<f32>,
    text: Option<String>,
    k: usize,
    deadline: Option<Instant>,
    homology_score: f64,
    draft_trace: Option<DraftTrace>,
    timings: StageTimings,
    started: Instant,
}

/// Where fallback results go when the hot cache is replicated.
pub trait CacheReplication: Send + Sync {
    /// Hands `tenant`'s fallback result (its best documents, as many as the validation
    /// depth) over for replication; it must not block the request.
    fn propose(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        query: &[f32],
        document_ids: Vec<DocId>,
    );
}

pub struct RetrievalEngine<C> {
    settings: EngineSettings,
    validator: HomologyValidator,
    fuzzy: Option<FuzzyChannel>,
    /// One cache per tenant: a tenant's drafts are validated only by its own queries, and
    /// its fallback results are served to no one else.
    caches: Arc<TenantCaches>,
    cloud: C,
    replication: Option<Arc<dyn CacheReplication>>,
}

impl<C: CloudSearch> RetrievalEngine<C> {
    /// `fuzzy` is `None` when the fuzzy channel is switched off (the paper's ablation).
    pub fn new(
        settings: EngineSettings,
        caches: Arc<TenantCaches>,
        fuzzy: Option<FuzzyChannel>,
        cloud: C,
    ) -> Result<Self, EngineError> {
        if settings.policy == RetrievalPolicy::EdgeIvf
            && (fuzzy.is_none() || !settings.fuzzy_in_draft)
        {
            return Err(EngineError::Misconfigured(
                "the edge-ivf policy needs the fuzzy channel in its drafts",
            ));
        }
        Ok(Self {
            validator: HomologyValidator::new(settings.tau),
            settings,
            fuzzy,
            caches,
            cloud,
            replication: None,
        })
    }

    /// Routes fallback results to the control plane instead of the local cache: they come
    /// back, to this edge as to every other, as replicated events.
    pub fn with_replication(mut self, replication: Arc<dyn CacheReplication>) -> Self {
        self.replication = Some(replication);
        self
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    pub fn caches(&self) -> &Arc<TenantCaches> {
        &self.caches
    }

    pub fn cloud(&self) -> &C {
        &self.cloud
    }

    /// The homology threshold in force.
    pub fn tau(&self) -> f64 {
        self.validator.tau()
    }

    /// Changes the homology threshold live (the control plane's runtime configuration).
    pub fn set_tau(&self, tau: f64) {
        self.validator.set_tau(tau);
    }

    /// Everything a retrieval does before the cloud: the exact-repeat lookup, encoding
    /// (with `encode`, only when needed), and the policy's draft and its validation. CPU
    /// work of up to milliseconds that never waits: run it on a blocking thread.
    pub fn answer_locally(
        &self,
        request: RetrievalRequest,
        encode: impl FnOnce(&str) -> Result<Vec<f32>, EncoderError>,
    ) -> Result<LocalAnswer, EngineError> {
        let started = Instant::now();
        let RetrievalRequest {
            tenant,
            query,
            k,
            deadline,
            trace,
        } = request;
        let mut timings = StageTimings::default();
        let (vector, text) = match query {
            Query::Text(text) => {
                // An exact-repeat cache answers before spending anything on encoding.
                if let Some(hit) = self.exact_repeat(&tenant, &text, k, started)? {
                    return Ok(LocalAnswer::Answered(hit));
                }
                let stage = Instant::now();
                let vector = encode(&text)?;
                timings.encode = Some(stage.elapsed());
                (vector, Some(text))
            }
            Query::Vector(vector) => (vector, None),
        };
        let mut homology_score = 0.0;
        let mut draft_trace = None;
        let accepted = match self.settings.policy {
            RetrievalPolicy::Has => {
                let judged = self.speculate(&tenant, &vector, k, trace, &mut timings)?;
                homology_score = judged.verdict.score;
                draft_trace = judged.trace;
                judged
                    .verdict
                    .accepted
                    .then(|| (draft::served(judged.draft, k), judged.matched))
            }
            RetrievalPolicy::EdgeIvf => {
                let draft = self.fuzzy_draft(&vector, k, &mut timings)?;
                Some((draft::served(draft, k), None))
            }
            RetrievalPolicy::SemanticCache => {
                let (score, hit) = self.semantic_hit(&tenant, &vector, k, &mut timings)?;
                homology_score = score;
                hit.map(|(documents, matched)| (documents, Some(matched)))
            }
            RetrievalPolicy::ExactCache | RetrievalPolicy::CloudOnly => None,
        };
        match accepted {
            Some((documents, matched_query)) => {
                timings.total = started.elapsed();
                Ok(LocalAnswer::Answered(Retrieval {
                    documents,
                    outcome: Outcome::Accepted,
                    homology_score,
                    matched_query,
                    timings,
                    draft_trace,
                }))
            }
            None => Ok(LocalAnswer::NeedsCloud(PendingFallback {
                tenant,
                vector,
                text,
                k,
                deadline,
                homology_score,
                draft_trace,
                timings,
                started,
            })),
        }
    }

    /// Asks the cloud for the exact result, caches (or proposes) its best documents when
    /// the policy caches, and answers with its best k.
    pub async fn fall_back(&self, pending: PendingFallback) -> Result<Retrieval, EngineError> {
        let PendingFallback {
            tenant,
            vector,
            text,
            k,
            deadline,
            homology_score,
            draft_trace,
            mut timings,
            started,
        } = pending;
        let result = self
            .exact_from_cloud(&tenant, text, vector, k, deadline, &mut timings)
            .await?;
        timings.total = started.elapsed();
        Ok(Retrieval {
            documents: result
                .into_iter()
                .map(|d| RetrievedDocument {
                    id: d.id,
                    title: d.title,
                    text: d.text,
                    score: d.score,
                })
                .collect(),
            outcome: Outcome::Fallback,
            homology_score,
            matched_query: None,
            timings,
            draft_trace,
        })
    }

    /// The cloud's exact top `k` for `vector`, with the documents' vectors, cached for
    /// `tenant` (or proposed for replication) when the policy caches, as a fallback's are:
    /// the fallback without the local part, for callers that speculate on their own
    /// (SpecHop's hops).
    pub async fn exact_from_cloud(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        vector: Vec<f32>,
        k: usize,
        deadline: Option<Instant>,
        timings: &mut StageTimings,
    ) -> Result<Vec<CloudDocument>, EngineError> {
        let caches = self.settings.policy.caches();
        let depth = self.caches.depth();
        let fetch = if caches { k.max(depth) } else { k };
        let stage = Instant::now();
        let mut result = self.cloud.search(&vector, fetch, deadline).await?;
        timings.cloud = Some(stage.elapsed());
        if caches {
            let stage = Instant::now();
            match &self.replication {
                Some(replication) => replication.propose(
                    tenant,
                    text,
                    &vector,
                    result.iter().take(depth).map(|d| d.id).collect(),
                ),
                None => {
                    self.caches.insert_fallback(tenant, text, vector, &result)?;
                }
            }
            timings.cache_update = Some(stage.elapsed());
        }
        result.truncate(k);
        Ok(result)
    }

    /// Fetches `text`'s exact result from the cloud and caches it for `tenant` whatever a
    /// draft would say: warming a fresh edge's cache (see [`crate::warmup`]).
    pub async fn cache_from_cloud(
        &self,
        tenant: Tenant,
        text: String,
        vector: Vec<f32>,
    ) -> Result<(), EngineError> {
        if !self.settings.policy.caches() {
            return Err(EngineError::Misconfigured(
                "the policy caches nothing to warm",
            ));
        }
        let pending = PendingFallback {
            tenant,
            vector,
            text: Some(text),
            k: self.caches.depth(),
            deadline: None,
            homology_score: 0.0,
            draft_trace: None,
            timings: StageTimings::default(),
            started: Instant::now(),
        };
        self.fall_back(pending).await.map(drop)
    }

    /// Both parts in turn, on the calling thread: for tests and tools; servers run the
    /// local part on a blocking thread instead.
    pub async fn retrieve(
        &self,
        request: RetrievalRequest,
        encode: impl FnOnce(&str) -> Result<Vec<f32>, EncoderError>,
    ) -> Result<Retrieval, EngineError> {
        match self.answer_locally(request, encode)? {
            LocalAnswer::Answered(retrieval) => Ok(retrieval),
            LocalAnswer::NeedsCloud(pending) => self.fall_back(pending).await,
        }
    }
}
