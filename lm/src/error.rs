//! Typed errors of the LM runtime. Every error that comes from a file names the file.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LmError {
    #[error("cannot open model file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a readable GGUF file")]
    Gguf {
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },
    #[error("{path}: GGUF metadata key `{key}` is {problem}")]
    Metadata {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error("{path}: architecture `{architecture}` is not supported (llama and qwen2 are)")]
    UnsupportedArchitecture { path: PathBuf, architecture: String },
    #[error("{path}: tensor `{name}` cannot be loaded")]
    Tensor {
        path: PathBuf,
        name: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    #[error("{path}: tokenizer cannot be built from the GGUF metadata: {reason}")]
    TokenizerMetadata { path: PathBuf, reason: String },
    #[error("tokenizer failed: {0}")]
    Tokenize(String),
    #[error("device `{0}` is not available: {1}")]
    Device(String, String),
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// The caller asked a long pass to stop between its chunks.
    #[error("the pass was interrupted by its caller")]
    Interrupted,
    /// A tensor operation failed (boxed: candle's error is large, and rare).
    #[error(transparent)]
    Candle(Box<candle_core::Error>),
}

impl From<candle_core::Error> for LmError {
    fn from(error: candle_core::Error) -> Self {
        Self::Candle(Box::new(error))
    }
}

pub type Result<T> = std::result::Result<T, LmError>;
