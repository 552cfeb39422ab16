//! Answers on the edge: `POST /v1/answer`, `POST /v1/chat/completions` and `Edge.Answer`
//! are thin front ends over one [`AnswerService`]. [`AnswerService::prepare`] does
//! everything that can refuse a request (validation, authorization and retrieval, the
//! backend's check of the prompt, admission to the queue), so a refusal is a status code,
//! never an error inside a reply that has started. [`AnswerService::stream`] then generates
//! through an [`LmBackend`] (standard RAG, or Speculative RAG) and yields the answer as
//! [`AnswerEvent`]s once the first text is written, so that a backend found down is a
//! status too; dropping the stream cancels the generation within one decoding step.
//!
//! Generation uses every core, so answers take the language model one at a time, in
//! arrival order, behind a bounded queue ([`ModelQueue`]); beyond it a request is refused
//! at once.

pub mod chat;
mod iterative;
pub mod metrics;
pub mod ralm;
pub mod spechop;
mod stream;

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_rag::{
    Admission, Answer, AnswerMode, AnswerRequest, BackendInfo, ChatTurn, Decoding, Document,
    LmBackend, ModelQueue, QueueError, RagError, SpeculativeSettings,
};
use tracing::Instrument;

use crate::api::answer as answer_json;
use crate::api::{EdgeError, InvalidArgument, RetrieveInput};
use crate::keyed_limit::{KeyedLimit, Place};
use crate::retrieval::Retrieval;
use crate::service::retrieve::{EdgeService, Incoming};
use crate::tenants::Tenant;
pub use iterative::IterativeModel;
use metrics::AnswerMetrics;
pub use stream::{AnswerEvent, AnswerStream};

/// Bounds and defaults of `/v1/answer`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AnswerLimits {
    /// Tokens generated when a request names no `max_tokens`.
    pub default_max_tokens: usize,
    pub max_tokens: usize,
    /// Longest retrieval query, in characters (`max_query_chars`).
    pub max_question_chars: usize,
    /// Answers waiting for the language model, beyond the one being generated.
    pub max_queued: usize,
    /// Answers generated at once: 1 on this process's cores, more on an engine that batches.
    pub concurrency: usize,
    /// Answers one tenant may have waiting or generating at once (`None`: bounded by the
    /// queue alone).
    pub per_tenant: Option<usize>,
    /// Whether a chat's follow-up is rewritten by the model into a standalone question for
    /// retrieval (`chat_query_rewrite`), instead of the rule of [`chat::retrieval_query`].
    pub rewrite_queries: bool,
    pub speculative: SpeculativeSettings,
}

/// A validated answer request.
#[derive(Clone, Debug, PartialEq)]
pub struct AnswerInput {
    /// What the model answers: the question, or a chat's last user message.
    pub question: String,
    /// What retrieval runs on: the question, or a chat's standalone question
    /// ([`chat::retrieval_query`]).
    pub query: String,
    /// A chat's system messages and earlier turns.
    pub conversation: Vec<ChatTurn>,
    pub k: Option<i64>,
    pub mode: AnswerMode,
    pub max_tokens: usize,
    pub decoding: Decoding,
}

/// A request that passed every check, with its documents retrieved and its place in the
/// queue taken.
pub struct Prepared {
    pub retrieval: Retrieval,
    request: AnswerRequest,
    query: String,
    notes: Vec<String>,
    backend: Arc<dyn LmBackend>,
    admission: Admission,
    place: Place<Tenant>,
    started: Instant,
    retrieve: Duration,
}

/// What the pipeline hands back: the retrieval, the answer and the time spent waiting.
pub struct Answered {
    pub retrieval: Retrieval,
    pub answer: Answer,
    pub mode: AnswerMode,
    /// What retrieval ran on.
    pub query: String,
    /// What the edge changed in the request to answer it, in words (fewer clusters than
    /// configured, turns left out of the prompt, greedy drafts).
    pub notes: Vec<String>,
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
    /// What iterative and multi-hop RAG (`/v1/ralm`, `/v1/spechop`) run on step by step:
    /// the model loaded here, or a llama.cpp engine (`/v1/ralm` only).
    iterative: Option<IterativeModel>,
    limits: AnswerLimits,
    queue: Arc<ModelQueue>,
    quota: Arc<KeyedLimit<Tenant>>,
    metrics: Arc<AnswerMetrics>,
}

impl AnswerService {
    pub fn new(
        retrieval: EdgeService,
        backend: Option<Arc<dyn LmBackend>>,
        iterative: Option<IterativeModel>,
        limits: AnswerLimits,
        metrics: Arc<AnswerMetrics>,
    ) -> Self {
        let gauge = Arc::clone(&metrics);
        Self {
            retrieval,
            backend,
            iterative,
            limits,
            queue: Arc::new(ModelQueue::with_concurrency(
                limits.concurrency,
                limits.max_queued,
                Box::new(move |waiting| gauge.set_queue(waiting)),
            )),
            quota: KeyedLimit::new(limits.per_tenant),
            metrics,
        }
    }

    pub fn limits(&self) -> AnswerLimits {
        self.limits
    }

    pub fn retrieval(&self) -> &EdgeService {
        &self.retrieval
    }

    /// Whether this edge answers in `mode` (`/v1/models` lists only those).
    pub fn serves(&self, mode: AnswerMode) -> bool {
        self.backend
            .as_ref()
            .is_some_and(|backend| backend.serves(mode))
    }

    /// What generates this edge's answers, and in which modes (for `/v1/status`); `None`
    /// without a backend.
    pub fn generation(&self) -> Option<(BackendInfo, Vec<AnswerMode>)> {
        let backend = self.backend.as_ref()?;
        let modes = [AnswerMode::Standard, AnswerMode::Speculative]
            .into_iter()
            .filter(|&mode| backend.serves(mode))
            .collect();
        Some((backend.info(), modes))
    }

    /// Checks a parsed body against the limits; errors name the field.
    pub fn validate(&self, body: answer_json::AnswerBody) -> Result<AnswerInput, InvalidArgument> {
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
        Ok(AnswerInput {
            question: question.to_string(),
            query: question.to_string(),
            conversation: Vec::new(),
            k: body.k,
            mode: match body.mode {
                answer_json::ModeJson::Standard => AnswerMode::Standard,
                answer_json::ModeJson::Speculative => AnswerMode::Speculative,
            },
            max_tokens: self.max_tokens(body.max_tokens)?,
            decoding: Decoding {
                temperature: body.temperature.unwrap_or(0.0),
                top_p: body.top_p.unwrap_or(1.0),
                seed: body.seed.unwrap_or(0),
                stop: body
                    .stop
                    .map(answer_json::StopJson::into_strings)
                    .unwrap_or_default(),
            },
        })
    }

    /// The answer's token budget: the request's, within the edge's bound, or the default.
    pub fn max_tokens(&self, asked: Option<i64>) -> Result<usize, InvalidArgument> {
        match asked {
            None => Ok(self.limits.default_max_tokens),
            Some(n) if n >= 1 && n as u64 <= self.limits.max_tokens as u64 => Ok(n as usize),
            Some(n) => Err(InvalidArgument::new(
                "max_tokens",
                format!("must be between 1 and {}, got {n}", self.limits.max_tokens),
            )),
        }
    }

    /// Checks the request, retrieves its documents, has the backend check the prompt and
    /// takes a place in the queue: everything that can refuse a request happens here,
    /// before a reply starts.
    pub async fn prepare(
        &self,
        authorization: Option<&str>,
        timeout: Result<Option<Duration>, InvalidArgument>,
        input: Result<AnswerInput, EdgeError>,
    ) -> Result<Prepared, EdgeError> {
        let started = Instant::now();
        let prepared = self
            .checked_and_admitted(authorization, timeout, input, started)
            .instrument(tracing::info_span!("answer_prepare"))
            .await;
        if let Err(error) = &prepared {
            self.metrics.observe_error(error);
        }
        prepared
    }

    async fn checked_and_admitted(
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
        // Refused before retrieval: it costs nothing to say.
        input.decoding.validate().map_err(generation_error)?;
        let tenant = self.retrieval.authenticate(authorization)?;
        let place = self.tenant_place(&tenant)?;
        if !backend.serves(input.mode) {
            return Err(InvalidArgument::new(
                "mode",
                "this edge's generation backend answers in standard mode only",
            )
            .into());
        }
        let mut notes = Vec::new();
        let query = self.standalone_query(&backend, &input, &mut notes).await?;
        let retrieval = self
            .retrieval
            .handle(Incoming {
                authorization,
                timeout,
                input: Ok(RetrieveInput {
                    query: Some(query.clone()),
                    vector: None,
                    k: input.k,
                }),
            })
            .await?;
        let retrieve = started.elapsed();
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
        let mut speculative = self.limits.speculative;
        let mut question = input.question;
        let mut conversation = input.conversation;
        if input.mode == AnswerMode::Speculative {
            if documents.len() < speculative.clusters {
                notes.push(format!(
                    "{} documents retrieved, fewer than the {} clusters configured: drafted \
                     from {} clusters",
                    documents.len(),
                    speculative.clusters,
                    documents.len().max(1)
                ));
                speculative.clusters = documents.len().max(1);
            }
            if !conversation.is_empty() {
                // Drafts are written from one question: the standalone one retrieval used.
                notes.push(
                    "speculative mode answers the standalone question retrieval used; the \
                     system messages and earlier turns were not read"
                        .into(),
                );
                question = query.clone();
                conversation.clear();
            }
            if input.decoding.temperature > 0.0 {
                notes.push(
                    "speculative drafts are greedy (the paper's setting); temperature and \
                     top_p apply in standard mode"
                        .into(),
                );
            }
        }
        let request = AnswerRequest {
            question,
            documents,
            mode: input.mode,
            max_new_tokens: input.max_tokens,
            speculative,
            conversation,
            decoding: input.decoding,
        };
        let (request, backend) = tokio::task::spawn_blocking(move || {
            let checked = backend.check(&request);
            checked.map(|()| (request, backend))
        })
        .await
        .map_err(EdgeError::TaskFailed)?
        .map_err(generation_error)?;
        let admission = self.queue.admit().map_err(queue_error)?;
        Ok(Prepared {
            retrieval,
            request,
            query,
            notes,
            backend,
            admission,
            place,
            started,
            retrieve,
        })
    }

    /// What retrieval runs on: the input's query, or with `chat_query_rewrite` and earlier
    /// turns, the model's standalone rewrite of the question (the rule's query when the
    /// backend cannot rewrite or the rewrite fails, said in `notes`). The rewrite runs
    /// outside the answers' queue: it is one short generation.
    async fn standalone_query(
        &self,
        backend: &Arc<dyn LmBackend>,
        input: &AnswerInput,
        notes: &mut Vec<String>,
    ) -> Result<String, EdgeError> {
        let follows_up = input
            .conversation
            .iter()
            .any(|turn| turn.role == hasten_rag::Role::User);
        if !self.limits.rewrite_queries || !follows_up {
            return Ok(input.query.clone());
        }
        let (backend, conversation, question) = (
            Arc::clone(backend),
            input.conversation.clone(),
            input.question.clone(),
        );
        let rewritten =
            tokio::task::spawn_blocking(move || backend.rewrite_query(&conversation, &question))
                .instrument(tracing::info_span!("answer_rewrite"))
                .await
                .map_err(EdgeError::TaskFailed)?;
        Ok(match rewritten {
            Some(Ok(query)) => {
                notes
                    .push("retrieval ran on the model's standalone rewrite of the question".into());
                query.chars().take(self.limits.max_question_chars).collect()
            }
            None => {
                notes.push(
                    "this edge's generation backend cannot rewrite queries: retrieval ran on \
                     the standalone-question rule"
                        .into(),
                );
                input.query.clone()
            }
            Some(Err(error)) => {
                tracing::warn!(error = %error.display_full(), "query rewrite failed; the rule's query is used");
                notes.push(
                    "the query rewrite failed: retrieval ran on the standalone-question rule"
                        .into(),
                );
                input.query.clone()
            }
        })
    }

    /// The tenant's place among the answers in progress.
    fn tenant_place(&self, tenant: &Tenant) -> Result<Place<Tenant>, EdgeError> {
        self.quota
            .take(tenant)
            .map_err(|limit| EdgeError::TenantAnswersFull {
                tenant: tenant.to_string(),
                limit,
            })
    }

    /// Generates the prepared answer: the documents, the answer's text as it is generated,
    /// then the whole answer (or a failure after the first text). Returns once the first
    /// text is written: a failure before it (the backend down, slow or refusing) is the
    /// error, so a streaming reply has not started. Dropping the stream (or this future)
    /// cancels the generation.
    pub async fn stream(&self, prepared: Prepared) -> Result<AnswerStream, EdgeError> {
        stream::start(self.clone(), prepared).await
    }

    pub(crate) fn metrics(&self) -> &AnswerMetrics {
        &self.metrics
    }
}

/// A refusal of the queue as the edge reports it.
fn queue_error(error: QueueError) -> EdgeError {
    match error {
        QueueError::Full(bound) => EdgeError::AnswerQueueFull(bound),
        QueueError::Closed => EdgeError::NoLanguageModel("the language model is shutting down"),
    }
}

/// A backend's failure as the edge reports it: a refused request names its field.
fn generation_error(error: RagError) -> EdgeError {
    match error.field() {
        Some(field) => {
            EdgeError::InvalidArgument(InvalidArgument::new(field, error.to_string_full()))
        }
        None if error.is_retryable() => EdgeError::GenerationUnavailable(error),
        None => EdgeError::Generation(error),
    }
}
