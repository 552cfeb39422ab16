//! Answers on the edge: `POST /v1/answer` retrieves with HaS (the retrieval pipeline as
//! `/v1/retrieve` runs it), then generates through an [`LmBackend`]: standard RAG, or
//! Speculative RAG (drafts from document subsets by the small model, verified by the large
//! one).
//!
//! Generation uses every core, so answers take the language model one at a time, in
//! arrival order, behind a bounded queue ([`ModelQueue`]); beyond it a request is refused
//! at once.

pub mod grpc;
pub mod http;
mod iterative;
pub mod json;
pub mod metrics;
pub mod openai;
pub mod ralm;
pub mod spechop;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_lm::LanguageModel;
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, Document, LmBackend, ModelQueue, QueueError,
    SpeculativeSettings,
};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::api::{EdgeError, InvalidArgument, RetrieveInput};
use crate::pipeline::{EdgeService, Incoming};
use crate::retrieval::Retrieval;
use metrics::AnswerMetrics;

/// Bounds and defaults of `/v1/answer`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AnswerLimits {
    /// Tokens generated when a request names no `max_tokens`.
    pub default_max_tokens: usize,
    pub max_tokens: usize,
    pub max_question_chars: usize,
    /// Answers waiting for the language model, beyond the one being generated.
    pub max_queued: usize,
    pub speculative: SpeculativeSettings,
}

/// A validated answer request.
#[derive(Clone, Debug, PartialEq)]
pub struct AnswerInput {
    pub question: String,
    pub k: Option<i64>,
    pub mode: AnswerMode,
    pub max_tokens: usize,
}

/// A request that passed every check, with its documents retrieved.
pub struct Prepared {
    pub retrieval: Retrieval,
    request: AnswerRequest,
    backend: Arc<dyn LmBackend>,
    started: Instant,
    retrieve: Duration,
}

impl Prepared {
    /// The answer's token budget.
    pub fn max_new_tokens(&self) -> usize {
        self.request.max_new_tokens
    }
}

/// What the pipeline hands back: the retrieval, the answer and the time spent waiting.
pub struct Answered {
    pub retrieval: Retrieval,
    pub answer: Answer,
    pub mode: AnswerMode,
    pub retrieve: Duration,
    pub queued: Duration,
}

impl Answered {
    /// From the request to the answer's first text: retrieval and the queue included.
    pub fn first_token(&self) -> Duration {
        self.retrieve + self.queued + self.answer.timings.first_token
    }

    /// From the request to the whole answer.
    pub fn total(&self) -> Duration {
        self.retrieve + self.queued + self.answer.timings.total
    }
}

#[derive(Clone)]
pub struct AnswerService {
    retrieval: EdgeService,
    backend: Option<Arc<dyn LmBackend>>,
    /// The model loaded here, when the backend is local: iterative and multi-hop RAG
    /// (`/v1/ralm`, `/v1/spechop`) run on it step by step.
    local_model: Option<Arc<LanguageModel>>,
    limits: AnswerLimits,
    queue: Arc<ModelQueue>,
    metrics: Arc<AnswerMetrics>,
}

impl AnswerService {
    pub fn new(
        retrieval: EdgeService,
        backend: Option<Arc<dyn LmBackend>>,
        local_model: Option<Arc<LanguageModel>>,
        limits: AnswerLimits,
        metrics: Arc<AnswerMetrics>,
    ) -> Self {
        let gauge = Arc::clone(&metrics);
        Self {
            retrieval,
            backend,
            local_model,
            limits,
            queue: Arc::new(ModelQueue::new(
                limits.max_queued,
                Box::new(move |waiting| gauge.set_queue(waiting)),
            )),
            metrics,
        }
    }

    pub fn limits(&self) -> AnswerLimits {
        self.limits
    }

    pub fn retrieval(&self) -> &EdgeService {
        &self.retrieval
    }

    /// Checks a parsed body against the limits; errors name the field.
    pub fn validate(&self, body: json::AnswerBody) -> Result<AnswerInput, InvalidArgument> {
        let question = body.question.unwrap_or_default();
        let question = question.trim();
        if question.is_empty() {
            return Err(InvalidArgument::new(
                "question",
                "is required and must not be empty",
            ));
        }
        let chars = question.chars().count();
        if chars > self.limits.max_question_chars {
            return Err(InvalidArgument::new(
                "question",
                format!(
                    "{chars} characters, the limit is {}",
                    self.limits.max_question_chars
                ),
            ));
        }
        let max_tokens = match body.max_tokens {
            None => self.limits.default_max_tokens,
            Some(n) if n >= 1 && n as u64 <= self.limits.max_tokens as u64 => n as usize,
            Some(n) => {
                return Err(InvalidArgument::new(
                    "max_tokens",
                    format!("must be between 1 and {}, got {n}", self.limits.max_tokens),
                ));
            }
        };
        Ok(AnswerInput {
            question: question.to_string(),
            k: body.k,
            mode: match body.mode {
                json::ModeJson::Standard => AnswerMode::Standard,
                json::ModeJson::Speculative => AnswerMode::Speculative,
            },
            max_tokens,
        })
    }

    /// Checks the request and retrieves its documents; everything that can refuse a request
    /// happens here, before a streamed reply starts.
    pub async fn prepare(
        &self,
        authorization: Option<&str>,
        timeout: Result<Option<Duration>, InvalidArgument>,
        input: Result<AnswerInput, EdgeError>,
    ) -> Result<Prepared, EdgeError> {
        let started = Instant::now();
        let prepared = self
            .retrieve(authorization, timeout, input, started)
            .instrument(tracing::info_span!("answer_retrieve"))
            .await;
        if let Err(error) = &prepared {
            self.metrics.observe_error(error);
        }
        prepared
    }

    async fn retrieve(
        &self,
        authorization: Option<&str>,
        timeout: Result<Option<Duration>, InvalidArgument>,
        input: Result<AnswerInput, EdgeError>,
        started: Instant,
    ) -> Result<Prepared, EdgeError> {
        let input = input?;
        let backend = self.backend.clone().ok_or(EdgeError::NoLanguageModel(
            "set `lm_model` (and `lm_drafter` for speculative answers)",
        ))?;
        let retrieval = self
            .retrieval
            .handle(Incoming {
                authorization,
                timeout,
                input: Ok(RetrieveInput {
                    query: Some(input.question.clone()),
                    vector: None,
                    k: input.k,
                }),
            })
            .await?;
        let documents: Vec<Document> = retrieval
            .documents
            .iter()
            .map(|doc| Document {
                title: doc.title.clone(),
                text: doc.text.clone(),
                vector: self.retrieval.document_vector(doc.id),
                id: Some(doc.id),
            })
            .collect();
        Ok(Prepared {
            retrieval,
            request: AnswerRequest {
                question: input.question,
                documents,
                mode: input.mode,
                max_new_tokens: input.max_tokens,
                speculative: self.limits.speculative,
            },
            backend,
            started,
            retrieve: started.elapsed(),
        })
    }

    /// Waits for the language model and answers. `on_text` receives the answer's text as it
    /// is generated (a streamed reply sends it on).
    pub async fn generate(
        &self,
        prepared: Prepared,
        on_text: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<Answered, EdgeError> {
        let Prepared {
            retrieval,
            request,
            backend,
            started,
            retrieve,
        } = prepared;
        let mode = request.mode;
        let span = tracing::info_span!(
            "answer_generate",
            ?mode,
            max_tokens = request.max_new_tokens
        );
        let outcome = async {
            let queued_at = Instant::now();
            let permit = self.queue.enter().await.map_err(|error| match error {
                QueueError::Full(bound) => EdgeError::AnswerQueueFull(bound),
                QueueError::Closed => {
                    EdgeError::NoLanguageModel("the language model is shutting down")
                }
            })?;
            let queued = queued_at.elapsed();
            let answer = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let mut forward = |text: &str| {
                    if let Some(sender) = &on_text {
                        // A client that went away stops receiving; the answer still
                        // completes (and is counted) rather than stopping the model mid-batch.
                        let _ = sender.send(text.to_string());
                    }
                };
                backend.answer(&request, &mut forward)
            })
            .await
            .map_err(EdgeError::TaskFailed)?
            .map_err(|error| match error.field() {
                Some(field) => {
                    EdgeError::InvalidArgument(InvalidArgument::new(field, error.to_string()))
                }
                None if error.is_retryable() => EdgeError::GenerationUnavailable(error),
                None => EdgeError::Generation(error),
            })?;
            Ok(Answered {
                retrieval,
                answer,
                mode,
                retrieve,
                queued,
            })
        }
        .instrument(span)
        .await;
        match &outcome {
            Ok(answered) => self.metrics.observe(answered, started.elapsed()),
            Err(error) => self.metrics.observe_error(error),
        }
        outcome
    }
}
