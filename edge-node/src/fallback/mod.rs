//! The exact search an edge falls back to: the [`CloudSearch`] seam the retrieval engine
//! calls, its errors, and the QUIC client to the cloud index that implements it ([`quic`]).

pub mod quic;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hasten_core::DocId;
use hasten_proto::frame::FrameError;
use hasten_proto::v1::ScoredDocument;

/// A document the cloud returned: what the edge needs to answer and to cache it.
#[derive(Clone, Debug, PartialEq)]
pub struct CloudDocument {
    pub id: DocId,
    pub score: f32,
    pub title: String,
    pub text: String,
    pub vector: Vec<f32>,
}

impl From<ScoredDocument> for CloudDocument {
    fn from(hit: ScoredDocument) -> Self {
        Self {
            id: hit.id,
            score: hit.score,
            title: hit.title,
            text: hit.text,
            vector: hit.vector,
        }
    }
}

/// The exact search the edge falls back to.
pub trait CloudSearch: Send + Sync + 'static {
    /// Exact top-`k` for each normalised query, in one call (a speculative session's
    /// verification batch), with texts and vectors, best first per query; given up at
    /// `deadline` (the client's), or at the client's own timeout if sooner.
    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<Vec<CloudDocument>>, CloudError>> + Send;

    /// Exact top-`k` for one normalised query (a fallback).
    fn search(
        &self,
        query: &[f32],
        k: usize,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<CloudDocument>, CloudError>> + Send {
        let queries = vec![query.to_vec()];
        async move {
            let mut results = self.search_batch(&queries, k, deadline).await?;
            Ok(results.pop().unwrap_or_default())
        }
    }

    /// The documents of `ids` the cloud holds, with texts and vectors (score 0): what an
    /// edge holding a fraction of the corpus needs to serve entries other edges learned.
    fn documents(
        &self,
        ids: &[DocId],
    ) -> impl Future<Output = Result<Vec<CloudDocument>, CloudError>> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The cloud's address names a host that does not resolve (now: it is looked up again
    /// on the next connection attempt).
    #[error("cannot resolve the cloud index's address {addr}")]
    Resolve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to the cloud index at {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectError,
    },
    #[error("the connection to the cloud index at {addr} failed")]
    Connection {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectionError,
    },
    #[error("the request stream to the cloud index at {addr} was closed")]
    Stream {
        addr: SocketAddr,
        #[source]
        source: quinn::ClosedStream,
    },
    #[error("the cloud index did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the client's deadline passed before the cloud index answered (it had {0:?})")]
    ClientDeadline(Duration),
    /// The cloud's own reason, as it sent it.
    #[error("the cloud index refused the request: {0}")]
    Refused(String),
    #[error("the cloud index is overloaded: {0}")]
    Overloaded(String),
    #[error(
        "the cloud index serves corpus version {cloud}, this edge holds {edge}: rebuild or redeploy so both use the same bundle"
    )]
    VersionMismatch { cloud: String, edge: String },
    #[error("protocol error talking to the cloud index")]
    Frame(#[from] FrameError),
    #[error("the cloud index answered out of protocol: expected {0}")]
    UnexpectedReply(&'static str),
}
