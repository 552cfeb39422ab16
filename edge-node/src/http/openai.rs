//! OpenAI-compatible chat completions, retrieval-augmented: `POST /v1/chat/completions`
//! (streaming and not) and `GET /v1/models`, so that the clients people already use (OpenAI
//! SDKs, LangChain, LlamaIndex) talk to Hasten unchanged. The last user message is the
//! question the model answers, with the system messages and earlier turns in its prompt;
//! retrieval runs on a standalone question ([`crate::service::answer::chat`]). The model name picks the mode
//! (`hasten-rag` standard, `hasten-rag-speculative` Speculative RAG). Errors have OpenAI's
//! shape (`{"error": {"message", "type", "param", "code"}}`), refusals come before the
//! reply starts, and a client that leaves cancels its generation.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::stream::{self, StreamExt};
use hasten_rag::{AnswerMode, Decoding};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::answer::finish_reason;
use crate::api::answer::StopJson;
use crate::api::json::parse_json_object;
use crate::api::{EdgeError, InvalidArgument};
use crate::http::embeddings::EMBEDDING_MODEL;
use crate::http::{
    BodyLimits, client_timeout, openai_error, openai_error_response, read_json_bytes,
};
use crate::service::answer::chat::{ChatMessageJson, read_messages, retrieval_query};
use crate::service::answer::{AnswerEvent, AnswerInput, AnswerService, Answered};

/// The models `/v1/models` lists: one per answer mode.
pub const STANDARD_MODEL: &str = "hasten-rag";
pub const SPECULATIVE_MODEL: &str = "hasten-rag-speculative";

#[derive(Clone)]
struct ChatState {
    service: AnswerService,
    body: BodyLimits,
}

/// `POST /v1/chat/completions` and `GET /v1/models`.
pub fn chat_routes(service: AnswerService, body: BodyLimits) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .with_state(ChatState { service, body })
}

/// The fields Hasten reads. Fields that change what is generated and that Hasten cannot do
/// are refused by name ([`unsupported`]); the rest (`user`, `metadata`, ...) are accepted
/// and ignored as an OpenAI server ignores what does not apply.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessageJson>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<StopJson>,
    n: Option<i64>,
    tools: Option<Value>,
    functions: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<Value>,
    response_format: Option<Value>,
    /// Hasten's extension: documents to retrieve (`k`).
    k: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

impl Usage {
    fn of(answered: &Answered) -> Self {
        let answer = &answered.answer;
        Self {
            prompt_tokens: answer.prompt_tokens,
            completion_tokens: answer.generated_tokens,
            total_tokens: answer.prompt_tokens + answer.generated_tokens,
        }
    }
}

/// The first field of the request that asks for something Hasten does not generate.
fn unsupported(request: &ChatRequest) -> Option<InvalidArgument> {
    let non_empty = |value: &Option<Value>| {
        value.as_ref().is_some_and(|v| match v {
            Value::Null => false,
            Value::Array(items) => !items.is_empty(),
            Value::Object(fields) => !fields.is_empty(),
            _ => true,
        })
    };
    let refuse = |field: &str, message: &str| Some(InvalidArgument::new(field, message));
    if request.n.is_some_and(|n| n != 1) {
        return refuse("n", "only one choice (n = 1) is generated");
    }
    if non_empty(&request.tools) || non_empty(&request.functions) {
        let field = if non_empty(&request.tools) {
            "tools"
        } else {
            "functions"
        };
        return refuse(field, "tool calling is not supported");
    }
    if request.logprobs == Some(true) || request.top_logprobs.is_some_and(|n| n > 0) {
        return refuse("logprobs", "log-probabilities are not returned");
    }
    for (field, value) in [
        ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return refuse(field, "repetition penalties are not supported; send 0");
        }
    }
    if non_empty(&request.logit_bias) {
        return refuse("logit_bias", "is not supported");
    }
    let format = request.response_format.as_ref().map(|f| &f["type"]);
    if format.is_some_and(|kind| !kind.is_null() && kind != "text") {
        return refuse("response_format", "only `text` answers are generated");
    }
    if request.stream_options.is_some() && !request.stream {
        return refuse("stream_options", "is only allowed with `stream: true`");
    }
    None
}

/// The models this edge can serve: one per answer mode its backend answers in, and its
/// encoder for `/v1/embeddings`.
async fn models(State(state): State<ChatState>) -> axum::Json<Value> {
    let model = |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "hasten"});
    let served: Vec<Value> = [
        (STANDARD_MODEL, AnswerMode::Standard),
        (SPECULATIVE_MODEL, AnswerMode::Speculative),
    ]
    .into_iter()
    .filter(|(_, mode)| state.service.serves(*mode))
    .map(|(id, _)| model(id))
    .chain(std::iter::once(model(EMBEDDING_MODEL)))
    .collect();
    axum::Json(json!({"object": "list", "data": served}))
}

/// The request as an answer's input; errors name the request's field.
fn chat_input(
    service: &AnswerService,
    request: &ChatRequest,
    mode: AnswerMode,
) -> Result<AnswerInput, InvalidArgument> {
    if let Some(invalid) = unsupported(request) {
        return Err(invalid);
    }
    let conversation = read_messages(&request.messages)?;
    let query = retrieval_query(&conversation, service.limits().max_question_chars);
    Ok(AnswerInput {
        question: conversation.question,
        query,
        conversation: conversation.earlier,
        k: request.k,
        mode,
        max_tokens: service.max_tokens(request.max_completion_tokens.or(request.max_tokens))?,
        decoding: Decoding {
            temperature: request.temperature.unwrap_or(0.0),
            top_p: request.top_p.unwrap_or(1.0),
            seed: request.seed.unwrap_or(0),
            stop: request
                .stop
                .clone()
                .map(StopJson::into_strings)
                .unwrap_or_default(),
        },
    })
}

/// A refusal as the chat API names its fields: the prompt's fit is the `messages`'.
fn chat_error(error: EdgeError) -> EdgeError {
    match error {
        EdgeError::InvalidArgument(mut invalid) => {
            invalid.field = match invalid.field.as_str() {
                "question" | "documents" => "messages".into(),
                "max_new_tokens" => "max_tokens".into(),
                _ => invalid.field,
            };
            EdgeError::InvalidArgument(invalid)
        }
        other => other,
    }
}

async fn chat_completions(
    State(state): State<ChatState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request = match read_request(&headers, body, state.body).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    let mode = match request.model.as_str() {
        STANDARD_MODEL => AnswerMode::Standard,
        SPECULATIVE_MODEL => AnswerMode::Speculative,
        other => return model_not_found(other),
    };
    if !state.service.serves(mode) {
        return model_not_found(&request.model);
    }
    let input = chat_input(&state.service, &request, mode).map_err(EdgeError::from);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let prepared = match state
        .service
        .prepare(authorization, client_timeout(&headers), input)
        .await
    {
        Ok(prepared) => prepared,
        Err(error) => return openai_error_response(chat_error(error)),
    };
    let id = completion_id();
    let created = unix_seconds();
    let events = match state.service.stream(prepared).await {
        Ok(events) => events,
        Err(error) => return openai_error_response(error),
    };
    if !request.stream {
        return match events.answered().await {
            Ok(answered) => {
                axum::Json(completion(&id, created, &request.model, answered)).into_response()
            }
            Err(error) => openai_error_response(error),
        };
    }
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|options| options.include_usage);
    let chunks = ChunkWriter {
        id,
        created,
        model: request.model,
        include_usage,
    };
    let events = events.flat_map(move |event| stream::iter(chunks.events(event)));
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

fn model_not_found(model: &str) -> Response {
    openai_error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("model"),
        "model_not_found",
        format!(
            "the model `{model}` does not exist on this edge; `GET /v1/models` lists those it serves"
        ),
    )
}

/// Writes an answer's events as `chat.completion.chunk` events.
struct ChunkWriter {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl ChunkWriter {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn events(&self, event: AnswerEvent) -> Vec<Event> {
        match event {
            AnswerEvent::Documents(_) => {
                vec![data_event(
                    &self.chunk(json!({"role": "assistant", "content": ""}), None),
                )]
            }
            AnswerEvent::Delta(text) => {
                vec![data_event(&self.chunk(json!({"content": text}), None))]
            }
            AnswerEvent::Done(answered) => {
                let finish = finish_reason(answered.answer.finish);
                let usage = Usage::of(&answered);
                let mut last = self.chunk(json!({}), Some(finish));
                // Hasten's extension, as on a whole completion: how retrieval went and where
                // the time went (clients ignore fields they do not know). The documents were
                // the stream's first event; they are not converted again here.
                last["hasten"] = json!({
                    "retrieval": super::answer::outcome(&answered),
                    "query": answered.query,
                    "prompt_tokens": answered.answer.prompt_tokens,
                    "timings": super::answer::timings(&answered),
                });
                let mut events = vec![data_event(&last)];
                if self.include_usage {
                    let usage = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage,
                    });
                    events.push(data_event(&usage));
                }
                events.push(Event::default().data("[DONE]"));
                events
            }
            AnswerEvent::Failed(error) => vec![
                data_event(&json!({"error": {
                    "message": error.to_string(), "type": "server_error", "code": error.kind(),
                }})),
                Event::default().data("[DONE]"),
            ],
        }
    }
}

fn data_event(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

async fn read_request(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<ChatRequest, Response> {
    let bytes = read_json_bytes(headers, body, limits)
        .await
        .map_err(openai_error_response)?;
    parse_json_object(&bytes).map_err(|invalid| openai_error_response(invalid.into()))
}

fn completion(id: &str, created: u64, model: &str, answered: Answered) -> Value {
    let finish = finish_reason(answered.answer.finish);
    let usage = Usage::of(&answered);
    let reply = super::answer::reply(answered);
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.answer},
            "finish_reason": finish,
        }],
        "usage": usage,
        // Hasten's extension: what the answer was written from, and where the time went.
        "hasten": {
            "retrieval": reply.retrieval,
            "query": reply.query,
            "documents": reply.documents,
            "used": reply.used,
            "prompt_tokens": reply.prompt_tokens,
            "drafting": reply.drafting,
            "dropped_turns": reply.dropped_turns,
            "notes": reply.notes,
            "timings": reply.timings,
        },
    })
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A completion id unique within this process and across restarts.
fn completion_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "chatcmpl-{nanos:x}{:x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
