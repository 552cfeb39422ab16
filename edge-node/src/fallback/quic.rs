//! The edge's QUIC client to the cloud index: one long-lived connection, one bidirectional
//! stream per request, reconnecting when the connection is lost. It also tracks the link's
//! state for readiness: an edge is ready once it has reached a cloud serving its corpus
//! version, and not while the cloud serves another one.

use display_full_error::DisplayFullErrorExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::DocId;
use hasten_core::trace_export::current_traceparent;
use hasten_proto::frame::{DEFAULT_MAX_FRAME_BYTES, read_frame, write_frame};
use hasten_proto::reload::Reloading;
use hasten_proto::v1::quic_error::Code;
use hasten_proto::v1::{
    DocumentsRequest, InfoRequest, QueryVector, QuicRequest, QuicResponse, SearchRequest,
    SearchResponse, quic_request, quic_response,
};
use parking_lot::Mutex;

use super::{CloudDocument, CloudError, CloudSearch};

/// What a fallback asks the cloud for: the exact top-`k` of each query (one for a
/// fallback, a batch for a verification), with the texts to answer and the vectors to
/// cache, within `timeout` (the cloud drops work past it). A partial answer is never
/// accepted: it would be cached and served as exact.
pub fn fallback_request(queries: &[Vec<f32>], k: usize, timeout: Duration) -> SearchRequest {
    SearchRequest {
        queries: queries
            .iter()
            .map(|query| QueryVector {
                values: query.clone(),
            })
            .collect(),
        k: k as u32,
        include_vectors: true,
        include_texts: true,
        timeout_ms: hasten_proto::wire_timeout_ms(timeout),
        allow_partial: false,
    }
}

/// The documents of a search's reply, per query in the request's order; a reply with
/// another number of result lists than `queries` is refused.
pub fn fallback_documents(
    response: SearchResponse,
    queries: usize,
) -> Result<Vec<Vec<CloudDocument>>, CloudError> {
    if response.results.len() != queries {
        return Err(CloudError::UnexpectedReply("one result list per query"));
    }
    Ok(response
        .results
        .into_iter()
        .map(|result| result.hits.into_iter().map(CloudDocument::from).collect())
        .collect())
}

/// Where and how to reach the cloud.
#[derive(Clone, Debug)]
pub struct CloudEndpoint {
    /// `HOST:PORT`: an IP address or a DNS name, resolved again at every connection attempt
    /// so that an edge follows a cloud whose name now points elsewhere.
    pub addr: String,
    /// TLS name the cloud's certificate must carry.
    pub server_name: String,
    /// Deadline of one request, connection set-up included.
    pub timeout: Duration,
    /// Corpus version the edge's bundle has; a cloud serving another is refused.
    pub corpus_version: String,
}

/// The state of the link to the cloud, as the last connection attempt left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloudLink {
    /// No connection attempted yet.
    Unknown,
    /// Connected to a cloud serving this edge's corpus version.
    Verified,
    /// The cloud could not be reached.
    Unreachable(String),
    /// The cloud serves another corpus version: no fallback can succeed.
    VersionMismatch { cloud: String },
}

impl CloudLink {
    /// Every state's label, as metrics and the status name them.
    pub const LABELS: [&'static str; 4] =
        ["unknown", "verified", "unreachable", "version_mismatch"];

    pub fn label(&self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Verified => "verified",
            Self::Unreachable(_) => "unreachable",
            Self::VersionMismatch { .. } => "version_mismatch",
        }
    }
}

/// The link's state and whether it was ever verified, shared with readiness and metrics.
#[derive(Debug)]
pub struct CloudLinkStatus {
    state: Mutex<(CloudLink, bool)>,
}

impl Default for CloudLinkStatus {
    fn default() -> Self {
        Self {
            state: Mutex::new((CloudLink::Unknown, false)),
        }
    }
}

impl CloudLinkStatus {
    pub fn current(&self) -> CloudLink {
        self.state.lock().0.clone()
    }

    /// Whether the edge can answer every query: it reached a cloud of its corpus version
    /// once (a later outage leaves its cached answers servable), and the cloud does not
    /// serve another version now.
    pub fn readiness(&self) -> Result<(), String> {
        let (link, verified_once) = &*self.state.lock();
        match link {
            CloudLink::VersionMismatch { cloud } => Err(format!(
                "the cloud index serves corpus version {cloud}, not this edge's: no fallback can succeed"
            )),
            _ if *verified_once => Ok(()),
            CloudLink::Unreachable(reason) => {
                Err(format!("the cloud index was never reached: {reason}"))
            }
            _ => Err("the cloud index was not reached yet".into()),
        }
    }

    fn set(&self, link: CloudLink) {
        let mut state = self.state.lock();
        if state.0 != link {
            match &link {
                CloudLink::VersionMismatch { cloud } => {
                    tracing::error!(%cloud, "the cloud index serves another corpus version; this edge is not ready")
                }
                CloudLink::Unreachable(reason) => {
                    tracing::warn!(%reason, "the cloud index is unreachable")
                }
                CloudLink::Verified | CloudLink::Unknown => {}
            }
        }
        state.1 |= link == CloudLink::Verified;
        state.0 = link;
    }
}

/// The TLS of the link: fixed, or made again from its files when they change (a renewed
/// client certificate, a rotated CA), which the next connection uses.
pub enum CloudTls {
    Fixed(quinn::ClientConfig),
    Reloading(Arc<Reloading<quinn::ClientConfig>>),
}

impl From<quinn::ClientConfig> for CloudTls {
    fn from(config: quinn::ClientConfig) -> Self {
        Self::Fixed(config)
    }
}

impl CloudTls {
    fn current(&self) -> quinn::ClientConfig {
        match self {
            Self::Fixed(config) => config.clone(),
            Self::Reloading(files) => files.current().as_ref().clone(),
        }
    }
}

pub struct QuicCloudClient {
    endpoint: quinn::Endpoint,
    tls: CloudTls,
    target: CloudEndpoint,
    /// The open connection. Held only to read or swap it, never across an await: a request
    /// whose deadline passes must be able to drop a dead connection at once.
    connection: Mutex<Option<quinn::Connection>>,
    /// One connection attempt at a time; others wait for it (within their own deadlines)
    /// rather than open a second.
    connecting: tokio::sync::Mutex<()>,
    link: Arc<CloudLinkStatus>,
}

impl std::fmt::Debug for QuicCloudClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicCloudClient")
            .field("target", &self.target)
            .finish()
    }
}

impl QuicCloudClient {
    /// A client endpoint on an ephemeral local port. Connects on first use, or on
    /// [`Self::verify_link`].
    pub fn new(tls: impl Into<CloudTls>, target: CloudEndpoint) -> std::io::Result<Self> {
        // Dual-stack, since a name may resolve to either family; IPv4 alone where the host
        // has no IPv6.
        let endpoint = quinn::Endpoint::client(SocketAddr::from(([0u16; 8], 0)))
            .or_else(|_| quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0))))?;
        Ok(Self {
            endpoint,
            tls: tls.into(),
            target,
            connection: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            link: Arc::new(CloudLinkStatus::default()),
        })
    }

    /// The link's state, for readiness and metrics.
    pub fn link(&self) -> Arc<CloudLinkStatus> {
        Arc::clone(&self.link)
    }

    /// Connects now (within the request timeout) and checks the cloud's corpus version, so
    /// that readiness reflects the link before the first fallback.
    pub async fn verify_link(&self) -> Result<(), CloudError> {
        tokio::time::timeout(self.target.timeout, self.connection())
            .await
            .map_err(|_| CloudError::Timeout(self.target.timeout))
            .inspect_err(|err| self.link.set(CloudLink::Unreachable(err.to_string_full())))?
            .map(|_| ())
    }

    /// The open connection, if it is still open.
    fn open_connection(&self) -> Option<quinn::Connection> {
        self.connection
            .lock()
            .as_ref()
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    /// The open connection, or a new one whose corpus version was checked.
    async fn connection(&self) -> Result<quinn::Connection, CloudError> {
        if let Some(connection) = self.open_connection() {
            return Ok(connection);
        }
        let _attempt = self.connecting.lock().await;
        // Whoever held the attempt before may have connected meanwhile.
        if let Some(connection) = self.open_connection() {
            return Ok(connection);
        }
        let connection = self.connect().await.inspect_err(|err| {
            if !matches!(err, CloudError::VersionMismatch { .. }) {
                self.link.set(CloudLink::Unreachable(err.to_string_full()));
            }
        })?;
        self.link.set(CloudLink::Verified);
        *self.connection.lock() = Some(connection.clone());
        Ok(connection)
    }

    /// The cloud's address as it resolves now: the first one this endpoint can reach.
    async fn resolve(&self) -> Result<SocketAddr, CloudError> {
        let resolve_error = |source| CloudError::Resolve {
            addr: self.target.addr.clone(),
            source,
        };
        let ipv6 = self.endpoint.local_addr().map_err(resolve_error)?.is_ipv6();
        tokio::net::lookup_host(&self.target.addr)
            .await
            .map_err(resolve_error)?
            .find(|addr| ipv6 || addr.is_ipv4())
            .ok_or_else(|| resolve_error(std::io::Error::other("no address this host can reach")))
    }

    async fn connect(&self) -> Result<quinn::Connection, CloudError> {
        let addr = self.resolve().await?;
        let connection = self
            .endpoint
            .connect_with(self.tls.current(), addr, &self.target.server_name)
            .map_err(|source| CloudError::Connect { addr, source })?
            .await
            .map_err(|source| CloudError::Connection { addr, source })?;
        let info = match exchange(&connection, info_request()).await?.body {
            Some(quic_response::Body::Info(info)) => info,
            Some(quic_response::Body::Error(e)) => return Err(CloudError::Refused(e.message)),
            _ => return Err(CloudError::UnexpectedReply("index info")),
        };
        if info.corpus_version != self.target.corpus_version {
            connection.close(0u32.into(), b"corpus version mismatch");
            self.link.set(CloudLink::VersionMismatch {
                cloud: info.corpus_version.clone(),
            });
            return Err(CloudError::VersionMismatch {
                cloud: info.corpus_version,
                edge: self.target.corpus_version.clone(),
            });
        }
        tracing::info!(%addr, documents = info.documents, "connected to the cloud index");
        Ok(connection)
    }

    async fn search_within_deadline(
        &self,
        queries: &[Vec<f32>],
        k: usize,
        give_up: Instant,
    ) -> Result<Vec<Vec<CloudDocument>>, CloudError> {
        let connection = self.connection().await?;
        // The cloud is told what remains after connecting, and drops the work once it is
        // spent.
        let remaining = give_up.saturating_duration_since(Instant::now());
        let request = QuicRequest {
            body: Some(quic_request::Body::Search(fallback_request(
                queries, k, remaining,
            ))),
            ..QuicRequest::default()
        };
        let response = exchange(&connection, request).await.inspect_err(|_| {
            if connection.close_reason().is_some() {
                tracing::warn!(addr = %self.target.addr, "connection to the cloud index lost");
            }
        })?;
        match response.body {
            Some(quic_response::Body::Search(search)) => fallback_documents(search, queries.len()),
            Some(quic_response::Body::Error(e)) => Err(refusal(e)),
            _ => Err(CloudError::UnexpectedReply("search results")),
        }
    }

    async fn documents_within(
        &self,
        ids: &[DocId],
        budget: Duration,
    ) -> Result<Vec<CloudDocument>, CloudError> {
        let connection = self.connection().await?;
        let request = QuicRequest {
            body: Some(quic_request::Body::Documents(DocumentsRequest {
                ids: ids.to_vec(),
                include_vectors: true,
                include_texts: true,
                timeout_ms: hasten_proto::wire_timeout_ms(budget),
            })),
            ..QuicRequest::default()
        };
        match exchange(&connection, request).await?.body {
            Some(quic_response::Body::Documents(answer)) => {
                if !answer.missing_ids.is_empty() {
                    tracing::warn!(
                        missing = answer.missing_ids.len(),
                        "the cloud holds no document under some cached ids"
                    );
                }
                Ok(answer
                    .documents
                    .into_iter()
                    .map(CloudDocument::from)
                    .collect())
            }
            Some(quic_response::Body::Error(e)) => Err(refusal(e)),
            _ => Err(CloudError::UnexpectedReply("documents")),
        }
    }
}

/// The cloud's refusal as the edge reports it: overload apart from the rest.
fn refusal(error: hasten_proto::v1::QuicError) -> CloudError {
    if error.code() == Code::ResourceExhausted {
        CloudError::Overloaded(error.message)
    } else {
        CloudError::Refused(error.message)
    }
}

fn info_request() -> QuicRequest {
    QuicRequest {
        body: Some(quic_request::Body::Info(InfoRequest {})),
        ..QuicRequest::default()
    }
}

/// One request on a fresh bidirectional stream, carrying the current span's trace context.
async fn exchange(
    connection: &quinn::Connection,
    mut request: QuicRequest,
) -> Result<QuicResponse, CloudError> {
    request.traceparent = current_traceparent().unwrap_or_default();
    let addr = connection.remote_address();
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|source| CloudError::Connection { addr, source })?;
    write_frame(&mut send, &request).await?;
    send.finish()
        .map_err(|source| CloudError::Stream { addr, source })?;
    Ok(read_frame(&mut recv, DEFAULT_MAX_FRAME_BYTES).await?)
}

impl CloudSearch for QuicCloudClient {
    async fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
        deadline: Option<Instant>,
    ) -> Result<Vec<Vec<CloudDocument>>, CloudError> {
        let started = Instant::now();
        let client_budget = deadline.map(|d| d.saturating_duration_since(started));
        let budget = client_budget.map_or(self.target.timeout, |b| b.min(self.target.timeout));
        let clients_deadline_binds = client_budget.is_some_and(|b| b < self.target.timeout);
        if budget.is_zero() {
            return Err(CloudError::ClientDeadline(budget));
        }
        let give_up = started + budget;
        let search = self.search_within_deadline(queries, k, give_up);
        match tokio::time::timeout_at(give_up.into(), search).await {
            Ok(result) => result,
            Err(_) if clients_deadline_binds => Err(CloudError::ClientDeadline(budget)),
            Err(_) => {
                // A cloud that stopped answering may have lost our connection state; start
                // over on the next request rather than wait for the idle timeout.
                if let Some(connection) = self.connection.lock().take() {
                    connection.close(0u32.into(), b"request timed out");
                }
                Err(CloudError::Timeout(budget))
            }
        }
    }

    async fn documents(&self, ids: &[DocId]) -> Result<Vec<CloudDocument>, CloudError> {
        let budget = self.target.timeout;
        tokio::time::timeout(budget, self.documents_within(ids, budget))
            .await
            .map_err(|_| CloudError::Timeout(budget))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_tells_the_cloud_its_remaining_budget_and_never_zero() {
        let budget = |timeout| fallback_request(&[vec![1.0]], 10, timeout).timeout_ms;
        assert_eq!(budget(Duration::from_millis(250)), 250);
        // 0 would ask for the cloud's default deadline instead of none left.
        assert_eq!(budget(Duration::ZERO), 1);
        assert_eq!(budget(Duration::from_secs(u64::MAX / 2)), u32::MAX);
    }

    #[test]
    fn readiness_needs_a_verified_link_and_no_version_mismatch() {
        let status = CloudLinkStatus::default();
        assert!(status.readiness().is_err(), "never reached");
        status.set(CloudLink::Unreachable("refused".into()));
        assert!(status.readiness().unwrap_err().contains("refused"));
        status.set(CloudLink::Verified);
        assert!(status.readiness().is_ok());
        // An outage after the link was verified leaves cached answers servable.
        status.set(CloudLink::Unreachable("gone".into()));
        assert!(status.readiness().is_ok());
        status.set(CloudLink::VersionMismatch {
            cloud: "other".into(),
        });
        assert!(status.readiness().unwrap_err().contains("other"));
    }
}
