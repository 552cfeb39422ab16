//! The query-level caches HaS is compared with: an exact-repeat cache (answered before any
//! encoding) and a semantic-threshold cache. Both serve a cached query's own result.

use std::time::Instant;

use hasten_core::vector::dot;

use super::{
    EngineError, MatchedQuery, Outcome, Retrieval, RetrievalEngine, RetrievalPolicy,
    RetrievedDocument, StageTimings,
};
use crate::caches::CacheState;
use crate::fallback::CloudSearch;
use crate::has::QueryId;
use crate::tenants::Tenant;

/// A cached query's result served as an answer, and the query.
type CachedAnswer = (Vec<RetrievedDocument>, MatchedQuery);

impl<C: CloudSearch> RetrievalEngine<C> {
    /// The exact-repeat cache's answer for `text` among `tenant`'s queries, when the policy
    /// is the exact-repeat cache and it holds that text.
    pub(super) fn exact_repeat(
        &self,
        tenant: &Tenant,
        text: &str,
        k: usize,
        started: Instant,
    ) -> Result<Option<Retrieval>, EngineError> {
        if self.settings.policy != RetrievalPolicy::ExactCache {
            return Ok(None);
        }
        let state = self.caches.get(tenant)?.read();
        let Some((documents, matched)) = state
            .lookup
            .find_text(text)
            .and_then(|(id, vector)| serve_entry(&state, id, vector, k))
        else {
            return Ok(None);
        };
        let took = started.elapsed();
        Ok(Some(Retrieval {
            documents,
            outcome: Outcome::Accepted,
            homology_score: 1.0,
            matched_query: Some(matched),
            timings: StageTimings {
                validation: Some(took),
                total: took,
                ..StageTimings::default()
            },
            draft_trace: None,
        }))
    }

    /// The semantic cache's verdict for `query`: the nearest cached query's similarity,
    /// and its result when the similarity reaches the threshold.
    pub(super) fn semantic_hit(
        &self,
        tenant: &Tenant,
        query: &[f32],
        k: usize,
        timings: &mut StageTimings,
    ) -> Result<(f64, Option<CachedAnswer>), EngineError> {
        let stage = Instant::now();
        let state = self.caches.get(tenant)?.read();
        let found = state.lookup.nearest(query)?;
        let score = found.map_or(0.0, |(_, similarity)| f64::from(similarity));
        let hit = found
            .filter(|(_, similarity)| *similarity >= self.settings.semantic_threshold)
            .and_then(|(id, _)| serve_entry(&state, id, query, k));
        timings.validation = Some(stage.elapsed());
        Ok((score, hit))
    }
}

/// A cached query's result served as the answer: its first k documents, scored against
/// `query`. `None` when it holds fewer than k.
fn serve_entry(state: &CacheState, id: QueryId, query: &[f32], k: usize) -> Option<CachedAnswer> {
    let entry = state.hot.get(id)?;
    if entry.doc_ids.len() < k {
        return None;
    }
    let documents = entry.doc_ids[..k]
        .iter()
        .map(|doc_id| {
            state
                .channel
                .document(*doc_id)
                .map(|doc| RetrievedDocument {
                    id: doc.id,
                    title: doc.title.clone(),
                    text: doc.text.clone(),
                    score: dot(query, &doc.vector),
                })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((
        documents,
        MatchedQuery {
            id,
            text: entry.text.clone(),
            shared_documents: k,
        },
    ))
}
