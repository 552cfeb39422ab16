//! JSON over HTTP for people and scripts: `POST /v1/retrieve` (the API), and for operators,
//! Prometheus and Kubernetes `GET /v1/status`, `/metrics`, `/readyz`, `/healthz` (the admin
//! routes, on the API's address or an address of their own); and how an error is answered
//! over HTTP, in Hasten's shape or OpenAI's. Everything about a request beyond its wire form
//! is the services' ([`crate::service`]).

pub mod answer;
pub mod embeddings;
pub mod iterative;
pub mod openai;
pub mod server;

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hasten_core::metrics::prometheus::Registry;
use serde_json::json;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::api::conversions::{error_json, reply_json, status_json};
use crate::api::json::{RetrieveReply, StatusJson, parse_body};
use crate::api::{EdgeError, InvalidArgument, RetrieveInput};
use crate::service::retrieve::{EdgeService, Incoming};

/// Header in which a client says how long it will wait, in milliseconds: the edge gives up
/// (504) when it passes and passes what remains on to the cloud.
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// Header carrying a request's id: the client's (or its proxy's) when it sent one, else a
/// new UUID. It is echoed on the response and recorded on the request's span, so every log
/// line of the request names it (`log_format = "json"`: under `spans`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest request id a log line carries: the header is the client's to choose.
const LOGGED_REQUEST_ID_CHARS: usize = 128;

/// `router` with request ids: each request gets one (kept when the client sent it), runs in
/// a span naming it, and its response carries it.
pub fn with_request_ids(router: Router) -> Router {
    router
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                // Only the span: outcomes are logged and counted by the services.
                .on_request(())
                .on_response(())
                .on_failure(()),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

fn request_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    let id: String = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .chars()
        .take(LOGGED_REQUEST_ID_CHARS)
        .collect();
    tracing::info_span!(
        "http",
        method = %request.method(),
        path = request.uri().path(),
        request_id = id
    )
}

/// Bounds on one request's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// Longest the body may take to arrive once the head has.
    pub timeout: Duration,
}

#[derive(Clone)]
struct ApiState {
    service: EdgeService,
    body: BodyLimits,
}

/// `POST /v1/retrieve`.
pub fn api_routes(service: EdgeService, body: BodyLimits) -> Router {
    Router::new()
        .route("/v1/retrieve", post(retrieve))
        .with_state(ApiState { service, body })
}

/// `GET /v1/status`, `/metrics`, `/readyz` and `/healthz`: what operators, Prometheus and
/// Kubernetes read. The status and metrics name every tenant and its traffic.
/// What generates answers and in which modes, asked at each status request (the answer
/// service's `generation`; a function, so that this module does not depend on the answer
/// service's, which depends on it).
pub type GenerationStatus =
    Arc<dyn Fn() -> Option<(hasten_rag::BackendInfo, Vec<hasten_rag::AnswerMode>)> + Send + Sync>;

pub fn admin_routes(
    service: EdgeService,
    generation: GenerationStatus,
    registry: Registry,
) -> Router {
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
        .route("/v1/status", get(status))
        .with_state((service, generation))
        .merge(observability)
}

/// The HTTP status an error is answered with.
pub(crate) fn status_code(error: &EdgeError) -> StatusCode {
    match error {
        EdgeError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        EdgeError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        EdgeError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        EdgeError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        EdgeError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        EdgeError::EdgeBusy(_)
        | EdgeError::CloudBusy(_)
        | EdgeError::AnswerQueueFull(_)
        | EdgeError::TenantAnswersFull { .. } => StatusCode::TOO_MANY_REQUESTS,
        EdgeError::NoLanguageModel(_) => StatusCode::SERVICE_UNAVAILABLE,
        EdgeError::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
        EdgeError::Unavailable(_) | EdgeError::GenerationUnavailable(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        EdgeError::Internal(_)
        | EdgeError::TaskFailed(_)
        | EdgeError::Generation(_)
        | EdgeError::IterativeFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for EdgeError {
    fn into_response(self) -> Response {
        let status = status_code(&self);
        let body = axum::Json(error_json(&self));
        match self {
            EdgeError::EdgeBusy(_)
            | EdgeError::CloudBusy(_)
            | EdgeError::AnswerQueueFull(_)
            | EdgeError::TenantAnswersFull { .. } => {
                (status, [(header::RETRY_AFTER, "1")], body).into_response()
            }
            EdgeError::Unauthenticated(_) => {
                (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
            }
            _ => (status, body).into_response(),
        }
    }
}

/// An OpenAI-shaped error reply.
pub(crate) fn openai_error(
    status: StatusCode,
    kind: &str,
    param: Option<&str>,
    code: &str,
    message: String,
) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    (status, axum::Json(body)).into_response()
}

/// An edge error as an OpenAI-shaped reply (a 429 with `Retry-After`).
pub(crate) fn openai_error_response(error: EdgeError) -> Response {
    let status = status_code(&error);
    let (kind, param) = match &error {
        EdgeError::InvalidArgument(invalid) => {
            ("invalid_request_error", Some(invalid.field.clone()))
        }
        EdgeError::Unauthenticated(_) => ("authentication_error", None),
        EdgeError::EdgeBusy(_)
        | EdgeError::CloudBusy(_)
        | EdgeError::AnswerQueueFull(_)
        | EdgeError::TenantAnswersFull { .. } => ("rate_limit_error", None),
        _ => ("server_error", None),
    };
    let message = match &error {
        EdgeError::InvalidArgument(invalid) => invalid.message.clone(),
        other => other.to_string(),
    };
    let mut response = openai_error(status, kind, param.as_deref(), error.kind(), message);
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

async fn retrieve(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<RetrieveReply>, EdgeError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let input = read_input(&headers, body, state.body).await;
    let incoming = Incoming {
        authorization,
        timeout: client_timeout(&headers),
        input,
    };
    let retrieval = state.service.handle(incoming).await?;
    Ok(axum::Json(reply_json(retrieval, state.service.replies())))
}

/// The request's JSON body, within the body limits.
async fn read_input(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<RetrieveInput, EdgeError> {
    let bytes = read_json_bytes(headers, body, limits).await?;
    Ok(parse_body(&bytes).map(RetrieveInput::from)?)
}

/// The bytes of a body declared as JSON, read within the body limits.
pub(crate) async fn read_json_bytes(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<axum::body::Bytes, EdgeError> {
    if !is_json(headers) {
        return Err(EdgeError::UnsupportedMediaType);
    }
    match tokio::time::timeout(limits.timeout, to_bytes(body, limits.max_bytes)).await {
        Err(_) => Err(EdgeError::BodyTimeout(limits.timeout)),
        Ok(Err(err)) if is_length_limit(&err) => Err(EdgeError::PayloadTooLarge(limits.max_bytes)),
        Ok(Err(err)) => {
            Err(InvalidArgument::new("body", format!("unreadable: {}", err.display_full())).into())
        }
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// Whether the request says its body is JSON (`application/json`, parameters allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether reading a body failed on the size limit.
fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if cause.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The client's timeout from [`TIMEOUT_HEADER`], when it sent one.
pub(crate) fn client_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidArgument> {
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

async fn status(
    State((service, generation)): State<(EdgeService, GenerationStatus)>,
) -> axum::Json<StatusJson> {
    axum::Json(status_json(service.status(), generation()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_bodies_are_read() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            is_json(&headers)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(!with("text/plain"));
        assert!(!with("application/jsonp"));
        assert!(!is_json(&HeaderMap::new()));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_too_large_and_a_slow_one_times_out() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let limits = BodyLimits {
            max_bytes: 16,
            timeout: Duration::from_millis(50),
        };
        let big = Body::from(format!("{{\"query\": \"{}\"}}", "x".repeat(64)));
        assert!(matches!(
            read_input(&headers, big, limits).await,
            Err(EdgeError::PayloadTooLarge(16))
        ));
        let slow = Body::from_stream(futures::stream::pending::<
            Result<axum::body::Bytes, std::io::Error>,
        >());
        assert!(matches!(
            read_input(&headers, slow, limits).await,
            Err(EdgeError::BodyTimeout(_))
        ));
    }
}
