//! The gRPC twin of `POST /v1/retrieve`.

use std::time::Instant;

use hasten_proto::v1 as pb;
use hasten_proto::v1::edge_server::Edge;
use tonic::{Request, Response, Status};

use crate::api::{EdgeError, RetrieveBody};
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
            EdgeError::Internal(m) => Status::internal(m),
        }
    }
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
        let valid = body
            .validate(self.service.limits())
            .map_err(|err| self.service.refused(err.into(), started))?;
        let retrieval = self.service.retrieve(valid, started).await?;
        Ok(Response::new(to_proto(retrieval)))
    }
}
