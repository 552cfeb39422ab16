//! What a run fails with. The model side (agents, steppers, the engines behind them) fails
//! with a [`StepError`]; a run adds its retrievers' failures, keeping the exact retriever's
//! own error type `R` whole, so that a caller maps its transport's failures without
//! downcasting.

/// What a run's model side fails with.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("language model")]
    Lm(#[from] hasten_lm::LmError),
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

pub type StepResult<T> = std::result::Result<T, StepError>;

/// What a run fails with; `R` is its exact retriever's (and speculator's) error.
#[derive(Debug, thiserror::Error)]
pub enum SpecError<R> {
    #[error(transparent)]
    Step(#[from] StepError),
    #[error("exact retrieval failed")]
    Retrieval(#[source] R),
    #[error("speculative retrieval failed")]
    Speculation(#[source] R),
    #[error("query encoding failed")]
    Encode(#[source] EncodeError),
    #[error("the exact retriever answered {answered} result lists for {asked} queries")]
    ShortAnswer { asked: usize, answered: usize },
    #[error("the exact retriever found no document for a query")]
    NoDocument,
    /// A thread of the run's own (an asynchronous verification, an exact retrieval in
    /// flight) ended without its answer.
    #[error("{0}")]
    ThreadLost(&'static str),
}

impl<R> SpecError<R> {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::Step(StepError::InvalidRequest(message.into()))
    }
}

/// A query encoder's failure, whatever the encoder.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct EncodeError(pub Box<dyn std::error::Error + Send + Sync>);

impl EncodeError {
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

/// What a retriever's error must be to cross a run: an error threads can carry.
pub trait RetrieverError: std::error::Error + Send + Sync + 'static {}

impl<T: std::error::Error + Send + Sync + 'static> RetrieverError for T {}
