//! JSON over HTTP for people and scripts: `POST /v1/retrieve`, `GET /v1/status`, and for
//! Prometheus and Kubernetes `GET /metrics`, `GET /readyz`, `GET /healthz`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use crate::replication::LinkStatus;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::api::{EdgeError, InvalidArgument, RetrieveBody, RetrieveReply, ValidRequest};
use crate::service::EdgeService;
use hasten_core::metrics::prometheus::Registry;

/// Header in which a client says how long it will wait, in milliseconds: the edge gives up
/// (504) when it passes and passes what remains on to the cloud.
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

#[derive(Clone)]
struct HttpState {
    service: EdgeService,
    max_body_bytes: usize,
}

pub fn router(service: EdgeService, max_body_bytes: usize, registry: Registry) -> Router {
    let observability = hasten_core::metrics::routes(
        registry,
        {
            let service = service.clone();
            Arc::new(move || service.refresh_metrics())
        },
        {
            let service = service.clone();
            Arc::new(move || service.readiness())
        },
    );
    Router::new()
        .route("/v1/retrieve", post(retrieve))
        .route("/v1/status", get(status))
        .with_state(HttpState {
            service,
            max_body_bytes,
        })
        .merge(observability)
}

impl IntoResponse for EdgeError {
    fn into_response(self) -> Response {
        let (status, body) = match &self {
            EdgeError::InvalidArgument(InvalidArgument { field, message }) => (
                StatusCode::BAD_REQUEST,
                json!({"error": {"code": "invalid_argument", "field": field, "message": message}}),
            ),
            EdgeError::Unavailable(message) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": {"code": "unavailable", "message": message}}),
            ),
            EdgeError::Overloaded(message) => {
                let body = json!({"error": {"code": "overloaded", "message": message}});
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(axum::http::header::RETRY_AFTER, "1")],
                    axum::Json(body),
                )
                    .into_response();
            }
            EdgeError::Unauthenticated(error) => {
                let body =
                    json!({"error": {"code": "unauthenticated", "message": error.to_string()}});
                return (
                    StatusCode::UNAUTHORIZED,
                    [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                    axum::Json(body),
                )
                    .into_response();
            }
            EdgeError::DeadlineExceeded(message) => (
                StatusCode::GATEWAY_TIMEOUT,
                json!({"error": {"code": "deadline_exceeded", "message": message}}),
            ),
            EdgeError::Internal(message) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"code": "internal", "message": message}}),
            ),
        };
        (status, axum::Json(body)).into_response()
    }
}

/// Parses the body, naming the offending field on error (`body` when it is not JSON at all).
pub fn parse_body(bytes: &[u8]) -> Result<RetrieveBody, InvalidArgument> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let body: RetrieveBody =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
            let path = err.path().to_string();
            let field = if matches!(path.as_str(), "" | "." | "?") {
                "body".to_string()
            } else {
                path
            };
            InvalidArgument::new(field, err.into_inner().to_string())
        })?;
    deserializer
        .end()
        .map_err(|err| InvalidArgument::new("body", err.to_string()))?;
    Ok(body)
}

async fn retrieve(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<RetrieveReply>, EdgeError> {
    let started = Instant::now();
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let timeout =
        client_timeout(&headers).map_err(|err| state.service.refused(None, err.into(), started))?;
    let caller = state.service.caller(authorization, timeout, started)?;
    let request = match read_request(&state, body).await {
        Ok(request) => request,
        Err(err) => return Err(state.service.refused(Some(&caller.tenant), err, started)),
    };
    let retrieval = state.service.retrieve(caller, request, started).await?;
    Ok(axum::Json(retrieval.into()))
}

/// The client's timeout from [`TIMEOUT_HEADER`], when it sent one.
fn client_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidArgument> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            InvalidArgument::new(TIMEOUT_HEADER, "must be a positive number of milliseconds")
        })
}

async fn read_request(state: &HttpState, body: Body) -> Result<ValidRequest, EdgeError> {
    let bytes = to_bytes(body, state.max_body_bytes).await.map_err(|_| {
        InvalidArgument::new(
            "body",
            format!("unreadable or larger than {} bytes", state.max_body_bytes),
        )
    })?;
    Ok(parse_body(&bytes)?.validate(state.service.limits())?)
}

async fn status(State(state): State<HttpState>) -> axum::Json<serde_json::Value> {
    let engine = state.service.engine();
    let cache = engine.cache_stats();
    let settings = engine.settings();
    axum::Json(json!({
        "policy": settings.policy,
        "tau": engine.tau(),
        "semantic_threshold": settings.semantic_threshold,
        "cached_queries": cache.queries,
        "cached_documents": cache.documents,
        "cache_bytes": cache.bytes,
        "default_k": state.service.limits().default_k,
        "control_plane": state.service.link().map(LinkStatus::report),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_field_or_the_body() {
        assert_eq!(
            parse_body(br#"{"query": "a", "k": "ten"}"#)
                .unwrap_err()
                .field,
            "k"
        );
        assert_eq!(
            parse_body(br#"{"query": "a", "vector": [1, "x"]}"#)
                .unwrap_err()
                .field,
            "vector[1]"
        );
        assert_eq!(parse_body(b"{not json").unwrap_err().field, "body");
        assert_eq!(
            parse_body(br#"{"query": "a"} trailing"#).unwrap_err().field,
            "body"
        );
        let unknown = parse_body(br#"{"qeury": "a"}"#).unwrap_err();
        assert!(unknown.message.contains("unknown field"), "{unknown}");
        assert_eq!(parse_body(br#"{"query": "a", "k": 3}"#).unwrap().k, Some(3));
    }
}
