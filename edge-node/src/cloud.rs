//! The edge's QUIC client to the cloud index: one long-lived connection, one bidirectional
//! stream per request, reconnecting when the connection is lost.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hasten_proto::frame::{DEFAULT_MAX_FRAME_BYTES, FrameError, read_frame, write_frame};
use hasten_proto::v1::quic_error::Code;
use hasten_proto::v1::{
    InfoRequest, QueryVector, QuicRequest, QuicResponse, SearchRequest, SearchResponse,
    quic_request, quic_response,
};
use tokio::sync::Mutex;

use crate::engine::{CloudDocument, CloudSearch};

/// What a fallback asks the cloud for: the exact top-`k` of one query, with the texts to
/// answer and the vectors to cache, within `timeout` (the cloud drops work past it). A
/// partial answer is never accepted: it would be cached and served as exact.
pub fn fallback_request(query: &[f32], k: usize, timeout: Duration) -> SearchRequest {
    SearchRequest {
        queries: vec![QueryVector {
            values: query.to_vec(),
        }],
        k: k as u32,
        include_vectors: true,
        include_texts: true,
        timeout_ms: hasten_proto::wire_timeout_ms(timeout),
        allow_partial: false,
    }
}

/// The documents of a fallback's reply (its one query's hits).
pub fn fallback_documents(mut response: SearchResponse) -> Vec<CloudDocument> {
    let hits = response.results.pop().map(|r| r.hits).unwrap_or_default();
    hits.into_iter()
        .map(|h| CloudDocument {
            id: h.id,
            score: h.score,
            title: h.title,
            text: h.text,
            vector: h.vector,
        })
        .collect()
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum CloudError {
    #[error("cannot reach the cloud index at {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("the cloud index did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the client's deadline passed before the cloud index answered (it had {0:?})")]
    ClientDeadline(Duration),
    #[error("the cloud index refused the request: {0}")]
    Refused(String),
    #[error("the cloud index is overloaded: {0}")]
    Overloaded(String),
    #[error(
        "the cloud index serves corpus version {cloud}, this edge holds {edge}: rebuild or redeploy so both use the same bundle"
    )]
    VersionMismatch { cloud: String, edge: String },
    #[error("protocol error talking to the cloud index: {0}")]
    Protocol(String),
}

impl From<FrameError> for CloudError {
    fn from(err: FrameError) -> Self {
        CloudError::Protocol(err.to_string())
    }
}

/// Where and how to reach the cloud.
#[derive(Clone, Debug)]
pub struct CloudEndpoint {
    pub addr: SocketAddr,
    /// TLS server name the cloud's certificate must carry.
    pub server_name: String,
    /// Deadline of one request, connection set-up included.
    pub timeout: Duration,
    /// Corpus version the edge's bundle has; a cloud serving another is refused.
    pub corpus_version: String,
}

pub struct QuicCloudClient {
    endpoint: quinn::Endpoint,
    target: CloudEndpoint,
    connection: Mutex<Option<quinn::Connection>>,
}

impl std::fmt::Debug for QuicCloudClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicCloudClient")
            .field("target", &self.target)
            .finish()
    }
}

impl QuicCloudClient {
    /// A client endpoint on an ephemeral local port. Connects lazily, on first use.
    pub fn new(config: quinn::ClientConfig, target: CloudEndpoint) -> std::io::Result<Self> {
        let bind: SocketAddr = if target.addr.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let mut endpoint = quinn::Endpoint::client(bind)?;
        endpoint.set_default_client_config(config);
        Ok(Self {
            endpoint,
            target,
            connection: Mutex::new(None),
        })
    }

    fn unreachable(&self, reason: impl ToString) -> CloudError {
        CloudError::Unreachable {
            addr: self.target.addr,
            reason: reason.to_string(),
        }
    }

    /// The open connection, or a new one whose corpus version was checked.
    async fn connection(&self) -> Result<quinn::Connection, CloudError> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(connection.clone());
        }
        let connecting = self
            .endpoint
            .connect(self.target.addr, &self.target.server_name)
            .map_err(|e| self.unreachable(e))?;
        let connection = connecting.await.map_err(|e| self.unreachable(e))?;
        let info = match exchange(&connection, info_request()).await?.body {
            Some(quic_response::Body::Info(info)) => info,
            Some(quic_response::Body::Error(e)) => return Err(CloudError::Refused(e.message)),
            _ => return Err(CloudError::Protocol("expected index info".into())),
        };
        if info.corpus_version != self.target.corpus_version {
            connection.close(0u32.into(), b"corpus version mismatch");
            return Err(CloudError::VersionMismatch {
                cloud: info.corpus_version,
                edge: self.target.corpus_version.clone(),
            });
        }
        tracing::info!(addr = %self.target.addr, documents = info.documents, "connected to the cloud index");
        *slot = Some(connection.clone());
        Ok(connection)
    }

    async fn search_within_deadline(
        &self,
        query: &[f32],
        k: usize,
        give_up: Instant,
    ) -> Result<Vec<CloudDocument>, CloudError> {
        let connection = self.connection().await?;
        // The cloud is told what remains after connecting, and drops the work once it is
        // spent.
        let remaining = give_up.saturating_duration_since(Instant::now());
        let request = QuicRequest {
            body: Some(quic_request::Body::Search(fallback_request(
                query, k, remaining,
            ))),
        };
        let response = exchange(&connection, request).await.inspect_err(|_| {
            if connection.close_reason().is_some() {
                tracing::warn!(addr = %self.target.addr, "connection to the cloud index lost");
            }
        })?;
        match response.body {
            Some(quic_response::Body::Search(search)) => Ok(fallback_documents(search)),
            Some(quic_response::Body::Error(e)) if e.code() == Code::ResourceExhausted => {
                Err(CloudError::Overloaded(e.message))
            }
            Some(quic_response::Body::Error(e)) => Err(CloudError::Refused(e.message)),
            _ => Err(CloudError::Protocol("expected search results".into())),
        }
    }
}

fn info_request() -> QuicRequest {
    QuicRequest {
        body: Some(quic_request::Body::Info(InfoRequest {})),
    }
}

/// One request on a fresh bidirectional stream.
async fn exchange(
    connection: &quinn::Connection,
    request: QuicRequest,
) -> Result<QuicResponse, CloudError> {
    let lost = |e: &dyn std::fmt::Display| CloudError::Unreachable {
        addr: connection.remote_address(),
        reason: e.to_string(),
    };
    let (mut send, mut recv) = connection.open_bi().await.map_err(|e| lost(&e))?;
    write_frame(&mut send, &request).await?;
    send.finish().map_err(|e| lost(&e))?;
    Ok(read_frame(&mut recv, DEFAULT_MAX_FRAME_BYTES).await?)
}

impl CloudSearch for QuicCloudClient {
    async fn search(
        &self,
        query: &[f32],
        k: usize,
        deadline: Option<Instant>,
    ) -> Result<Vec<CloudDocument>, CloudError> {
        let started = Instant::now();
        let client_budget = deadline.map(|d| d.saturating_duration_since(started));
        let budget = client_budget.map_or(self.target.timeout, |b| b.min(self.target.timeout));
        let clients_deadline_binds = client_budget.is_some_and(|b| b < self.target.timeout);
        if budget.is_zero() {
            return Err(CloudError::ClientDeadline(budget));
        }
        let give_up = started + budget;
        let search = self.search_within_deadline(query, k, give_up);
        match tokio::time::timeout_at(give_up.into(), search).await {
            Ok(result) => result,
            Err(_) if clients_deadline_binds => Err(CloudError::ClientDeadline(budget)),
            Err(_) => {
                // A cloud that stopped answering may have lost our connection state; start
                // over on the next request rather than wait for the idle timeout.
                if let Some(connection) = self.connection.lock().await.take() {
                    connection.close(0u32.into(), b"request timed out");
                }
                Err(CloudError::Timeout(budget))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_tells_the_cloud_its_remaining_budget_and_never_zero() {
        let budget = |timeout| fallback_request(&[1.0], 10, timeout).timeout_ms;
        assert_eq!(budget(Duration::from_millis(250)), 250);
        // 0 would ask for the cloud's default deadline instead of none left.
        assert_eq!(budget(Duration::ZERO), 1);
        assert_eq!(budget(Duration::from_secs(u64::MAX / 2)), u32::MAX);
    }
}
