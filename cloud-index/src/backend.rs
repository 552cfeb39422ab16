//! The search API both kinds of cloud server answer: a shard over its partition, a router
//! over the whole corpus. The QUIC and gRPC front ends are written once against this.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use hasten_proto::v1::{
    DocumentsRequest, DocumentsResponse, IndexInfo, SearchRequest, SearchResponse,
};

use crate::error::SearchError;
use crate::metrics::CloudMetrics;
use tokio::sync::Semaphore;

pub trait SearchBackend: Clone + Send + Sync + 'static {
    /// What this server answers over.
    fn info(&self) -> IndexInfo;

    /// Exact top-k of every query of the request.
    fn search(
        &self,
        request: SearchRequest,
    ) -> impl Future<Output = Result<SearchResponse, SearchError>> + Send;

    /// The requested documents this server's corpus holds, by id.
    fn documents(
        &self,
        request: DocumentsRequest,
    ) -> impl Future<Output = Result<DocumentsResponse, SearchError>> + Send;
}

/// A backend whose every search is counted and timed, under the server's shard index
/// (`all` for a router).
#[derive(Clone, Debug)]
pub struct Metered<B> {
    inner: B,
    metrics: CloudMetrics,
    shard: String,
}

impl<B: SearchBackend> Metered<B> {
    pub fn new(inner: B, metrics: CloudMetrics, shard: String) -> Self {
        Self {
            inner,
            metrics,
            shard,
        }
    }
}

impl<B: SearchBackend> SearchBackend for Metered<B> {
    fn info(&self) -> IndexInfo {
        self.inner.info()
    }

    async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let outcome = self.inner.search(request).await;
        self.metrics
            .observe_search(&self.shard, outcome.is_ok(), started.elapsed());
        outcome
    }

    async fn documents(&self, request: DocumentsRequest) -> Result<DocumentsResponse, SearchError> {
        let outcome = self.inner.documents(request).await;
        self.metrics.observe_documents(outcome.is_ok());
        outcome
    }
}

/// A backend that answers at most `limit` searches at once and refuses the rest at once
/// with [`SearchError::Overloaded`], so that overload shows as fast refusals a caller can
/// retry elsewhere rather than as a queue whose every entry misses its deadline.
#[derive(Clone, Debug)]
pub struct Admission<B> {
    inner: B,
    permits: Arc<Semaphore>,
    limit: usize,
}

impl<B: SearchBackend> Admission<B> {
    pub fn new(inner: B, limit: usize) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl<B: SearchBackend> SearchBackend for Admission<B> {
    fn info(&self) -> IndexInfo {
        self.inner.info()
    }

    async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        let _permit = self.permits.try_acquire().map_err(|_| {
            SearchError::Overloaded(format!("{} searches already in flight", self.limit))
        })?;
        self.inner.search(request).await
    }

    /// Documents by id are lookups, not scans: they take no search permit.
    async fn documents(&self, request: DocumentsRequest) -> Result<DocumentsResponse, SearchError> {
        self.inner.documents(request).await
    }
}
