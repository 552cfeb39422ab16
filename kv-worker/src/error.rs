//! Typed errors of the KV worker.

use hasten_lm::LmError;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("the model failed")]
    Lm(#[from] LmError),
    /// A tensor operation failed (boxed: candle's error is large, and rare).
    #[error(transparent)]
    Candle(Box<candle_core::Error>),
    #[error("recompute ratio {0} is outside [0, 1]")]
    Ratio(f64),
    #[error(
        "a context of {context} tokens (system {system}, chunks {chunks}, question {question}) \
         plus {new_tokens} new tokens exceeds the model's window of {window}"
    )]
    ContextTooLong {
        context: usize,
        system: usize,
        chunks: usize,
        question: usize,
        new_tokens: usize,
        window: usize,
    },
    #[error("invalid request: {0}")]
    InvalidInput(String),
}

impl From<candle_core::Error> for KvError {
    fn from(error: candle_core::Error) -> Self {
        Self::Candle(Box::new(error))
    }
}

pub type Result<T> = std::result::Result<T, KvError>;
