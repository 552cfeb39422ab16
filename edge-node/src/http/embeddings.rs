//! `POST /v1/embeddings`, OpenAI-compatible: the edge's own encoder (all-MiniLM-L6-v2, the
//! vectors its retrieval uses), so that a LangChain or LlamaIndex application can embed its
//! own texts with Hasten too. Texts longer than the encoder's 256 tokens are cut there, as
//! the model was trained. Errors have OpenAI's shape.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::json::parse_json_object;
use crate::api::{EdgeError, InvalidArgument};
use crate::http::{BodyLimits, openai_error_response, read_json_bytes};
use crate::service::retrieve::EdgeService;

/// The model `/v1/models` lists for embeddings.
pub const EMBEDDING_MODEL: &str = "all-MiniLM-L6-v2";
/// Most texts in one request (OpenAI's bound is 2,048; a CPU edge encodes ~100 a second).
pub const MAX_INPUTS: usize = 256;

#[derive(Clone)]
struct EmbeddingState {
    service: EdgeService,
    body: BodyLimits,
}

/// `POST /v1/embeddings`.
pub fn embedding_routes(service: EdgeService, body: BodyLimits) -> Router {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(EmbeddingState { service, body })
}

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    model: String,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
}

/// The texts to embed: one string or a list of them (token arrays are refused: the ids
/// would be another tokenizer's).
fn inputs(input: &Value) -> Result<Vec<String>, InvalidArgument> {
    let texts: Vec<String> = match input {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                InvalidArgument::new(
                    "input",
                    "must be a string or a list of strings (token arrays are not accepted)",
                )
            })?,
        _ => {
            return Err(InvalidArgument::new(
                "input",
                "must be a string or a list of strings",
            ));
        }
    };
    if texts.is_empty() || texts.len() > MAX_INPUTS {
        return Err(InvalidArgument::new(
            "input",
            format!("holds {} texts; send 1 to {MAX_INPUTS}", texts.len()),
        ));
    }
    if texts.iter().any(|text| text.trim().is_empty()) {
        return Err(InvalidArgument::new("input", "holds an empty text"));
    }
    Ok(texts)
}

/// A vector as OpenAI's `base64` format sends it: little-endian f32s.
fn base64_vector(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn embeddings(
    State(state): State<EmbeddingState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match embed(&state, &headers, body).await {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(error) => openai_error_response(error),
    }
}

async fn embed(
    state: &EmbeddingState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, EdgeError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state.service.authenticate(authorization)?;
    let bytes = read_json_bytes(headers, body, state.body).await?;
    let request: EmbeddingRequest = parse_json_object(&bytes)?;
    if request.model != EMBEDDING_MODEL {
        return Err(InvalidArgument::new(
            "model",
            format!(
                "this edge embeds with `{EMBEDDING_MODEL}`, not `{}`",
                request.model
            ),
        )
        .into());
    }
    let encoder = Arc::clone(state.service.encoder());
    if let Some(dimensions) = request.dimensions
        && dimensions != encoder.dimension() as u64
    {
        return Err(InvalidArgument::new(
            "dimensions",
            format!(
                "the encoder's vectors have {} dimensions",
                encoder.dimension()
            ),
        )
        .into());
    }
    let as_base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(InvalidArgument::new(
                "encoding_format",
                format!("`{other}` is neither `float` nor `base64`"),
            )
            .into());
        }
    };
    let texts = inputs(&request.input)?;
    let (vectors, tokens) = tokio::task::spawn_blocking(move || {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        encoder.encode_counted(&texts)
    })
    .await
    .map_err(EdgeError::TaskFailed)?
    .map_err(|error| EdgeError::Internal(error.into()))?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if as_base64 {
                json!(base64_vector(vector))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": EMBEDDING_MODEL,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn inputs_are_one_text_or_a_list_of_texts() {
        assert_eq!(inputs(&json!("a")).unwrap(), vec!["a"]);
        assert_eq!(inputs(&json!(["a", "b"])).unwrap(), vec!["a", "b"]);
        for refused in [json!([[1, 2]]), json!([]), json!(7), json!(["a", " "])] {
            assert_eq!(inputs(&refused).unwrap_err().field, "input", "{refused}");
        }
    }

    #[test]
    fn base64_vectors_are_little_endian_floats() {
        let encoded = base64_vector(&[1.0, -0.5]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat()
        );
    }
}
