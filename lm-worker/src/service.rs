//! The `Generation` gRPC service: one answer at a time on the worker's models, behind a
//! bounded queue, its text streamed as it is generated.

use display_full_error::DisplayFullErrorExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::Stream;
use futures::stream::{self, StreamExt};
use hasten_proto::v1 as pb;
use hasten_proto::v1::generation_server::Generation;
use hasten_rag::{AnswerSink, LmBackend, ModelQueue, QueueError, RagError};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::metrics::WorkerMetrics;
use hasten_worker_api::generation::{answer_proto, info_proto, request_from_proto};

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, Status>> + Send>>;

#[derive(Clone)]
pub struct GenerationService {
    backend: Arc<dyn LmBackend>,
    queue: Arc<ModelQueue>,
    metrics: Arc<WorkerMetrics>,
}

impl GenerationService {
    /// Serves `backend`, letting at most `max_queued` answers wait behind the one generating.
    pub fn new(
        backend: Arc<dyn LmBackend>,
        max_queued: usize,
        metrics: Arc<WorkerMetrics>,
    ) -> Self {
        let gauge = Arc::clone(&metrics);
        Self {
            backend,
            queue: Arc::new(ModelQueue::new(
                max_queued,
                Box::new(move |waiting| gauge.set_queue(waiting)),
            )),
            metrics,
        }
    }
}

type EventSender = mpsc::UnboundedSender<Result<pb::GenerateEvent, Status>>;

/// Sends the answer's text to the caller's stream; a caller that went away (the stream
/// dropped) cancels the generation.
struct WorkerSink<'a> {
    sender: &'a EventSender,
    started: Instant,
    first_text: Option<std::time::Duration>,
}

impl AnswerSink for WorkerSink<'_> {
    fn text(&mut self, delta: &str) {
        self.first_text
            .get_or_insert_with(|| self.started.elapsed());
        let _ = self.sender.send(Ok(pb::GenerateEvent {
            event: Some(pb::generate_event::Event::Delta(delta.to_string())),
        }));
    }

    fn cancelled(&self) -> bool {
        self.sender.is_closed()
    }
}

/// The status a failed answer is sent back with; a refused request names its field.
fn status(error: &RagError) -> Status {
    match error.field() {
        Some(_) => Status::invalid_argument(error.to_string_full()),
        None if error.is_retryable() => Status::unavailable(error.to_string_full()),
        None => Status::internal(error.to_string_full()),
    }
}

#[tonic::async_trait]
impl Generation for GenerationService {
    type AnswerStream = EventStream;

    async fn answer(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::AnswerStream>, Status> {
        let started = Instant::now();
        let request = request_from_proto(request.into_inner()).map_err(|error| {
            self.metrics.observe_error("invalid_argument");
            Status::invalid_argument(error.to_string_full())
        })?;
        // Refused before queueing: a bad request should not wait minutes to learn it.
        if let Err(error) = self.backend.check(&request) {
            self.metrics.observe_error("invalid_argument");
            return Err(status(&error));
        }
        let span = tracing::info_span!(
            "generate",
            mode = ?request.mode,
            documents = request.documents.len(),
            max_tokens = request.max_new_tokens
        );
        let permit = self
            .queue
            .enter()
            .instrument(span.clone())
            .await
            .map_err(|error| {
                self.metrics.observe_error("overloaded");
                match error {
                    QueueError::Full(_) => Status::resource_exhausted(error.to_string_full()),
                    QueueError::Closed => Status::unavailable(error.to_string_full()),
                }
            })?;
        let (sender, receiver) = mpsc::unbounded_channel();
        let backend = Arc::clone(&self.backend);
        let metrics = Arc::clone(&self.metrics);
        let mode = request.mode;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let _span = span.entered();
            let mut sink = WorkerSink {
                sender: &sender,
                started,
                first_text: None,
            };
            let outcome = backend.answer(&request, &mut sink);
            let first_text = sink.first_text;
            let last = match outcome {
                Ok(answer) => {
                    metrics.observe(mode, &answer, first_text, started.elapsed());
                    Ok(pb::GenerateEvent {
                        event: Some(pb::generate_event::Event::Answer(answer_proto(answer))),
                    })
                }
                Err(RagError::Cancelled) => {
                    metrics.observe_error("cancelled");
                    return;
                }
                Err(error) => {
                    tracing::warn!(error = %error.display_full(), "generation failed");
                    metrics.observe_error(match error.field() {
                        Some(_) => "invalid_argument",
                        None => "internal",
                    });
                    Err(status(&error))
                }
            };
            let _ = sender.send(last);
        });
        let events = stream::unfold(receiver, |mut receiver| async move {
            let event = receiver.recv().await?;
            Some((event, receiver))
        });
        Ok(Response::new(events.boxed()))
    }

    async fn info(
        &self,
        _request: Request<pb::GenerationInfoRequest>,
    ) -> Result<Response<pb::GenerationInfo>, Status> {
        Ok(Response::new(info_proto(self.backend.info())))
    }
}
