//! OpenAI-compatible chat completions, retrieval-augmented: `POST /v1/chat/completions`
//! (streaming and not) and `GET /v1/models`, so that the clients people already use (OpenAI
//! SDKs, LangChain, LlamaIndex) talk to Hasten unchanged. The last user message is the
//! question the edge retrieves for and answers; the model name picks the mode
//! (`hasten-rag` standard, `hasten-rag-speculative` Speculative RAG). Errors have OpenAI's
//! shape (`{"error": {"message", "type", "param", "code"}}`).

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
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::json::{AnswerBody, ModeJson};
use super::{AnswerService, Answered};
use crate::api::json::parse_json_object;
use crate::api::{EdgeError, InvalidArgument};
use crate::http::{BodyLimits, client_timeout, read_json_bytes, status_code};

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

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

/// The fields Hasten reads; clients send many more (temperature, user, ...), which are
/// accepted and ignored as an OpenAI server ignores what it does not support.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    n: Option<i64>,
    /// Hasten's extension: documents to retrieve (`k`).
    #[serde(default)]
    k: Option<i64>,
}

#[derive(Debug, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

/// An OpenAI-shaped error reply.
fn openai_error(
    status: StatusCode,
    kind: &str,
    param: Option<&str>,
    code: &str,
    message: String,
) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    (status, axum::Json(body)).into_response()
}

fn from_edge_error(error: EdgeError) -> Response {
    let status = status_code(&error);
    let (kind, param) = match &error {
        EdgeError::InvalidArgument(invalid) => {
            ("invalid_request_error", Some(invalid.field.clone()))
        }
        EdgeError::Unauthenticated(_) => ("authentication_error", None),
        EdgeError::EdgeBusy(_) | EdgeError::CloudBusy(_) | EdgeError::AnswerQueueFull(_) => {
            ("rate_limit_error", None)
        }
        _ => ("server_error", None),
    };
    let message = match &error {
        EdgeError::InvalidArgument(invalid) => invalid.message.clone(),
        other => other.to_string(),
    };
    openai_error(status, kind, param.as_deref(), error.kind(), message)
}

async fn models() -> axum::Json<Value> {
    let model = |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "hasten"});
    axum::Json(json!({"object": "list", "data": [model(STANDARD_MODEL), model(SPECULATIVE_MODEL)]}))
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
        STANDARD_MODEL => ModeJson::Standard,
        SPECULATIVE_MODEL => ModeJson::Speculative,
        other => {
            return openai_error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                "model_not_found",
                format!(
                    "the model `{other}` does not exist; this edge serves `{STANDARD_MODEL}` and `{SPECULATIVE_MODEL}`"
                ),
            );
        }
    };
    if request.n.is_some_and(|n| n != 1) {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("n"),
            "invalid_argument",
            "only one choice (n = 1) is generated".into(),
        );
    }
    let question = match last_user_message(&request.messages) {
        Ok(question) => question,
        Err(invalid) => return from_edge_error(invalid.into()),
    };
    let body = AnswerBody {
        question: Some(question),
        k: request.k,
        mode,
        max_tokens: request.max_completion_tokens.or(request.max_tokens),
        stream: request.stream,
    };
    let input = state.service.validate(body).map_err(|mut invalid| {
        if invalid.field == "question" {
            invalid.field = "messages".into();
        }
        EdgeError::from(invalid)
    });
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let prepared = match state
        .service
        .prepare(authorization, client_timeout(&headers), input)
        .await
    {
        Ok(prepared) => prepared,
        Err(error) => return from_edge_error(error),
    };
    let id = completion_id();
    let created = unix_seconds();
    let model = request.model;
    let max_tokens = prepared.max_new_tokens();
    if !request.stream {
        return match state.service.generate(prepared, None).await {
            Ok(answered) => {
                axum::Json(completion(&id, created, &model, answered, max_tokens)).into_response()
            }
            Err(error) => from_edge_error(error),
        };
    }
    let (sender, receiver) = mpsc::unbounded_channel();
    let service = state.service.clone();
    let finished = tokio::spawn(async move { service.generate(prepared, Some(sender)).await });
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |delta: Value, finish: Option<&str>| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })
        }
    };
    let first = chunk(json!({"role": "assistant", "content": ""}), None);
    let head = stream::once(async move { data_event(&first) });
    let text_chunk = chunk.clone();
    let deltas = stream::unfold(receiver, move |mut receiver| {
        let text_chunk = text_chunk.clone();
        async move {
            let text = receiver.recv().await?;
            Some((
                data_event(&text_chunk(json!({"content": text}), None)),
                receiver,
            ))
        }
    });
    let tail = stream::once(async move {
        let last = match finished.await {
            Ok(Ok(answered)) => {
                let finish = finish_reason(&answered, max_tokens);
                chunk(json!({}), Some(finish))
            }
            Ok(Err(error)) => json!({"error": {"message": error.to_string(), "type": "server_error", "code": error.kind()}}),
            Err(join) => json!({"error": {"message": join.to_string(), "type": "server_error", "code": "internal"}}),
        };
        stream::iter([data_event(&last), Event::default().data("[DONE]")])
    })
    .flatten();
    Sse::new(head.chain(deltas).chain(tail).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
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
        .map_err(from_edge_error)?;
    parse_json_object(&bytes).map_err(|invalid| from_edge_error(invalid.into()))
}

/// The text of the last user message (string content, or the text parts of an array).
fn last_user_message(messages: &[ChatMessage]) -> Result<String, InvalidArgument> {
    let message = messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .ok_or_else(|| InvalidArgument::new("messages", "needs at least one `user` message"))?;
    match &message.content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter(|part| part["type"] == "text")
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")),
        _ => Err(InvalidArgument::new(
            "messages",
            "a message's `content` must be text",
        )),
    }
}

fn finish_reason(answered: &Answered, max_tokens: usize) -> &'static str {
    if answered.answer.generated_tokens >= max_tokens {
        "length"
    } else {
        "stop"
    }
}

fn completion(id: &str, created: u64, model: &str, answered: Answered, max_tokens: usize) -> Value {
    let finish = finish_reason(&answered, max_tokens);
    let usage = Usage {
        prompt_tokens: answered.answer.prompt_tokens,
        completion_tokens: answered.answer.generated_tokens,
        total_tokens: answered.answer.prompt_tokens + answered.answer.generated_tokens,
    };
    let reply = super::http::reply(answered);
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
            "documents": reply.documents,
            "used": reply.used,
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
