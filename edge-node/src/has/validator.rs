//! Homology validation: a draft is trusted when one cached query's exact result shares
//! enough of the draft's documents. Homologous queries (same entity, another attribute)
//! retrieve overlapping passages, so the overlap stands in for the exact search's verdict.

use std::sync::atomic::{AtomicU64, Ordering};

use hasten_core::DocId;

use super::hot_cache::{HotCache, Vote};

/// Tolerance when comparing votes with tau x k: tau comes from a decimal configuration and
/// tau x k is meant to be an integer count (0.2 x 10 = 2 shared documents).
const TAU_EPSILON: f64 = 1e-9;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub accepted: bool,
    /// Votes of the best cached query divided by the validation depth.
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

    /// Scores the draft's best `depth` documents against the cache: score = votes / depth
    /// for the best cached query; accepted when score >= tau. The depth is the same for
    /// every request (cached entries hold that many documents too), so k does not change
    /// how many shared documents accept a draft.
    pub fn judge(&self, cache: &HotCache, draft: &[DocId], depth: usize) -> Verdict {
        let depth = depth.max(1);
        let best = cache.best_match(&draft[..draft.len().min(depth)]);
        let votes = best.map_or(0, |v| v.shared);
        let depth = depth as f64;
        let accepted = best.is_some() && votes as f64 >= self.tau() * depth - TAU_EPSILON;
        Verdict {
            accepted,
            score: votes as f64 / depth,
            best,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let verdict =
            HomologyValidator::new(0.2).judge(&cache, &[4, 5, 6, 1, 9, 10, 11, 12, 13, 14], 10);
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
                validator.judge(&cache, &draft_two, 10).accepted,
                "tau {tau}"
            );
            assert!(
                !validator.judge(&cache, &draft_one, 10).accepted,
                "tau {tau}"
            );
        }
        let tau_03 = HomologyValidator::new(0.3);
        assert!(
            tau_03
                .judge(
                    &cache_with(&[&[1, 2, 3]]),
                    &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                    10
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
        let verdict = HomologyValidator::new(0.2).judge(&cache, &draft, 10);
        assert_eq!(verdict.best.map(|v| v.shared), Some(1));
        assert!(!verdict.accepted);
        assert!((verdict.score - 0.1).abs() < 1e-12);
    }

    #[test]
    fn an_empty_cache_never_accepts_even_at_tau_zero() {
        let verdict = HomologyValidator::new(0.0).judge(&HotCache::bounded(5), &[1, 2], 10);
        assert!(!verdict.accepted);
        assert_eq!(verdict.score, 0.0);
    }
}
