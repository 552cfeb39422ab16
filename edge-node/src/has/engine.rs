//! The HaS engine: two-channel draft, exact re-rank, homology validation, and the exact
//! fallback to the cloud whose result is cached.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use hasten_core::DocId;
use hasten_core::index::IndexError;
use hasten_core::vector::dot;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::channels::{CacheChannel, EdgeDocument, FuzzyChannel};
use super::hot_cache::{CacheChange, HotCache, QueryId};
use super::validator::{HomologyValidator, Verdict};
use crate::cloud::CloudError;

/// How the edge answers a query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RetrievalPolicy {
    /// Homology-aware speculative retrieval.
    #[default]
    Has,
    /// Every query goes to the cloud; nothing is cached (the baseline).
    CloudOnly,
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
    /// Exact top-`k` for a normalised query, with texts and vectors.
    fn search(
        &self,
        query: &[f32],
        k: usize,
    ) -> impl Future<Output = Result<Vec<CloudDocument>, CloudError>> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cloud index unavailable: {0}")]
    Cloud(#[from] CloudError),
    #[error("edge index failure: {0}")]
    Index(#[from] IndexError),
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

#[derive(Clone, Debug, PartialEq)]
pub struct Retrieval {
    pub documents: Vec<RetrievedDocument>,
    pub outcome: Outcome,
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
}

struct CacheState {
    hot: HotCache,
    channel: CacheChannel,
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

pub struct HasEngine<C> {
    settings: EngineSettings,
    validator: HomologyValidator,
    fuzzy: Option<FuzzyChannel>,
    cache: RwLock<CacheState>,
    cloud: C,
}

impl<C: CloudSearch> HasEngine<C> {
    /// `fuzzy` is `None` when the fuzzy channel is switched off (the paper's ablation).
    pub fn new(
        settings: EngineSettings,
        hot: HotCache,
        channel: CacheChannel,
        fuzzy: Option<FuzzyChannel>,
        cloud: C,
    ) -> Self {
        Self {
            validator: HomologyValidator::new(settings.tau),
            settings,
            fuzzy,
            cache: RwLock::new(CacheState { hot, channel }),
            cloud,
        }
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Cached queries and the distinct documents they reference.
    pub fn cache_size(&self) -> (usize, usize) {
        let state = self.cache.read();
        (state.hot.len(), state.channel.len())
    }

    /// Answers a normalised query: an accepted draft, or the cloud's exact result.
    #[tracing::instrument(skip_all, fields(k, outcome))]
    pub async fn retrieve(
        &self,
        query: Vec<f32>,
        text: Option<String>,
        k: usize,
        mut timings: StageTimings,
    ) -> Result<Retrieval, EngineError> {
        tracing::Span::current().record("k", k);
        let started = Instant::now();
        let mut homology_score = 0.0;
        if self.settings.policy == RetrievalPolicy::Has {
            let judged = self.speculate(&query, k, &mut timings)?;
            homology_score = judged.verdict.score;
            if judged.verdict.accepted {
                tracing::Span::current().record("outcome", "accepted");
                timings.total_us = timings.encode_us + micros_since(started);
                return Ok(Retrieval {
                    documents: judged
                        .draft
                        .into_iter()
                        .map(|(score, doc)| RetrievedDocument {
                            id: doc.id,
                            title: doc.title.clone(),
                            text: doc.text.clone(),
                            score,
                        })
                        .collect(),
                    outcome: Outcome::Accepted,
                    homology_score,
                    matched_query: judged.matched,
                    timings,
                });
            }
        }
        tracing::Span::current().record("outcome", "fallback");
        let cloud_started = Instant::now();
        let result = self.cloud.search(&query, k).await?;
        timings.cloud_us = micros_since(cloud_started);
        if self.settings.policy == RetrievalPolicy::Has {
            let update_started = Instant::now();
            self.insert(text, query, &result);
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

    /// Two-channel draft, exact re-rank to k, and the homology verdict: the accept path,
    /// without the encoder and without touching the cloud.
    pub fn speculate(
        &self,
        query: &[f32],
        k: usize,
        timings: &mut StageTimings,
    ) -> Result<Speculation, EngineError> {
        let state = self.cache.read();
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
            let docs = fuzzy
                .search(query, self.settings.fuzzy_candidates.max(k))?
                .iter()
                .filter_map(|hit| fuzzy.document(hit.id).cloned())
                .collect();
            Ok((docs, micros_since(stage)))
        };
        let (cached, fuzzy) = rayon::join(cache_channel, fuzzy_channel);
        let (cached, cache_us) = cached?;
        let (fuzzy, fuzzy_us) = fuzzy?;
        timings.cache_channel_us = cache_us;
        timings.fuzzy_channel_us = fuzzy_us;
        let mut candidates: HashMap<DocId, Arc<EdgeDocument>> =
            HashMap::with_capacity(cached.len() + fuzzy.len());
        for doc in cached.into_iter().chain(fuzzy) {
            candidates.entry(doc.id).or_insert(doc);
        }

        let stage = Instant::now();
        let mut draft: Vec<(f32, Arc<EdgeDocument>)> = candidates
            .into_values()
            .map(|doc| (dot(query, &doc.vector), doc))
            .collect();
        draft.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        draft.truncate(k);
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

    /// Caches a fallback result: the hot cache, its inverted index and the cache channel
    /// change together under one write lock. Returns how the cached documents changed
    /// (nothing when the result carries no usable vectors).
    pub fn insert(
        &self,
        text: Option<String>,
        query: Vec<f32>,
        result: &[CloudDocument],
    ) -> CacheChange {
        if result.is_empty() || result.iter().any(|d| d.vector.len() != query.len()) {
            tracing::warn!("cloud result without usable vectors; not cached");
            return CacheChange::default();
        }
        let ids: Vec<DocId> = result.iter().map(|d| d.id).collect();
        let mut state = self.cache.write();
        let (_, change) = state.hot.insert(text, query, &ids);
        let added: Vec<Arc<EdgeDocument>> = result
            .iter()
            .filter(|d| change.added.contains(&d.id))
            .map(|d| {
                self.fuzzy
                    .as_ref()
                    .and_then(|f| f.document(d.id))
                    .cloned()
                    .unwrap_or_else(|| {
                        Arc::new(EdgeDocument {
                            id: d.id,
                            title: d.title.clone(),
                            text: d.text.clone(),
                            vector: d.vector.clone(),
                        })
                    })
            })
            .collect();
        let state = &mut *state;
        if let Err(err) = state.channel.remove(&change.released) {
            tracing::error!(%err, "cache channel removal failed");
        }
        if let Err(err) = state.channel.add(added) {
            tracing::error!(%err, "cache channel insertion failed");
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cloud_index::ExactSearcher;
    use hasten_core::bundle::{CorpusBundle, write_bundle};
    use hasten_core::corpus::Document;
    use hasten_proto::v1::{QueryVector, SearchRequest};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const D: usize = 16;
    const K: usize = 4;

    /// The real exact searcher, in process, counting the fallbacks that reach it.
    struct LocalCloud {
        searcher: ExactSearcher,
        calls: AtomicUsize,
    }

    impl CloudSearch for LocalCloud {
        async fn search(&self, query: &[f32], k: usize) -> Result<Vec<CloudDocument>, CloudError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let request = SearchRequest {
                queries: vec![QueryVector {
                    values: query.to_vec(),
                }],
                k: k as u32,
                include_vectors: true,
                include_texts: true,
            };
            let mut response = self
                .searcher
                .search(&request)
                .map_err(|e| CloudError::Refused(e.to_string()))?;
            let hits = response.results.pop().map(|r| r.hits).unwrap_or_default();
            Ok(hits
                .into_iter()
                .map(|h| CloudDocument {
                    id: h.id,
                    score: h.score,
                    title: h.title,
                    text: h.text,
                    vector: h.vector,
                })
                .collect())
        }
    }

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = dot(&v, &v).sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// 8 well-separated topics of 6 documents each; returns the engine and topic centres.
    fn engine(capacity: usize) -> (tempfile::TempDir, HasEngine<LocalCloud>, Vec<Vec<f32>>) {
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
        let fuzzy = FuzzyChannel::build(&bundle, 1.0, Some(2), Some(2)).unwrap();
        let channel = CacheChannel::train(D, bundle.vectors(), Some(2), Some(2)).unwrap();
        let cloud = LocalCloud {
            searcher: ExactSearcher::new(bundle).unwrap(),
            calls: AtomicUsize::new(0),
        };
        // 48 fuzzy candidates = the whole toy corpus: its 1-bit PQ ranks nothing, the exact
        // re-rank decides.
        let settings = EngineSettings {
            policy: RetrievalPolicy::Has,
            tau: 0.5,
            fuzzy_candidates: 48,
        };
        (
            dir,
            HasEngine::new(
                settings,
                HotCache::new(capacity),
                channel,
                Some(fuzzy),
                cloud,
            ),
            centres,
        )
    }

    async fn ask(engine: &HasEngine<LocalCloud>, q: &[f32], text: &str) -> Retrieval {
        engine
            .retrieve(q.to_vec(), Some(text.into()), K, StageTimings::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_fallback_inserts_its_query_and_an_accepted_draft_inserts_nothing() {
        let (_dir, engine, centres) = engine(10);
        let first = ask(&engine, &centres[0], "about topic 0").await;
        assert_eq!(first.outcome, Outcome::Fallback);
        assert_eq!(engine.cache_size(), (1, K));
        assert!(first.timings.cloud_us > 0);

        let nearby = unit(
            centres[0]
                .iter()
                .enumerate()
                .map(|(i, x)| x + if i == 9 { 0.1 } else { 0.0 })
                .collect(),
        );
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
            engine.cache_size(),
            (1, K),
            "an accepted draft must not touch the cache"
        );
        assert_eq!(engine.cloud.calls.load(Ordering::SeqCst), 1);

        let other = ask(&engine, &centres[3], "about topic 3").await;
        assert_eq!(other.outcome, Outcome::Fallback);
        assert_eq!(engine.cache_size(), (2, 2 * K));
        assert_eq!(engine.cloud.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn eviction_takes_unreferenced_documents_out_of_the_cache_channel() {
        let (_dir, engine, centres) = engine(1);
        let first = ask(&engine, &centres[0], "topic 0").await;
        let first_ids: Vec<DocId> = first.documents.iter().map(|d| d.id).collect();
        assert!(
            first_ids
                .iter()
                .all(|id| engine.cache.read().channel.contains(*id))
        );
        ask(&engine, &centres[5], "topic 5").await;
        let state = engine.cache.read();
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
    async fn cloud_only_never_caches() {
        let (_dir, mut engine, centres) = engine(10);
        engine.settings.policy = RetrievalPolicy::CloudOnly;
        for _ in 0..2 {
            assert_eq!(
                ask(&engine, &centres[1], "t1").await.outcome,
                Outcome::Fallback
            );
        }
        assert_eq!(engine.cache_size(), (0, 0));
    }
}
