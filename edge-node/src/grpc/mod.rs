//! The gRPC twins of `POST /v1/retrieve` and `POST /v1/answer`. Everything about a request
//! beyond its wire form is the services' ([`crate::service`]).

pub mod answer;

use std::time::Duration;

use hasten_proto::v1 as pb;
use hasten_proto::v1::edge_server::Edge;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::api::conversions::reply_proto;
use crate::api::{EdgeError, InvalidArgument, RetrieveInput};
use crate::grpc::answer::{AnswerEvents, answer_events};
use crate::service::answer::AnswerService;
use crate::service::retrieve::{EdgeService, Incoming};

#[derive(Clone)]
pub struct EdgeGrpc {
    service: EdgeService,
    answers: AnswerService,
}

impl EdgeGrpc {
    pub fn new(service: EdgeService, answers: AnswerService) -> Self {
        Self { service, answers }
    }
}

/// The caller's bearer token and deadline, from a call's metadata.
fn caller(metadata: &MetadataMap) -> (Option<String>, Result<Option<Duration>, InvalidArgument>) {
    let authorization = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let timeout = match metadata.get("grpc-timeout") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map_err(|_| InvalidArgument::new("grpc-timeout", "not ASCII"))
            .and_then(grpc_timeout)
            .map(Some),
    };
    (authorization, timeout)
}

impl From<EdgeError> for Status {
    fn from(err: EdgeError) -> Self {
        let message = err.to_string();
        match err {
            EdgeError::InvalidArgument(_)
            | EdgeError::PayloadTooLarge(_)
            | EdgeError::UnsupportedMediaType => Status::invalid_argument(message),
            EdgeError::BodyTimeout(_) => Status::deadline_exceeded(message),
            EdgeError::Unauthenticated(_) => Status::unauthenticated(message),
            EdgeError::EdgeBusy(_)
            | EdgeError::CloudBusy(_)
            | EdgeError::AnswerQueueFull(_)
            | EdgeError::TenantAnswersFull { .. } => Status::resource_exhausted(message),
            EdgeError::DeadlineExceeded(_) => Status::deadline_exceeded(message),
            EdgeError::Unavailable(_)
            | EdgeError::NoLanguageModel(_)
            | EdgeError::GenerationUnavailable(_) => Status::unavailable(message),
            EdgeError::Internal(_)
            | EdgeError::TaskFailed(_)
            | EdgeError::Generation(_)
            | EdgeError::IterativeFailed(_) => Status::internal(message),
        }
    }
}

/// A `grpc-timeout` header value: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &str) -> Result<Duration, InvalidArgument> {
    let invalid =
        || InvalidArgument::new("grpc-timeout", format!("`{value}` is not a gRPC timeout"));
    let split = value.len().checked_sub(1).ok_or_else(invalid)?;
    let (digits, unit) = value.split_at_checked(split).ok_or_else(invalid)?;
    if digits.is_empty() || digits.len() > 8 {
        return Err(invalid());
    }
    let amount: u64 = digits.parse().map_err(|_| invalid())?;
    Ok(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return Err(invalid()),
    })
}

#[tonic::async_trait]
impl Edge for EdgeGrpc {
    async fn retrieve(
        &self,
        request: Request<pb::RetrieveRequest>,
    ) -> Result<Response<pb::RetrieveResponse>, Status> {
        let (authorization, timeout) = caller(request.metadata());
        let incoming = Incoming {
            authorization: authorization.as_deref(),
            timeout,
            input: Ok(RetrieveInput::from(request.into_inner())),
        };
        let retrieval = self.service.handle(incoming).await?;
        Ok(Response::new(reply_proto(
            retrieval,
            self.service.replies(),
        )))
    }

    type AnswerStream = AnswerEvents;

    async fn answer(
        &self,
        request: Request<pb::AnswerRequest>,
    ) -> Result<Response<Self::AnswerStream>, Status> {
        let (authorization, timeout) = caller(request.metadata());
        let events = answer_events(
            &self.answers,
            authorization.as_deref(),
            timeout,
            request.into_inner(),
        )
        .await?;
        Ok(Response::new(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_by_unit_and_junk_is_refused() {
        assert_eq!(grpc_timeout("250m").unwrap(), Duration::from_millis(250));
        assert_eq!(grpc_timeout("2S").unwrap(), Duration::from_secs(2));
        assert_eq!(grpc_timeout("1H").unwrap(), Duration::from_secs(3600));
        assert_eq!(grpc_timeout("30u").unwrap(), Duration::from_micros(30));
        for junk in ["", "m", "123456789m", "10x", "-5m", "1.5S", "é"] {
            assert!(grpc_timeout(junk).is_err(), "{junk}");
        }
    }
}
