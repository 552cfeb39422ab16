//! The edge service behind both front ends: encode the query, then run the HaS engine.

use std::sync::Arc;
use std::time::Instant;

use hasten_core::encoder::TextEncoder;
use tokio::sync::Semaphore;

use crate::api::{EdgeError, QueryInput, RequestLimits, ValidRequest};
use crate::cloud::QuicCloudClient;
use crate::engine::{Retrieval, RetrievalEngine, RetrievalRequest, StageTimings};
use crate::metrics::EdgeMetrics;
use crate::replication::LinkStatus;
use crate::tenants::{Tenant, TenantDirectory};

/// Who asks and how long they wait: the tenant of the request's token, and the client's
/// deadline when it gave one.
#[derive(Clone, Debug)]
pub struct Caller {
    pub tenant: Tenant,
    pub deadline: Option<Instant>,
}

#[derive(Clone)]
pub struct EdgeService {
    encoder: Arc<TextEncoder>,
    engine: Arc<RetrievalEngine<QuicCloudClient>>,
    limits: RequestLimits,
    link: Option<Arc<LinkStatus>>,
    metrics: Arc<EdgeMetrics>,
    tenants: Arc<TenantDirectory>,
    /// Requests being answered; beyond its bound a request is refused at once.
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl EdgeService {
    pub fn new(
        encoder: Arc<TextEncoder>,
        engine: Arc<RetrievalEngine<QuicCloudClient>>,
        limits: RequestLimits,
        metrics: Arc<EdgeMetrics>,
        max_in_flight: usize,
        tenants: Arc<TenantDirectory>,
    ) -> Self {
        Self {
            encoder,
            engine,
            limits,
            link: None,
            metrics,
            tenants,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
        }
    }

    /// Brings the scrape-time metrics up to date.
    pub fn refresh_metrics(&self) {
        self.metrics.refresh(
            &self.engine.tenant_cache_stats(),
            self.link.as_deref().map(LinkStatus::report),
        );
    }

    /// Whether the edge should get traffic: when its cache is replicated, only once it
    /// streams from the control plane (before that it would miss what other edges learnt).
    pub fn readiness(&self) -> Result<(), String> {
        match self.link.as_deref().map(LinkStatus::report) {
            Some(link) if !link.subscribed => Err("not subscribed to the control plane yet".into()),
            _ => Ok(()),
        }
    }

    /// Counts a request refused before it reached the engine (of `tenant` when known);
    /// gives the error back.
    pub fn refused(
        &self,
        tenant: Option<&Tenant>,
        error: EdgeError,
        started: Instant,
    ) -> EdgeError {
        self.metrics
            .observe_error(tenant, &error, started.elapsed());
        error
    }

    /// The caller of a request with this `Authorization` header value and client timeout.
    /// The token itself goes no further than this.
    pub fn caller(
        &self,
        authorization: Option<&str>,
        timeout: Option<std::time::Duration>,
        started: Instant,
    ) -> Result<Caller, EdgeError> {
        let tenant = self
            .tenants
            .authenticate(authorization)
            .map_err(|e| self.refused(None, e.into(), started))?;
        Ok(Caller {
            tenant,
            deadline: timeout.map(|t| started + t),
        })
    }

    /// Reports the control-plane link's state in the status.
    pub fn with_link(mut self, link: Arc<LinkStatus>) -> Self {
        self.link = Some(link);
        self
    }

    /// The control-plane link, when the cache is replicated.
    pub fn link(&self) -> Option<&LinkStatus> {
        self.link.as_deref()
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    pub fn engine(&self) -> &RetrievalEngine<QuicCloudClient> {
        &self.engine
    }

    /// Retrieves for `caller`'s `request`, received at `started`, and records the outcome.
    pub async fn retrieve(
        &self,
        caller: Caller,
        request: ValidRequest,
        started: Instant,
    ) -> Result<Retrieval, EdgeError> {
        let tenant = caller.tenant.clone();
        let outcome = match self.in_flight.try_acquire() {
            Ok(_permit) => self.run(caller, request).await,
            Err(_) => Err(EdgeError::Overloaded(format!(
                "{} requests already in flight at this edge; retry shortly",
                self.max_in_flight
            ))),
        };
        match &outcome {
            Ok(retrieval) => self
                .metrics
                .observe_retrieval(&tenant, retrieval, started.elapsed()),
            Err(error) => self
                .metrics
                .observe_error(Some(&tenant), error, started.elapsed()),
        }
        outcome
    }

    async fn run(&self, caller: Caller, request: ValidRequest) -> Result<Retrieval, EdgeError> {
        let mut timings = StageTimings::default();
        let (vector, text) = match request.input {
            QueryInput::Vector(vector) => (vector, None),
            QueryInput::Text(text) => {
                // An exact-repeat cache answers before spending anything on encoding.
                if let Some(hit) =
                    self.engine
                        .cached_answer_for_text(&caller.tenant, &text, request.k)
                {
                    return Ok(hit);
                }
                let encoder = Arc::clone(&self.encoder);
                let started = Instant::now();
                // Encoding is milliseconds of CPU: keep it off the async workers.
                let (vector, text) = tokio::task::spawn_blocking(move || {
                    encoder.encode_one(&text).map(|v| (v, text))
                })
                .await
                .map_err(|e| EdgeError::Internal(format!("encoder task failed: {e}")))?
                .map_err(|e| EdgeError::Internal(format!("encoder failed: {e}")))?;
                timings.encode_us = started.elapsed().as_micros() as u64;
                (vector, Some(text))
            }
        };
        Ok(self
            .engine
            .retrieve(
                RetrievalRequest {
                    tenant: caller.tenant,
                    vector,
                    text,
                    k: request.k,
                    deadline: caller.deadline,
                },
                timings,
            )
            .await?)
    }
}
