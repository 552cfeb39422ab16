//! RaLMSpec's speculative retriever: a per-request cache of the documents the exact
//! retriever returned, ranked with the exact retriever's own metric.

use std::collections::HashSet;

use hasten_core::vector::dot;

use crate::retriever::RetrievedDocument;

/// Guesses the exact retriever's top-1 document for a query.
pub trait Speculator: Send {
    /// The guess for `query`, or `None` when there is nothing to guess from.
    fn speculate(&mut self, query: &[f32]) -> Option<RetrievedDocument>;
    /// Documents the exact retriever returned, best first per query.
    fn observe(&mut self, documents: &[RetrievedDocument]);
}

/// The documents of one request's exact retrievals, searched exhaustively by inner product
/// (the exact retriever's metric on normalised vectors): a request sees tens of documents,
/// so a scan costs microseconds and needs no index.
#[derive(Debug, Default)]
pub struct LocalDocumentCache {
    documents: Vec<RetrievedDocument>,
    ids: HashSet<u64>,
}

impl LocalDocumentCache {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    /// The cached document closest to `query`; on equal scores the one cached first.
    pub fn nearest(&self, query: &[f32]) -> Option<&RetrievedDocument> {
        let mut best: Option<(&RetrievedDocument, f32)> = None;
        for document in &self.documents {
            let score = dot(query, &document.vector);
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((document, score));
            }
        }
        best.map(|(document, _)| document)
    }
}

impl Speculator for LocalDocumentCache {
    fn speculate(&mut self, query: &[f32]) -> Option<RetrievedDocument> {
        self.nearest(query).cloned()
    }

    fn observe(&mut self, documents: &[RetrievedDocument]) {
        for document in documents {
            if self.ids.insert(document.id) {
                self.documents.push(document.clone());
            }
        }
    }
}
