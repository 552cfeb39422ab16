//! The hot cache: recent fallback queries with the documents the cloud returned for them,
//! plus the inverted index from each cached document to the cached queries whose results
//! hold it. The homology validator votes through that index. A bounded cache evicts FIFO
//! by itself; an unbounded one leaves every eviction to its owner (the replicated log).

use std::collections::{HashMap, HashSet, VecDeque};

use hasten_core::DocId;

/// Identifier of a cached query, increasing with insertion order.
pub type QueryId = u64;

/// A cached fallback: the query and the exact top-k the cloud returned for it. HaS votes
/// by documents only, so the query's vector is kept by the lookups that need it, not here
/// (it would be 1.5 KB of a ~2 KB entry).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedQuery {
    pub id: QueryId,
    /// The query's text when it was asked as text.
    pub text: Option<String>,
    /// The cloud's result, best first, without duplicates.
    pub doc_ids: Vec<DocId>,
}

/// How an insertion changed the set of documents the cache references.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheChange {
    /// Documents referenced now that were not before: they join the cache channel.
    pub added: Vec<DocId>,
    /// Documents no cached query references any more: they leave the cache channel.
    pub released: Vec<DocId>,
    /// Queries evicted to make room (FIFO).
    pub evicted: Vec<CachedQuery>,
}

/// The best cached query for a draft: who shares the most (weighted) documents with it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Vote {
    pub query: QueryId,
    /// Draft documents its result holds.
    pub shared: usize,
    /// Their weights summed (each document's weight is given by its rank in the draft).
    pub weight: f64,
}

#[derive(Debug)]
pub struct HotCache {
    /// FIFO bound on cached queries; `None` when evictions come from elsewhere.
    capacity: Option<usize>,
    order: VecDeque<QueryId>,
    entries: HashMap<QueryId, CachedQuery>,
    /// Inverted index: document -> cached queries whose result holds it.
    postings: HashMap<DocId, Vec<QueryId>>,
    next_id: QueryId,
}

impl HotCache {
    /// An empty cache holding at most `capacity` queries (at least one), evicting FIFO.
    pub fn bounded(capacity: usize) -> Self {
        Self::with_capacity(Some(capacity.max(1)))
    }

    /// An empty cache that never evicts by itself: its owner removes queries.
    pub fn unbounded() -> Self {
        Self::with_capacity(None)
    }

    fn with_capacity(capacity: Option<usize>) -> Self {
        Self {
            capacity,
            order: VecDeque::new(),
            entries: HashMap::new(),
            postings: HashMap::new(),
            next_id: 0,
        }
    }

    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// The id the next [`Self::insert`] would use.
    pub fn next_id(&self) -> QueryId {
        self.next_id
    }

    /// Cached queries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Distinct documents referenced by cached queries.
    pub fn documents(&self) -> usize {
        self.postings.len()
    }

    pub fn get(&self, id: QueryId) -> Option<&CachedQuery> {
        self.entries.get(&id)
    }

    pub fn contains(&self, id: QueryId) -> bool {
        self.entries.contains_key(&id)
    }

    pub fn contains_document(&self, doc: DocId) -> bool {
        self.postings.contains_key(&doc)
    }

    /// Cached queries in insertion order, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &CachedQuery> {
        self.order.iter().filter_map(|id| self.entries.get(id))
    }

    /// Bytes held: entries (document ids, text) and the inverted index,
    /// with a flat allowance for each map slot's overhead.
    pub fn bytes(&self) -> usize {
        let entries: usize = self
            .entries
            .values()
            .map(|e| e.doc_ids.len() * 8 + e.text.as_ref().map_or(0, String::len) + 96)
            .sum();
        let postings: usize = self.postings.values().map(|q| q.len() * 8 + 48).sum();
        entries + postings + self.order.len() * 8
    }

    /// The inverted index, for inspection and tests.
    pub fn postings(&self) -> &HashMap<DocId, Vec<QueryId>> {
        &self.postings
    }

    /// Caches a query and its documents, evicting the oldest queries beyond capacity (when
    /// bounded).
    /// Returns the new query's id and the net change in referenced documents.
    pub fn insert(&mut self, text: Option<String>, doc_ids: &[DocId]) -> (QueryId, CacheChange) {
        let id = self.next_id;
        (id, self.insert_as(id, text, doc_ids))
    }

    /// Removes cached queries by id (a replicated eviction or invalidation); ids not held
    /// are ignored.
    pub fn remove(&mut self, ids: &[QueryId]) -> CacheChange {
        let mut change = CacheChange::default();
        for id in ids {
            let Some(entry) = self.entries.remove(id) else {
                continue;
            };
            // Replicated evictions take the oldest: O(1) instead of a scan of the order.
            if self.order.front() == Some(id) {
                self.order.pop_front();
            } else {
                self.order.retain(|q| q != id);
            }
            for doc in &entry.doc_ids {
                self.unlink(*doc, *id);
                if !self.postings.contains_key(doc) && !change.released.contains(doc) {
                    change.released.push(*doc);
                }
            }
            change.evicted.push(entry);
        }
        change
    }

    /// Caches a query under an id chosen elsewhere (the control plane's, so every edge
    /// names it alike); an id already held is left as it is. Later local ids follow the
    /// largest id seen.
    pub fn insert_as(
        &mut self,
        id: QueryId,
        text: Option<String>,
        doc_ids: &[DocId],
    ) -> CacheChange {
        if self.entries.contains_key(&id) {
            return CacheChange::default();
        }
        let mut seen = HashSet::new();
        let doc_ids: Vec<DocId> = doc_ids
            .iter()
            .copied()
            .filter(|d| seen.insert(*d))
            .collect();
        let mut touched: Vec<DocId> = Vec::new();
        let mut before: HashSet<DocId> = HashSet::new();
        let mut evicted = Vec::new();
        while self
            .capacity
            .is_some_and(|capacity| self.entries.len() >= capacity)
        {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(entry) = self.entries.remove(&oldest) {
                for doc in &entry.doc_ids {
                    before.insert(*doc);
                    touched.push(*doc);
                    self.unlink(*doc, oldest);
                }
                evicted.push(entry);
            }
        }
        self.next_id = self.next_id.max(id + 1);
        for doc in &doc_ids {
            if !before.contains(doc) && self.postings.contains_key(doc) {
                before.insert(*doc);
            }
            touched.push(*doc);
            self.postings.entry(*doc).or_default().push(id);
        }
        self.order.push_back(id);
        self.entries.insert(id, CachedQuery { id, text, doc_ids });
        let mut change = CacheChange {
            evicted,
            ..CacheChange::default()
        };
        let mut reported = HashSet::new();
        for doc in touched {
            if !reported.insert(doc) {
                continue;
            }
            let now = self.postings.contains_key(&doc);
            // `before` only knows documents touched here that were referenced beforehand;
            // a document first seen in the new entry was unreferenced.
            match (before.contains(&doc), now) {
                (false, true) => change.added.push(doc),
                (true, false) => change.released.push(doc),
                _ => {}
            }
        }
        change
    }

    fn unlink(&mut self, doc: DocId, query: QueryId) {
        if let Some(queries) = self.postings.get_mut(&doc) {
            queries.retain(|q| *q != query);
            if queries.is_empty() {
                self.postings.remove(&doc);
            }
        }
    }

    /// Each draft document votes, with the weight `weight` gives its rank in the draft, for
    /// the cached queries whose results hold it; returns the query with the most weight
    /// (ties go to the most recently cached), or `None` when no draft document is cached.
    pub fn best_match(&self, draft: &[DocId], weight: impl Fn(usize) -> f64) -> Option<Vote> {
        let mut votes: HashMap<QueryId, Vote> = HashMap::new();
        for (rank, doc) in unique_ranks(draft) {
            for query in self.postings.get(&doc).into_iter().flatten() {
                let vote = votes.entry(*query).or_insert(Vote {
                    query: *query,
                    shared: 0,
                    weight: 0.0,
                });
                vote.shared += 1;
                vote.weight += weight(rank);
            }
        }
        votes.into_values().max_by(strongest)
    }

    /// The best of `queries` for a draft, votes weighted as in [`Self::best_match`]; `None`
    /// when none of them shares a document with it (or none is cached).
    pub fn best_among(
        &self,
        queries: &[QueryId],
        draft: &[DocId],
        weight: impl Fn(usize) -> f64,
    ) -> Option<Vote> {
        let ranks: HashMap<DocId, usize> = unique_ranks(draft).map(|(r, d)| (d, r)).collect();
        queries
            .iter()
            .filter_map(|id| self.entries.get(id))
            .map(|entry| {
                let ranked = entry.doc_ids.iter().filter_map(|d| ranks.get(d));
                Vote {
                    query: entry.id,
                    shared: ranked.clone().count(),
                    weight: ranked.map(|r| weight(*r)).sum(),
                }
            })
            .filter(|vote| vote.shared > 0)
            .max_by(strongest)
    }
}

/// Each distinct draft document with its rank (a repeated document votes once, at its
/// first rank).
fn unique_ranks(draft: &[DocId]) -> impl Iterator<Item = (usize, DocId)> + '_ {
    let mut seen = HashSet::new();
    draft
        .iter()
        .enumerate()
        .filter(move |(_, d)| seen.insert(**d))
        .map(|(rank, d)| (rank, *d))
}

/// Order of votes: more weight, then more shared documents, then the newer query.
fn strongest(a: &Vote, b: &Vote) -> std::cmp::Ordering {
    a.weight
        .total_cmp(&b.weight)
        .then(a.shared.cmp(&b.shared))
        .then(a.query.cmp(&b.query))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn count(_: usize) -> f64 {
        1.0
    }

    fn insert(cache: &mut HotCache, docs: &[DocId]) -> (QueryId, CacheChange) {
        cache.insert(None, docs)
    }

    /// The inverted index rebuilt from scratch from the cached entries.
    fn rebuilt_postings(cache: &HotCache) -> HashMap<DocId, Vec<QueryId>> {
        let mut postings: HashMap<DocId, Vec<QueryId>> = HashMap::new();
        for entry in cache.entries() {
            for doc in &entry.doc_ids {
                postings.entry(*doc).or_default().push(entry.id);
            }
        }
        postings
    }

    #[test]
    fn votes_count_shared_documents_and_ties_go_to_the_newest() {
        let mut cache = HotCache::bounded(10);
        let (a, _) = insert(&mut cache, &[1, 2, 3, 4]);
        let (b, _) = insert(&mut cache, &[3, 4, 5, 6]);
        assert_eq!(
            cache.best_match(&[1, 2, 3, 9], count),
            Some(Vote {
                query: a,
                shared: 3,
                weight: 3.0
            })
        );
        assert_eq!(
            cache.best_match(&[3, 4, 9], count),
            Some(Vote {
                query: b,
                shared: 2,
                weight: 2.0
            })
        );
        assert_eq!(cache.best_match(&[7, 8], count), None);
        // A document repeated in the draft votes once.
        assert_eq!(
            cache.best_match(&[5, 5, 5], count),
            Some(Vote {
                query: b,
                shared: 1,
                weight: 1.0
            })
        );
    }

    #[test]
    fn rank_weights_prefer_the_query_holding_the_drafts_best_documents() {
        let mut cache = HotCache::bounded(10);
        let (top, _) = insert(&mut cache, &[1, 20]);
        let (tail, _) = insert(&mut cache, &[8, 9]);
        let draft = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        // By count the two tie and the newer wins; by rank the holder of the first wins.
        assert_eq!(cache.best_match(&draft, count).map(|v| v.query), Some(tail));
        let by_rank = |rank: usize| 1.0 / (rank as f64 + 2.0).log2();
        let vote = cache.best_match(&draft, by_rank).unwrap();
        assert_eq!((vote.query, vote.shared), (top, 1));
        assert!((vote.weight - 1.0).abs() < 1e-12);
        // Restricted to the tail query, it is the best there is.
        assert_eq!(
            cache
                .best_among(&[tail, 99], &draft, by_rank)
                .map(|v| v.query),
            Some(tail)
        );
        assert_eq!(cache.best_among(&[99], &draft, count), None);
    }

    #[test]
    fn fifo_eviction_unlinks_the_oldest_query_and_releases_its_unshared_documents() {
        let mut cache = HotCache::bounded(2);
        let (first, added) = insert(&mut cache, &[1, 2, 3]);
        assert_eq!(added.added, vec![1, 2, 3]);
        insert(&mut cache, &[3, 4]);
        let (_, change) = insert(&mut cache, &[4, 5]);
        assert_eq!(
            change.evicted.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![first]
        );
        let mut released = change.released.clone();
        released.sort_unstable();
        assert_eq!(released, vec![1, 2], "3 is still held by the second query");
        assert_eq!(change.added, vec![5]);
        assert!(cache.get(first).is_none());
        assert!(!cache.contains_document(1) && cache.contains_document(3));
        assert!(cache.postings().values().all(|qs| !qs.contains(&first)));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn an_unbounded_cache_evicts_nothing_by_itself() {
        let mut cache = HotCache::unbounded();
        for doc in 0..50 {
            insert(&mut cache, &[doc]);
        }
        assert_eq!(cache.len(), 50);
        let change = cache.remove(&[0]);
        assert_eq!(change.released, vec![0]);
        assert_eq!(cache.len(), 49);
    }

    #[test]
    fn a_document_in_both_the_evicted_and_the_new_entry_stays() {
        let mut cache = HotCache::bounded(1);
        insert(&mut cache, &[1, 2]);
        let (_, change) = insert(&mut cache, &[2, 3]);
        assert_eq!(change.released, vec![1]);
        assert_eq!(change.added, vec![3]);
        assert!(cache.contains_document(2));
    }

    #[test]
    fn replicated_ids_and_removals_keep_the_index_consistent() {
        let mut cache = HotCache::bounded(10);
        cache.insert_as(1 << 16, None, &[1, 2]);
        cache.insert_as(2 << 16, None, &[2, 3]);
        // An id already held is left alone; a local insert continues after the largest id.
        assert_eq!(cache.insert_as(1 << 16, None, &[9]), CacheChange::default());
        let (local, _) = insert(&mut cache, &[4]);
        assert_eq!(local, (2 << 16) + 1);
        // Removing the oldest and a middle entry releases only unshared documents.
        let change = cache.remove(&[1 << 16, local, 77]);
        assert_eq!(change.released, vec![1, 4]);
        assert_eq!(change.evicted.len(), 2);
        assert_eq!(
            cache.entries().map(|e| e.id).collect::<Vec<_>>(),
            vec![2 << 16]
        );
        assert_eq!(cache.postings(), &rebuilt_postings(&cache));
    }

    /// One step of a property test: insert a result, remove some cached queries (an
    /// invalidation or a replicated eviction), or vote on a draft.
    #[derive(Clone, Debug)]
    enum Step {
        Insert(Vec<DocId>),
        Remove(Vec<usize>),
        Vote(Vec<DocId>),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => prop::collection::vec(0u64..20, 0..8).prop_map(Step::Insert),
            1 => prop::collection::vec(0usize..8, 1..3).prop_map(Step::Remove),
            2 => prop::collection::vec(0u64..20, 1..10).prop_map(Step::Vote),
        ]
    }

    proptest! {
        /// Under any sequence of inserts, removals and votes: the inverted index equals the
        /// one rebuilt from the entries, the reported added/released documents track exactly
        /// what is referenced, the capacity holds, and a vote equals a brute-force count
        /// (most shared documents, ties to the newest query).
        #[test]
        fn the_cache_and_its_inverted_index_agree_under_any_sequence(
            capacity in 1usize..6,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let mut cache = HotCache::bounded(capacity);
            let mut referenced: HashSet<DocId> = HashSet::new();
            for step in steps {
                match step {
                    Step::Insert(docs) => {
                        let (_, change) = insert(&mut cache, &docs);
                        for d in &change.released { prop_assert!(referenced.remove(d)); }
                        for d in &change.added { prop_assert!(referenced.insert(*d)); }
                    }
                    Step::Remove(picks) => {
                        let ids: Vec<QueryId> = cache.entries().map(|e| e.id).collect();
                        let chosen: Vec<QueryId> = picks
                            .iter()
                            .filter_map(|i| ids.get(*i).copied())
                            .collect();
                        let change = cache.remove(&chosen);
                        for d in &change.released { prop_assert!(referenced.remove(d)); }
                        prop_assert!(change.added.is_empty());
                    }
                    Step::Vote(draft) => {
                        let unique: HashSet<DocId> = draft.iter().copied().collect();
                        let expected = cache
                            .entries()
                            .map(|e| {
                                let shared =
                                    e.doc_ids.iter().filter(|d| unique.contains(d)).count();
                                (shared, e.id)
                            })
                            .filter(|(shared, _)| *shared > 0)
                            .max()
                            .map(|(shared, query)| Vote { query, shared, weight: shared as f64 });
                        prop_assert_eq!(cache.best_match(&draft, count), expected);
                        let every: Vec<QueryId> = cache.entries().map(|e| e.id).collect();
                        prop_assert_eq!(cache.best_among(&every, &draft, count), expected);
                    }
                }
                prop_assert!(cache.len() <= capacity);
                prop_assert_eq!(cache.postings(), &rebuilt_postings(&cache));
                let live: HashSet<DocId> = cache.postings().keys().copied().collect();
                prop_assert_eq!(&referenced, &live);
            }
        }
    }
}
