//! The JSON API's wire types: `POST /v1/retrieve` bodies and replies, `GET /v1/status`,
//! and error bodies. Domain types never reach serde; [`super::conversions`] maps them.

use display_full_error::DisplayFullErrorExt;
use serde::{Deserialize, Serialize};

use super::InvalidArgument;

/// `POST /v1/retrieve` body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveBody {
    pub query: Option<String>,
    pub vector: Option<Vec<f32>>,
    pub k: Option<i64>,
}

/// Parses a `/v1/retrieve` body, naming the offending field on error.
pub fn parse_body(bytes: &[u8]) -> Result<RetrieveBody, InvalidArgument> {
    parse_json_object(bytes)
}

/// Parses a JSON object body into `T`, naming the offending field on error (`body` when it
/// is not a JSON object at all: serde would also read a struct from a JSON array, by
/// position).
pub fn parse_json_object<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, InvalidArgument> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(InvalidArgument::new("body", "must be a JSON object"));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let body: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let field = if matches!(path.as_str(), "" | "." | "?") {
            "body".to_string()
        } else {
            path
        };
        InvalidArgument::new(field, err.into_inner().to_string())
    })?;
    deserializer
        .end()
        .map_err(|err| InvalidArgument::new("body", err.to_string_full()))?;
    Ok(body)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeJson {
    Accepted,
    Fallback,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentJson {
    pub id: u64,
    pub title: String,
    pub text: String,
    pub score: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatchedQueryJson {
    pub id: u64,
    /// Present only where the operator shows cached queries' texts
    /// (`expose_matched_query_text`): it is another user's question.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub text: Option<String>,
    pub shared_documents: usize,
}

/// Microseconds per stage; a stage that did not run is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingsJson {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub encode_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cache_channel_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fuzzy_channel_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub merge_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub validation_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cloud_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cache_update_us: Option<u64>,
    pub total_us: u64,
}

/// `POST /v1/retrieve` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrieveReply {
    pub documents: Vec<DocumentJson>,
    pub outcome: OutcomeJson,
    pub homology_score: f64,
    pub matched_query: Option<MatchedQueryJson>,
    pub timings_us: TimingsJson,
    /// Where the HaS draft came from; only where the operator shows it
    /// (`expose_draft_trace`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub draft_trace: Option<DraftTraceJson>,
}

/// Document ids of an HaS draft and of what it was drawn and validated from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DraftTraceJson {
    pub draft: Vec<u64>,
    pub cache_channel: Vec<u64>,
    pub fuzzy_channel: Vec<u64>,
    pub best_match: Option<TracedMatchJson>,
}

/// The cached query with the most votes, and the documents it cached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TracedMatchJson {
    pub id: u64,
    /// As `matched_query.text`: only where the operator shows cached queries' texts.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub text: Option<String>,
    pub shared_documents: usize,
    pub documents: Vec<u64>,
}

/// The control-plane link in `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkJson {
    pub applied_index: u64,
    pub subscribed: bool,
    pub proposed: u64,
    pub dropped: u64,
}

/// The cloud link in `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CloudLinkJson {
    /// `unknown`, `verified`, `unreachable` or `version_mismatch`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusJson {
    pub policy: String,
    pub tau: f64,
    pub semantic_threshold: f32,
    pub corpus_version: String,
    pub cached_queries: usize,
    pub cached_documents: usize,
    pub cache_bytes: usize,
    /// This edge's FIFO bound per tenant; absent when the control plane decides evictions.
    pub cache_capacity: Option<usize>,
    pub default_k: usize,
    /// Documents validated per draft and cached per query.
    pub validation_depth: usize,
    pub cloud: CloudLinkJson,
    pub control_plane: Option<LinkJson>,
    /// Replicated entries not cached here, by reason.
    pub skipped_entries: std::collections::BTreeMap<&'static str, u64>,
    /// Corpus documents this edge holds: all, or its share with `corpus_fraction` < 1.
    pub held_documents: usize,
    /// Documents of cached entries outside the share, fetched from the cloud since start.
    pub fetched_documents: u64,
    /// Such documents waiting to be fetched.
    pub pending_documents: usize,
    /// What generates answers; absent on an edge without a language model.
    pub generation: Option<GenerationJson>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerationJson {
    pub verifier: String,
    pub drafter: String,
    /// Where it runs: this process's device, a worker, or an engine (with how the engine
    /// scores speculative drafts).
    pub device: String,
    /// The answer modes served (`standard`, `speculative`).
    pub modes: Vec<String>,
}

/// Error body of every failed request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorJson {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorDetail {
    pub code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_field_or_the_body() {
        assert_eq!(
            parse_body(br#"{"query": "a", "k": "ten"}"#)
                .unwrap_err()
                .field,
            "k"
        );
        assert_eq!(
            parse_body(br#"{"query": "a", "vector": [1, "x"]}"#)
                .unwrap_err()
                .field,
            "vector[1]"
        );
        assert_eq!(parse_body(b"{not json").unwrap_err().field, "body");
        let array = parse_body(br#"["who?", null, 3]"#).unwrap_err();
        assert_eq!(
            (array.field.as_str(), array.message.as_str()),
            ("body", "must be a JSON object")
        );
        assert_eq!(
            parse_body(br#"{"query": "a"} trailing"#).unwrap_err().field,
            "body"
        );
        let unknown = parse_body(br#"{"qeury": "a"}"#).unwrap_err();
        assert!(unknown.message.contains("unknown field"), "{unknown}");
        assert_eq!(parse_body(br#"{"query": "a", "k": 3}"#).unwrap().k, Some(3));
    }
}
