//! Typed errors of answer generation. A refused request names the field that is wrong, so
//! the edge can turn it into a 400 that points at the caller's mistake.

#[derive(Debug, thiserror::Error)]
pub enum RagError {
    /// The request cannot be answered as asked; `field` is its path in [`crate::AnswerRequest`].
    #[error("invalid request: `{field}` {message}")]
    InvalidRequest {
        field: &'static str,
        message: String,
    },
    /// The caller went away; generation stopped at the next step.
    #[error("the answer was cancelled: its client went away")]
    Cancelled,
    /// A query rewrite gave no question (the model's reply is kept for the log).
    #[error("the query rewrite gave no question: {0:?}")]
    Rewrite(String),
    /// The language model failed (loading, tokenising or a forward pass).
    #[error("language model")]
    Lm(#[source] hasten_lm::LmError),
    /// A remote generation worker failed or could not be reached. `retryable`: the worker is
    /// down, busy or too slow, so the same request may succeed later or elsewhere.
    #[error("generation worker at {endpoint}")]
    Worker {
        endpoint: String,
        retryable: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<hasten_lm::LmError> for RagError {
    /// A pass interrupted because its caller went away is the answer's cancellation.
    fn from(error: hasten_lm::LmError) -> Self {
        match error {
            hasten_lm::LmError::Interrupted => Self::Cancelled,
            other => Self::Lm(other),
        }
    }
}

impl RagError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            field,
            message: message.into(),
        }
    }

    /// The offending field when the request was refused.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::InvalidRequest { field, .. } => Some(field),
            Self::Lm(_) | Self::Worker { .. } | Self::Cancelled | Self::Rewrite(_) => None,
        }
    }

    /// Whether the backend could not take the request now (a worker down or busy), as
    /// opposed to failing on it.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Worker {
                retryable: true,
                ..
            }
        )
    }
}

pub type Result<T> = std::result::Result<T, RagError>;
