#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("language model")]
    Lm(#[from] hasten_lm::LmError),
    #[error("exact retrieval failed")]
    Retrieval(#[source] RetrievalError),
    #[error("query encoding failed")]
    Encode(#[source] RetrievalError),
    #[error("the exact retriever answered {answered} result lists for {asked} queries")]
    ShortAnswer { asked: usize, answered: usize },
    #[error("the exact retriever found no document for a query")]
    NoDocument,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The caller went away; the run stopped before its next step.
    #[error("the caller went away")]
    Cancelled,
    /// A remote generation engine failed; `retryable` when it is down, busy or slow.
    #[error("generation engine at {endpoint}")]
    Generation {
        endpoint: String,
        retryable: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub type Result<T> = std::result::Result<T, SpecError>;

/// A retriever's failure, whatever its transport.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RetrievalError(pub Box<dyn std::error::Error + Send + Sync>);

impl RetrievalError {
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}
