//! The `KvGeneration` gRPC service: one answer at a time on the worker's model, behind a
//! bounded queue, its text streamed as it is generated. Requests that can be refused without
//! the model (unknown corpus version or chunk, bad ratio) are refused before they queue.

use display_full_error::DisplayFullErrorExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::Stream;
use futures::stream::{self, StreamExt};
use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_server::KvGeneration;
use hasten_rag::{AnswerSink, ModelQueue, QueueError};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::conversions::{generated_proto, info_proto, request_from_proto, variant_from_proto};
use crate::error::KvError;
use crate::metrics::KvMetrics;
use crate::store::StoreError;
use crate::worker::{KvWorker, WorkerError};

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::KvGenerateEvent, Status>> + Send>>;

#[derive(Clone)]
pub struct KvGenerationService {
    worker: Arc<KvWorker>,
    queue: Arc<ModelQueue>,
    metrics: Arc<KvMetrics>,
    default_max_new_tokens: usize,
}

impl KvGenerationService {
    pub fn new(
        worker: Arc<KvWorker>,
        max_queued: usize,
        default_max_new_tokens: usize,
        metrics: Arc<KvMetrics>,
    ) -> Self {
        let gauge = Arc::clone(&metrics);
        Self {
            worker,
            queue: Arc::new(ModelQueue::new(
                max_queued,
                Box::new(move |waiting| gauge.set_queue(waiting)),
            )),
            metrics,
            default_max_new_tokens,
        }
    }
}

/// The status an error is sent back with, and its metrics label.
pub fn status(error: &WorkerError) -> (Status, &'static str) {
    let message = error.to_string_full();
    match error {
        WorkerError::Invalid { .. } | WorkerError::Kv(KvError::Ratio(_)) => {
            (Status::invalid_argument(message), "invalid_argument")
        }
        WorkerError::Kv(KvError::ContextTooLong { .. } | KvError::InvalidInput(_)) => {
            (Status::invalid_argument(message), "invalid_argument")
        }
        WorkerError::UnknownChunk { .. } | WorkerError::Store(StoreError::NotFound(_)) => {
            (Status::not_found(message), "not_found")
        }
        WorkerError::UnknownCorpus { .. }
        | WorkerError::Store(StoreError::Mismatch { .. } | StoreError::Corrupt(_)) => {
            (Status::failed_precondition(message), "failed_precondition")
        }
        WorkerError::Store(StoreError::InvalidKey(_)) => {
            (Status::invalid_argument(message), "invalid_argument")
        }
        _ => (Status::internal(message), "internal"),
    }
}

type KvEventSender = mpsc::UnboundedSender<Result<pb::KvGenerateEvent, Status>>;

/// Sends the answer's text to the caller's stream; a caller that went away (the stream
/// dropped) stops the decoding.
struct Forward<'a> {
    sender: &'a KvEventSender,
}

impl AnswerSink for Forward<'_> {
    fn text(&mut self, delta: &str) {
        let _ = self.sender.send(Ok(pb::KvGenerateEvent {
            event: Some(pb::kv_generate_event::Event::Delta(delta.to_string())),
        }));
    }

    fn cancelled(&self) -> bool {
        self.sender.is_closed()
    }
}

#[tonic::async_trait]
impl KvGeneration for KvGenerationService {
    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<pb::KvGenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let refuse = |error: WorkerError| {
            let (status, reason) = status(&error);
            self.metrics.observe_error(reason);
            status
        };
        let request = request_from_proto(request.into_inner(), self.default_max_new_tokens)
            .map_err(refuse)?;
        self.worker.validate(&request).map_err(refuse)?;
        let span = tracing::info_span!(
            "kv_generate",
            mode = request.settings.mode.name(),
            ratio = request.settings.ratio,
            chunks = request.chunks.len(),
            corpus = request.corpus_version.as_deref().unwrap_or("-"),
        );
        // Loads start now, while the request waits for the model.
        self.worker.prefetch_for(&request);
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
        let queued = arrived.elapsed();
        let (sender, receiver) = mpsc::unbounded_channel();
        let worker = Arc::clone(&self.worker);
        let metrics = Arc::clone(&self.metrics);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let _span = span.entered();
            let mut forward = Forward { sender: &sender };
            let generated = worker.generate(&request, &mut forward);
            if sender.is_closed() {
                // The caller went away: decoding stopped at its next piece of text.
                metrics.observe_error("cancelled");
                return;
            }
            let last = match generated {
                Ok(generated) => {
                    let mode = request.settings.mode.name();
                    metrics.observe(mode, &generated, queued);
                    metrics.observe_tiers(&worker.tiers());
                    let answer = generated_proto(generated, queued, worker.model_id().as_str());
                    Ok(pb::KvGenerateEvent {
                        event: Some(pb::kv_generate_event::Event::Answer(answer)),
                    })
                }
                Err(error) => {
                    tracing::warn!(error = %error.display_full(), "generation failed");
                    let (status, reason) = status(&error);
                    metrics.observe_error(reason);
                    Err(status)
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

    async fn prefetch(
        &self,
        request: Request<pb::KvPrefetchRequest>,
    ) -> Result<Response<pb::KvPrefetchReply>, Status> {
        let request = request.into_inner();
        let variant = variant_from_proto(request.variant).map_err(|e| status(&e).0)?;
        let started = self
            .worker
            .prefetch(&request.corpus_version, &request.ids, variant);
        Ok(Response::new(pb::KvPrefetchReply {
            started: started as u32,
        }))
    }

    async fn info(
        &self,
        _request: Request<pb::KvInfoRequest>,
    ) -> Result<Response<pb::KvInfo>, Status> {
        let worker = Arc::clone(&self.worker);
        let info = tokio::task::spawn_blocking(move || {
            worker.reload_catalogs()?;
            worker.info()
        })
        .await
        .map_err(|e| Status::internal(e.to_string_full()))?
        .map_err(|e| status(&e).0)?;
        self.metrics.observe_info(&info);
        Ok(Response::new(info_proto(info)))
    }
}
