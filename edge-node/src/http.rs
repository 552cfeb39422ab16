//! JSON over HTTP for people and scripts: `POST /v1/retrieve`, `GET /v1/status`, and for
//! Prometheus and Kubernetes `GET /metrics`, `GET /readyz`, `GET /healthz`. Everything
//! about a request beyond its wire form is the pipeline's.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hasten_core::metrics::prometheus::Registry;

use crate::api::conversions::{error_json, reply_json, status_json};
use crate::api::json::{RetrieveReply, StatusJson, parse_body};
use crate::api::{EdgeError, InvalidArgument, RetrieveInput};
use crate::pipeline::{EdgeService, Incoming};

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
        let status = match &self {
            EdgeError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
            EdgeError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            EdgeError::EdgeBusy(_) | EdgeError::CloudBusy(_) => StatusCode::TOO_MANY_REQUESTS,
            EdgeError::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            EdgeError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            EdgeError::Internal(_) | EdgeError::TaskFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = axum::Json(error_json(&self));
        match self {
            EdgeError::EdgeBusy(_) | EdgeError::CloudBusy(_) => {
                (status, [(header::RETRY_AFTER, "1")], body).into_response()
            }
            EdgeError::Unauthenticated(_) => {
                (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
            }
            _ => (status, body).into_response(),
        }
    }
}

async fn retrieve(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<RetrieveReply>, EdgeError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let input = match to_bytes(body, state.max_body_bytes).await {
        Ok(bytes) => parse_body(&bytes).map(RetrieveInput::from),
        Err(_) => Err(InvalidArgument::new(
            "body",
            format!("unreadable or larger than {} bytes", state.max_body_bytes),
        )),
    };
    let incoming = Incoming {
        authorization,
        timeout: client_timeout(&headers),
        input,
    };
    let retrieval = state.service.handle(incoming).await?;
    Ok(axum::Json(reply_json(retrieval, state.service.replies())))
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

async fn status(State(state): State<HttpState>) -> axum::Json<StatusJson> {
    axum::Json(status_json(state.service.status()))
}
