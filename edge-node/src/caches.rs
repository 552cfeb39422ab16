//! Each tenant's cache at the edge, and every way it changes.
//!
//! A tenant's cache is its hot cache (queries and the inverted index from documents to
//! them), the cache channel over the documents those queries hold, and the lookup the
//! caching baselines use; the three change together under one lock. They change in two
//! ways only: a standalone edge caches its own fallbacks and evicts FIFO by its own
//! capacity; an edge with a control plane applies the committed stream, and then every
//! eviction comes from the log (its hot cache has no capacity of its own), so that every
//! edge holds what the replicated state machine holds.

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hasten_core::DocId;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use hasten_core::index::IndexError;

use crate::fallback::CloudDocument;
use crate::has::{CacheChange, CacheChannel, DocumentStore, EdgeDocument, HotCache, QueryId};
use crate::lookup::{LookupKind, QueryLookup};
use crate::tenants::Tenant;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("no cache for tenant `{0}` at this edge")]
    UnknownTenant(Tenant),
    #[error("an edge serves at least one tenant")]
    NoTenant,
    #[error("building a cache index failed")]
    Index(#[from] IndexError),
}

/// Who decides which cached queries leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// This edge, FIFO, beyond this many queries per tenant.
    Fifo(usize),
    /// The control plane's log: nothing leaves unless a committed event says so.
    FromLog,
}

/// Size of a cache at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub queries: usize,
    pub documents: usize,
    /// Bytes held: entries, inverted index, cache-channel codes, documents held only for
    /// the cache, and the query lookup.
    pub bytes: usize,
}

impl std::ops::Add for CacheStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            queries: self.queries + other.queries,
            documents: self.documents + other.documents,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// One tenant's cache: its queries, the channel over their documents, and the lookup the
/// caching baselines use.
#[derive(Debug)]
pub struct CacheState {
    pub hot: HotCache,
    pub channel: CacheChannel,
    pub lookup: QueryLookup,
}

impl CacheState {
    fn new(lookup: LookupKind, hot: HotCache, channel: CacheChannel) -> Result<Self, CacheError> {
        let lookup = QueryLookup::of_kind(lookup, channel.dimension())?;
        Ok(Self {
            hot,
            channel,
            lookup,
        })
    }

    fn stats(&self) -> CacheStats {
        let dimension = self.channel.dimension();
        CacheStats {
            queries: self.hot.len(),
            documents: self.channel.len(),
            bytes: self.hot.bytes() + self.channel.bytes() + self.lookup.bytes(dimension),
        }
    }

    /// Caches `vector`'s result under `id`; `added` resolves the documents it newly
    /// references. Returns how the referenced documents changed, and the newly referenced
    /// documents `added` could not resolve.
    fn insert(
        &mut self,
        id: QueryId,
        text: Option<String>,
        vector: Vec<f32>,
        document_ids: &[DocId],
        added: impl Fn(DocId) -> Option<Arc<EdgeDocument>>,
    ) -> (CacheChange, Vec<DocId>) {
        if !self.hot.contains(id)
            && let Err(err) = self.lookup.insert(id, text.as_deref(), &vector)
        {
            tracing::error!(error = %err.display_full(), "query lookup insertion failed");
        }
        let change = self.hot.insert_as(id, text, document_ids);
        self.follow_removal(&change);
        let mut documents = Vec::with_capacity(change.added.len());
        let mut missing = Vec::new();
        for &doc in &change.added {
            match added(doc) {
                Some(document) => documents.push(document),
                None => missing.push(doc),
            }
        }
        if let Err(err) = self.channel.add(documents) {
            tracing::error!(error = %err.display_full(), "cache channel insertion failed");
        }
        (change, missing)
    }

    fn remove(&mut self, ids: &[QueryId]) {
        let change = self.hot.remove(ids);
        self.follow_removal(&change);
    }

    fn follow_removal(&mut self, change: &CacheChange) {
        if let Err(err) = self.channel.remove(&change.released) {
            tracing::error!(error = %err.display_full(), "cache channel removal failed");
        }
        if let Err(err) = self.lookup.remove(&change.evicted) {
            tracing::error!(error = %err.display_full(), "query lookup removal failed");
        }
    }
}

/// A cache entry as the control plane replicates it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicatedEntry {
    pub id: QueryId,
    pub tenant: Tenant,
    pub text: Option<String>,
    pub vector: Vec<f32>,
    pub document_ids: Vec<DocId>,
    pub corpus_version: String,
}

/// Why a replicated entry was not cached here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Of a tenant this edge does not serve: expected when edges serve different tenants.
    Tenant,
    /// Of another corpus version than this edge's bundle: expected during a corpus update.
    CorpusVersion,
    /// Its vector does not fit this edge's corpus, or it holds no documents.
    Malformed,
}

impl SkipReason {
    pub const ALL: [SkipReason; 3] = [Self::Tenant, Self::CorpusVersion, Self::Malformed];

    pub fn label(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::CorpusVersion => "corpus_version",
            Self::Malformed => "malformed",
        }
    }
}

/// Every tenant's cache at this edge.
#[derive(Debug)]
pub struct TenantCaches {
    caches: BTreeMap<Tenant, RwLock<CacheState>>,
    eviction: Eviction,
    /// The corpus documents, to serve cached results whose documents the cloud did not send
    /// (replicated entries carry ids only).
    documents: Arc<DocumentStore>,
    corpus_version: String,
    /// Documents kept per cached query (the validation depth).
    depth: usize,
    /// Replicated entries not cached, by [`SkipReason`] (in its `ALL` order).
    skipped: [AtomicU64; 3],
    /// Documents of cached entries that neither the store nor a cache channel holds (an
    /// edge with a fraction of the corpus): they count in votes at once, and are served
    /// once [`TenantCaches::attach_documents`] brings them from the cloud.
    missing: Mutex<BTreeSet<DocId>>,
    missing_added: Notify,
    /// Documents attached since start.
    attached: AtomicU64,
}

impl TenantCaches {
    /// An empty cache for each of `tenants`, each channel an empty copy of `channel` (one
    /// training for all), with a query lookup of kind `lookup`. Each cached query keeps
    /// its first `depth` documents.
    pub fn new(
        lookup: LookupKind,
        tenants: &[Tenant],
        eviction: Eviction,
        channel: &CacheChannel,
        documents: Arc<DocumentStore>,
        corpus_version: String,
        depth: usize,
    ) -> Result<Self, CacheError> {
        if tenants.is_empty() {
            return Err(CacheError::NoTenant);
        }
        let mut caches = BTreeMap::new();
        for tenant in tenants {
            let hot = match eviction {
                Eviction::Fifo(capacity) => HotCache::bounded(capacity),
                Eviction::FromLog => HotCache::unbounded(),
            };
            let state = CacheState::new(lookup, hot, channel.empty_copy()?)?;
            caches.insert(tenant.clone(), RwLock::new(state));
        }
        Ok(Self {
            caches,
            eviction,
            documents,
            corpus_version,
            depth: depth.max(1),
            skipped: Default::default(),
            missing: Mutex::new(BTreeSet::new()),
            missing_added: Notify::new(),
            attached: AtomicU64::new(0),
        })
    }

    pub fn get(&self, tenant: &Tenant) -> Result<&RwLock<CacheState>, CacheError> {
        self.caches
            .get(tenant)
            .ok_or_else(|| CacheError::UnknownTenant(tenant.clone()))
    }

    pub fn eviction(&self) -> Eviction {
        self.eviction
    }

    pub fn documents(&self) -> &DocumentStore {
        &self.documents
    }

    pub fn corpus_version(&self) -> &str {
        &self.corpus_version
    }

    /// Documents kept per cached query.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Each tenant's cache size.
    pub fn stats(&self) -> Vec<(Tenant, CacheStats)> {
        self.caches
            .iter()
            .map(|(tenant, cache)| (tenant.clone(), cache.read().stats()))
            .collect()
    }

    /// All tenants' caches together.
    pub fn total(&self) -> CacheStats {
        self.stats()
            .into_iter()
            .fold(CacheStats::default(), |total, (_, one)| total + one)
    }

    /// Replicated entries not cached for `reason` since start.
    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.skipped[reason as usize].load(Ordering::Relaxed)
    }

    /// Ids of the cached queries of every tenant, each tenant's oldest first.
    pub fn cached_ids(&self) -> Vec<QueryId> {
        self.caches
            .values()
            .flat_map(|cache| cache.read().hot.entries().map(|e| e.id).collect::<Vec<_>>())
            .collect()
    }

    /// Caches a fallback of `tenant` (a standalone edge: no control plane). The result's
    /// first [`Self::depth`] documents are kept; nothing is cached when they carry no
    /// vectors of the query's dimension.
    pub fn insert_fallback(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        query: Vec<f32>,
        result: &[CloudDocument],
    ) -> Result<CacheChange, CacheError> {
        let cache = self.get(tenant)?;
        let kept = &result[..result.len().min(self.depth)];
        if kept.is_empty() || kept.iter().any(|d| d.vector.len() != query.len()) {
            tracing::warn!("cloud result without usable vectors; not cached");
            return Ok(CacheChange::default());
        }
        let ids: Vec<DocId> = kept.iter().map(|d| d.id).collect();
        let mut state = cache.write();
        let id = state.hot.next_id();
        let (change, _) = state.insert(id, text, query, &ids, |doc| {
            self.documents.get(doc).cloned().or_else(|| {
                kept.iter().find(|d| d.id == doc).map(|d| {
                    Arc::new(EdgeDocument {
                        id: d.id,
                        title: d.title.clone(),
                        text: d.text.clone(),
                        vector: d.vector.clone(),
                    })
                })
            })
        });
        Ok(change)
    }

    /// Removes cached queries (ids are unique across tenants); ids not held are ignored.
    pub fn remove(&self, ids: &[QueryId]) {
        if ids.is_empty() {
            return;
        }
        for cache in self.caches.values() {
            cache.write().remove(ids);
        }
    }

    /// Empties every cache (before installing a whole replicated state).
    pub fn clear(&self) {
        self.remove(&self.cached_ids());
    }

    /// Caches a replicated entry in its tenant's cache under the control plane's id, its
    /// documents taken from this edge's own store; counts and logs an entry this edge
    /// cannot use. Every edge applying the same events in the same order holds the same
    /// caches.
    pub fn insert_replicated(&self, entry: ReplicatedEntry) {
        let skip = |reason: SkipReason, why: &str| {
            self.skipped[reason as usize].fetch_add(1, Ordering::Relaxed);
            // Entries of other tenants are routine where edges serve different tenants.
            match reason {
                SkipReason::Tenant => {
                    tracing::debug!(id = entry.id, tenant = %entry.tenant, why, "replicated entry not cached")
                }
                _ => {
                    tracing::warn!(id = entry.id, tenant = %entry.tenant, why, "replicated entry not cached")
                }
            }
        };
        if entry.corpus_version != self.corpus_version {
            return skip(
                SkipReason::CorpusVersion,
                "it belongs to another corpus version than this edge's bundle",
            );
        }
        let Some(cache) = self.caches.get(&entry.tenant) else {
            return skip(SkipReason::Tenant, "this edge does not serve its tenant");
        };
        if entry.vector.len() != self.documents.dimension() || entry.document_ids.is_empty() {
            return skip(
                SkipReason::Malformed,
                "its vector does not fit this edge's corpus, or it holds no documents",
            );
        }
        let kept = &entry.document_ids[..entry.document_ids.len().min(self.depth)];
        // An id this edge's share lacks counts in the homology vote at once (the inverted
        // index holds it, as on every edge); its text and vector follow from the cloud.
        let (_, missing) = cache
            .write()
            .insert(entry.id, entry.text, entry.vector, kept, |doc| {
                self.documents.get(doc).cloned()
            });
        if !missing.is_empty() {
            self.missing.lock().extend(missing);
            self.missing_added.notify_one();
        }
    }

    /// Up to `max` documents cached entries need and nobody holds, taken off the queue.
    pub fn take_missing(&self, max: usize) -> Vec<DocId> {
        let mut missing = self.missing.lock();
        let taken: Vec<DocId> = missing.iter().take(max).copied().collect();
        for id in &taken {
            missing.remove(id);
        }
        taken
    }

    /// Puts back documents whose fetch failed.
    pub fn requeue_missing(&self, ids: &[DocId]) {
        self.missing.lock().extend(ids);
    }

    /// Documents waiting to be fetched.
    pub fn missing_len(&self) -> usize {
        self.missing.lock().len()
    }

    /// Documents attached from the cloud since start.
    pub fn attached(&self) -> u64 {
        self.attached.load(Ordering::Relaxed)
    }

    /// Waits until a cached entry names a document nobody holds (at once if one did since
    /// the last wait).
    pub async fn missing_added(&self) {
        self.missing_added.notified().await;
    }

    /// Gives each tenant's cache channel the fetched `documents` its cached entries still
    /// reference (an entry evicted meanwhile needs them no more). Returns how many were
    /// attached.
    pub fn attach_documents(&self, documents: &[Arc<EdgeDocument>]) -> usize {
        let mut attached = 0;
        for cache in self.caches.values() {
            let mut state = cache.write();
            let wanted: Vec<Arc<EdgeDocument>> = documents
                .iter()
                .filter(|d| state.hot.contains_document(d.id) && !state.channel.contains(d.id))
                .cloned()
                .collect();
            attached += wanted.len();
            if let Err(err) = state.channel.add(wanted) {
                tracing::error!(error = %err.display_full(), "cache channel insertion failed");
            }
        }
        self.attached.fetch_add(attached as u64, Ordering::Relaxed);
        attached
    }

    /// Applies a corpus update's carried entries: this edge's version gains them when it
    /// is the new one, and loses them when it is the old one.
    pub fn carry_over(&self, from_version: &str, to_version: &str, entries: Vec<ReplicatedEntry>) {
        if to_version == self.corpus_version {
            for entry in entries {
                self.insert_replicated(entry);
            }
        } else if from_version == self.corpus_version {
            let ids: Vec<QueryId> = entries.iter().map(|e| e.id).collect();
            self.remove(&ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{CORPUS_VERSION, Fixture, Setup, fixture, topics};
    use crate::retrieval::Outcome;

    const D: usize = 16;

    fn edge(eviction: Eviction) -> (Fixture, Vec<Vec<f32>>) {
        let (vectors, titles, centres) = topics(8, 12, D);
        let setup = Setup {
            eviction,
            ..Setup::default()
        };
        (fixture(&vectors, &titles, setup), centres)
    }

    fn replicated(id: QueryId, vector: &[f32], documents: Vec<DocId>) -> ReplicatedEntry {
        ReplicatedEntry {
            id,
            tenant: Tenant::default_tenant(),
            text: Some(format!("question {id}")),
            vector: vector.to_vec(),
            document_ids: documents,
            corpus_version: CORPUS_VERSION.into(),
        }
    }

    #[tokio::test]
    async fn a_replicated_entry_is_served_from_the_edges_own_documents() {
        let (edge, centres) = edge(Eviction::FromLog);
        // Another edge's fallback for topic 2 arrives as ids only; id 999 is not in this
        // edge's corpus.
        let ids: Vec<DocId> = (24..33).chain([999]).collect();
        edge.caches
            .insert_replicated(replicated(7 << 16, &centres[2], ids));
        assert_eq!(edge.caches.cached_ids(), vec![7 << 16]);
        assert_eq!(edge.sizes(), (1, 9), "the unknown id has no document here");
        let cache = edge.caches.get(&Tenant::default_tenant()).unwrap();
        assert!(cache.read().hot.contains_document(999), "it still votes");

        let reply = edge.ask(&Tenant::default_tenant(), &centres[2], 4).await;
        assert_eq!(reply.outcome, Outcome::Accepted);
        assert_eq!(edge.calls(), 0, "the cloud was not asked");
        assert!(reply.documents.iter().all(|d| d.title == "t2"));

        edge.caches.remove(&[7 << 16]);
        assert_eq!(edge.sizes(), (0, 0));
        assert!(!cache.read().hot.contains_document(999));
    }

    #[test]
    fn entries_this_edge_cannot_use_are_skipped_and_counted_by_reason() {
        let (edge, centres) = edge(Eviction::FromLog);
        let caches = &edge.caches;
        let mut other_tenant = replicated(1 << 16, &centres[0], vec![1, 2]);
        other_tenant.tenant = Tenant::new("initech");
        caches.insert_replicated(other_tenant);
        let mut other_version = replicated(2 << 16, &centres[0], vec![1, 2]);
        other_version.corpus_version = "another-corpus".into();
        caches.insert_replicated(other_version);
        caches.insert_replicated(replicated(3 << 16, &[1.0; D + 1], vec![1, 2]));
        caches.insert_replicated(replicated(4 << 16, &centres[0], vec![]));
        assert!(caches.cached_ids().is_empty());
        let counts: Vec<u64> = SkipReason::ALL
            .iter()
            .map(|reason| caches.skipped(*reason))
            .collect();
        assert_eq!(counts, vec![1, 1, 2]);
    }

    #[test]
    fn a_cache_that_follows_the_log_evicts_nothing_by_itself() {
        // A bounded hot cache evicts FIFO by itself, replicated inserts included; an edge
        // with a control plane never builds one.
        for (eviction, held) in [(Eviction::FromLog, 30), (Eviction::Fifo(3), 3)] {
            let (edge, centres) = edge(eviction);
            for i in 0..30u64 {
                let vector = &centres[(i % 8) as usize];
                edge.caches
                    .insert_replicated(replicated((i + 1) << 16, vector, vec![i, i + 1]));
            }
            assert_eq!(edge.sizes().0, held, "{eviction:?}");
        }
    }

    #[test]
    fn a_corpus_update_adds_carried_entries_to_the_new_version_and_takes_them_from_the_old() {
        let (edge, centres) = edge(Eviction::FromLog);
        let carried = vec![
            replicated(1 << 16, &centres[0], vec![1, 2]),
            replicated(2 << 16, &centres[1], vec![13, 14]),
        ];
        // This edge holds the new version: it gains them.
        edge.caches
            .carry_over("fixture-v0", CORPUS_VERSION, carried.clone());
        assert_eq!(edge.caches.cached_ids(), vec![1 << 16, 2 << 16]);
        // This edge's version is the old one of another update: it loses them.
        let moved: Vec<ReplicatedEntry> = carried
            .into_iter()
            .map(|mut entry| {
                entry.corpus_version = "fixture-v2".into();
                entry
            })
            .collect();
        edge.caches
            .carry_over(CORPUS_VERSION, "fixture-v2", moved.clone());
        assert!(edge.caches.cached_ids().is_empty());
        // An update between two other versions changes nothing here.
        edge.caches.carry_over("x", "y", moved);
        assert!(edge.caches.cached_ids().is_empty());
    }
}
