//! The search API both kinds of cloud server answer: a shard over its partition, a router
//! over the whole corpus. The QUIC and gRPC front ends are written once against this.

use std::future::Future;

use hasten_proto::v1::{IndexInfo, SearchRequest, SearchResponse};

use crate::error::SearchError;

pub trait SearchBackend: Clone + Send + Sync + 'static {
    /// What this server answers over.
    fn info(&self) -> IndexInfo;

    /// Exact top-k of every query of the request.
    fn search(
        &self,
        request: SearchRequest,
    ) -> impl Future<Output = Result<SearchResponse, SearchError>> + Send;
}
