//! [`EngineLm`]: standard RAG through an engine's streamed chat completions, Speculative RAG
//! through a drafter engine and a verifier engine ([`crate::speculative`]).

use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hasten_rag::prompt::standard_messages;
use hasten_rag::rewrite::{REWRITE_TOKENS, rewrite_messages, standalone_question};
use hasten_rag::stop::StopStrings;
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, AnswerSink, AnswerTimings, BackendInfo, ChatMessage,
    ChatTurn, Decoding, Document, DraftingTokens, Finish, LmBackend, RagError,
};
use tokio::runtime::Handle;

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::routes::EngineRoutes;
use crate::scoring::Scoring;
use crate::speculative::{Engines, draft_all, judge_and_answer};
use crate::wire::{self, ChatRequest, ModelList, StreamOptions, Usage};

/// How often a call in flight looks whether its caller went away.
const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// An engine's API key: read from configuration, sent as a bearer token, shown nowhere.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where the engines are and how to call them.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// Base URL of the engine's OpenAI API, `/v1` included (`http://vllm:8000/v1`): it
    /// answers in standard mode and verifies Speculative RAG's drafts.
    pub url: String,
    /// The model the engine serves, as its `/v1/models` names it.
    pub model: String,
    /// The engine that writes Speculative RAG's drafts (a smaller model); `url` when absent.
    pub drafter_url: Option<String>,
    /// The drafter engine's model; `model` when absent.
    pub drafter_model: Option<String>,
    /// Sent as a bearer token to both engines; never logged.
    pub api_key: Option<ApiKey>,
    /// Longest wait for an engine's next bytes: the connection, a reply's head, each
    /// streamed chunk. An engine silent for longer is treated as down.
    pub timeout: Duration,
    /// PEM file of the CA that signed the engines' certificates, beside the system's roots.
    pub ca_file: Option<PathBuf>,
}

pub struct EngineLm {
    generation: Endpoint,
    drafter: Endpoint,
    /// Found once by [`EngineLm::detect_scoring`]; until then speculative mode is not served.
    scoring: OnceLock<Scoring>,
    /// The runtime the HTTP calls run on; [`LmBackend::answer`] blocks on it, so it is
    /// called from a blocking thread (`spawn_blocking`), as the edge does.
    runtime: Handle,
}

impl std::fmt::Debug for EngineLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLm")
            .field("engine", &self.generation.base)
            .field("model", &self.generation.model)
            .field("drafter", &self.drafter.base)
            .field("scoring", &self.scoring.get())
            .finish()
    }
}

/// Idle pooled connections are dropped before the engines' servers close them: llama.cpp's
/// server (cpp-httplib) and uvicorn (vLLM, SGLang) close an idle keep-alive connection after
/// 5 s, and a request sent on one at that moment fails with "connection closed before message
/// completed" (seen in CI as a 503 on a speculative answer).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

impl EngineLm {
    /// A client of the engines; nothing is called until the first answer, [`EngineLm::probe`]
    /// or [`EngineLm::detect_scoring`]. Call within a tokio runtime.
    pub fn new(settings: EngineSettings) -> Result<Self, EngineError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(settings.timeout)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT);
        if let Some(path) = &settings.ca_file {
            let pem = std::fs::read(path).map_err(|source| EngineError::CaFile {
                path: path.display().to_string(),
                source,
            })?;
            let ca = reqwest::Certificate::from_pem(&pem).map_err(EngineError::Client)?;
            builder = builder.add_root_certificate(ca);
        }
        let http = builder.build().map_err(EngineError::Client)?;
        let key = settings.api_key.map(|key| key.0);
        let drafter = Endpoint::new(
            http.clone(),
            settings.drafter_url.as_deref().unwrap_or(&settings.url),
            settings
                .drafter_model
                .unwrap_or_else(|| settings.model.clone()),
            key.clone(),
            settings.timeout,
        );
        Ok(Self {
            generation: Endpoint::new(http, &settings.url, settings.model, key, settings.timeout),
            drafter,
            scoring: OnceLock::new(),
            runtime: Handle::current(),
        })
    }

    pub fn url(&self) -> &str {
        &self.generation.base
    }

    /// The models the engine lists (`GET /models`): whether it is up, and serves ours.
    pub async fn probe(&self) -> Result<Vec<String>, EngineError> {
        let url = format!("{}/models", self.generation.base);
        let list: ModelList = self.generation.get_json(&url).await?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    /// Finds, once, how the verifier engine scores drafts, which decides whether speculative
    /// mode is served. An engine that cannot be reached is an error (ask again later).
    pub async fn detect_scoring(&self) -> Result<Scoring, EngineError> {
        if let Some(scoring) = self.scoring.get() {
            return Ok(scoring.clone());
        }
        let scoring = Scoring::detect(&self.generation).await?;
        tracing::info!(engine = %self.generation.base, %scoring, "speculative scoring detected");
        Ok(self.scoring.get_or_init(|| scoring).clone())
    }

    /// The engine's failure as the answer's.
    fn failed(&self, error: EngineError) -> RagError {
        error.into_answer_error(&self.generation.base)
    }

    /// Runs `work` until it ends, giving up as soon as the caller leaves (which drops the
    /// engine requests in flight, closing them upstream). Deadlines are the work's own.
    async fn guarded<T>(
        &self,
        sink: &dyn AnswerSink,
        work: impl Future<Output = T>,
    ) -> Result<T, RagError> {
        // Asked first too: a stream whose chunks come faster than the check's period would
        // otherwise never reach the watcher's first look.
        if sink.cancelled() {
            return Err(RagError::Cancelled);
        }
        let left = async {
            loop {
                tokio::time::sleep(CANCEL_CHECK).await;
                if sink.cancelled() {
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            () = left => Err(RagError::Cancelled),
            outcome = work => Ok(outcome),
        }
    }

    async fn answer_standard(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        let started = Instant::now();
        let documents: Vec<&Document> = request.documents.iter().collect();
        let messages = standard_messages(&request.question, &documents, &request.conversation);
        let completion = self
            .complete(&messages, request.max_new_tokens, &request.decoding, sink)
            .await?;
        let total = started.elapsed();
        let first_token = completion.first_text.unwrap_or(total);
        Ok(Answer {
            text: completion.text.trim().to_string(),
            rationale: None,
            documents_used: (0..request.documents.len()).collect(),
            drafts: Vec::new(),
            timings: AnswerTimings {
                // The engine reads the prompt and writes the first token in one wait.
                prefill: first_token,
                first_token,
                decode: total.saturating_sub(first_token),
                verify: Duration::ZERO,
                total,
                kv: None,
            },
            prompt_tokens: completion.usage.map_or(0, |u| u.prompt_tokens),
            // Without usage, one streamed delta is about one token.
            generated_tokens: completion
                .usage
                .map_or(completion.deltas, |u| u.completion_tokens),
            finish: completion.finish,
            drafting: DraftingTokens::default(),
            dropped_turns: 0,
        })
    }

    /// One chat completion on the answering engine, its text streamed to `sink` as it
    /// comes; the caller leaving closes the request.
    async fn complete(
        &self,
        messages: &[ChatMessage],
        max_tokens: usize,
        decoding: &Decoding,
        sink: &mut dyn AnswerSink,
    ) -> Result<Completion, RagError> {
        let started = Instant::now();
        let body = ChatRequest {
            model: &self.generation.model,
            messages: wire::messages(messages),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            max_tokens,
            temperature: decoding.temperature,
            top_p: decoding.top_p,
            seed: decoding.seed,
            stop: &decoding.stop,
            logprobs: false,
            top_logprobs: None,
        };
        let mut events = self
            .guarded(&*sink, self.generation.chat_stream(&body))
            .await?
            .map_err(|error| self.failed(error))?;
        // The engine applies the stop strings too; this also ends the answer with an engine
        // that ignores them, and closes the request when it does.
        let mut stops = StopStrings::new(&decoding.stop);
        let mut completion = Completion::default();
        let mut engine_finish: Option<String> = None;
        loop {
            let Some(chunk) = self
                .guarded(&*sink, events.next())
                .await?
                .map_err(|error| self.failed(error))?
            else {
                break;
            };
            completion.usage = chunk.usage.or(completion.usage);
            let Some(choice) = chunk.choices.into_iter().next() else {
                continue;
            };
            if let Some(reason) = choice.finish_reason {
                engine_finish = Some(reason);
            }
            let Some(delta) = choice.delta.content.filter(|d| !d.is_empty()) else {
                continue;
            };
            completion.deltas += 1;
            let released = stops.push(&delta);
            if !released.is_empty() {
                completion
                    .first_text
                    .get_or_insert_with(|| started.elapsed());
                sink.text(&released);
                completion.text.push_str(&released);
            }
            if stops.stopped() {
                break;
            }
        }
        let stopped_by_string = stops.stopped();
        if engine_finish.is_none() && !stopped_by_string {
            return Err(self.failed(EngineError::Reply {
                url: events.url,
                message: "the stream ended before the answer did".into(),
            }));
        }
        let rest = stops.finish();
        if !rest.is_empty() {
            completion
                .first_text
                .get_or_insert_with(|| started.elapsed());
            sink.text(&rest);
            completion.text.push_str(&rest);
        }
        completion.finish = match engine_finish.as_deref() {
            Some("length") if !stopped_by_string => Finish::Length,
            _ => Finish::Stop,
        };
        Ok(completion)
    }

    async fn answer_speculative(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        let started = Instant::now();
        let scoring = self
            .detect_scoring()
            .await
            .map_err(|error| self.failed(error))?;
        let engines = Engines {
            drafter: &self.drafter,
            verifier: &self.generation,
            scoring: &scoring,
        };
        let drafted = self.guarded(&*sink, draft_all(&engines, request)).await??;
        let answer = self
            .guarded(
                &*sink,
                judge_and_answer(&engines, request, drafted, started),
            )
            .await??;
        if !answer.text.is_empty() {
            sink.text(&answer.text);
        }
        Ok(answer)
    }

    /// The answering engine's token routes, as its scoring was detected.
    pub(crate) fn routes(&self) -> Result<EngineRoutes<'_>, EngineError> {
        match self.scoring.get() {
            Some(scoring) => EngineRoutes::new(&self.generation, scoring),
            None => EngineRoutes::new(
                &self.generation,
                &Scoring::Unavailable("not reached yet".into()),
            ),
        }
    }

    /// The runtime the engine calls run on, for blocking callers.
    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Iterative RAG's steps for `question` on the engine (`/v1/ralm`).
    pub fn ralm(
        &self,
        question: &str,
        settings: hasten_spec_retrieval::ralm::RalmSettings,
    ) -> Result<crate::ralm::EngineRalm<'_>, hasten_spec_retrieval::StepError> {
        self.takes_token_ids()?;
        crate::ralm::EngineRalm::new(self, question, settings)
    }

    /// A multi-hop agent with `hops` hops on the engine (`/v1/spechop`).
    pub fn hop_agent(
        &self,
        hops: usize,
    ) -> Result<crate::hop::EngineHopAgent<'_>, hasten_spec_retrieval::StepError> {
        self.takes_token_ids()?;
        Ok(crate::hop::EngineHopAgent::new(self, hops))
    }

    /// Whether iterative and multi-hop RAG can step on the engine: they go through token
    /// ids, which llama.cpp's server and vLLM's take and return (known once it was reached).
    pub fn steps_token_ids(&self) -> bool {
        self.scoring.get().is_some_and(Scoring::scores_prompts)
    }

    fn takes_token_ids(&self) -> Result<(), hasten_spec_retrieval::StepError> {
        if self.steps_token_ids() {
            return Ok(());
        }
        Err(hasten_spec_retrieval::StepError::InvalidRequest(
            "iterative and multi-hop RAG on an engine need llama.cpp's or vLLM's server (token \
             ids in and out), and this edge's engine is neither or was not reached yet"
                .into(),
        ))
    }

    /// The verifier engine's verdicts on `(rationale, answer)` drafts of `question`, as
    /// speculative mode computes them.
    pub async fn verify(
        &self,
        question: &str,
        drafts: &[(&str, &str)],
    ) -> Result<hasten_rag::verify::Verification, EngineError> {
        let scoring = self.detect_scoring().await?;
        crate::speculative::verify(&self.generation, &scoring, question, drafts).await
    }
}

/// What one chat completion gave.
#[derive(Default)]
struct Completion {
    text: String,
    finish: Finish,
    usage: Option<Usage>,
    /// Text chunks streamed (about one token each).
    deltas: usize,
    first_text: Option<Duration>,
}

impl LmBackend for EngineLm {
    fn answer(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        request.validate()?;
        let _span = tracing::info_span!(
            "engine_answer",
            engine = %self.generation.base,
            mode = ?request.mode,
            documents = request.documents.len()
        )
        .entered();
        match request.mode {
            AnswerMode::Standard => self.runtime.block_on(self.answer_standard(request, sink)),
            AnswerMode::Speculative if self.serves(AnswerMode::Speculative) => self
                .runtime
                .block_on(self.answer_speculative(request, sink)),
            AnswerMode::Speculative => Err(RagError::InvalidRequest {
                field: "mode",
                message: format!(
                    "speculative is not served by this edge's generation engine ({})",
                    self.scoring
                        .get()
                        .map_or_else(|| "not reached yet".to_string(), ToString::to_string)
                ),
            }),
        }
    }

    fn rewrite_query(
        &self,
        conversation: &[ChatTurn],
        question: &str,
    ) -> Option<Result<String, RagError>> {
        let messages = rewrite_messages(conversation, question);
        let completion = self.runtime.block_on(self.complete(
            &messages,
            REWRITE_TOKENS,
            &Decoding::default(),
            &mut |_: &str| {},
        ));
        Some(completion.and_then(|completion| {
            standalone_question(&completion.text).ok_or(RagError::Rewrite(completion.text))
        }))
    }

    fn serves(&self, mode: AnswerMode) -> bool {
        match mode {
            AnswerMode::Standard => true,
            AnswerMode::Speculative => self.scoring.get().is_some_and(Scoring::scores_prompts),
        }
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            drafter: self.drafter.model.clone(),
            verifier: self.generation.model.clone(),
            device: format!(
                "engine {} (drafts on {}; speculative scoring: {})",
                self.generation.base,
                self.drafter.base,
                self.scoring
                    .get()
                    .map_or_else(|| "not detected yet".to_string(), ToString::to_string)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_key_is_never_printed() {
        let settings = EngineSettings {
            url: "http://e/v1".into(),
            model: "m".into(),
            drafter_url: None,
            drafter_model: None,
            api_key: Some(ApiKey::new("sk-very-secret")),
            timeout: Duration::from_secs(1),
            ca_file: None,
        };
        assert!(!format!("{settings:?}").contains("sk-very-secret"));
    }
}
