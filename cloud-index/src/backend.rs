//! The search API both kinds of cloud server answer: a shard over its partition, a router
//! over the whole corpus. The QUIC and gRPC front ends are written once against this.

use std::future::Future;
use std::time::Instant;

use hasten_proto::v1::{IndexInfo, SearchRequest, SearchResponse};

use crate::error::SearchError;
use crate::metrics::CloudMetrics;

pub trait SearchBackend: Clone + Send + Sync + 'static {
    /// What this server answers over.
    fn info(&self) -> IndexInfo;

    /// Exact top-k of every query of the request.
    fn search(
        &self,
        request: SearchRequest,
    ) -> impl Future<Output = Result<SearchResponse, SearchError>> + Send;
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
}
