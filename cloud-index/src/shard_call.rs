//! The requests a router sends to one replica of a shard at a time, failing over to the
//! next ([`crate::router`]): a search, or documents by id. Each says how one attempt goes and
//! what makes a reply an answer.

use std::future::Future;
use std::time::Duration;

use hasten_proto::v1::{DocumentsRequest, DocumentsResponse, SearchRequest, SearchResponse};

use crate::replica::{AttemptError, Replica};

/// A request the router sends to one replica of a shard at a time, failing over to the
/// next: a search, or documents by id.
pub trait ShardCall: Sync {
    type Reply: Send;

    /// The time the caller gave the request, for errors.
    fn timeout_ms(&self) -> u32;

    /// One attempt on `replica` within `attempt`.
    fn attempt(
        &self,
        replica: &Replica,
        attempt: Duration,
    ) -> impl Future<Output = Result<Self::Reply, AttemptError>> + Send;

    /// Why `reply` is no answer to this request, when it is not.
    fn check(&self, reply: &Self::Reply) -> Result<(), String>;
}

impl ShardCall for SearchRequest {
    type Reply = SearchResponse;

    fn timeout_ms(&self) -> u32 {
        self.timeout_ms
    }

    async fn attempt(
        &self,
        replica: &Replica,
        attempt: Duration,
    ) -> Result<SearchResponse, AttemptError> {
        let request = SearchRequest {
            timeout_ms: hasten_proto::wire_timeout_ms(attempt),
            allow_partial: false,
            ..self.clone()
        };
        replica.search(request, attempt).await
    }

    fn check(&self, reply: &SearchResponse) -> Result<(), String> {
        let queries = self.queries.len();
        if reply.results.len() == queries {
            return Ok(());
        }
        Err(format!(
            "answered {} result lists for {queries} queries",
            reply.results.len()
        ))
    }
}

impl ShardCall for DocumentsRequest {
    type Reply = DocumentsResponse;

    fn timeout_ms(&self) -> u32 {
        self.timeout_ms
    }

    async fn attempt(
        &self,
        replica: &Replica,
        attempt: Duration,
    ) -> Result<DocumentsResponse, AttemptError> {
        let request = DocumentsRequest {
            timeout_ms: hasten_proto::wire_timeout_ms(attempt),
            ..self.clone()
        };
        replica.documents(request, attempt).await
    }

    fn check(&self, reply: &DocumentsResponse) -> Result<(), String> {
        let answered = reply.documents.len() + reply.missing_ids.len();
        if answered == self.ids.len() {
            return Ok(());
        }
        Err(format!(
            "answered {answered} documents and missing ids for {} ids",
            self.ids.len()
        ))
    }
}
