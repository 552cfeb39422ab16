//! The one ranking order of search results in Hasten: best score first, ties broken by
//! ascending document id. Shards, routers and edges all sort by it, so a merge of shards'
//! answers equals one exact search over the whole corpus and every answer is deterministic.

use std::cmp::Ordering;

use crate::DocId;

/// Orders `(score, id)` pairs best first.
pub fn best_first(a: (f32, DocId), b: (f32, DocId)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_scores_first_then_lower_ids() {
        let mut hits = [(0.5, 7), (0.9, 3), (0.5, 2), (f32::NAN, 1), (0.9, 1)];
        hits.sort_by(|a, b| best_first(*a, *b));
        let ids: Vec<DocId> = hits.iter().map(|h| h.1).collect();
        // total_cmp ranks a positive NaN above every number: it cannot hide among them.
        assert_eq!(ids, vec![1, 1, 3, 2, 7]);
    }
}
