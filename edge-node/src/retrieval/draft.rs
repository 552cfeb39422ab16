//! HaS's draft and its verdict: the cache channel and the fuzzy channel side by side, the
//! union re-ranked by exact inner product, and the homology validation of its best
//! `validation depth` documents against the tenant's cached queries.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::DocId;
use hasten_core::index::IndexError;
use hasten_core::ranking::best_first;
use hasten_core::vector::dot;

use super::{
    DraftTrace, EngineError, MatchedQuery, RetrievalEngine, RetrievedDocument, StageTimings,
    TracedMatch,
};
use crate::caches::CacheState;
use crate::fallback::CloudSearch;
use crate::has::hot_cache::Vote;
use crate::has::{EdgeDocument, QueryId, Verdict};
use crate::tenants::Tenant;

/// Cached queries nearest the query that hybrid validation lets vote (those at least sigma
/// similar among them): a subject's questions under every relation fit well within it.
const HYBRID_NEIGHBOURS: usize = 32;

/// Draft documents, best first, with their exact inner products.
pub type Draft = Vec<(f32, Arc<EdgeDocument>)>;

/// What one channel found, and how long it took.
type Found = (Vec<Arc<EdgeDocument>>, Duration);

/// A draft and its verdict.
#[derive(Clone, Debug)]
pub struct Speculation {
    /// The best max(k, validation depth) candidates by exact inner product, best first
    /// (from the cache channel alone when the fuzzy channel is kept out of drafts).
    pub draft: Draft,
    pub verdict: Verdict,
    /// The cached query that validated the draft, when accepted.
    pub matched: Option<MatchedQuery>,
    /// Where the draft came from, when asked for.
    pub trace: Option<DraftTrace>,
}

impl<C: CloudSearch> RetrievalEngine<C> {
    /// Two-channel draft, exact re-rank, and the homology verdict against `tenant`'s cache:
    /// the accept path, without the encoder and without touching the cloud. With `trace`,
    /// also where the draft came from.
    pub fn speculate(
        &self,
        tenant: &Tenant,
        query: &[f32],
        k: usize,
        trace: bool,
        timings: &mut StageTimings,
    ) -> Result<Speculation, EngineError> {
        let depth = self.caches.depth();
        let size = k.max(depth);
        let state = self.caches.get(tenant)?.read();
        // The two channels are independent; run them side by side (the draft waits for the
        // slower one instead of their sum).
        let cache_channel = || -> Result<Found, IndexError> {
            let stage = Instant::now();
            let docs = state
                .channel
                .candidates(query, self.settings.cache_candidates.max(size))?;
            Ok((docs, stage.elapsed()))
        };
        let fuzzy_channel = || -> Result<Option<Found>, IndexError> {
            let Some(fuzzy) = &self.fuzzy else {
                return Ok(None);
            };
            let stage = Instant::now();
            let docs = fuzzy.candidates(query, self.settings.fuzzy_candidates.max(size))?;
            Ok(Some((docs, stage.elapsed())))
        };
        let (cached, fuzzy) = rayon::join(cache_channel, fuzzy_channel);
        let (cached, cache_took) = cached?;
        timings.cache_channel = Some(cache_took);
        let fuzzy = match fuzzy? {
            Some((docs, took)) => {
                timings.fuzzy_channel = Some(took);
                docs
            }
            None => Vec::new(),
        };
        let ids = |docs: &[Arc<EdgeDocument>]| docs.iter().map(|d| d.id).collect::<Vec<_>>();
        let mut draft_trace = trace.then(|| DraftTrace {
            cache_channel: ids(&cached),
            fuzzy_channel: ids(&fuzzy),
            ..DraftTrace::default()
        });
        let stage = Instant::now();
        // The paper's ablations keep the fuzzy channel out of validation or out of the
        // served draft; both then need the cache channel's own ranking.
        let settings = &self.settings;
        let ablated =
            self.fuzzy.is_some() && !(settings.fuzzy_in_validation && settings.fuzzy_in_draft);
        let cache_only = ablated.then(|| rerank(query, cached.clone(), size));
        let merged = rerank(query, cached.into_iter().chain(fuzzy).collect(), size);
        timings.merge = Some(stage.elapsed());

        let stage = Instant::now();
        let ranking = match &cache_only {
            Some(cache_only) if !settings.fuzzy_in_validation => cache_only,
            _ => &merged,
        };
        let validated: Vec<DocId> = ranking.iter().take(depth).map(|(_, d)| d.id).collect();
        let (verdict, semantic) = self.validate(&state, query, &validated, depth)?;
        let matched = verdict.best.filter(|_| verdict.accepted).and_then(|vote| {
            state.hot.get(vote.query).map(|entry| MatchedQuery {
                id: entry.id,
                text: entry.text.clone(),
                shared_documents: vote.shared,
            })
        });
        timings.validation = Some(stage.elapsed());
        let mut draft = match cache_only {
            Some(cache_only) if !settings.fuzzy_in_draft => cache_only,
            _ => merged,
        };
        // The validating query's documents join what is served: always after a semantic
        // acceptance (they are why the draft was trusted), after a homology one by choice.
        if let Some(matched) = &matched
            && (semantic || settings.draft_with_matched)
            && let Some(entry) = state.hot.get(matched.id)
        {
            let theirs = entry
                .doc_ids
                .iter()
                .filter_map(|id| state.channel.document(*id).cloned());
            let pool = draft.into_iter().map(|(_, d)| d).chain(theirs).collect();
            draft = rerank(query, pool, size);
        }
        if let Some(trace) = &mut draft_trace {
            trace.draft = draft.iter().take(k).map(|(_, d)| d.id).collect();
            trace.best_match = verdict.best.and_then(|vote| {
                state.hot.get(vote.query).map(|entry| TracedMatch {
                    id: entry.id,
                    text: entry.text.clone(),
                    shared_documents: vote.shared,
                    documents: entry.doc_ids.clone(),
                })
            });
        }
        Ok(Speculation {
            draft,
            verdict,
            matched,
            trace: draft_trace,
        })
    }

    /// The verdict on a draft's `validated` documents, and whether it was a semantic
    /// acceptance (hybrid validation: the nearest cached query similar enough on its own).
    fn validate(
        &self,
        state: &CacheState,
        query: &[f32],
        validated: &[DocId],
        depth: usize,
    ) -> Result<(Verdict, bool), EngineError> {
        let settings = &self.settings;
        let Some(sigma) = settings.hybrid_similarity else {
            let verdict =
                self.validator
                    .judge(&state.hot, validated, depth, &settings.validation, None);
            return Ok((verdict, false));
        };
        let near = state.lookup.nearest_n(query, HYBRID_NEIGHBOURS)?;
        let voters: Vec<QueryId> = near
            .iter()
            .filter(|(_, similarity)| *similarity >= sigma)
            .map(|(id, _)| *id)
            .collect();
        let verdict = self.validator.judge(
            &state.hot,
            validated,
            depth,
            &settings.validation,
            Some(&voters),
        );
        if verdict.accepted {
            return Ok((verdict, false));
        }
        match near.first() {
            Some(&(nearest, similarity)) if similarity >= settings.semantic_threshold => {
                let vote = state
                    .hot
                    .best_among(&[nearest], validated, |_| 1.0)
                    .unwrap_or(Vote {
                        query: nearest,
                        shared: 0,
                        weight: 0.0,
                    });
                let accepted = Verdict {
                    accepted: true,
                    best: Some(vote),
                    ..verdict
                };
                Ok((accepted, true))
            }
            _ => Ok((verdict, false)),
        }
    }

    /// The fuzzy channel's candidates re-ranked exactly, top k.
    pub(super) fn fuzzy_draft(
        &self,
        query: &[f32],
        k: usize,
        timings: &mut StageTimings,
    ) -> Result<Draft, EngineError> {
        let Some(fuzzy) = &self.fuzzy else {
            return Err(EngineError::Misconfigured("the fuzzy channel is off"));
        };
        let stage = Instant::now();
        let candidates = fuzzy.candidates(query, self.settings.fuzzy_candidates.max(k))?;
        timings.fuzzy_channel = Some(stage.elapsed());
        let stage = Instant::now();
        let draft = rerank(query, candidates, k);
        timings.merge = Some(stage.elapsed());
        Ok(draft)
    }
}

/// Candidates deduplicated by id, ranked by exact inner product with the query (Hasten's
/// ranking order), best `size`.
fn rerank(query: &[f32], candidates: Vec<Arc<EdgeDocument>>, size: usize) -> Draft {
    let mut seen = HashSet::with_capacity(candidates.len());
    let mut draft: Draft = candidates
        .into_iter()
        .filter(|doc| seen.insert(doc.id))
        .map(|doc| (dot(query, &doc.vector), doc))
        .collect();
    draft.sort_by(|a, b| best_first((a.0, a.1.id), (b.0, b.1.id)));
    draft.truncate(size);
    draft
}

/// The best `k` of a draft, as served.
pub(super) fn served(draft: Draft, k: usize) -> Vec<RetrievedDocument> {
    draft
        .into_iter()
        .take(k)
        .map(|(score, doc)| RetrievedDocument {
            id: doc.id,
            title: doc.title.clone(),
            text: doc.text.clone(),
            score,
        })
        .collect()
}
