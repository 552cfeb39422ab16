//! [`RemoteLm`]: an [`LmBackend`] that sends generation to a worker over gRPC, so the edge
//! can answer with models it does not hold.

use hasten_proto::grpc_client_tls::GrpcClientTls;
use hasten_proto::v1 as pb;
use hasten_proto::v1::generation_client::GenerationClient;
use hasten_proto::worker::{lazy_channel, worker_uri};
use hasten_rag::{Answer, AnswerRequest, AnswerSink, BackendInfo, LmBackend, RagError};
use tokio::runtime::Handle;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::generation::{WireError, answer_from_proto, info_from_proto, request_proto};

/// How often a call in flight looks whether its caller went away.
const CANCEL_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

pub struct RemoteLm {
    endpoint: String,
    client: GenerationClient<Channel>,
    /// The runtime the gRPC calls run on; [`LmBackend::answer`] blocks on it, so it is called
    /// from a blocking thread (`spawn_blocking`), as the edge does.
    runtime: Handle,
    info: parking_lot::Mutex<Option<BackendInfo>>,
}

impl std::fmt::Debug for RemoteLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLm")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl RemoteLm {
    /// A client of the worker at `authority` (`host:port`), over TLS when `tls` is given.
    /// Connects on first use, so a worker that starts later is found then; call within a
    /// tokio runtime.
    pub fn connect_lazy(authority: &str, tls: Option<GrpcClientTls>) -> Result<Self, RagError> {
        let endpoint = worker_uri(authority, tls.is_some());
        let channel = lazy_channel(&endpoint, tls.as_ref()).map_err(|source| RagError::Worker {
            endpoint: endpoint.clone(),
            retryable: false,
            source: Box::new(source),
        })?;
        Ok(Self {
            client: GenerationClient::new(channel),
            endpoint,
            runtime: Handle::current(),
            info: parking_lot::Mutex::new(None),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Asks the worker which models it runs (and so whether it is reachable).
    pub async fn probe(&self) -> Result<BackendInfo, RagError> {
        let info = self
            .client
            .clone()
            .info(pb::GenerationInfoRequest {})
            .await
            .map_err(|status| self.failure(status))?;
        let info = info_from_proto(info.into_inner());
        *self.info.lock() = Some(info.clone());
        Ok(info)
    }

    fn failure(&self, status: Status) -> RagError {
        RagError::Worker {
            endpoint: self.endpoint.clone(),
            retryable: matches!(
                status.code(),
                Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded
            ),
            source: Box::new(status),
        }
    }

    fn broken_reply(&self, error: WireError) -> RagError {
        RagError::Worker {
            endpoint: self.endpoint.clone(),
            retryable: false,
            source: Box::new(error),
        }
    }

    async fn call(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        let mut events = self
            .client
            .clone()
            .answer(request_proto(request))
            .await
            .map_err(|status| self.failure(status))?
            .into_inner();
        let mut cancel_check = tokio::time::interval(CANCEL_CHECK);
        loop {
            // Dropping the stream cancels the call, and the worker stops generating.
            let event = tokio::select! {
                event = events.message() => event.map_err(|s| self.failure(s))?,
                _ = cancel_check.tick() => {
                    if sink.cancelled() {
                        return Err(RagError::Cancelled);
                    }
                    continue;
                }
            };
            let Some(event) = event else { break };
            match event.event {
                Some(pb::generate_event::Event::Delta(text)) => sink.text(&text),
                Some(pb::generate_event::Event::Answer(answer)) => {
                    return answer_from_proto(answer, request.documents.len())
                        .map_err(|e| self.broken_reply(e));
                }
                None => {}
            }
        }
        Err(self.broken_reply(WireError {
            field: "answer",
            message: "never came: the stream ended after the text".into(),
        }))
    }
}

impl LmBackend for RemoteLm {
    fn answer(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        // Checked here too, so a bad request names its field without a round trip.
        request.validate()?;
        let _span = tracing::info_span!("remote_generate", endpoint = %self.endpoint).entered();
        self.runtime.block_on(self.call(request, sink))
    }

    fn info(&self) -> BackendInfo {
        self.info.lock().clone().unwrap_or_else(|| BackendInfo {
            drafter: "unknown (not reached yet)".into(),
            verifier: "unknown (not reached yet)".into(),
            device: format!("worker at {}", self.endpoint),
        })
    }
}
