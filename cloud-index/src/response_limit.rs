//! The largest answer a cloud server builds. A search whose answer could exceed the message
//! limit of the cloud's transports (one QUIC frame or one gRPC message,
//! [`DEFAULT_MAX_FRAME_BYTES`]) is refused before any work, naming what to reduce: built,
//! such an answer could only fail at encoding (1,024 queries x k = 1,000 with vectors and
//! texts built 2.3 GB on the demo corpus, at a peak of 4.7 GB resident, before failing).

use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::response_size::AnswerShape;
use hasten_proto::v1::SearchRequest;

use crate::error::SearchError;

/// What a search asks for, as far as the size of its answer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchShape {
    pub queries: usize,
    pub k: usize,
    pub include_vectors: bool,
    pub include_texts: bool,
}

impl SearchShape {
    pub fn of(request: &SearchRequest) -> Self {
        Self {
            queries: request.queries.len(),
            k: request.k as usize,
            include_vectors: request.include_vectors,
            include_texts: request.include_texts,
        }
    }

    /// One request carrying the queries of both, as a router combines the searches of a
    /// batch: the larger k, and whatever either includes.
    pub fn joined(self, other: Self) -> Self {
        Self {
            queries: self.queries + other.queries,
            k: self.k.max(other.k),
            include_vectors: self.include_vectors || other.include_vectors,
            include_texts: self.include_texts || other.include_texts,
        }
    }
}

/// The answers one server can send: what its hits can carry, and the message limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLimit {
    /// Floats in a document vector.
    dimension: usize,
    /// Documents searched: no query gets more hits.
    documents: usize,
    /// Most bytes one hit's title and text take encoded.
    texts_bytes: usize,
    /// Shards a partial answer may name as missing (0 for a shard server).
    shards: usize,
    /// Largest answer sent, in bytes.
    max_bytes: u64,
}

impl ResponseLimit {
    /// A server searching `documents` documents of `dimension`, whose largest hit carries
    /// `texts_bytes` of title and text ([`hasten_proto::response_size::texts_encoded_len`]),
    /// answering for `shards` shards (a router; 0 for a shard server).
    pub fn new(dimension: usize, documents: usize, texts_bytes: usize, shards: usize) -> Self {
        Self {
            dimension,
            documents,
            texts_bytes,
            shards,
            max_bytes: DEFAULT_MAX_FRAME_BYTES as u64,
        }
    }

    /// Floats in a document vector, which every query must have.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Most bytes one hit's title and text take encoded.
    pub fn texts_bytes(&self) -> usize {
        self.texts_bytes
    }

    /// Bytes of the largest answer to `search`.
    pub fn worst_case_bytes(&self, search: SearchShape) -> u64 {
        AnswerShape {
            queries: search.queries,
            hits: search.k.min(self.documents),
            vector_floats: if search.include_vectors {
                self.dimension
            } else {
                0
            },
            texts_bytes: if search.include_texts {
                self.texts_bytes
            } else {
                0
            },
            missing_shards: self.shards,
        }
        .max_encoded_len()
    }

    pub fn fits(&self, search: SearchShape) -> bool {
        self.worst_case_bytes(search) <= self.max_bytes
    }

    /// Refuses `search` when its answer could exceed the message limit, naming what the
    /// caller can reduce.
    pub fn check(&self, search: SearchShape) -> Result<(), SearchError> {
        let bytes = self.worst_case_bytes(search);
        if bytes <= self.max_bytes {
            return Ok(());
        }
        let mut remedies = vec!["fewer queries", "a smaller k"];
        if search.include_vectors {
            remedies.push("include_vectors = false");
        }
        if search.include_texts {
            remedies.push("include_texts = false");
        }
        Err(SearchError::InvalidArgument(format!(
            "the answer to {} queries x k = {}{} could take {:.1} MiB, above the message limit of {:.0} MiB; ask with {}",
            search.queries,
            search.k,
            contents(search),
            mib(bytes),
            mib(self.max_bytes),
            remedies.join(", ")
        )))
    }
}

fn contents(search: SearchShape) -> &'static str {
    match (search.include_vectors, search.include_texts) {
        (true, true) => " with vectors and texts",
        (true, false) => " with vectors",
        (false, true) => " with texts",
        (false, false) => "",
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    fn shape(queries: usize, k: usize, include_vectors: bool, include_texts: bool) -> SearchShape {
        SearchShape {
            queries,
            k,
            include_vectors,
            include_texts,
        }
    }

    /// 384-d vectors and passages of up to ~1 KB over 100,000 documents.
    fn limit() -> ResponseLimit {
        ResponseLimit::new(384, 100_000, 1024, 0)
    }

    #[test]
    fn the_testers_search_is_refused_naming_what_to_reduce() {
        let err = limit().check(shape(1024, 1000, true, true)).unwrap_err();
        let SearchError::InvalidArgument(message) = &err else {
            panic!("not an invalid argument: {err}");
        };
        for named in [
            "1024 queries x k = 1000",
            "fewer queries",
            "smaller k",
            "include_vectors = false",
            "include_texts = false",
            "64 MiB",
        ] {
            assert!(message.contains(named), "{message} lacks {named}");
        }
        // Ids and scores alone fit the message limit at any k and batch size; under a
        // smaller limit they would not, and there is nothing to leave out.
        assert!(limit().fits(shape(1024, 1000, false, false)));
        let small = ResponseLimit {
            max_bytes: 1 << 20,
            ..limit()
        };
        let err = small.check(shape(1024, 1000, false, false)).unwrap_err();
        assert!(
            !err.to_string_full().contains("include_"),
            "nothing to leave out: {err}"
        );
    }

    #[test]
    fn the_limit_is_the_message_limit_whatever_the_answer_carries() {
        let limit = limit();
        assert!(limit.fits(shape(1, 10, true, true)), "an edge's fallback");
        assert!(
            limit.fits(shape(256, 10, true, true)),
            "a batch of fallbacks"
        );
        // The largest k that fits a batch of 256 queries with vectors and no texts, and the
        // next one, which does not.
        let fitting = (1..=1000)
            .take_while(|&k| limit.fits(shape(256, k, true, false)))
            .last()
            .unwrap();
        let at = limit.worst_case_bytes(shape(256, fitting, true, false));
        let beyond = limit.worst_case_bytes(shape(256, fitting + 1, true, false));
        assert!(at <= DEFAULT_MAX_FRAME_BYTES as u64 && beyond > DEFAULT_MAX_FRAME_BYTES as u64);
        assert!(limit.check(shape(256, fitting + 1, true, false)).is_err());
        // Leaving the vectors out, the same search fits.
        assert!(limit.fits(shape(256, fitting + 1, false, false)));
    }

    #[test]
    fn no_query_gets_more_hits_than_there_are_documents() {
        let small = ResponseLimit::new(384, 90, 1024, 0);
        assert_eq!(
            small.worst_case_bytes(shape(4, 1000, true, true)),
            small.worst_case_bytes(shape(4, 90, true, true))
        );
    }

    #[test]
    fn joined_searches_take_the_larger_k_and_whatever_either_includes() {
        let joined = shape(2, 50, false, true).joined(shape(3, 10, true, false));
        assert_eq!(joined, shape(5, 50, true, true));
    }
}
