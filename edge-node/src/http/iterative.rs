//! `POST /v1/ralm` and `POST /v1/spechop` over HTTP: a JSON body in, the run's JSON reply
//! out. Closing the connection drops the handler's future, which stops the run before its
//! next step ([`AnswerService::ralm`], [`AnswerService::spechop`]).

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use display_full_error::DisplayFullErrorExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{BodyLimits, read_json_bytes};
use crate::api::EdgeError;
use crate::api::json::parse_json_object;
use crate::service::answer::AnswerService;
use crate::service::answer::ralm::RalmBody;
use crate::service::answer::spechop::SpecHopBody;
use crate::tenants::Tenant;

#[derive(Clone)]
struct IterativeState {
    service: AnswerService,
    body: BodyLimits,
}

/// `POST /v1/ralm` and `POST /v1/spechop`.
pub fn iterative_routes(service: AnswerService, body: BodyLimits) -> Router {
    Router::new()
        .route("/v1/ralm", post(ralm))
        .route("/v1/spechop", post(spechop))
        .with_state(IterativeState { service, body })
}

async fn ralm(State(state): State<IterativeState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = async {
        let (tenant, body): (_, RalmBody) = read_request(&state, &headers, body).await?;
        let input = state.service.validate_ralm(body)?;
        state.service.ralm(&tenant, input).await
    }
    .await;
    respond(outcome, "iterative RAG")
}

async fn spechop(State(state): State<IterativeState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = async {
        let (tenant, body): (_, SpecHopBody) = read_request(&state, &headers, body).await?;
        let input = state.service.validate_spechop(body)?;
        state.service.spechop(tenant, input).await
    }
    .await;
    respond(outcome, "multi-hop RAG")
}

/// Authenticates a request and parses its JSON body.
async fn read_request<B: DeserializeOwned>(
    state: &IterativeState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Tenant, B), EdgeError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let tenant = state.service.retrieval().authenticate(authorization)?;
    let bytes = read_json_bytes(headers, body, state.body).await?;
    Ok((tenant, parse_json_object(&bytes)?))
}

/// The reply, or the error as JSON (logged when the edge is at fault).
fn respond<R: Serialize>(outcome: Result<R, EdgeError>, what: &str) -> Response {
    match outcome {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(error) => {
            if error.is_server_side() {
                tracing::warn!(error = %error.display_full(), "{what} failed");
            }
            error.into_response()
        }
    }
}
