//! Homology validation: a draft is trusted when one cached query's exact result shares
//! enough of the draft's documents. Homologous queries (same entity, another attribute)
//! retrieve overlapping passages, so the overlap stands in for the exact search's verdict.

use std::sync::atomic::{AtomicU64, Ordering};

use hasten_core::DocId;
use serde::{Deserialize, Serialize};

use super::hot_cache::{HotCache, QueryId, Vote};

/// Tolerance when comparing scores with tau: tau comes from a decimal configuration and
/// tau x depth is meant to be an integer count (0.2 x 10 = 2 shared documents).
const TAU_EPSILON: f64 = 1e-9;

/// How much a shared document's vote weighs.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum VoteWeighting {
    /// Every shared document counts one (the paper).
    #[default]
    Count,
    /// A shared document weighs by its rank in the draft, 1 / log2(rank + 2) as in DCG, so
    /// sharing the draft's best documents counts more than sharing its tail.
    Rank,
}

impl VoteWeighting {
    /// The weight of the draft document at `rank` (0 = best).
    pub fn weight(self, rank: usize) -> f64 {
        match self {
            Self::Count => 1.0,
            Self::Rank => 1.0 / (rank as f64 + 2.0).log2(),
        }
    }
}

/// What a draft must show beyond the votes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ValidationRules {
    pub weighting: VoteWeighting,
    /// The validating query's best this many cached documents must all be among the
    /// draft's validated documents (0: no such requirement).
    pub require_matched_top: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub accepted: bool,
    /// Vote weight of the best cached query divided by the weight of a full match at the
    /// validation depth (with counted votes: shared documents / depth).
    pub score: f64,
    pub best: Option<Vote>,
}

/// The threshold is an atomic so the control plane's runtime configuration can change it
/// while drafts are judged.
#[derive(Debug)]
pub struct HomologyValidator {
    tau_bits: AtomicU64,
}

impl HomologyValidator {
    /// `tau` in [0, 1]: the share of the validated draft documents one cached query must
    /// hold.
    pub fn new(tau: f64) -> Self {
        Self {
            tau_bits: AtomicU64::new(tau.to_bits()),
        }
    }

    pub fn tau(&self) -> f64 {
        f64::from_bits(self.tau_bits.load(Ordering::Relaxed))
    }

    pub fn set_tau(&self, tau: f64) {
        self.tau_bits.store(tau.to_bits(), Ordering::Relaxed);
    }

    /// Scores the draft's best `depth` documents against the cache (against `voters` alone
    /// when given): score = the best cached query's vote weight over a full match's;
    /// accepted when score >= tau and `rules` hold. The depth is the same for every
    /// request (cached entries hold that many documents too), so k does not change how
    /// many shared documents accept a draft.
    pub fn judge(
        &self,
        cache: &HotCache,
        draft: &[DocId],
        depth: usize,
        rules: &ValidationRules,
        voters: Option<&[QueryId]>,
    ) -> Verdict {
        let depth = depth.max(1);
        let validated = &draft[..draft.len().min(depth)];
        let weight = |rank| rules.weighting.weight(rank);
        let best = match voters {
            Some(ids) => cache.best_among(ids, validated, weight),
            None => cache.best_match(validated, weight),
        };
        let full: f64 = (0..depth).map(weight).sum();
        let score = best.map_or(0.0, |vote| vote.weight / full);
        let holds_top = |vote: &Vote| {
            cache.get(vote.query).is_some_and(|entry| {
                entry
                    .doc_ids
                    .iter()
                    .take(rules.require_matched_top)
                    .all(|doc| validated.contains(doc))
            })
        };
        let accepted = best
            .as_ref()
            .is_some_and(|vote| score >= self.tau() - TAU_EPSILON && holds_top(vote));
        Verdict {
            accepted,
            score,
            best,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTED: ValidationRules = ValidationRules {
        weighting: VoteWeighting::Count,
        require_matched_top: 0,
    };

    fn cache_with(results: &[&[DocId]]) -> HotCache {
        let mut cache = HotCache::bounded(100);
        for docs in results {
            cache.insert(None, docs);
        }
        cache
    }

    #[test]
    fn score_is_votes_over_k_for_the_best_cached_query() {
        let cache = cache_with(&[&[1, 2, 3], &[4, 5, 6, 7]]);
        let verdict = HomologyValidator::new(0.2).judge(
            &cache,
            &[4, 5, 6, 1, 9, 10, 11, 12, 13, 14],
            10,
            &COUNTED,
            None,
        );
        assert_eq!(verdict.best.map(|v| v.shared), Some(3));
        assert!((verdict.score - 0.3).abs() < 1e-12);
        assert!(verdict.accepted);
    }

    #[test]
    fn a_score_of_exactly_tau_accepts_and_one_vote_less_rejects() {
        let cache = cache_with(&[&[1, 2, 3]]);
        let draft_two = [1, 2, 20, 21, 22, 23, 24, 25, 26, 27];
        let draft_one = [1, 30, 20, 21, 22, 23, 24, 25, 26, 27];
        for tau in [0.2, 0.1 + 0.1] {
            let validator = HomologyValidator::new(tau);
            assert!(
                validator
                    .judge(&cache, &draft_two, 10, &COUNTED, None)
                    .accepted,
                "tau {tau}"
            );
            assert!(
                !validator
                    .judge(&cache, &draft_one, 10, &COUNTED, None)
                    .accepted,
                "tau {tau}"
            );
        }
        let tau_03 = HomologyValidator::new(0.3);
        assert!(
            tau_03
                .judge(
                    &cache_with(&[&[1, 2, 3]]),
                    &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                    10,
                    &COUNTED,
                    None
                )
                .accepted
        );
    }

    #[test]
    fn only_the_drafts_best_depth_documents_vote() {
        let cache = cache_with(&[&[1, 2, 3]]);
        // Documents 2 and 3 are shared, but only the first 10 draft documents are judged.
        let mut draft: Vec<DocId> = (100..109).collect();
        draft.insert(0, 1);
        draft.extend([2, 3]);
        let verdict = HomologyValidator::new(0.2).judge(&cache, &draft, 10, &COUNTED, None);
        assert_eq!(verdict.best.map(|v| v.shared), Some(1));
        assert!(!verdict.accepted);
        assert!((verdict.score - 0.1).abs() < 1e-12);
    }

    #[test]
    fn an_empty_cache_never_accepts_even_at_tau_zero() {
        let verdict =
            HomologyValidator::new(0.0).judge(&HotCache::bounded(5), &[1, 2], 10, &COUNTED, None);
        assert!(!verdict.accepted);
        assert_eq!(verdict.score, 0.0);
    }

    #[test]
    fn rank_weights_score_a_match_on_the_drafts_head_above_one_on_its_tail() {
        let by_rank = ValidationRules {
            weighting: VoteWeighting::Rank,
            ..COUNTED
        };
        let draft: Vec<DocId> = (1..=10).collect();
        let validator = HomologyValidator::new(0.3);
        let head = validator.judge(&cache_with(&[&[1, 2, 90]]), &draft, 10, &by_rank, None);
        let tail = validator.judge(&cache_with(&[&[9, 10, 90]]), &draft, 10, &by_rank, None);
        // Two shared documents each: 0.2 by count, rejected at 0.3 either way by count.
        assert!(head.accepted && !tail.accepted, "{head:?} {tail:?}");
        assert!(head.score > 0.3 && tail.score < 0.15);
        let full = validator.judge(&cache_with(&[&draft]), &draft, 10, &by_rank, None);
        assert!((full.score - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_required_top_rejects_a_match_whose_best_documents_the_draft_lacks() {
        let cache = cache_with(&[&[50, 1, 2, 3]]);
        let draft: Vec<DocId> = (1..=10).collect();
        let needs_top = ValidationRules {
            require_matched_top: 1,
            ..COUNTED
        };
        let validator = HomologyValidator::new(0.2);
        assert!(validator.judge(&cache, &draft, 10, &COUNTED, None).accepted);
        let verdict = validator.judge(&cache, &draft, 10, &needs_top, None);
        assert!(!verdict.accepted);
        assert_eq!(verdict.best.map(|v| v.shared), Some(3));
        let with_top: Vec<DocId> = [50].into_iter().chain(1..=9).collect();
        assert!(
            validator
                .judge(&cache, &with_top, 10, &needs_top, None)
                .accepted
        );
    }

    #[test]
    fn voters_restrict_who_may_validate() {
        let cache = cache_with(&[&[1, 2, 3], &[1, 2]]);
        let draft: Vec<DocId> = (1..=10).collect();
        let validator = HomologyValidator::new(0.3);
        let newer_only = validator.judge(&cache, &draft, 10, &COUNTED, Some(&[1]));
        assert!(!newer_only.accepted);
        assert_eq!(newer_only.best.map(|v| v.query), Some(1));
        assert!(
            validator
                .judge(&cache, &draft, 10, &COUNTED, Some(&[0, 1]))
                .accepted
        );
        assert!(
            !validator
                .judge(&cache, &draft, 10, &COUNTED, Some(&[]))
                .accepted
        );
    }
}
