//! What can go wrong between the edge and an engine.

use display_full_error::DisplayFullErrorExt;
use hasten_rag::RagError;

/// A failed call to an engine; `url` is the address called.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The HTTP client could not be built (a bad CA file, say).
    #[error("engine client")]
    Client(#[source] reqwest::Error),
    #[error("engine CA file {path}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The engine could not be reached, or the connection broke.
    #[error("calling {url}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// Nothing came from the engine for the call's deadline.
    #[error("{url} sent nothing for {seconds:.1} s")]
    Timeout { url: String, seconds: f64 },
    /// The engine answered with an error status.
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    /// The engine's reply is not what the OpenAI API describes.
    #[error("{url} sent an unreadable reply: {message}")]
    Reply { url: String, message: String },
    /// The model's chat template lays a draft out otherwise than as its own turn, so
    /// verification cannot score drafts apart from their surroundings.
    #[error("the chat template at {url} does not keep an assistant turn as written")]
    Template { url: String },
}

impl EngineError {
    /// Whether the same call may succeed later (engine down, busy or slow), as opposed to
    /// refused for what it asked.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Http { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::Client(_) | Self::CaFile { .. } | Self::Reply { .. } | Self::Template { .. } => {
                false
            }
        }
    }

    /// The failure as an answer's: a refused prompt is the request's error (the engine
    /// alone knows whether it fits its context); anything else is the engine's, retryable
    /// when it is down, busy or slow.
    pub(crate) fn into_answer_error(self, engine: &str) -> RagError {
        if let Self::Status {
            status: 400,
            message,
            ..
        } = &self
        {
            return RagError::InvalidRequest {
                field: "messages",
                message: format!("were refused by the generation engine: {message}"),
            };
        }
        tracing::warn!(engine, error = %self.display_full(), "generation engine failed");
        RagError::Worker {
            endpoint: engine.to_string(),
            retryable: self.is_retryable(),
            source: Box::new(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_engine_down_busy_or_slow_is_worth_retrying() {
        let status = |status| EngineError::Status {
            url: "u".into(),
            status,
            message: String::new(),
        };
        assert!(status(503).is_retryable());
        assert!(status(429).is_retryable());
        assert!(!status(400).is_retryable());
        assert!(!status(404).is_retryable());
        let timeout = EngineError::Timeout {
            url: "u".into(),
            seconds: 1.0,
        };
        assert!(timeout.is_retryable());
    }

    #[test]
    fn a_refused_prompt_is_the_requests_error_and_a_down_engine_is_retryable() {
        let refused = EngineError::Status {
            url: "u".into(),
            status: 400,
            message: "context too long".into(),
        }
        .into_answer_error("http://e/v1");
        assert_eq!(refused.field(), Some("messages"));
        let down = EngineError::Timeout {
            url: "u".into(),
            seconds: 1.0,
        }
        .into_answer_error("http://e/v1");
        assert!(down.is_retryable());
        assert!(down.to_string().contains("http://e/v1"));
    }
}
