//! The gRPC twin of `POST /v1/retrieve`.

use std::time::{Duration, Instant};

use hasten_proto::v1 as pb;
use hasten_proto::v1::edge_server::Edge;
use tonic::{Request, Response, Status};

use crate::api::{EdgeError, InvalidArgument, RetrieveBody};
use crate::engine::{Outcome, Retrieval};
use crate::service::EdgeService;

#[derive(Clone)]
pub struct EdgeGrpc {
    service: EdgeService,
}

impl EdgeGrpc {
    pub fn new(service: EdgeService) -> Self {
        Self { service }
    }
}

impl From<EdgeError> for Status {
    fn from(err: EdgeError) -> Self {
        match err {
            EdgeError::InvalidArgument(e) => Status::invalid_argument(e.to_string()),
            EdgeError::Unavailable(m) => Status::unavailable(m),
            EdgeError::Overloaded(m) => Status::resource_exhausted(m),
            EdgeError::Unauthenticated(e) => Status::unauthenticated(e.to_string()),
            EdgeError::DeadlineExceeded(m) => Status::deadline_exceeded(m),
            EdgeError::Internal(m) => Status::internal(m),
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

fn to_proto(r: Retrieval) -> pb::RetrieveResponse {
    let t = r.timings;
    pb::RetrieveResponse {
        documents: r
            .documents
            .into_iter()
            .map(|d| pb::Document {
                id: d.id,
                title: d.title,
                text: d.text,
                score: d.score,
            })
            .collect(),
        outcome: match r.outcome {
            Outcome::Accepted => pb::Outcome::Accepted,
            Outcome::Fallback => pb::Outcome::Fallback,
        } as i32,
        homology_score: r.homology_score as f32,
        matched_query: r.matched_query.map(|m| pb::MatchedQuery {
            id: m.id,
            text: m.text.unwrap_or_default(),
            shared_documents: m.shared_documents as u32,
        }),
        timings: Some(pb::StageTimings {
            encode_us: t.encode_us,
            cache_channel_us: t.cache_channel_us,
            fuzzy_channel_us: t.fuzzy_channel_us,
            merge_us: t.merge_us,
            validation_us: t.validation_us,
            cloud_us: t.cloud_us,
            cache_update_us: t.cache_update_us,
            total_us: t.total_us,
        }),
    }
}

#[tonic::async_trait]
impl Edge for EdgeGrpc {
    async fn retrieve(
        &self,
        request: Request<pb::RetrieveRequest>,
    ) -> Result<Response<pb::RetrieveResponse>, Status> {
        let started = Instant::now();
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(grpc_timeout)
            .transpose()
            .map_err(|err| self.service.refused(None, err.into(), started))?;
        let caller = self.service.caller(authorization, timeout, started)?;
        let request = request.into_inner();
        let body = RetrieveBody {
            query: match &request.input {
                Some(pb::retrieve_request::Input::Query(q)) => Some(q.clone()),
                _ => None,
            },
            vector: match request.input {
                Some(pb::retrieve_request::Input::Vector(v)) => Some(v.values),
                _ => None,
            },
            k: request.k.map(i64::from),
        };
        let valid = body.validate(self.service.limits()).map_err(|err| {
            self.service
                .refused(Some(&caller.tenant), err.into(), started)
        })?;
        let retrieval = self.service.retrieve(caller, valid, started).await?;
        Ok(Response::new(to_proto(retrieval)))
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
