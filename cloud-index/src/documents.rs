//! Documents by id: what an edge that holds a fraction of the corpus asks for to serve a
//! cached entry another edge learned. A shard answers from its bundle; a router splits the
//! ids by shard and asks each shard's replicas, as it does for a search.

use std::collections::{HashMap, HashSet};

use hasten_core::DocId;
use hasten_core::bundle::ShardOf;
use hasten_proto::v1::{DocumentsRequest, DocumentsResponse, ScoredDocument};

use crate::error::SearchError;
use crate::response_limit::{ResponseLimit, SearchShape};

/// Most ids in one request: an edge asks for the documents of the entries it applies in
/// one batch; a restart's catch-up spreads over several.
pub const MAX_DOCUMENT_IDS: usize = 1024;

/// Checks `request` before any work, shard or router alike: 1..=[`MAX_DOCUMENT_IDS`] ids
/// and an answer within the message limit. Returns the ids without repeats, in the order
/// of their first request.
pub fn validated_ids(
    request: &DocumentsRequest,
    limit: &ResponseLimit,
) -> Result<Vec<DocId>, SearchError> {
    if request.ids.is_empty() || request.ids.len() > MAX_DOCUMENT_IDS {
        return Err(SearchError::InvalidArgument(format!(
            "ids must hold 1..={MAX_DOCUMENT_IDS} document ids, got {}",
            request.ids.len()
        )));
    }
    let mut seen = HashSet::with_capacity(request.ids.len());
    let ids: Vec<DocId> = request
        .ids
        .iter()
        .copied()
        .filter(|id| seen.insert(*id))
        .collect();
    // The answer is shaped like one query's hit list with a hit per id.
    let shape = SearchShape {
        queries: 1,
        k: ids.len(),
        include_vectors: request.include_vectors,
        include_texts: request.include_texts,
    };
    if !limit.fits(shape) {
        return Err(SearchError::InvalidArgument(format!(
            "{} documents{} could exceed the message limit; ask for fewer ids at once",
            ids.len(),
            if request.include_texts {
                " with their texts"
            } else {
                ""
            }
        )));
    }
    Ok(ids)
}

/// `ids` split by the shard holding each, among `shards` partitions (`id % shards`, as
/// `cloud-index build --shards` partitions a corpus), each shard's in request order.
pub fn ids_by_shard(ids: &[DocId], shards: usize) -> Vec<Vec<DocId>> {
    let mut split = vec![Vec::new(); shards.max(1)];
    for &id in ids {
        split[ShardOf::of_document(id, shards as u32) as usize].push(id);
    }
    split
}

/// The shards' answers as one, in the order of `ids`: an id no shard returned is missing.
pub fn merge_shard_documents(ids: &[DocId], answers: Vec<DocumentsResponse>) -> DocumentsResponse {
    let mut found: HashMap<DocId, ScoredDocument> = answers
        .into_iter()
        .flat_map(|answer| answer.documents)
        .map(|doc| (doc.id, doc))
        .collect();
    let mut merged = DocumentsResponse::default();
    for id in ids {
        match found.remove(id) {
            Some(doc) => merged.documents.push(doc),
            None => merged.missing_ids.push(*id),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    fn limit() -> ResponseLimit {
        ResponseLimit::new(4, 100, 64, 0)
    }

    #[test]
    fn ids_are_checked_and_deduplicated_in_request_order() {
        let request = |ids: Vec<u64>| DocumentsRequest {
            ids,
            include_texts: true,
            ..Default::default()
        };
        assert_eq!(
            validated_ids(&request(vec![7, 3, 7, 1]), &limit()).unwrap(),
            vec![7, 3, 1]
        );
        assert!(matches!(
            validated_ids(&request(vec![]), &limit()),
            Err(SearchError::InvalidArgument(_))
        ));
        let too_many = (0..=MAX_DOCUMENT_IDS as u64).collect();
        assert!(matches!(
            validated_ids(&request(too_many), &limit()),
            Err(SearchError::InvalidArgument(_))
        ));
    }

    #[test]
    fn an_answer_above_the_message_limit_is_refused_before_any_work() {
        // Documents of 100 MB each: one fits no frame.
        let huge = ResponseLimit::new(4, 100, 100 << 20, 0);
        let request = DocumentsRequest {
            ids: vec![1],
            include_texts: true,
            ..Default::default()
        };
        let err = validated_ids(&request, &huge).unwrap_err();
        assert!(err.to_string_full().contains("fewer ids"), "{err}");
        let without_texts = DocumentsRequest {
            include_texts: false,
            ..request
        };
        assert!(validated_ids(&without_texts, &huge).is_ok());
    }

    #[test]
    fn ids_split_by_shard_and_merge_back_in_request_order_with_the_missing_named() {
        let ids = vec![5, 2, 9, 4];
        assert_eq!(ids_by_shard(&ids, 2), vec![vec![2, 4], vec![5, 9]]);
        assert_eq!(ids_by_shard(&ids, 1), vec![ids.clone()]);
        let doc = |id| ScoredDocument {
            id,
            ..Default::default()
        };
        let merged = merge_shard_documents(
            &ids,
            vec![
                DocumentsResponse {
                    documents: vec![doc(4), doc(2)],
                    missing_ids: vec![],
                },
                DocumentsResponse {
                    documents: vec![doc(5)],
                    missing_ids: vec![9],
                },
            ],
        );
        let order: Vec<u64> = merged.documents.iter().map(|d| d.id).collect();
        assert_eq!(order, vec![5, 2, 4]);
        assert_eq!(merged.missing_ids, vec![9]);
    }
}
