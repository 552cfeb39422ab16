//! What the edge's iterative endpoints (`/v1/ralm`, `/v1/spechop`) share: the model they
//! step (loaded here, or a llama.cpp engine) behind the answers' queue, the cloud as their
//! exact retriever, and their HTTP plumbing.

use std::sync::Arc;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use hasten_engine::EngineLm;
use hasten_lm::LanguageModel;
use hasten_rag::RagError;
use hasten_spec_retrieval::{RetrievalError, RetrievedDocument, SpecError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::AnswerService;
use crate::api::EdgeError;
use crate::api::json::parse_json_object;
use crate::fallback::quic::QuicCloudClient;
use crate::fallback::{CloudDocument, CloudError};
use crate::http::{BodyLimits, read_json_bytes};
use crate::pipeline::EdgeService;
use crate::retrieval::{EngineError, RetrievalEngine};
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
    ) -> Result<T, RetrievalError>
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
        answered
            .recv()
            .map_err(|_| RetrievalError::new("the cloud search task ended without an answer"))
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

/// A failed run as the edge reports it: the cloud's failures as fallbacks report them.
pub(super) fn edge_error(error: SpecError) -> EdgeError {
    match error {
        SpecError::Retrieval(RetrievalError(source)) => match source.downcast::<CloudError>() {
            Ok(cloud) => EdgeError::from(EngineError::Cloud(*cloud)),
            Err(other) => match other.downcast::<EngineError>() {
                Ok(engine) => EdgeError::from(*engine),
                Err(other) => {
                    EdgeError::IterativeFailed(SpecError::Retrieval(RetrievalError(other)))
                }
            },
        },
        SpecError::Lm(error) => EdgeError::Generation(RagError::Lm(error)),
        SpecError::Generation {
            endpoint,
            retryable,
            source,
        } => {
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

impl AnswerService {
    /// Runs `work` on the iterative model, on a blocking thread, once the answers' queue
    /// admits it; returns its result and the milliseconds it queued.
    pub(super) async fn on_iterative_model<T: Send + 'static>(
        &self,
        work: impl FnOnce(&IterativeModel, &EdgeService, EngineHandle) -> Result<T, EdgeError>
        + Send
        + 'static,
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
        let permit = self.queue.enter().await.map_err(super::queue_error)?;
        let queued_ms = started.elapsed().as_secs_f64() * 1e3;
        let service = self.retrieval.clone();
        let engine = EngineHandle {
            engine: Arc::clone(service.engine()),
            runtime: tokio::runtime::Handle::current(),
        };
        let output = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work(&model, &service, engine)
        })
        .await
        .map_err(EdgeError::TaskFailed)??;
        Ok((output, queued_ms))
    }

    /// Authenticates a request and parses its JSON body.
    pub(super) async fn read_request<B: DeserializeOwned>(
        &self,
        headers: &HeaderMap,
        body: Body,
        limits: BodyLimits,
    ) -> Result<(Tenant, B), EdgeError> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let tenant = self
            .retrieval
            .authenticate(authorization)
            .map_err(EdgeError::from)?;
        let bytes = read_json_bytes(headers, body, limits).await?;
        Ok((tenant, parse_json_object(&bytes)?))
    }
}

/// The reply, or the error as JSON (logged when the edge is at fault).
pub(super) fn respond<R: Serialize>(outcome: Result<R, EdgeError>, what: &str) -> Response {
    match outcome {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(error) => {
            if error.is_server_side() {
                tracing::warn!(error = %error, source = ?std::error::Error::source(&error), "{what} failed");
            }
            error.into_response()
        }
    }
}
