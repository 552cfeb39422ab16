//! What can go wrong answering a search, for shards and routers alike; each transport maps
//! these onto its own status codes.

#[derive(Clone, Debug, thiserror::Error)]
pub enum SearchError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("index failure: {0}")]
    Index(String),
    #[error("search task failed: {0}")]
    Task(String),
    #[error("shard {shard} unavailable: {reason}")]
    ShardUnavailable { shard: usize, reason: String },
    #[error("deadline of {timeout_ms} ms exceeded: {what}")]
    DeadlineExceeded { timeout_ms: u64, what: String },
    #[error("overloaded: {0}")]
    Overloaded(String),
    #[error("shutting down")]
    ShuttingDown,
}

impl From<hasten_core::index::IndexError> for SearchError {
    fn from(err: hasten_core::index::IndexError) -> Self {
        SearchError::Index(err.to_string())
    }
}
