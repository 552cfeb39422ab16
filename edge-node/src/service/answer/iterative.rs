//! What the edge's iterative endpoints (`/v1/ralm`, `/v1/spechop`) share: the model they
//! step (loaded here, or a llama.cpp engine) behind the answers' queue, the cloud as their
//! exact retriever, and stopping a run whose client left.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use hasten_engine::EngineLm;
use hasten_lm::LanguageModel;
use hasten_rag::RagError;
use hasten_spec_retrieval::hop::{Action, Hop, HopAgent};
use hasten_spec_retrieval::ralm::{RalmSettings, RalmStepper, StepTokens};
use hasten_spec_retrieval::{RetrievedDocument, SpecError, StepError, StepResult};

use super::AnswerService;
use super::metrics::AnswerMetrics;
use crate::api::EdgeError;
use crate::fallback::CloudDocument;
use crate::fallback::quic::QuicCloudClient;
use crate::retrieval::{EngineError, RetrievalEngine};
use crate::service::retrieve::EdgeService;
use crate::tenants::Tenant;

/// What iterative requests generate with, step by step.
#[derive(Clone)]
pub enum IterativeModel {
    /// The model loaded in this process (`lm_model`).
    Local(Arc<LanguageModel>),
    /// An engine that takes and returns token ids (llama.cpp's server, `lm_engine_url`):
    /// `/v1/ralm` only so far.
    Engine(Arc<EngineLm>),
}

/// The edge's retrieval engine, for a blocking thread that must wait on the runtime where
/// the QUIC connection and its timers are driven.
#[derive(Clone)]
pub(super) struct EngineHandle {
    pub engine: Arc<RetrievalEngine<QuicCloudClient>>,
    pub runtime: tokio::runtime::Handle,
}

impl EngineHandle {
    /// Runs `work` as a task on the edge's runtime and waits for its result on this
    /// (blocking) thread.
    pub fn block_on<T, F>(
        &self,
        work: impl FnOnce(Arc<RetrievalEngine<QuicCloudClient>>) -> F,
    ) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let task = work(Arc::clone(&self.engine));
        let (answer, answered) = sync_channel(1);
        self.runtime.spawn(async move {
            // The request may have given up; nobody is left to tell.
            let _ = answer.send(task.await);
        });
        answered.recv().map_err(|_| EngineError::TaskLost)
    }
}

pub(super) fn retrieved(document: CloudDocument) -> RetrievedDocument {
    RetrievedDocument {
        id: document.id,
        score: document.score,
        title: document.title.into(),
        text: document.text.into(),
        vector: document.vector.into(),
    }
}

/// A failed run (or step) as the edge reports it: its retrievers' failures as fallbacks
/// report them.
pub(super) fn edge_error(error: impl Into<SpecError<EngineError>>) -> EdgeError {
    match error.into() {
        SpecError::Retrieval(engine) | SpecError::Speculation(engine) => EdgeError::from(engine),
        SpecError::Step(StepError::Lm(error)) => EdgeError::Generation(RagError::Lm(error)),
        SpecError::Step(StepError::Cancelled) => EdgeError::Generation(RagError::Cancelled),
        SpecError::Step(StepError::Generation {
            endpoint,
            retryable,
            source,
        }) => {
            let error = RagError::Worker {
                endpoint,
                retryable,
                source,
            };
            if retryable {
                EdgeError::GenerationUnavailable(error)
            } else {
                EdgeError::Generation(error)
            }
        }
        other => EdgeError::IterativeFailed(other),
    }
}

/// Whether the request that started a run went away (its client disconnected); the run
/// stops before its next step, giving the model to the next request.
#[derive(Clone, Default)]
pub(super) struct Departure(Arc<AtomicBool>);

impl Departure {
    fn check(&self) -> StepResult<()> {
        if self.0.load(Ordering::Relaxed) {
            Err(StepError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Marks the run's [`Departure`] and counts the cancellation when the request's future is
/// dropped before it finished (waiting in the queue or generating).
struct LeaveGuard {
    departure: Departure,
    metrics: Arc<AnswerMetrics>,
    finished: bool,
}

impl Drop for LeaveGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.departure.0.store(true, Ordering::Relaxed);
            self.metrics.observe_cancelled();
        }
    }
}

/// A RaLM stepper or a hop agent that stops at its next step once its request left.
pub(super) struct Cancellable<'a, T: ?Sized> {
    pub inner: &'a T,
    pub departure: &'a Departure,
}

impl<T: RalmStepper + ?Sized> RalmStepper for Cancellable<'_, T> {
    fn settings(&self) -> &RalmSettings {
        self.inner.settings()
    }

    fn query_text(&self, generated: &[u32]) -> StepResult<String> {
        self.inner.query_text(generated)
    }

    fn step(&self, document: &RetrievedDocument, generated: &[u32]) -> StepResult<StepTokens> {
        self.departure.check()?;
        self.inner.step(document, generated)
    }

    fn text(&self, generated: &[u32]) -> StepResult<String> {
        self.inner.text(generated)
    }
}

impl<T: HopAgent + ?Sized> HopAgent for Cancellable<'_, T> {
    fn act(&self, question: &str, hops: &[Hop], must_answer: bool) -> StepResult<Action> {
        self.departure.check()?;
        self.inner.act(question, hops, must_answer)
    }

    fn read(
        &self,
        question: &str,
        hops: &[Hop],
        query: &str,
        documents: &[RetrievedDocument],
    ) -> StepResult<String> {
        self.departure.check()?;
        self.inner.read(question, hops, query, documents)
    }
}

/// What a run gets besides its input.
pub(super) struct RunContext<'a> {
    pub model: &'a IterativeModel,
    pub service: &'a EdgeService,
    pub engine: EngineHandle,
    pub departure: &'a Departure,
}

impl AnswerService {
    /// Runs `work` on the iterative model, on a blocking thread, once the answers' queue
    /// admits it; returns its result and the milliseconds it queued. Dropping the returned
    /// future (the client left) stops the run before its next step and frees its place.
    pub(super) async fn on_iterative_model<T: Send + 'static>(
        &self,
        tenant: &Tenant,
        work: impl FnOnce(RunContext<'_>) -> Result<T, EdgeError> + Send + 'static,
    ) -> Result<(T, f64), EdgeError> {
        let model = self.iterative.clone().ok_or(EdgeError::NoLanguageModel(
            "iterative RAG runs on a model loaded here (`lm_model`) or on a llama.cpp engine \
             (`lm_engine_url`)",
        ))?;
        if let IterativeModel::Engine(engine) = &model
            && !engine.steps_token_ids()
        {
            return Err(EdgeError::NoLanguageModel(
                "iterative RAG on an engine steps through token ids, which only llama.cpp's \
                 server takes here: this edge's engine is another, or was not reached yet",
            ));
        }
        let started = Instant::now();
        let place = self.tenant_place(tenant)?;
        let admission = self.queue.admit().map_err(super::queue_error)?;
        let mut guard = LeaveGuard {
            departure: Departure::default(),
            metrics: Arc::clone(&self.metrics),
            finished: false,
        };
        let permit = admission.ready().await.map_err(super::queue_error)?;
        let queued_ms = started.elapsed().as_secs_f64() * 1e3;
        let service = self.retrieval.clone();
        let engine = EngineHandle {
            engine: Arc::clone(service.engine()),
            runtime: tokio::runtime::Handle::current(),
        };
        let departure = guard.departure.clone();
        let output = tokio::task::spawn_blocking(move || {
            let _held = (permit, place);
            work(RunContext {
                model: &model,
                service: &service,
                engine,
                departure: &departure,
            })
        })
        .await;
        guard.finished = true;
        Ok((output.map_err(EdgeError::TaskFailed)??, queued_ms))
    }
}
