//! One shard replica as the router sees it: a lazily connected gRPC client and its health.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hasten_core::trace_export::{TRACEPARENT, current_traceparent};
use hasten_proto::control::{EndpointError, grpc_endpoint};
use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{
    DocumentsRequest, DocumentsResponse, IndexInfo, InfoRequest, SearchRequest, SearchResponse,
};
use parking_lot::Mutex;
use tonic::transport::Channel;

/// Time to open a TCP connection to a replica. A replica on the same network answers a
/// SYN in well under a millisecond; a second means it is gone, and a request's deadline
/// must leave room to try the next replica.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Failed health checks in a row that take a replica out of rotation. A replica busy with a
/// large batch can miss one check's deadline while serving well; a dead one fails every
/// check, and the first request that tries it marks it down at once anyway.
const CHECKS_TO_MARK_DOWN: u32 = 3;

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
    /// The replica serves but is at its bound of searches in flight: try another, keep it.
    #[error("{0}")]
    Overloaded(String),
}

/// A shard replica: where it is, a client to it, and whether it is believed to be serving.
#[derive(Debug)]
pub struct Replica {
    pub endpoint: String,
    client: CloudIndexClient<Channel>,
    live: AtomicBool,
    /// Health checks failed since the last success.
    failed_checks: AtomicU32,
    /// Has shown that it serves the corpus and shard the map lists it for. A replica that
    /// has not (a new endpoint, or one found serving something else) is never tried: its
    /// answer could be another shard's.
    verified: AtomicBool,
    /// Why the replica is down, for error messages naming it.
    down_reason: Mutex<String>,
    /// The last index description it gave.
    info: Mutex<Option<IndexInfo>>,
}

impl Replica {
    /// A replica client that connects on first use, over mutual TLS with `tls`. Starts
    /// down and unverified until its health is checked.
    pub fn new(endpoint: &str, tls: Option<&MutualTls>) -> Result<Self, EndpointError> {
        let channel = grpc_endpoint(endpoint, tls)?
            .with(|endpoint| endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
            .connect_lazy();
        let client = CloudIndexClient::new(channel)
            .max_decoding_message_size(DEFAULT_MAX_FRAME_BYTES)
            .max_encoding_message_size(DEFAULT_MAX_FRAME_BYTES);
        Ok(Self {
            endpoint: endpoint.to_string(),
            client,
            live: AtomicBool::new(false),
            failed_checks: AtomicU32::new(0),
            verified: AtomicBool::new(false),
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

    /// Whether the replica may be tried at all (it was seen serving the corpus and shard
    /// expected).
    pub fn is_usable(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// Takes the replica out of use for serving the wrong corpus or shard.
    pub fn refuse(&self, why: String) {
        self.verified.store(false, Ordering::Release);
        self.mark_down(why);
    }

    /// Records a failed health check; the replica goes down after
    /// [`CHECKS_TO_MARK_DOWN`] in a row.
    pub fn check_failed(&self, reason: String) {
        if self.failed_checks.fetch_add(1, Ordering::AcqRel) + 1 >= CHECKS_TO_MARK_DOWN {
            self.mark_down(reason);
        }
    }

    /// Marks the replica live and verified (its caller checked what it serves, or it is
    /// usable already); logs when it was down.
    pub fn mark_live(&self) {
        self.failed_checks.store(0, Ordering::Release);
        self.verified.store(true, Ordering::Release);
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
        // The shard's span joins the trace of the search (or batch) calling it.
        if let Some(value) = current_traceparent().and_then(|tp| tp.parse().ok()) {
            request.metadata_mut().insert(TRACEPARENT, value);
        }
        within(timeout, client.search(request)).await
    }

    /// One documents-by-id attempt with `timeout` for the whole exchange.
    pub async fn documents(
        &self,
        documents: DocumentsRequest,
        timeout: Duration,
    ) -> Result<DocumentsResponse, AttemptError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(documents);
        request.set_timeout(timeout);
        within(timeout, client.documents(request)).await
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
        Ok(Err(status)) if status.code() == tonic::Code::ResourceExhausted => {
            Err(AttemptError::Overloaded(status.message().to_string()))
        }
        Ok(Err(status)) => Err(AttemptError::Failed(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
        Err(_) => Err(AttemptError::TimedOut(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replica_is_tried_once_verified_and_goes_down_after_failed_checks_in_a_row() {
        let replica = Replica::new("127.0.0.1:1", None).unwrap();
        assert!(!replica.is_usable() && !replica.is_live());
        replica.mark_live();
        for _ in 1..CHECKS_TO_MARK_DOWN {
            replica.check_failed("no answer".into());
        }
        assert!(
            replica.is_live(),
            "a check or two missed took a replica out"
        );
        replica.check_failed("no answer".into());
        assert!(!replica.is_live() && replica.is_usable());
        assert_eq!(replica.down_reason(), "no answer");
        replica.refuse("holds shard 1 of 2".into());
        assert!(!replica.is_usable());
    }
}
