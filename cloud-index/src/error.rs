//! What can go wrong answering a search, for shards and routers alike; each transport maps
//! these onto its own status codes.
//!
//! The error is `Clone`: one failed batch or one failed shard answers every search that
//! shared it. Sources that are not `Clone` are held in an `Arc` for that.

use std::sync::Arc;

use hasten_core::index::IndexError;
use tokio::sync::oneshot::error::RecvError;
use tokio::task::JoinError;

#[derive(Clone, Debug, thiserror::Error)]
pub enum SearchError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("index failure")]
    Index(#[source] Arc<IndexError>),
    #[error("search task failed")]
    Task(#[source] Arc<JoinError>),
    /// The batch a search was queued in ended without answering it.
    #[error("the batch carrying this search failed")]
    BatchLost(#[source] RecvError),
    /// A step that always answers did not (a broken invariant, not an input).
    #[error("{0} gave no answer")]
    NoAnswer(&'static str),
    #[error("shard {shard} unavailable: {reason}")]
    ShardUnavailable { shard: usize, reason: String },
    #[error("deadline of {timeout_ms} ms exceeded: {what}")]
    DeadlineExceeded { timeout_ms: u64, what: String },
    #[error("overloaded: {0}")]
    Overloaded(String),
    #[error("shutting down")]
    ShuttingDown,
}

impl From<IndexError> for SearchError {
    fn from(err: IndexError) -> Self {
        SearchError::Index(Arc::new(err))
    }
}

impl From<JoinError> for SearchError {
    fn from(err: JoinError) -> Self {
        SearchError::Task(Arc::new(err))
    }
}

impl From<RecvError> for SearchError {
    fn from(err: RecvError) -> Self {
        SearchError::BatchLost(err)
    }
}

#[cfg(test)]
mod tests {
    use display_full_error::DisplayFullErrorExt;
    use std::error::Error;

    use super::*;

    #[tokio::test]
    async fn a_failed_task_keeps_its_cause_through_clones() {
        let join = tokio::spawn(async { panic!("scan broke") })
            .await
            .unwrap_err();
        let err = SearchError::from(join);
        let shared = err.clone();
        let source = shared
            .source()
            .expect("the join error is kept as the source");
        let join = source.downcast_ref::<Arc<JoinError>>().unwrap();
        assert!(join.is_panic());
        let index = SearchError::from(IndexError::Invalid("bad buffer".into()));
        let source = index.source().unwrap();
        assert!(source.downcast_ref::<Arc<IndexError>>().is_some());
        assert_eq!(source.to_string_full(), "bad buffer");
    }
}
