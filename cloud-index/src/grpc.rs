//! The gRPC twin of the QUIC fast path.

use display_full_error::DisplayFullErrorExt;
use hasten_core::trace_export::{TRACEPARENT, set_remote_parent};
use hasten_proto::v1::cloud_index_server::CloudIndex;
use hasten_proto::v1::{
    DocumentsRequest, DocumentsResponse, IndexInfo, InfoRequest, SearchRequest, SearchResponse,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::backend::SearchBackend;
use crate::error::SearchError;

#[derive(Clone, Debug)]
pub struct CloudIndexGrpc<B> {
    service: B,
}

impl<B> CloudIndexGrpc<B> {
    pub fn new(service: B) -> Self {
        Self { service }
    }
}

impl From<SearchError> for Status {
    fn from(err: SearchError) -> Self {
        let message = err.to_string_full();
        match err {
            SearchError::InvalidArgument(_) => Status::invalid_argument(message),
            SearchError::ShardUnavailable { .. } | SearchError::ShuttingDown => {
                Status::unavailable(message)
            }
            SearchError::DeadlineExceeded { .. } => Status::deadline_exceeded(message),
            SearchError::Overloaded(_) => Status::resource_exhausted(message),
            SearchError::Index(_)
            | SearchError::Task(_)
            | SearchError::BatchLost(_)
            | SearchError::NoAnswer(_) => Status::internal(message),
        }
    }
}

#[tonic::async_trait]
impl<B: SearchBackend> CloudIndex for CloudIndexGrpc<B> {
    async fn search(
        &self,
        request: Request<SearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        let span = tracing::info_span!(
            "search",
            queries = request.get_ref().queries.len(),
            k = request.get_ref().k
        );
        // Joins the caller's trace (a router's batch) when it sent one; the span must get
        // its parent before it is entered.
        if let Some(traceparent) = request
            .metadata()
            .get(TRACEPARENT)
            .and_then(|value| value.to_str().ok())
        {
            set_remote_parent(&span, traceparent);
        }
        let search = self.service.search(request.into_inner()).instrument(span);
        Ok(Response::new(search.await?))
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<IndexInfo>, Status> {
        Ok(Response::new(self.service.info()))
    }

    #[tracing::instrument(skip_all, fields(ids = request.get_ref().ids.len()))]
    async fn documents(
        &self,
        request: Request<DocumentsRequest>,
    ) -> Result<Response<DocumentsResponse>, Status> {
        Ok(Response::new(
            self.service.documents(request.into_inner()).await?,
        ))
    }
}
