//! The edge's retrieval engine: HaS (two-channel draft, exact re-rank, homology validation,
//! and the exact fallback to the cloud whose result is cached), and the baselines HaS is
//! measured against, behind one interface so that they run on the same machinery.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use hasten_core::DocId;
use hasten_core::index::IndexError;
use hasten_core::vector::dot;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::cloud::CloudError;
use crate::has::{
    CacheChange, CacheChannel, DocumentStore, EdgeDocument, FuzzyChannel, HomologyValidator,
    HotCache, QueryId, Verdict,
};
use crate::lookup::QueryLookup;
use crate::tenants::Tenant;

/// How the edge answers a query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RetrievalPolicy {
    /// Homology-aware speculative retrieval.
    #[default]
    Has,
    /// Every query goes to the cloud; nothing is cached (the baseline).
    CloudOnly,
    /// The fuzzy channel's re-ranked candidates, never validated, never the cloud (the
    /// paper's "ANNS on the edge").
    EdgeIvf,
    /// Reuse a cached result only for an identical query text.
    ExactCache,
    /// Reuse the nearest cached query's result when its cosine similarity reaches the
    /// semantic threshold (GPTCache, RedisVL, Proximity).
    SemanticCache,
}

impl RetrievalPolicy {
    /// Whether fallback results are cached under this policy.
    pub fn caches(self) -> bool {
        matches!(self, Self::Has | Self::ExactCache | Self::SemanticCache)
    }
}

/// A document the cloud returned: what the edge needs to answer and to cache it.
#[derive(Clone, Debug, PartialEq)]
pub struct CloudDocument {
    pub id: DocId,
    pub score: f32,
    pub title: String,
    pub text: String,
    pub vector: Vec<f32>,
}

/// The exact search the edge falls back to.
pub trait CloudSearch: Send + Sync + 'static {
    /// Exact top-`k` for a normalised query, with texts and vectors; given up at
    /// `deadline` (the caller's), or at the client's own timeout if sooner.
    fn search(
        &self,
        query: &[f32],
        k: usize,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<CloudDocument>, CloudError>> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cloud index unavailable: {0}")]
    Cloud(#[from] CloudError),
    #[error("edge index failure: {0}")]
    Index(#[from] IndexError),
    #[error("{0}")]
    Misconfigured(&'static str),
    #[error("no cache for tenant `{0}` at this edge")]
    UnknownTenant(Tenant),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    Fallback,
}

/// Microseconds per stage; zero when a stage did not run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTimings {
    pub encode_us: u64,
    pub cache_channel_us: u64,
    pub fuzzy_channel_us: u64,
    pub merge_us: u64,
    pub validation_us: u64,
    pub cloud_us: u64,
    pub cache_update_us: u64,
    pub total_us: u64,
}

fn micros_since(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrievedDocument {
    pub id: DocId,
    pub title: String,
    pub text: String,
    pub score: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatchedQuery {
    pub id: QueryId,
    pub text: Option<String>,
    pub shared_documents: usize,
}

/// One retrieval as the engine receives it: a normalised query vector, for a tenant.
#[derive(Clone, Debug)]
pub struct RetrievalRequest {
    pub tenant: Tenant,
    pub vector: Vec<f32>,
    /// The query's text, when it came as text (cached with the result).
    pub text: Option<String>,
    pub k: usize,
    /// When the client stops waiting; a fallback gets what remains of it.
    pub deadline: Option<Instant>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Retrieval {
    pub documents: Vec<RetrievedDocument>,
    pub outcome: Outcome,
    /// The score the acceptance was decided on: homology (votes / k) for HaS, cosine
    /// similarity for the semantic cache, 1 for an exact repeat, 0 otherwise.
    pub homology_score: f64,
    pub matched_query: Option<MatchedQuery>,
    pub timings: StageTimings,
}

/// Tunables of the engine. Defaults are the HaS paper's.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    pub policy: RetrievalPolicy,
    pub tau: f64,
    /// Candidates fetched from the fuzzy channel before the exact re-rank (the reference
    /// fetches 5 x k = 50).
    pub fuzzy_candidates: usize,
    /// Cosine similarity at which the semantic cache reuses a cached result.
    pub semantic_threshold: f32,
}

/// Size of the cache at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub queries: usize,
    pub documents: usize,
    /// Bytes held by the cache: entries, inverted index, cache-channel codes, documents
    /// held only for the cache, and the query lookup.
    pub bytes: usize,
}

/// One tenant's cache: its queries, the channel over their documents, and the lookup the
/// caching baselines use.
struct CacheState {
    hot: HotCache,
    channel: CacheChannel,
    lookup: QueryLookup,
}

impl CacheState {
    fn new(
        policy: RetrievalPolicy,
        hot: HotCache,
        channel: CacheChannel,
    ) -> Result<Self, EngineError> {
        let lookup = match policy {
            RetrievalPolicy::ExactCache => QueryLookup::exact(),
            RetrievalPolicy::SemanticCache => QueryLookup::semantic(channel.dimension())?,
            _ => QueryLookup::None,
        };
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
}

/// A draft and its verdict.
#[derive(Clone, Debug)]
pub struct Speculation {
    /// The k best candidates by exact inner product, best first.
    pub draft: Vec<(f32, Arc<EdgeDocument>)>,
    pub verdict: Verdict,
    /// The cached query that validated the draft, when accepted.
    pub matched: Option<MatchedQuery>,
}

pub struct RetrievalEngine<C> {
    settings: EngineSettings,
    validator: HomologyValidator,
    fuzzy: Option<FuzzyChannel>,
    documents: Arc<DocumentStore>,
    /// One cache per tenant: a tenant's drafts are validated only by its own queries, and
    /// its fallback results are served to no one else.
    caches: BTreeMap<Tenant, RwLock<CacheState>>,
    cloud: C,
    replication: Option<Arc<dyn CacheReplication>>,
}

impl<C: CloudSearch> RetrievalEngine<C> {
    /// `fuzzy` is `None` when the fuzzy channel is switched off (the paper's ablation).
    /// `documents` resolves the document ids of replicated entries. The engine serves the
    /// default tenant until [`Self::with_tenants`] names others.
    pub fn new(
        settings: EngineSettings,
        hot: HotCache,
        channel: CacheChannel,
        fuzzy: Option<FuzzyChannel>,
        documents: Arc<DocumentStore>,
        cloud: C,
    ) -> Result<Self, EngineError> {
        if settings.policy == RetrievalPolicy::EdgeIvf && fuzzy.is_none() {
            return Err(EngineError::Misconfigured(
                "the edge-ivf policy needs the fuzzy channel",
            ));
        }
        let state = CacheState::new(settings.policy, hot, channel)?;
        Ok(Self {
            validator: HomologyValidator::new(settings.tau),
            settings,
            fuzzy,
            documents,
            caches: BTreeMap::from([(Tenant::default_tenant(), RwLock::new(state))]),
            cloud,
            replication: None,
        })
    }

    /// Gives each of `tenants` its own empty cache (of the same capacity and trained
    /// channel), in place of the default tenant's.
    pub fn with_tenants(mut self, tenants: &[Tenant]) -> Result<Self, EngineError> {
        let template = self
            .caches
            .values()
            .next()
            .ok_or(EngineError::Misconfigured("the engine has no cache"))?;
        let (capacity, channel) = {
            let state = template.read();
            (state.hot.capacity(), state.channel.empty_copy()?)
        };
        let mut caches = BTreeMap::new();
        for tenant in tenants {
            let state = CacheState::new(
                self.settings.policy,
                HotCache::new(capacity),
                channel.empty_copy()?,
            )?;
            caches.insert(tenant.clone(), RwLock::new(state));
        }
        self.caches = caches;
        Ok(self)
    }

    fn cache(&self, tenant: &Tenant) -> Result<&RwLock<CacheState>, EngineError> {
        self.caches
            .get(tenant)
            .ok_or_else(|| EngineError::UnknownTenant(tenant.clone()))
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Cached queries, the distinct documents they reference, and the bytes held, over
    /// all tenants.
    pub fn cache_stats(&self) -> CacheStats {
        self.tenant_cache_stats()
            .into_iter()
            .fold(CacheStats::default(), |total, (_, one)| CacheStats {
                queries: total.queries + one.queries,
                documents: total.documents + one.documents,
                bytes: total.bytes + one.bytes,
            })
    }

    /// Each tenant's cache size.
    pub fn tenant_cache_stats(&self) -> Vec<(Tenant, CacheStats)> {
        self.caches
            .iter()
            .map(|(tenant, cache)| (tenant.clone(), cache.read().stats()))
            .collect()
    }

    /// The exact-repeat cache's answer for `text` among `tenant`'s queries, found before
    /// any encoding.
    pub fn cached_answer_for_text(
        &self,
        tenant: &Tenant,
        text: &str,
        k: usize,
    ) -> Option<Retrieval> {
        if self.settings.policy != RetrievalPolicy::ExactCache {
            return None;
        }
        let started = Instant::now();
        let state = self.caches.get(tenant)?.read();
        let id = state.lookup.find_text(text)?;
        let (documents, matched) = serve_entry(&state, id, None, k)?;
        let lookup_us = micros_since(started);
        Some(Retrieval {
            documents,
            outcome: Outcome::Accepted,
            homology_score: 1.0,
            matched_query: Some(matched),
            timings: StageTimings {
                validation_us: lookup_us,
                total_us: lookup_us,
                ..StageTimings::default()
            },
        })
    }

    /// Answers a normalised query under the engine's policy: an accepted draft or cached
    /// result, or the cloud's exact result (cached when the policy caches).
    #[tracing::instrument(skip_all, fields(k, tenant = %request.tenant, outcome))]
    pub async fn retrieve(
        &self,
        request: RetrievalRequest,
        mut timings: StageTimings,
    ) -> Result<Retrieval, EngineError> {
        let RetrievalRequest {
            tenant,
            vector: query,
            text,
            k,
            deadline,
        } = request;
        tracing::Span::current().record("k", k);
        let cache = self.cache(&tenant)?;
        let started = Instant::now();
        let mut homology_score = 0.0;
        let accepted = match self.settings.policy {
            RetrievalPolicy::Has => {
                let judged = self.speculate(&tenant, &query, k, &mut timings)?;
                homology_score = judged.verdict.score;
                judged
                    .verdict
                    .accepted
                    .then(|| (draft_documents(judged.draft), judged.matched))
            }
            RetrievalPolicy::EdgeIvf => {
                let draft = self.fuzzy_draft(&query, k, &mut timings)?;
                Some((draft_documents(draft), None))
            }
            RetrievalPolicy::SemanticCache => {
                let stage = Instant::now();
                let state = cache.read();
                let found = state.lookup.nearest(&query)?;
                homology_score = found.map_or(0.0, |(_, similarity)| f64::from(similarity));
                let hit = found
                    .filter(|(_, similarity)| *similarity >= self.settings.semantic_threshold)
                    .and_then(|(id, _)| serve_entry(&state, id, Some(&query), k));
                timings.validation_us = micros_since(stage);
                hit.map(|(documents, matched)| (documents, Some(matched)))
            }
            RetrievalPolicy::ExactCache | RetrievalPolicy::CloudOnly => None,
        };
        if let Some((documents, matched_query)) = accepted {
            tracing::Span::current().record("outcome", "accepted");
            timings.total_us = timings.encode_us + micros_since(started);
            return Ok(Retrieval {
                documents,
                outcome: Outcome::Accepted,
                homology_score,
                matched_query,
                timings,
            });
        }
        tracing::Span::current().record("outcome", "fallback");
        let cloud_started = Instant::now();
        let result = self.cloud.search(&query, k, deadline).await?;
        timings.cloud_us = micros_since(cloud_started);
        if self.settings.policy.caches() {
            let update_started = Instant::now();
            match &self.replication {
                Some(replication) => replication.propose(
                    &tenant,
                    text,
                    &query,
                    result.iter().map(|d| d.id).collect(),
                ),
                None => {
                    self.insert(&tenant, text, query, &result)?;
                }
            }
            timings.cache_update_us = micros_since(update_started);
        }
        timings.total_us = timings.encode_us + micros_since(started);
        Ok(Retrieval {
            documents: result
                .into_iter()
                .map(|d| RetrievedDocument {
                    id: d.id,
                    title: d.title,
                    text: d.text,
                    score: d.score,
                })
                .collect(),
            outcome: Outcome::Fallback,
            homology_score,
            matched_query: None,
            timings,
        })
    }

    /// The fuzzy channel's candidates re-ranked exactly, top k.
    fn fuzzy_draft(
        &self,
        query: &[f32],
        k: usize,
        timings: &mut StageTimings,
    ) -> Result<Vec<(f32, Arc<EdgeDocument>)>, EngineError> {
        let Some(fuzzy) = &self.fuzzy else {
            return Err(EngineError::Misconfigured("the fuzzy channel is off"));
        };
        let stage = Instant::now();
        let candidates = fuzzy.candidates(query, self.settings.fuzzy_candidates.max(k))?;
        timings.fuzzy_channel_us = micros_since(stage);
        let stage = Instant::now();
        let draft = rerank(query, candidates, k);
        timings.merge_us = micros_since(stage);
        Ok(draft)
    }

    /// Two-channel draft, exact re-rank to k, and the homology verdict against `tenant`'s
    /// cache: the accept path, without the encoder and without touching the cloud.
    pub fn speculate(
        &self,
        tenant: &Tenant,
        query: &[f32],
        k: usize,
        timings: &mut StageTimings,
    ) -> Result<Speculation, EngineError> {
        let state = self.cache(tenant)?.read();
        // The two channels are independent; run them side by side (the draft waits for the
        // slower one instead of their sum).
        let cache_channel = || -> Result<(Vec<Arc<EdgeDocument>>, u64), IndexError> {
            let stage = Instant::now();
            let docs = state
                .channel
                .search(query, k)?
                .iter()
                .filter_map(|hit| state.channel.document(hit.id).cloned())
                .collect();
            Ok((docs, micros_since(stage)))
        };
        let fuzzy_channel = || -> Result<(Vec<Arc<EdgeDocument>>, u64), IndexError> {
            let Some(fuzzy) = &self.fuzzy else {
                return Ok((Vec::new(), 0));
            };
            let stage = Instant::now();
            let docs = fuzzy.candidates(query, self.settings.fuzzy_candidates.max(k))?;
            Ok((docs, micros_since(stage)))
        };
        let (cached, fuzzy) = rayon::join(cache_channel, fuzzy_channel);
        let (cached, cache_us) = cached?;
        let (fuzzy, fuzzy_us) = fuzzy?;
        timings.cache_channel_us = cache_us;
        timings.fuzzy_channel_us = fuzzy_us;
        let stage = Instant::now();
        let draft = rerank(query, cached.into_iter().chain(fuzzy).collect(), k);
        timings.merge_us = micros_since(stage);

        let stage = Instant::now();
        let ids: Vec<DocId> = draft.iter().map(|(_, d)| d.id).collect();
        let verdict = self.validator.judge(&state.hot, &ids, k);
        let matched = verdict.best.filter(|_| verdict.accepted).and_then(|vote| {
            state.hot.get(vote.query).map(|entry| MatchedQuery {
                id: entry.id,
                text: entry.text.clone(),
                shared_documents: vote.shared,
            })
        });
        timings.validation_us = micros_since(stage);
        Ok(Speculation {
            draft,
            verdict,
            matched,
        })
    }

    /// Caches a fallback result in `tenant`'s cache: the hot cache, its inverted index and
    /// the cache channel change together under one write lock. Returns how the cached
    /// documents changed (nothing when the result carries no usable vectors).
    pub fn insert(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        query: Vec<f32>,
        result: &[CloudDocument],
    ) -> Result<CacheChange, EngineError> {
        let cache = self.cache(tenant)?;
        if !usable(&query, result) {
            return Ok(CacheChange::default());
        }
        let ids: Vec<DocId> = result.iter().map(|d| d.id).collect();
        let mut state = cache.write();
        let (id, change) = state.hot.insert(text, query, &ids);
        let added = result
            .iter()
            .filter(|d| change.added.contains(&d.id))
            .map(|d| {
                self.documents.get(d.id).cloned().unwrap_or_else(|| {
                    Arc::new(EdgeDocument {
                        id: d.id,
                        title: d.title.clone(),
                        text: d.text.clone(),
                        vector: d.vector.clone(),
                    })
                })
            })
            .collect();
        follow_change(&mut state, id, &change, added);
        Ok(change)
    }

    /// Applies a replicated cache event: removes the entries the control plane evicted or
    /// invalidated (ids are unique across tenants), then caches `entry` in its tenant's
    /// cache under the control plane's id, its documents taken from this edge's own store.
    /// Every edge applying the same events in the same order holds the same caches.
    pub fn apply_replicated(&self, removed: &[QueryId], entry: Option<ReplicatedEntry>) {
        if !removed.is_empty() {
            for cache in self.caches.values() {
                let mut state = cache.write();
                let change = state.hot.remove(removed);
                follow_removal(&mut state, &change);
            }
        }
        let Some(entry) = entry else { return };
        let Some(cache) = self.caches.get(&entry.tenant) else {
            tracing::debug!(
                id = entry.id,
                tenant = %entry.tenant,
                "replicated entry of a tenant this edge does not serve; not cached"
            );
            return;
        };
        let mut state = cache.write();
        if entry.vector.len() != self.documents.dimension() || entry.document_ids.is_empty() {
            tracing::warn!(
                id = entry.id,
                dimension = entry.vector.len(),
                "replicated entry does not fit this edge's corpus; not cached"
            );
            return;
        }
        let change = state
            .hot
            .insert_as(entry.id, entry.text, entry.vector, &entry.document_ids);
        // An id this edge's corpus lacks still counts in the homology vote (the inverted
        // index holds it, as on every edge); only its text cannot be served from here.
        let added: Vec<Arc<EdgeDocument>> = change
            .added
            .iter()
            .filter_map(|id| self.documents.get(*id).cloned())
            .collect();
        if added.len() < change.added.len() {
            tracing::warn!(
                id = entry.id,
                missing = change.added.len() - added.len(),
                "replicated entry names documents outside this edge's corpus"
            );
        }
        follow_change(&mut state, entry.id, &change, added);
    }

    /// The homology threshold in force.
    pub fn tau(&self) -> f64 {
        self.validator.tau()
    }

    /// Changes the homology threshold live (the control plane's runtime configuration).
    pub fn set_tau(&self, tau: f64) {
        self.validator.set_tau(tau);
    }

    /// Ids of the cached queries of every tenant, each tenant's oldest first.
    pub fn cached_ids(&self) -> Vec<QueryId> {
        self.caches
            .values()
            .flat_map(|cache| cache.read().hot.entries().map(|e| e.id).collect::<Vec<_>>())
            .collect()
    }

    /// Routes fallback results to the control plane instead of the local cache: they come
    /// back, to this edge as to every other, as replicated events.
    pub fn set_replication(&mut self, replication: Arc<dyn CacheReplication>) {
        self.replication = Some(replication);
    }
}

fn follow_removal(state: &mut CacheState, change: &CacheChange) {
    if let Err(err) = state.channel.remove(&change.released) {
        tracing::error!(%err, "cache channel removal failed");
    }
    if let Err(err) = state.lookup.remove(&change.evicted) {
        tracing::error!(%err, "query lookup removal failed");
    }
}

/// Brings the cache channel and the query lookup in line with a hot-cache insertion that
/// newly references the documents `added`.
fn follow_change(
    state: &mut CacheState,
    id: QueryId,
    change: &CacheChange,
    added: Vec<Arc<EdgeDocument>>,
) {
    follow_removal(state, change);
    if let Err(err) = state.channel.add(added) {
        tracing::error!(%err, "cache channel insertion failed");
    }
    if let Some(entry) = state.hot.get(id)
        && let Err(err) = state
            .lookup
            .insert(id, entry.text.as_deref(), &entry.vector)
    {
        tracing::error!(%err, "query lookup insertion failed");
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
}

/// Where fallback results go when the hot cache is replicated.
pub trait CacheReplication: Send + Sync {
    /// Hands `tenant`'s fallback result over for replication; it must not block the
    /// request.
    fn propose(
        &self,
        tenant: &Tenant,
        text: Option<String>,
        query: &[f32],
        document_ids: Vec<DocId>,
    );
}

/// Whether a result can be cached: documents with vectors of the query's dimension.
fn usable(query: &[f32], result: &[CloudDocument]) -> bool {
    let usable = !result.is_empty() && result.iter().all(|d| d.vector.len() == query.len());
    if !usable {
        tracing::warn!("cloud result without usable vectors; not cached");
    }
    usable
}

/// Candidates deduplicated by id, ranked by exact inner product with the query (ties by
/// id), best k.
fn rerank(
    query: &[f32],
    candidates: Vec<Arc<EdgeDocument>>,
    k: usize,
) -> Vec<(f32, Arc<EdgeDocument>)> {
    let mut seen = HashSet::with_capacity(candidates.len());
    let mut draft: Vec<(f32, Arc<EdgeDocument>)> = candidates
        .into_iter()
        .filter(|doc| seen.insert(doc.id))
        .map(|doc| (dot(query, &doc.vector), doc))
        .collect();
    draft.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    draft.truncate(k);
    draft
}

fn draft_documents(draft: Vec<(f32, Arc<EdgeDocument>)>) -> Vec<RetrievedDocument> {
    draft
        .into_iter()
        .map(|(score, doc)| RetrievedDocument {
            id: doc.id,
            title: doc.title.clone(),
            text: doc.text.clone(),
            score,
        })
        .collect()
}

/// A cached query's result served as the answer: its first k documents, scored against
/// `query` (or the cached query's own vector). `None` when it holds fewer than k.
fn serve_entry(
    state: &CacheState,
    id: QueryId,
    query: Option<&[f32]>,
    k: usize,
) -> Option<(Vec<RetrievedDocument>, MatchedQuery)> {
    let entry = state.hot.get(id)?;
    if entry.doc_ids.len() < k {
        return None;
    }
    let query = query.unwrap_or(&entry.vector);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cloud_index::ExactSearcher;
    use hasten_core::bundle::{CorpusBundle, write_bundle};
    use hasten_core::corpus::Document;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::cloud::{fallback_documents, fallback_request};

    const D: usize = 16;
    const K: usize = 4;

    /// The real exact searcher, in process, counting the fallbacks that reach it.
    struct LocalCloud {
        searcher: ExactSearcher,
        calls: AtomicUsize,
    }

    impl CloudSearch for LocalCloud {
        async fn search(
            &self,
            query: &[f32],
            k: usize,
            _deadline: Option<Instant>,
        ) -> Result<Vec<CloudDocument>, CloudError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let response = self
                .searcher
                .search(&fallback_request(
                    query,
                    k,
                    std::time::Duration::from_secs(1),
                ))
                .map_err(|e| CloudError::Refused(e.to_string()))?;
            Ok(fallback_documents(response))
        }
    }

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = dot(&v, &v).sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// 8 well-separated topics of 6 documents each; returns the engine and topic centres.
    fn engine_with(
        capacity: usize,
        policy: RetrievalPolicy,
    ) -> (
        tempfile::TempDir,
        RetrievalEngine<LocalCloud>,
        Vec<Vec<f32>>,
    ) {
        let mut rng = StdRng::seed_from_u64(9);
        let centres: Vec<Vec<f32>> = (0..8)
            .map(|t| unit((0..D).map(|i| if i == t { 1.0 } else { 0.0 }).collect()))
            .collect();
        let mut docs = Vec::new();
        let mut vectors = Vec::new();
        for (t, c) in centres.iter().enumerate() {
            for j in 0..6 {
                docs.push(Document {
                    id: (t * 6 + j) as u64,
                    title: format!("t{t}"),
                    text: format!("doc {t}/{j}"),
                });
                vectors.extend(unit(
                    c.iter().map(|x| x + 0.15 * rng.random::<f32>()).collect(),
                ));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        write_bundle(&dir.path().join("b"), vec![], &docs, &vectors, D, &[]).unwrap();
        let bundle = CorpusBundle::load(&dir.path().join("b")).unwrap();
        let documents = Arc::new(DocumentStore::from_bundle(&bundle));
        let fuzzy = FuzzyChannel::build(&documents, 1.0, Some(2), Some(2)).unwrap();
        let channel = CacheChannel::train(D, bundle.vectors(), Some(2), Some(2)).unwrap();
        let cloud = LocalCloud {
            searcher: ExactSearcher::new(bundle).unwrap(),
            calls: AtomicUsize::new(0),
        };
        // 48 fuzzy candidates = the whole toy corpus: its 1-bit PQ ranks nothing, the exact
        // re-rank decides.
        let settings = EngineSettings {
            policy,
            tau: 0.5,
            fuzzy_candidates: 48,
            semantic_threshold: 0.95,
        };
        let engine = RetrievalEngine::new(
            settings,
            HotCache::new(capacity),
            channel,
            Some(fuzzy),
            documents,
            cloud,
        )
        .unwrap();
        (dir, engine, centres)
    }

    fn engine(
        capacity: usize,
    ) -> (
        tempfile::TempDir,
        RetrievalEngine<LocalCloud>,
        Vec<Vec<f32>>,
    ) {
        engine_with(capacity, RetrievalPolicy::Has)
    }

    /// (cached queries, cached documents)
    fn sizes(engine: &RetrievalEngine<LocalCloud>) -> (usize, usize) {
        let stats = engine.cache_stats();
        (stats.queries, stats.documents)
    }

    fn calls(engine: &RetrievalEngine<LocalCloud>) -> usize {
        engine.cloud.calls.load(Ordering::SeqCst)
    }

    /// `centres[t]` nudged along another axis: close to topic t, not identical.
    fn near(centres: &[Vec<f32>], t: usize, by: f32) -> Vec<f32> {
        unit(
            centres[t]
                .iter()
                .enumerate()
                .map(|(i, x)| x + if i == 9 { by } else { 0.0 })
                .collect(),
        )
    }

    async fn ask(engine: &RetrievalEngine<LocalCloud>, q: &[f32], text: &str) -> Retrieval {
        ask_as(engine, &Tenant::default_tenant(), q, text).await
    }

    async fn ask_as(
        engine: &RetrievalEngine<LocalCloud>,
        tenant: &Tenant,
        q: &[f32],
        text: &str,
    ) -> Retrieval {
        let request = RetrievalRequest {
            tenant: tenant.clone(),
            vector: q.to_vec(),
            text: Some(text.into()),
            k: K,
            deadline: None,
        };
        engine
            .retrieve(request, StageTimings::default())
            .await
            .unwrap()
    }

    /// The default tenant's cache.
    fn default_cache(engine: &RetrievalEngine<LocalCloud>) -> &RwLock<CacheState> {
        engine.cache(&Tenant::default_tenant()).unwrap()
    }

    #[tokio::test]
    async fn a_fallback_inserts_its_query_and_an_accepted_draft_inserts_nothing() {
        let (_dir, engine, centres) = engine(10);
        let first = ask(&engine, &centres[0], "about topic 0").await;
        assert_eq!(first.outcome, Outcome::Fallback);
        assert_eq!(sizes(&engine), (1, K));
        assert!(first.timings.cloud_us > 0);

        let nearby = near(&centres, 0, 0.1);
        let second = ask(&engine, &nearby, "also topic 0").await;
        assert_eq!(second.outcome, Outcome::Accepted);
        assert!(second.homology_score >= 0.5);
        assert_eq!(
            second
                .matched_query
                .as_ref()
                .and_then(|m| m.text.as_deref()),
            Some("about topic 0")
        );
        assert_eq!(
            sizes(&engine),
            (1, K),
            "an accepted draft must not touch the cache"
        );
        assert_eq!(calls(&engine), 1);

        let other = ask(&engine, &centres[3], "about topic 3").await;
        assert_eq!(other.outcome, Outcome::Fallback);
        assert_eq!(sizes(&engine), (2, 2 * K));
        assert_eq!(calls(&engine), 2);
    }

    #[tokio::test]
    async fn eviction_takes_unreferenced_documents_out_of_the_cache_channel() {
        let (_dir, engine, centres) = engine(1);
        let first = ask(&engine, &centres[0], "topic 0").await;
        let first_ids: Vec<DocId> = first.documents.iter().map(|d| d.id).collect();
        assert!(
            first_ids
                .iter()
                .all(|id| default_cache(&engine).read().channel.contains(*id))
        );
        ask(&engine, &centres[5], "topic 5").await;
        let state = default_cache(&engine).read();
        assert_eq!(state.hot.len(), 1);
        for id in &first_ids {
            assert!(
                !state.channel.contains(*id),
                "document {id} of the evicted query is still cached"
            );
            assert!(!state.hot.contains_document(*id));
        }
        let hits = state.channel.search(&centres[0], 20).unwrap();
        assert!(
            hits.iter().all(|h| !first_ids.contains(&h.id)),
            "evicted documents still searchable"
        );
        assert_eq!(state.channel.indexed(), K);
    }

    #[tokio::test]
    async fn a_replicated_entry_is_served_from_the_edges_own_documents() {
        let (_dir, engine, centres) = engine(10);
        // Another edge's fallback for topic 2 arrives as ids only; id 999 is not in this
        // edge's corpus.
        let ids: Vec<DocId> = (12..12 + K as u64).chain([999]).collect();
        engine.apply_replicated(
            &[],
            Some(ReplicatedEntry {
                id: 7 << 16,
                tenant: Tenant::default_tenant(),
                text: Some("another edge asked about topic 2".into()),
                vector: centres[2].clone(),
                document_ids: ids.clone(),
            }),
        );
        assert_eq!(engine.cached_ids(), vec![7 << 16]);
        assert_eq!(
            sizes(&engine),
            (1, K),
            "the unknown id has no document here"
        );
        assert!(default_cache(&engine).read().hot.contains_document(999));

        let reply = ask(&engine, &near(&centres, 2, 0.1), "topic 2 again").await;
        assert_eq!(reply.outcome, Outcome::Accepted);
        assert_eq!(calls(&engine), 0, "the cloud was not asked");
        assert!(reply.documents.iter().all(|d| d.title == "t2"));

        engine.apply_replicated(&[7 << 16], None);
        assert_eq!(sizes(&engine), (0, 0));
        assert!(!default_cache(&engine).read().hot.contains_document(999));
        // A vector of another dimension cannot be this edge's entry.
        engine.apply_replicated(
            &[],
            Some(ReplicatedEntry {
                id: 8 << 16,
                tenant: Tenant::default_tenant(),
                text: None,
                vector: vec![1.0; D + 1],
                document_ids: ids,
            }),
        );
        assert!(engine.cached_ids().is_empty());
    }

    #[tokio::test]
    async fn a_tenant_is_never_accepted_through_another_tenants_cache() {
        let (_dir, engine, centres) = engine(10);
        let (acme, globex) = (Tenant::new("acme"), Tenant::new("globex"));
        let engine = engine
            .with_tenants(&[acme.clone(), globex.clone()])
            .unwrap();
        let first = ask_as(&engine, &acme, &centres[2], "topic 2").await;
        assert_eq!(first.outcome, Outcome::Fallback);
        // The homologous question is accepted for the tenant who asked the first...
        let again = ask_as(&engine, &acme, &near(&centres, 2, 0.1), "topic 2 again").await;
        assert_eq!(again.outcome, Outcome::Accepted);
        // ...but another tenant's draft finds nothing to validate it: the cloud answers.
        let other = ask_as(&engine, &globex, &near(&centres, 2, 0.1), "topic 2 again").await;
        assert_eq!(other.outcome, Outcome::Fallback);
        assert_eq!(calls(&engine), 2);
        let stats: BTreeMap<Tenant, CacheStats> = engine.tenant_cache_stats().into_iter().collect();
        assert_eq!((stats[&acme].queries, stats[&globex].queries), (1, 1));

        // A replicated entry lands in its own tenant's cache only, and one of a tenant this
        // edge does not serve is dropped.
        let entry = |id: QueryId, tenant: &Tenant| ReplicatedEntry {
            id,
            tenant: tenant.clone(),
            text: None,
            vector: centres[5].clone(),
            document_ids: (30..30 + K as u64).collect(),
        };
        engine.apply_replicated(&[], Some(entry(9 << 16, &globex)));
        engine.apply_replicated(&[], Some(entry(10 << 16, &Tenant::new("initech"))));
        let stats: BTreeMap<Tenant, CacheStats> = engine.tenant_cache_stats().into_iter().collect();
        assert_eq!((stats[&acme].queries, stats[&globex].queries), (1, 2));
        assert_eq!(
            ask_as(&engine, &acme, &near(&centres, 5, 0.1), "t5")
                .await
                .outcome,
            Outcome::Fallback
        );
        assert!(engine.cache(&Tenant::default_tenant()).is_err());
    }

    #[tokio::test]
    async fn cloud_only_never_caches() {
        let (_dir, engine, centres) = engine_with(10, RetrievalPolicy::CloudOnly);
        for _ in 0..2 {
            assert_eq!(
                ask(&engine, &centres[1], "t1").await.outcome,
                Outcome::Fallback
            );
        }
        assert_eq!(sizes(&engine), (0, 0));
    }

    #[tokio::test]
    async fn exact_cache_reuses_only_an_identical_text() {
        let (_dir, engine, centres) = engine_with(10, RetrievalPolicy::ExactCache);
        assert!(
            engine
                .cached_answer_for_text(&Tenant::default_tenant(), "about topic 2", K)
                .is_none()
        );
        let first = ask(&engine, &centres[2], "about topic 2").await;
        assert_eq!(first.outcome, Outcome::Fallback);
        let hit = engine
            .cached_answer_for_text(&Tenant::default_tenant(), "  About   TOPIC 2 ", K)
            .unwrap();
        assert_eq!(hit.outcome, Outcome::Accepted);
        let ids = |r: &Retrieval| r.documents.iter().map(|d| d.id).collect::<Vec<_>>();
        assert_eq!(ids(&hit), ids(&first));
        assert!(
            engine
                .cached_answer_for_text(&Tenant::default_tenant(), "about topic 2?", K)
                .is_none()
        );
        // A homologous but different text is not an exact repeat: the cloud answers.
        let other = ask(&engine, &near(&centres, 2, 0.05), "more about topic 2").await;
        assert_eq!(other.outcome, Outcome::Fallback);
        assert_eq!(calls(&engine), 2);
    }

    #[tokio::test]
    async fn semantic_cache_reuses_the_nearest_query_above_the_threshold() {
        let (_dir, engine, centres) = engine_with(10, RetrievalPolicy::SemanticCache);
        ask(&engine, &centres[4], "topic 4").await;
        let close = ask(&engine, &near(&centres, 4, 0.1), "close to topic 4").await;
        assert_eq!(close.outcome, Outcome::Accepted);
        assert!(close.homology_score >= 0.95, "{}", close.homology_score);
        assert_eq!(
            close.matched_query.and_then(|m| m.text).as_deref(),
            Some("topic 4")
        );
        let far = ask(&engine, &near(&centres, 4, 0.6), "loosely topic 4").await;
        assert_eq!(
            far.outcome,
            Outcome::Fallback,
            "similarity {}",
            far.homology_score
        );
        assert!(far.homology_score < 0.95);
        assert_eq!(calls(&engine), 2);
    }

    #[tokio::test]
    async fn edge_ivf_answers_from_the_fuzzy_channel_alone() {
        let (_dir, engine, centres) = engine_with(10, RetrievalPolicy::EdgeIvf);
        let r = ask(&engine, &centres[6], "topic 6").await;
        assert_eq!(r.outcome, Outcome::Accepted);
        assert!(
            r.documents.iter().all(|d| d.title == "t6"),
            "{:?}",
            r.documents
        );
        assert_eq!(calls(&engine), 0);
        assert_eq!(sizes(&engine), (0, 0));
    }

    #[tokio::test]
    async fn cache_bytes_grow_with_entries_and_shrink_with_evictions() {
        let (_dir, engine, centres) = engine_with(2, RetrievalPolicy::Has);
        let empty = engine.cache_stats().bytes;
        ask(&engine, &centres[0], "a").await;
        let one = engine.cache_stats().bytes;
        ask(&engine, &centres[3], "b").await;
        let two = engine.cache_stats().bytes;
        ask(&engine, &centres[5], "c").await;
        let still_two = engine.cache_stats().bytes;
        assert!(empty < one && one < two, "{empty} {one} {two}");
        let ratio = still_two as f64 / two as f64;
        assert!((0.9..1.1).contains(&ratio), "{two} vs {still_two}");
    }
}
