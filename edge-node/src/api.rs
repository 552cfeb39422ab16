//! The edge's request contract, shared by the JSON and gRPC front ends: what a retrieve
//! request may hold, how it is checked, and the errors a client sees.

use hasten_core::vector::normalized_query;
use serde::{Deserialize, Serialize};

use crate::cloud::CloudError;
use crate::engine::{
    EngineError, MatchedQuery, Outcome, Retrieval, RetrievedDocument, StageTimings,
};
use crate::tenants::AuthError;

/// Bounds on what a request may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub default_k: usize,
    pub max_k: usize,
    pub max_query_chars: usize,
    pub dimension: usize,
}

/// `POST /v1/retrieve` body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveBody {
    pub query: Option<String>,
    pub vector: Option<Vec<f32>>,
    pub k: Option<i64>,
}

/// What to retrieve, once checked.
#[derive(Clone, Debug, PartialEq)]
pub enum QueryInput {
    Text(String),
    /// L2-normalised.
    Vector(Vec<f32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValidRequest {
    pub input: QueryInput,
    pub k: usize,
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

impl RetrieveBody {
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
        let input = match (self.query, self.vector) {
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
                QueryInput::Text(text.to_string())
            }
            (None, Some(vector)) => QueryInput::Vector(
                normalized_query(&vector, limits.dimension)
                    .map_err(|e| InvalidArgument::new("vector", e.to_string()))?,
            ),
        };
        Ok(ValidRequest { input, k })
    }
}

/// Why a request failed, as the front ends report it.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    InvalidArgument(#[from] InvalidArgument),
    #[error("{0}")]
    Unavailable(String),
    /// Too much in flight here or in the cloud: retry shortly (HTTP 429).
    #[error("{0}")]
    Overloaded(String),
    /// No valid bearer token (HTTP 401, UNAUTHENTICATED).
    #[error(transparent)]
    Unauthenticated(#[from] AuthError),
    /// The client's deadline passed before an answer (HTTP 504, DEADLINE_EXCEEDED).
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
}

impl From<EngineError> for EdgeError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::Cloud(e @ CloudError::Overloaded(_)) => {
                EdgeError::Overloaded(e.to_string())
            }
            EngineError::Cloud(e @ CloudError::ClientDeadline(_)) => {
                EdgeError::DeadlineExceeded(e.to_string())
            }
            EngineError::Cloud(e) => {
                EdgeError::Unavailable(format!("cloud index unavailable: {e}"))
            }
            EngineError::Index(e) => EdgeError::Internal(e.to_string()),
            EngineError::Misconfigured(m) => EdgeError::Internal(m.to_string()),
            e @ EngineError::UnknownTenant(_) => EdgeError::Internal(e.to_string()),
        }
    }
}

/// `POST /v1/retrieve` response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrieveReply {
    pub documents: Vec<RetrievedDocument>,
    pub outcome: Outcome,
    pub homology_score: f64,
    pub matched_query: Option<MatchedQuery>,
    pub timings_us: StageTimings,
}

impl From<Retrieval> for RetrieveReply {
    fn from(r: Retrieval) -> Self {
        Self {
            documents: r.documents,
            outcome: r.outcome,
            homology_score: r.homology_score,
            matched_query: r.matched_query,
            timings_us: r.timings,
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

    fn field_of(body: RetrieveBody) -> String {
        body.validate(&LIMITS).unwrap_err().field
    }

    #[test]
    fn every_bad_input_names_its_field() {
        let text = |q: &str| Some(q.to_string());
        assert_eq!(
            field_of(RetrieveBody {
                query: text("  "),
                ..Default::default()
            }),
            "query"
        );
        assert_eq!(
            field_of(RetrieveBody {
                query: text(&"x".repeat(21)),
                ..Default::default()
            }),
            "query"
        );
        assert_eq!(field_of(RetrieveBody::default()), "query");
        assert_eq!(
            field_of(RetrieveBody {
                query: text("a"),
                k: Some(0),
                ..Default::default()
            }),
            "k"
        );
        assert_eq!(
            field_of(RetrieveBody {
                query: text("a"),
                k: Some(101),
                ..Default::default()
            }),
            "k"
        );
        assert_eq!(
            field_of(RetrieveBody {
                vector: Some(vec![1.0]),
                ..Default::default()
            }),
            "vector"
        );
        assert_eq!(
            field_of(RetrieveBody {
                vector: Some(vec![1.0, f32::INFINITY, 0.0]),
                ..Default::default()
            }),
            "vector"
        );
        assert_eq!(
            field_of(RetrieveBody {
                query: text("a"),
                vector: Some(vec![1.0, 0.0, 0.0]),
                k: None
            }),
            "query"
        );
    }

    #[test]
    fn good_input_gets_defaults_and_a_normalised_vector() {
        let ok = RetrieveBody {
            query: Some(" who? ".into()),
            ..Default::default()
        }
        .validate(&LIMITS)
        .unwrap();
        assert_eq!(
            ok,
            ValidRequest {
                input: QueryInput::Text("who?".into()),
                k: 10
            }
        );
        let v = RetrieveBody {
            vector: Some(vec![0.0, 2.0, 0.0]),
            k: Some(100),
            query: None,
        }
        .validate(&LIMITS)
        .unwrap();
        assert_eq!(
            v,
            ValidRequest {
                input: QueryInput::Vector(vec![0.0, 1.0, 0.0]),
                k: 100
            }
        );
    }
}
