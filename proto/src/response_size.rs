//! The most bytes a search's answer can take on the wire, from its shape alone: how many
//! queries, how many hits each, and what a hit carries. A server checks it before it
//! searches, so that an answer too large to send is refused rather than built. Protobuf's
//! encoding is known field by field (`cloud.proto`), so the bound is exact for the worst
//! case: every id 10 bytes long, every score non-zero, every hit as long as the longest.

use prost::encoding::{encoded_len_varint, key_len};

/// Field numbers of `cloud.proto` that the bound counts.
const SCORED_DOCUMENT_ID: u32 = 1;
const SCORED_DOCUMENT_SCORE: u32 = 2;
const SCORED_DOCUMENT_TITLE: u32 = 3;
const SCORED_DOCUMENT_TEXT: u32 = 4;
const SCORED_DOCUMENT_VECTOR: u32 = 5;
const SEARCH_RESPONSE_PARTIAL: u32 = 2;
const SEARCH_RESPONSE_MISSING_SHARDS: u32 = 3;
/// `QueryHits.hits`, `SearchResponse.results` and `QuicResponse.search`: every message
/// nested in an answer is field 1 of its parent.
const NESTED: u32 = 1;

/// Bytes of the largest varint of a 64-bit and a 32-bit integer.
const MAX_VARINT64_BYTES: u64 = 10;
const MAX_VARINT32_BYTES: u64 = 5;

/// What the largest answer to a search holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerShape {
    /// Queries, each with its own hit list.
    pub queries: usize,
    /// Hits per query.
    pub hits: usize,
    /// Floats in a hit's vector; 0 when vectors are left out.
    pub vector_floats: usize,
    /// Most bytes one hit's title and text take ([`texts_encoded_len`]); 0 when texts are
    /// left out.
    pub texts_bytes: usize,
    /// Shards a partial answer may list as missing; 0 for an index that answers alone.
    pub missing_shards: usize,
}

impl AnswerShape {
    /// Bytes of the largest `QuicResponse` carrying such an answer. The `SearchResponse`
    /// inside it, which is what gRPC sends, is a few bytes smaller, so this bounds both
    /// transports.
    pub fn max_encoded_len(&self) -> u64 {
        let id = field_key(SCORED_DOCUMENT_ID) + MAX_VARINT64_BYTES;
        let score = field_key(SCORED_DOCUMENT_SCORE) + 4;
        let vector = match self.vector_floats as u64 {
            0 => 0,
            floats => length_delimited(SCORED_DOCUMENT_VECTOR, floats.saturating_mul(4)),
        };
        let hit = length_delimited(NESTED, id + score + self.texts_bytes as u64 + vector);
        let query = length_delimited(NESTED, hit.saturating_mul(self.hits as u64));
        let partial = field_key(SEARCH_RESPONSE_PARTIAL) + 1;
        let missing = match self.missing_shards as u64 {
            0 => 0,
            shards => length_delimited(
                SEARCH_RESPONSE_MISSING_SHARDS,
                shards.saturating_mul(MAX_VARINT32_BYTES),
            ),
        };
        let response = query
            .saturating_mul(self.queries as u64)
            .saturating_add(partial + missing);
        length_delimited(NESTED, response)
    }
}

/// Bytes a hit's `title` and `text` take in a `ScoredDocument` (an empty string takes
/// none).
pub fn texts_encoded_len(title: &str, text: &str) -> usize {
    let string = |tag: u32, value: &str| match value.len() {
        0 => 0,
        len => key_len(tag) + encoded_len_varint(len as u64) + len,
    };
    string(SCORED_DOCUMENT_TITLE, title) + string(SCORED_DOCUMENT_TEXT, text)
}

fn field_key(tag: u32) -> u64 {
    key_len(tag) as u64
}

/// A length-delimited field of `len` bytes: its key, its length, its bytes.
fn length_delimited(tag: u32, len: u64) -> u64 {
    field_key(tag) + encoded_len_varint(len) as u64 + len
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::v1::{QueryHits, QuicResponse, ScoredDocument, SearchResponse, quic_response};

    /// The answer `shape` describes at its largest: every hit with the largest id, a
    /// non-zero score, `title` and `text`, and a vector of non-zero floats.
    fn largest_answer(shape: &AnswerShape, title: &str, text: &str) -> QuicResponse {
        let hit = ScoredDocument {
            id: u64::MAX,
            score: 0.5,
            title: title.into(),
            text: text.into(),
            vector: vec![0.25; shape.vector_floats],
        };
        let query = QueryHits {
            hits: vec![hit; shape.hits],
        };
        QuicResponse {
            body: Some(quic_response::Body::Search(SearchResponse {
                results: vec![query; shape.queries],
                partial: true,
                missing_shards: vec![u32::MAX; shape.missing_shards],
            })),
        }
    }

    #[test]
    fn the_bound_is_the_encoded_length_of_the_largest_answer() {
        let long_text = "x".repeat(300);
        let cases = [
            (3, 4, 5, "title", "a text", 2),
            (1, 1000, 384, "A title", long_text.as_str(), 0),
            (2, 0, 384, "t", "u", 1),
            (2, 7, 0, "", "", 0),
            (5, 3, 0, "", long_text.as_str(), 3),
        ];
        for (queries, hits, vector_floats, title, text, missing_shards) in cases {
            let shape = AnswerShape {
                queries,
                hits,
                vector_floats,
                texts_bytes: texts_encoded_len(title, text),
                missing_shards,
            };
            let largest = largest_answer(&shape, title, text);
            assert_eq!(
                shape.max_encoded_len(),
                largest.encoded_len() as u64,
                "{shape:?}"
            );
        }
    }

    #[test]
    fn smaller_answers_stay_under_the_bound() {
        let shape = AnswerShape {
            queries: 2,
            hits: 3,
            vector_floats: 4,
            texts_bytes: texts_encoded_len("longest title", "the longest text"),
            missing_shards: 0,
        };
        let small = SearchResponse {
            results: vec![
                QueryHits {
                    hits: vec![ScoredDocument {
                        id: 7,
                        score: 0.0,
                        title: "t".into(),
                        text: String::new(),
                        vector: vec![0.0; 4],
                    }],
                },
                QueryHits::default(),
            ],
            partial: false,
            missing_shards: Vec::new(),
        };
        assert!((small.encoded_len() as u64) < shape.max_encoded_len());
    }
}
