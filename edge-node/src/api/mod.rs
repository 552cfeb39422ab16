//! The edge's request contract, shared by the JSON and gRPC front ends: what a retrieve
//! request may hold, how it is checked, and the errors a client sees. Wire forms live in
//! [`json`] (and the generated protobuf types); [`conversions`] turns them into these
//! types and back.

pub mod answer;
pub mod conversions;
pub mod json;

use display_full_error::DisplayFullErrorExt;
use hasten_core::vector::normalized_query;

use crate::retrieval::{EngineError, Query};
use crate::tenants::AuthError;

/// Bounds on what a request may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub default_k: usize,
    pub max_k: usize,
    pub max_query_chars: usize,
    pub dimension: usize,
}

/// A retrieve request as either front end received it, before any check.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetrieveInput {
    pub query: Option<String>,
    pub vector: Option<Vec<f32>>,
    pub k: Option<i64>,
}

/// A request that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidRequest {
    pub query: Query,
    pub k: usize,
}

/// How replies are shaped for this deployment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyOptions {
    /// Show the text of the cached query an acceptance went through (another user's
    /// question); its id and score are always shown.
    pub matched_query_text: bool,
    /// Show where each HaS draft came from ([`crate::retrieval::DraftTrace`]): its
    /// channels' candidates and the best cached query's documents, for evaluating HaS's
    /// rules. Off in production: it shows what other users' questions cached.
    pub draft_trace: bool,
}

/// A request the edge refuses; `field` names what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidArgument {
    pub field: String,
    pub message: String,
}

impl InvalidArgument {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl RetrieveInput {
    pub fn validate(self, limits: &RequestLimits) -> Result<ValidRequest, InvalidArgument> {
        let k = match self.k {
            None => limits.default_k,
            Some(k) if (1..=limits.max_k as i64).contains(&k) => k as usize,
            Some(k) => {
                return Err(InvalidArgument::new(
                    "k",
                    format!("must be between 1 and {}, got {k}", limits.max_k),
                ));
            }
        };
        let query = match (self.query, self.vector) {
            (Some(_), Some(_)) => {
                return Err(InvalidArgument::new(
                    "query",
                    "give either `query` or `vector`, not both",
                ));
            }
            (None, None) => {
                return Err(InvalidArgument::new(
                    "query",
                    "a `query` text or a `vector` is required",
                ));
            }
            (Some(text), None) => {
                let text = text.trim();
                if text.is_empty() {
                    return Err(InvalidArgument::new("query", "must not be empty"));
                }
                let chars = text.chars().count();
                if chars > limits.max_query_chars {
                    return Err(InvalidArgument::new(
                        "query",
                        format!(
                            "{chars} characters, the limit is {}",
                            limits.max_query_chars
                        ),
                    ));
                }
                Query::Text(text.to_string())
            }
            (None, Some(vector)) => Query::Vector(
                normalized_query(&vector, limits.dimension)
                    .map_err(|e| InvalidArgument::new("vector", e.to_string_full()))?,
            ),
        };
        Ok(ValidRequest { query, k })
    }
}

/// Why a request failed, as the front ends report it. Messages are for clients: what went
/// wrong inside (addresses, TLS, index errors) stays in the source, which the edge logs.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    InvalidArgument(#[from] InvalidArgument),
    /// No valid bearer token (HTTP 401, UNAUTHENTICATED).
    #[error(transparent)]
    Unauthenticated(#[from] AuthError),
    /// The body is larger than the edge reads (HTTP 413).
    #[error("the body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The body is not declared as JSON (HTTP 415).
    #[error("the body must be JSON, sent with `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// The body did not arrive in time (HTTP 408).
    #[error("the body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// This edge is at its bound of requests in flight (HTTP 429).
    #[error("{0} requests already in flight at this edge; retry shortly")]
    EdgeBusy(usize),
    /// The cloud index is at its bound (HTTP 429).
    #[error("the cloud index is overloaded; retry shortly")]
    CloudBusy(#[source] EngineError),
    /// The client's deadline passed before an answer (HTTP 504, DEADLINE_EXCEEDED).
    #[error("the request's deadline passed before the cloud index answered")]
    DeadlineExceeded(#[source] EngineError),
    /// The query needed the cloud index, which could not answer (HTTP 503).
    #[error(
        "the cloud index is unavailable; queries this edge can answer from its cache still are"
    )]
    Unavailable(#[source] EngineError),
    #[error("internal error")]
    Internal(#[source] EngineError),
    #[error("internal error: the retrieval task failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    /// `/v1/answer` on an edge configured without a language model (HTTP 503).
    #[error("this edge has no language model: {0}")]
    NoLanguageModel(&'static str),
    /// Answers waiting for the language model are at their bound (HTTP 429).
    #[error("{0} answers already waiting for the language model; retry shortly")]
    AnswerQueueFull(usize),
    /// The tenant has `answer_queue_per_tenant` answers in progress already (HTTP 429).
    #[error(
        "tenant {tenant} has {limit} answers in progress, its limit \
         (`answer_queue_per_tenant`); retry shortly"
    )]
    TenantAnswersFull { tenant: String, limit: usize },
    /// The language model failed on a valid request (HTTP 500).
    #[error("internal error: generation failed")]
    Generation(#[source] hasten_rag::RagError),
    /// The generation worker is down, busy or too slow (HTTP 503).
    #[error("the generation backend (worker or engine) is unavailable; retry shortly")]
    GenerationUnavailable(#[source] hasten_rag::RagError),
    /// Iterative RAG (`/v1/ralm`) failed on a valid request (HTTP 500).
    #[error("internal error: iterative RAG failed")]
    IterativeFailed(#[source] hasten_spec_retrieval::SpecError<EngineError>),
}

impl EdgeError {
    /// The error's kind, as metrics and JSON bodies name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "invalid_argument",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::BodyTimeout(_) => "body_timeout",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::EdgeBusy(_)
            | Self::CloudBusy(_)
            | Self::AnswerQueueFull(_)
            | Self::TenantAnswersFull { .. } => "overloaded",
            Self::DeadlineExceeded(_) => "deadline_exceeded",
            Self::Unavailable(_) | Self::GenerationUnavailable(_) => "unavailable",
            Self::Internal(_)
            | Self::TaskFailed(_)
            | Self::Generation(_)
            | Self::IterativeFailed(_) => "internal",
            Self::NoLanguageModel(_) => "no_language_model",
        }
    }

    /// Whether the edge or its dependencies failed (worth a log line with the cause), as
    /// opposed to the client asking wrongly or too much.
    pub fn is_server_side(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::Internal(_)
                | Self::TaskFailed(_)
                | Self::Generation(_)
                | Self::GenerationUnavailable(_)
                | Self::IterativeFailed(_)
        )
    }
}

impl From<EngineError> for EdgeError {
    fn from(err: EngineError) -> Self {
        use crate::fallback::CloudError;
        match &err {
            EngineError::Cloud(CloudError::Overloaded(_)) => EdgeError::CloudBusy(err),
            EngineError::Cloud(CloudError::ClientDeadline(_)) => EdgeError::DeadlineExceeded(err),
            EngineError::Cloud(_) => EdgeError::Unavailable(err),
            EngineError::Index(_)
            | EngineError::Encode(_)
            | EngineError::Cache(_)
            | EngineError::Misconfigured(_)
            | EngineError::TaskLost => EdgeError::Internal(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RequestLimits = RequestLimits {
        default_k: 10,
        max_k: 100,
        max_query_chars: 20,
        dimension: 3,
    };

    fn field_of(input: RetrieveInput) -> String {
        input.validate(&LIMITS).unwrap_err().field
    }

    #[test]
    fn every_bad_input_names_its_field() {
        let text = |q: &str| Some(q.to_string());
        assert_eq!(
            field_of(RetrieveInput {
                query: text("  "),
                ..Default::default()
            }),
            "query"
        );
        assert_eq!(
            field_of(RetrieveInput {
                query: text(&"x".repeat(21)),
                ..Default::default()
            }),
            "query"
        );
        assert_eq!(field_of(RetrieveInput::default()), "query");
        for k in [0, 101, -1] {
            assert_eq!(
                field_of(RetrieveInput {
                    query: text("a"),
                    k: Some(k),
                    ..Default::default()
                }),
                "k"
            );
        }
        assert_eq!(
            field_of(RetrieveInput {
                vector: Some(vec![1.0]),
                ..Default::default()
            }),
            "vector"
        );
        assert_eq!(
            field_of(RetrieveInput {
                vector: Some(vec![1.0, f32::INFINITY, 0.0]),
                ..Default::default()
            }),
            "vector"
        );
        assert_eq!(
            field_of(RetrieveInput {
                query: text("a"),
                vector: Some(vec![1.0, 0.0, 0.0]),
                k: None
            }),
            "query"
        );
    }

    #[test]
    fn good_input_gets_defaults_and_a_normalised_vector() {
        let ok = RetrieveInput {
            query: Some(" who? ".into()),
            ..Default::default()
        }
        .validate(&LIMITS)
        .unwrap();
        assert_eq!(
            ok,
            ValidRequest {
                query: Query::Text("who?".into()),
                k: 10
            }
        );
        let v = RetrieveInput {
            vector: Some(vec![0.0, 2.0, 0.0]),
            k: Some(100),
            query: None,
        }
        .validate(&LIMITS)
        .unwrap();
        assert_eq!(
            v,
            ValidRequest {
                query: Query::Vector(vec![0.0, 1.0, 0.0]),
                k: 100
            }
        );
    }

    #[test]
    fn client_messages_keep_internals_in_the_source() {
        use crate::fallback::CloudError;
        let err = EdgeError::from(EngineError::Cloud(CloudError::Refused(
            "shard 3 at 10.0.0.7:7101 unavailable".into(),
        )));
        assert_eq!(err.kind(), "unavailable");
        assert!(!err.to_string().contains("10.0.0.7"), "{err}");
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert!(source.is_some_and(|s| s.contains("cloud")));
    }
}
