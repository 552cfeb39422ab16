//! What every client of the control plane shares: connection settings, and the follower
//! of the committed stream that edges (the hot cache) and routers (the shard map) run.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{AccessToken, BearerToken};
use crate::grpc_client_tls::GrpcClientTls;
use crate::tls::{MutualTls, TlsError};
use crate::v1::control_plane_client::ControlPlaneClient;
use crate::v1::{CommittedEvent, SubscribeRequest};

/// Largest gRPC message to or from a control-plane node: a snapshot of a full cache (5,000
/// entries with their documents and vectors) is tens of megabytes.
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

/// How long connecting to a node may take before the caller tries another.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// HTTP/2 pings on every control-plane connection, idle or not: a peer that stopped
/// answering (a hung process, a dropped route) is noticed within interval + timeout
/// instead of never.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// First wait before a follower reconnects; doubles up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Why a gRPC endpoint cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("not a gRPC address")]
    Uri(#[from] tonic::transport::Error),
    #[error("the client's TLS files cannot be used")]
    Tls(#[from] TlsError),
}

/// Where a gRPC client dials, and under mutual TLS the TLS its connections are made with
/// (read again from its files when they change).
#[derive(Clone, Debug)]
pub struct GrpcTarget {
    endpoint: Endpoint,
    tls: Option<GrpcClientTls>,
}

impl From<Endpoint> for GrpcTarget {
    /// An endpoint connected as tonic connects it (its own TLS settings, if any).
    fn from(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            tls: None,
        }
    }
}

impl GrpcTarget {
    /// The target with `settings` (timeouts, keep-alives) applied to its endpoint.
    pub fn with(self, settings: impl FnOnce(Endpoint) -> Endpoint) -> Self {
        Self {
            endpoint: settings(self.endpoint),
            tls: self.tls,
        }
    }

    /// A channel that connects on first use; call within a tokio runtime.
    pub fn connect_lazy(self) -> Channel {
        match &self.tls {
            Some(tls) => tls.lazy_channel(self.endpoint),
            None => self.endpoint.connect_lazy(),
        }
    }

    /// A channel connected now.
    pub async fn connect(self) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => tls.channel(self.endpoint).await,
            None => self.endpoint.connect().await,
        }
    }
}

/// The gRPC endpoint of the control-plane node at `address` (host:port), over mutual TLS
/// when `tls` is given.
pub fn endpoint(address: &str, tls: Option<&MutualTls>) -> Result<GrpcTarget, EndpointError> {
    Ok(grpc_endpoint(address, tls)?.with(|endpoint| {
        endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
    }))
}

/// A gRPC endpoint for `address` (`host:port` or a URI): over TLS with `tls`'s client
/// certificate when given, else plaintext.
pub fn grpc_endpoint(address: &str, tls: Option<&MutualTls>) -> Result<GrpcTarget, EndpointError> {
    let authority = address.split_once("://").map_or(address, |(_, rest)| rest);
    Ok(match tls {
        // `http`: the connector makes the TLS stream, and tonic refuses an `https` URI
        // without TLS settings of its own.
        Some(tls) => GrpcTarget {
            endpoint: Endpoint::from_shared(format!("http://{authority}"))?,
            tls: Some(GrpcClientTls::load(tls.paths())?),
        },
        None => GrpcTarget {
            endpoint: Endpoint::from_shared(format!("http://{authority}"))?,
            tls: None,
        },
    })
}

/// How a client proves itself to the control plane: a client certificate under mutual
/// TLS, the shared token ([`crate::auth`]), both, or neither (loopback only).
#[derive(Clone, Debug, Default)]
pub struct ControlAccess {
    pub tls: Option<MutualTls>,
    pub token: Option<AccessToken>,
}

impl ControlAccess {
    /// The interceptor that sends the token, if any, with every request.
    pub fn bearer(&self) -> BearerToken {
        BearerToken::new(self.token.clone())
    }
}

/// A control-plane client that sends its token with every request.
pub type ControlClient = ControlPlaneClient<InterceptedService<Channel, BearerToken>>;

/// Why a control-plane client could not connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Connect(#[from] tonic::transport::Error),
}

/// A connected control-plane client with Hasten's message bounds.
pub async fn connect(address: &str, access: &ControlAccess) -> Result<ControlClient, ConnectError> {
    let channel = endpoint(address, access.tls.as_ref())?.connect().await?;
    Ok(
        ControlPlaneClient::with_interceptor(channel, access.bearer())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// Where a follower stands: the last index it applied and whether a stream is open.
#[derive(Debug, Default)]
pub struct FollowStatus {
    applied_index: AtomicU64,
    subscribed: AtomicBool,
}

impl FollowStatus {
    pub fn applied_index(&self) -> u64 {
        self.applied_index.load(Ordering::Acquire)
    }

    pub fn subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Acquire)
    }
}

/// Why one subscription ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot connect")]
    Connect(#[from] ConnectError),
    #[error("the stream failed")]
    Stream(#[from] tonic::Status),
    #[error("applying an event failed")]
    Apply(#[from] tokio::task::JoinError),
}

/// Follows the committed stream of a control plane: subscribes to one of `endpoints` from
/// the index after the last one applied, hands each event in order to `apply` (on the
/// blocking pool: applying can take milliseconds, or seconds for a whole state), and moves
/// to the next endpoint whenever the stream breaks. Runs until the process ends.
pub async fn follow<F>(
    endpoints: Vec<String>,
    access: ControlAccess,
    subscriber: String,
    status: Arc<FollowStatus>,
    apply: F,
) where
    F: Fn(CommittedEvent) + Send + Sync + 'static,
{
    let apply = Arc::new(apply);
    let mut wait = FIRST_RETRY;
    for endpoint in endpoints.iter().cycle() {
        let from_index = status.applied_index() + 1;
        match stream_from(
            endpoint,
            &access,
            &subscriber,
            from_index,
            &status,
            &apply,
            &mut wait,
        )
        .await
        {
            Ok(()) => tracing::info!(%endpoint, "control-plane stream ended; reconnecting"),
            Err(err) => {
                tracing::info!(%endpoint, error = %err.display_full(), "control-plane stream lost; reconnecting")
            }
        }
        status.subscribed.store(false, Ordering::Release);
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_RETRY);
    }
}

async fn stream_from<F>(
    endpoint: &str,
    access: &ControlAccess,
    subscriber: &str,
    from_index: u64,
    status: &FollowStatus,
    apply: &Arc<F>,
    wait: &mut Duration,
) -> Result<(), StreamError>
where
    F: Fn(CommittedEvent) + Send + Sync + 'static,
{
    let mut client = connect(endpoint, access).await?;
    let mut stream = client
        .subscribe(SubscribeRequest {
            from_index,
            subscriber: subscriber.to_string(),
        })
        .await?
        .into_inner();
    status.subscribed.store(true, Ordering::Release);
    tracing::info!(%endpoint, from_index, "following the control plane");
    while let Some(event) = stream.message().await? {
        *wait = FIRST_RETRY;
        let replaces_state = event.state.is_some();
        if event.index <= status.applied_index() && !replaces_state {
            continue;
        }
        let index = event.index;
        let apply = Arc::clone(apply);
        tokio::task::spawn_blocking(move || apply(event)).await?;
        status.applied_index.store(index, Ordering::Release);
    }
    Ok(())
}
