//! What can go wrong between the edge and an engine.

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
}

impl EngineError {
    /// Whether the same call may succeed later (engine down, busy or slow), as opposed to
    /// refused for what it asked.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Http { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::Client(_) | Self::CaFile { .. } | Self::Reply { .. } => false,
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
}
