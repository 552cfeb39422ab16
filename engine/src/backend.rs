//! [`EngineLm`]: standard RAG through an engine's streamed chat completions.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use hasten_rag::prompt::standard_messages;
use hasten_rag::stop::StopStrings;
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, AnswerSink, AnswerTimings, BackendInfo, Document,
    DraftingTokens, Finish, LmBackend, RagError,
};
use tokio::runtime::Handle;

use crate::error::EngineError;
use crate::wire::{ChatChunk, ChatRequest, ErrorReply, Message, ModelList, StreamOptions, Usage};

/// How often a call in flight looks whether its caller went away.
const CANCEL_CHECK: Duration = Duration::from_millis(50);
/// Most characters of an engine's error body kept in a message.
const ERROR_BODY_CHARS: usize = 400;

/// An engine's API key: read from configuration, sent as a bearer token, shown nowhere.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// Where the engine is and how to call it.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// Base URL of the engine's OpenAI API, `/v1` included (`http://vllm:8000/v1`).
    pub url: String,
    /// The model the engine serves, as its `/v1/models` names it.
    pub model: String,
    /// Sent as a bearer token; never logged.
    pub api_key: Option<ApiKey>,
    /// Longest wait for the engine's next bytes: the connection, the reply's head, each
    /// streamed chunk. An engine silent for longer is treated as down.
    pub timeout: Duration,
    /// PEM file of the CA that signed the engine's certificate, beside the system's roots.
    pub ca_file: Option<PathBuf>,
}

pub struct EngineLm {
    settings: EngineSettings,
    http: reqwest::Client,
    /// The runtime the HTTP calls run on; [`LmBackend::answer`] blocks on it, so it is
    /// called from a blocking thread (`spawn_blocking`), as the edge does.
    runtime: Handle,
}

impl std::fmt::Debug for EngineLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLm")
            .field("settings", &self.settings)
            .finish()
    }
}

impl EngineLm {
    /// A client of the engine; nothing is called until the first answer or
    /// [`EngineLm::probe`]. Call within a tokio runtime.
    pub fn new(mut settings: EngineSettings) -> Result<Self, EngineError> {
        settings.url = settings.url.trim_end_matches('/').to_string();
        let mut builder = reqwest::Client::builder().connect_timeout(settings.timeout);
        if let Some(path) = &settings.ca_file {
            let pem = std::fs::read(path).map_err(|source| EngineError::CaFile {
                path: path.display().to_string(),
                source,
            })?;
            let ca = reqwest::Certificate::from_pem(&pem).map_err(EngineError::Client)?;
            builder = builder.add_root_certificate(ca);
        }
        Ok(Self {
            http: builder.build().map_err(EngineError::Client)?,
            settings,
            runtime: Handle::current(),
        })
    }

    pub fn url(&self) -> &str {
        &self.settings.url
    }

    /// The models the engine lists (`GET /models`): whether it is up, and serves ours.
    pub async fn probe(&self) -> Result<Vec<String>, EngineError> {
        let url = format!("{}/models", self.settings.url);
        let call = async {
            let response = self
                .authorized(self.http.get(&url))
                .send()
                .await
                .map_err(|source| http_error(&url, source))?;
            let response = success(&url, response).await?;
            response
                .json::<ModelList>()
                .await
                .map_err(|source| EngineError::Reply {
                    url: url.clone(),
                    message: source.to_string(),
                })
        };
        let list = tokio::time::timeout(self.settings.timeout, call)
            .await
            .map_err(|_| self.timed_out(&url))??;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.settings.api_key {
            Some(key) => request.bearer_auth(&key.0),
            None => request,
        }
    }

    fn timed_out(&self, url: &str) -> EngineError {
        EngineError::Timeout {
            url: url.to_string(),
            seconds: self.settings.timeout.as_secs_f64(),
        }
    }

    /// The engine's failure as the answer's: a refused prompt is the request's error (the
    /// engine alone knows whether it fits its context); anything else is the engine's,
    /// retryable when it is down, busy or slow.
    fn failed(&self, error: EngineError) -> RagError {
        if let EngineError::Status {
            status: 400,
            message,
            ..
        } = &error
        {
            return RagError::InvalidRequest {
                field: "messages",
                message: format!("were refused by the generation engine: {message}"),
            };
        }
        tracing::warn!(engine = %self.settings.url, error = %error, "generation engine failed");
        RagError::Worker {
            endpoint: self.settings.url.clone(),
            retryable: error.is_retryable(),
            source: Box::new(error),
        }
    }

    /// Runs `work` for at most the call's deadline, giving up as soon as the caller leaves
    /// (which drops the request, closing it upstream).
    async fn guarded<T>(
        &self,
        url: &str,
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
            outcome = tokio::time::timeout(self.settings.timeout, work) => {
                outcome.map_err(|_| self.failed(self.timed_out(url)))
            }
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
        let body = ChatRequest {
            model: &self.settings.model,
            messages: messages
                .iter()
                .map(|m| Message {
                    role: m.role.name(),
                    content: &m.content,
                })
                .collect(),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            max_tokens: request.max_new_tokens,
            temperature: request.decoding.temperature,
            top_p: request.decoding.top_p,
            seed: request.decoding.seed,
            stop: &request.decoding.stop,
        };
        let url = format!("{}/chat/completions", self.settings.url);
        let send = self.authorized(self.http.post(&url)).json(&body).send();
        let response = self
            .guarded(&url, &*sink, send)
            .await?
            .map_err(|source| self.failed(http_error(&url, source)))?;
        let response = self
            .guarded(&url, &*sink, success(&url, response))
            .await?
            .map_err(|error| self.failed(error))?;

        let mut events = response.bytes_stream().eventsource();
        // The engine applies the stop strings too; this also ends the answer with an engine
        // that ignores them, and closes the request when it does.
        let mut stops = StopStrings::new(&request.decoding.stop);
        let mut text = String::new();
        let mut first_text: Option<Duration> = None;
        let mut engine_finish: Option<String> = None;
        let mut usage: Option<Usage> = None;
        let mut deltas = 0usize;
        loop {
            let Some(event) = self.guarded(&url, &*sink, events.next()).await? else {
                if engine_finish.is_none() {
                    return Err(self.failed(EngineError::Reply {
                        url,
                        message: "the stream ended before the answer did".into(),
                    }));
                }
                break;
            };
            let event = event.map_err(|source| {
                self.failed(EngineError::Reply {
                    url: url.clone(),
                    message: source.to_string(),
                })
            })?;
            if event.data.trim() == "[DONE]" {
                break;
            }
            let chunk: ChatChunk = serde_json::from_str(&event.data).map_err(|source| {
                self.failed(EngineError::Reply {
                    url: url.clone(),
                    message: format!("{source} in {}", clip(&event.data)),
                })
            })?;
            usage = chunk.usage.or(usage);
            let Some(choice) = chunk.choices.into_iter().next() else {
                continue;
            };
            if let Some(reason) = choice.finish_reason {
                engine_finish = Some(reason);
            }
            let Some(delta) = choice.delta.content.filter(|d| !d.is_empty()) else {
                continue;
            };
            deltas += 1;
            let released = stops.push(&delta);
            if !released.is_empty() {
                first_text.get_or_insert_with(|| started.elapsed());
                sink.text(&released);
                text.push_str(&released);
            }
            if stops.stopped() {
                break;
            }
        }
        let stopped_by_string = stops.stopped();
        let rest = stops.finish();
        if !rest.is_empty() {
            first_text.get_or_insert_with(|| started.elapsed());
            sink.text(&rest);
            text.push_str(&rest);
        }
        let finish = match engine_finish.as_deref() {
            Some("length") if !stopped_by_string => Finish::Length,
            _ => Finish::Stop,
        };
        let total = started.elapsed();
        let first_token = first_text.unwrap_or(total);
        Ok(Answer {
            text: text.trim().to_string(),
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
            },
            prompt_tokens: usage.map_or(0, |u| u.prompt_tokens),
            // Without usage, one streamed delta is about one token.
            generated_tokens: usage.map_or(deltas, |u| u.completion_tokens),
            finish,
            drafting: DraftingTokens::default(),
            dropped_turns: 0,
        })
    }
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
            engine = %self.settings.url,
            documents = request.documents.len()
        )
        .entered();
        match request.mode {
            AnswerMode::Standard => self.runtime.block_on(self.answer_standard(request, sink)),
            AnswerMode::Speculative => Err(RagError::InvalidRequest {
                field: "mode",
                message: "speculative is not served by this edge's generation engine".into(),
            }),
        }
    }

    /// Speculative RAG needs the verifier's log-probabilities of text it did not write,
    /// which this backend does not read from engines yet.
    fn serves(&self, mode: AnswerMode) -> bool {
        mode == AnswerMode::Standard
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            drafter: self.settings.model.clone(),
            verifier: self.settings.model.clone(),
            device: format!("engine {}", self.settings.url),
        }
    }
}

fn http_error(url: &str, source: reqwest::Error) -> EngineError {
    EngineError::Http {
        url: url.to_string(),
        source,
    }
}

/// The response when its status is a success; else the engine's error message.
async fn success(url: &str, response: reqwest::Response) -> Result<reqwest::Response, EngineError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<ErrorReply>(&body)
        .map(|reply| reply.error.message)
        .unwrap_or_else(|_| clip(&body).to_string());
    Err(EngineError::Status {
        url: url.to_string(),
        status: status.as_u16(),
        message,
    })
}

/// At most [`ERROR_BODY_CHARS`] characters of `text`.
fn clip(text: &str) -> &str {
    match text.char_indices().nth(ERROR_BODY_CHARS) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}
