//! One shard replica as the router sees it: a lazily connected gRPC client and its health.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{IndexInfo, InfoRequest, SearchRequest, SearchResponse};
use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint};

/// Time to open a TCP connection to a replica. A replica on the same network answers a
/// SYN in well under a millisecond; a second means it is gone, and a request's deadline
/// must leave room to try the next replica.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Why one attempt on a replica failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AttemptError {
    /// The replica judged the request itself bad: no other replica will think otherwise.
    #[error("{0}")]
    Rejected(String),
    /// The replica failed, is unreachable or answered nonsense: another may succeed.
    #[error("{0}")]
    Failed(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// A shard replica: where it is, a client to it, and whether it is believed to be serving.
#[derive(Debug)]
pub struct Replica {
    pub endpoint: String,
    client: CloudIndexClient<Channel>,
    live: AtomicBool,
    /// Why the replica is down, for error messages naming it.
    down_reason: Mutex<String>,
    /// The last index description it gave.
    info: Mutex<Option<IndexInfo>>,
}

/// A shard-map endpoint as a URI: `host:port` gets `http://`.
pub fn endpoint_uri(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

impl Replica {
    /// A replica client that connects on first use. Starts down until its health is checked.
    pub fn new(endpoint: &str) -> Result<Self, String> {
        let channel = Endpoint::from_shared(endpoint_uri(endpoint))
            .map_err(|e| format!("`{endpoint}` is not a valid endpoint: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        let client = CloudIndexClient::new(channel)
            .max_decoding_message_size(DEFAULT_MAX_FRAME_BYTES)
            .max_encoding_message_size(DEFAULT_MAX_FRAME_BYTES);
        Ok(Self {
            endpoint: endpoint.to_string(),
            client,
            live: AtomicBool::new(false),
            down_reason: Mutex::new("not checked yet".into()),
            info: Mutex::new(None),
        })
    }

    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub fn down_reason(&self) -> String {
        self.down_reason.lock().clone()
    }

    pub fn last_info(&self) -> Option<IndexInfo> {
        self.info.lock().clone()
    }

    /// Marks the replica down; logs when it was live.
    pub fn mark_down(&self, reason: String) {
        if self.live.swap(false, Ordering::AcqRel) {
            tracing::warn!(endpoint = %self.endpoint, %reason, "replica down");
        }
        *self.down_reason.lock() = reason;
    }

    /// Marks the replica live; logs when it was down.
    pub fn mark_live(&self) {
        if !self.live.swap(true, Ordering::AcqRel) {
            tracing::info!(endpoint = %self.endpoint, "replica live");
        }
    }

    /// Asks the replica what it serves.
    pub async fn info(&self, timeout: Duration) -> Result<IndexInfo, AttemptError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(timeout);
        let info = within(timeout, client.info(request)).await?;
        *self.info.lock() = Some(info.clone());
        Ok(info)
    }

    /// One search attempt with `timeout` for the whole exchange.
    pub async fn search(
        &self,
        search: SearchRequest,
        timeout: Duration,
    ) -> Result<SearchResponse, AttemptError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(search);
        request.set_timeout(timeout);
        within(timeout, client.search(request)).await
    }
}

async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, AttemptError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
            Err(AttemptError::Rejected(status.message().to_string()))
        }
        Ok(Err(status)) => Err(AttemptError::Failed(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
        Err(_) => Err(AttemptError::TimedOut(timeout)),
    }
}
