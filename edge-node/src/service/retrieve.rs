//! One request pipeline for both front ends: token, deadline, validation, admission,
//! retrieval and metrics, written once. The HTTP and gRPC front ends only turn their wire
//! forms into an [`Incoming`] request and the result back.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::encoder::TextEncoder;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::api::ReplyOptions;
use crate::api::{EdgeError, InvalidArgument, RequestLimits, RetrieveInput};
use crate::caches::{CacheStats, Eviction, SkipReason};
use crate::fallback::quic::{CloudLink, CloudLinkStatus, QuicCloudClient};
use crate::metrics::{DocumentCounts, EdgeMetrics};
use crate::replication::{LinkReport, LinkStatus};
use crate::retrieval::{
    LocalAnswer, Outcome, Retrieval, RetrievalEngine, RetrievalPolicy, RetrievalRequest,
};
use crate::tenants::{AuthError, Tenant, TenantDirectory};

/// A retrieve request as a front end received it, each part parsed but not yet checked.
#[derive(Debug)]
pub struct Incoming<'a> {
    /// The `Authorization` header (or metadata) value.
    pub authorization: Option<&'a str>,
    /// The client's timeout, as its header parsed.
    pub timeout: Result<Option<Duration>, InvalidArgument>,
    /// The request, as its body was read and parsed.
    pub input: Result<RetrieveInput, EdgeError>,
}

/// What `GET /v1/status` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeStatus {
    pub policy: RetrievalPolicy,
    pub tau: f64,
    pub semantic_threshold: f32,
    pub corpus_version: String,
    pub cache: CacheStats,
    pub cache_capacity: Option<usize>,
    pub default_k: usize,
    pub validation_depth: usize,
    pub cloud: CloudLink,
    pub link: Option<LinkReport>,
    pub skipped: Vec<(SkipReason, u64)>,
    /// The share this edge holds, and the documents of cached entries fetched from the
    /// cloud since start and waiting.
    pub documents: DocumentCounts,
}

#[derive(Clone)]
pub struct EdgeService {
    encoder: Arc<TextEncoder>,
    engine: Arc<RetrievalEngine<QuicCloudClient>>,
    limits: RequestLimits,
    replies: ReplyOptions,
    cloud_link: Arc<CloudLinkStatus>,
    link: Option<Arc<LinkStatus>>,
    metrics: Arc<EdgeMetrics>,
    tenants: Arc<TenantDirectory>,
    /// Requests being answered; beyond its bound a request is refused at once.
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl EdgeService {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        encoder: Arc<TextEncoder>,
        engine: Arc<RetrievalEngine<QuicCloudClient>>,
        limits: RequestLimits,
        replies: ReplyOptions,
        metrics: Arc<EdgeMetrics>,
        max_in_flight: usize,
        tenants: Arc<TenantDirectory>,
        link: Option<Arc<LinkStatus>>,
    ) -> Self {
        let cloud_link = engine.cloud().link();
        Self {
            encoder,
            engine,
            limits,
            replies,
            cloud_link,
            link,
            metrics,
            tenants,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
        }
    }

    /// The embedding of a corpus document, as the edge holds it (for clustering documents
    /// before Speculative RAG drafts from them).
    pub fn document_vector(&self, id: hasten_core::corpus::DocId) -> Option<Vec<f32>> {
        self.engine
            .caches()
            .documents()
            .get(id)
            .map(|doc| doc.vector.clone())
    }

    pub fn replies(&self) -> ReplyOptions {
        self.replies
    }

    /// Whether the edge should get traffic: it can answer, i.e. its encoder and indexes are
    /// loaded (they are before it serves) and its cloud link was verified. A control plane
    /// being away does not make it unready: it serves from its cache meanwhile, and the
    /// subscription shows in the status, a metric and an alert instead.
    pub fn readiness(&self) -> Result<(), String> {
        self.cloud_link.readiness()
    }

    /// Brings the scrape-time metrics up to date.
    pub fn refresh_metrics(&self) {
        let caches = self.engine.caches();
        let skipped: Vec<(SkipReason, u64)> = SkipReason::ALL
            .iter()
            .map(|reason| (*reason, caches.skipped(*reason)))
            .collect();
        self.metrics.refresh(
            &caches.stats(),
            self.document_counts(),
            self.link.as_deref().map(LinkStatus::report),
            &self.cloud_link.current(),
            &skipped,
        );
    }

    fn document_counts(&self) -> DocumentCounts {
        let caches = self.engine.caches();
        DocumentCounts {
            held: caches.documents().len(),
            fetched: caches.attached(),
            pending: caches.missing_len(),
        }
    }

    pub fn status(&self) -> EdgeStatus {
        let engine = &self.engine;
        let caches = engine.caches();
        let settings = engine.settings();
        EdgeStatus {
            policy: settings.policy,
            tau: engine.tau(),
            semantic_threshold: settings.semantic_threshold,
            corpus_version: caches.corpus_version().to_string(),
            cache: caches.total(),
            cache_capacity: match caches.eviction() {
                Eviction::Fifo(capacity) => Some(capacity),
                Eviction::FromLog => None,
            },
            default_k: self.limits.default_k,
            validation_depth: caches.depth(),
            cloud: self.cloud_link.current(),
            link: self.link.as_deref().map(LinkStatus::report),
            skipped: SkipReason::ALL
                .iter()
                .map(|reason| (*reason, caches.skipped(*reason)))
                .collect(),
            documents: self.document_counts(),
        }
    }

    /// The bearer token's tenant (the default tenant when the edge requires none).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Tenant, AuthError> {
        self.tenants.authenticate(authorization)
    }

    pub fn encoder(&self) -> &Arc<TextEncoder> {
        &self.encoder
    }

    pub fn engine(&self) -> &Arc<RetrievalEngine<QuicCloudClient>> {
        &self.engine
    }

    /// Answers one request: token, deadline, validation, admission, retrieval, each
    /// refusal and answer counted.
    pub async fn handle(&self, incoming: Incoming<'_>) -> Result<Retrieval, EdgeError> {
        let started = Instant::now();
        let tenant = self
            .tenants
            .authenticate(incoming.authorization)
            .map_err(|e| self.refused(None, e.into(), started))?;
        let checked = incoming
            .timeout
            .map_err(EdgeError::from)
            .and_then(|timeout| {
                let request = incoming.input?.validate(&self.limits)?;
                Ok((timeout, request))
            });
        let (timeout, request) = checked.map_err(|e| self.refused(Some(&tenant), e, started))?;
        let span = tracing::info_span!(
            "retrieve",
            tenant = %tenant,
            k = request.k,
            outcome = tracing::field::Empty
        );
        let request = RetrievalRequest {
            tenant: tenant.clone(),
            query: request.query,
            k: request.k,
            deadline: timeout.map(|t| started + t),
            trace: self.replies.draft_trace,
        };
        let outcome = match self.in_flight.try_acquire() {
            Ok(_permit) => self.retrieve(request).instrument(span.clone()).await,
            Err(_) => Err(EdgeError::EdgeBusy(self.max_in_flight)),
        };
        let took = started.elapsed();
        match &outcome {
            Ok(retrieval) => {
                span.record(
                    "outcome",
                    match retrieval.outcome {
                        Outcome::Accepted => "accepted",
                        Outcome::Fallback => "fallback",
                    },
                );
                self.metrics.observe_retrieval(&tenant, retrieval, took);
            }
            Err(error) => {
                span.record("outcome", error.kind());
                if error.is_server_side() {
                    tracing::warn!(parent: &span, error = %error.display_full(), "request failed");
                }
                self.metrics.observe_error(Some(&tenant), error, took);
            }
        }
        outcome
    }

    /// The local part (exact-repeat lookup, encoding, draft and validation) in one task on
    /// the blocking pool, then the cloud when it could not answer.
    async fn retrieve(&self, request: RetrievalRequest) -> Result<Retrieval, EdgeError> {
        let engine = Arc::clone(&self.engine);
        let encoder = Arc::clone(&self.encoder);
        let local = tokio::task::spawn_blocking(move || {
            engine.answer_locally(request, |text| encoder.encode_one(text))
        })
        .await
        .map_err(EdgeError::TaskFailed)??;
        match local {
            LocalAnswer::Answered(retrieval) => Ok(retrieval),
            LocalAnswer::NeedsCloud(pending) => Ok(self.engine.fall_back(pending).await?),
        }
    }

    fn refused(&self, tenant: Option<&Tenant>, error: EdgeError, started: Instant) -> EdgeError {
        self.metrics
            .observe_error(tenant, &error, started.elapsed());
        error
    }
}
