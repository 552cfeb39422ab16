//! The gRPC twin of the QUIC fast path.

use hasten_proto::v1::cloud_index_server::CloudIndex;
use hasten_proto::v1::{IndexInfo, InfoRequest, SearchRequest, SearchResponse};
use tonic::{Request, Response, Status};

use crate::searcher::{CloudService, SearchError};

#[derive(Clone, Debug)]
pub struct CloudIndexGrpc {
    service: CloudService,
}

impl CloudIndexGrpc {
    pub fn new(service: CloudService) -> Self {
        Self { service }
    }
}

impl From<SearchError> for Status {
    fn from(err: SearchError) -> Self {
        match err {
            SearchError::InvalidArgument(message) => Status::invalid_argument(message),
            other => Status::internal(other.to_string()),
        }
    }
}

#[tonic::async_trait]
impl CloudIndex for CloudIndexGrpc {
    #[tracing::instrument(skip_all, fields(queries = request.get_ref().queries.len(), k = request.get_ref().k))]
    async fn search(
        &self,
        request: Request<SearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        Ok(Response::new(
            self.service.search(request.into_inner()).await?,
        ))
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<IndexInfo>, Status> {
        Ok(Response::new(self.service.info()))
    }
}
