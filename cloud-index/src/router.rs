//! The router: the cloud's search API over a sharded corpus.
//!
//! Every search goes to one live replica of every shard at once; each shard answers its
//! exact top-k, and the router merges them by score (ties by document id) into the global
//! top-k, which is exactly what one exact search over the whole corpus returns. A replica
//! that fails or times out is marked down and the shard's next live replica is tried, for as
//! long as the request's deadline allows; a shard with no live replica fails the request with
//! an UNAVAILABLE naming it, or, when the request allows, is left out of a result flagged
//! partial. [`crate::replica_set`] checks every replica's health and identity (corpus
//! version, model, shard number) and brings recovered replicas back. When every replica of a
//! shard is believed down, each is still tried once (health can lag a restart) before the
//! shard is reported unavailable.
//!
//! Concurrent searches are coalesced ([`crate::batcher`]) into one request per shard, so
//! that every shard searches the same batches and answers them together. A search whose
//! answer could exceed the message limit is refused before it is sent
//! ([`crate::response_limit`], with the largest hit any shard holds), and a batch whose
//! combined request could is sent as several requests.
//!
//! Documents by id go the same way to the shard holding each id ([`crate::shard_call`]).
//!
//! The shard map comes from a `watch` channel ([`crate::shard_map`]): the configured map,
//! replaced by the control plane's when the router follows one.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hasten_core::ranking::best_first;
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::{
    DocumentsRequest, DocumentsResponse, IndexInfo, QueryHits, SearchRequest, SearchResponse,
};
use tokio::sync::watch;

use crate::backend::SearchBackend;
use crate::batcher::{BatchRunner, BatchingSettings, MicroBatcher};
use crate::documents::{ids_by_shard, merge_shard_documents, validated_ids};
use crate::error::SearchError;
use crate::metrics::CloudMetrics;
use crate::replica::{AttemptError, Replica};
use crate::replica_set::{ReplicaSet, RouterError, RouterSettings};
use crate::response_limit::{ResponseLimit, SearchShape};
use crate::searcher::validated_queries;
use crate::shard_call::ShardCall;
use crate::shard_map::ShardMap;

#[derive(Debug)]
struct RouterState {
    replicas: Arc<ReplicaSet>,
    settings: RouterSettings,
    /// The largest answer to one request, the router's and each shard's alike.
    limit: ResponseLimit,
    /// Spreads load over a shard's live replicas.
    rotation: AtomicUsize,
    metrics: CloudMetrics,
}

/// Scatter-gather search over a sharded corpus.
#[derive(Clone, Debug)]
pub struct Router {
    state: Arc<RouterState>,
    /// Coalesces concurrent searches into one request per shard; `None` sends each search
    /// on its own.
    batcher: Option<MicroBatcher<RouterState>>,
}

impl Router {
    /// Starts once every shard of the current map in `map` has a replica that answers and
    /// every answering replica serves the same corpus and the shard the map says
    /// ([`ReplicaSet::start`]). With `tls`, shards are reached over mutual TLS.
    pub async fn start(
        map: watch::Receiver<Arc<ShardMap>>,
        settings: RouterSettings,
        batching: Option<BatchingSettings>,
        metrics: CloudMetrics,
        tls: Option<MutualTls>,
    ) -> Result<Self, RouterError> {
        let replicas = ReplicaSet::start(map, settings, metrics.clone(), tls).await?;
        let state = Arc::new(RouterState {
            limit: response_limit(&replicas),
            replicas,
            settings,
            rotation: AtomicUsize::new(0),
            metrics: metrics.clone(),
        });
        let batcher =
            batching.map(|settings| MicroBatcher::start(Arc::clone(&state), settings, metrics));
        Ok(Self { state, batcher })
    }

    /// Publishes every replica's health to the metrics now (the health checks do so every
    /// interval; a scrape wants what requests found since).
    pub fn report_replicas(&self) {
        self.state.replicas.report();
    }

    /// Shards with no live replica now, for readiness.
    pub fn unavailable_shards(&self) -> Vec<usize> {
        self.state
            .replicas
            .live_replicas()
            .into_iter()
            .enumerate()
            .filter(|(_, live)| *live == 0)
            .map(|(shard, _)| shard)
            .collect()
    }
}

/// The router's response limit, from what its shards said at start: the corpus's
/// dimension, all their documents, the largest hit any of them holds, and how many shards
/// a partial answer may name. Replicas that come later serve the same corpus and shards,
/// so the same documents.
fn response_limit(replicas: &ReplicaSet) -> ResponseLimit {
    let shards = replicas.shard_infos();
    let infos = shards.iter().flatten();
    ResponseLimit::new(
        replicas.identity().dimension as usize,
        infos.clone().map(|info| info.documents as usize).sum(),
        infos
            .map(|info| info.max_texts_bytes as usize)
            .max()
            .unwrap_or(0),
        shards.len(),
    )
}

/// One caller's search as the router queues it: the request, validated, and when its
/// caller stops waiting.
#[derive(Debug)]
pub struct RoutedSearch {
    request: SearchRequest,
    deadline: Instant,
}

/// What one caller asked for, kept while its queries travel in a combined request.
struct Asked {
    queries: usize,
    k: usize,
    include_vectors: bool,
    include_texts: bool,
    allow_partial: bool,
}

impl RouterState {
    /// Sends `request` to one replica of `shard`, starting with the one `rotation` points
    /// at, moving on to the next while the deadline allows.
    async fn call_shard<C: ShardCall>(
        &self,
        shard: usize,
        endpoints: &[String],
        request: &C,
        deadline: Instant,
        rotation: usize,
    ) -> Result<C::Reply, SearchError> {
        let unavailable = |reason: String| SearchError::ShardUnavailable { shard, reason };
        let mut replicas = Vec::with_capacity(endpoints.len());
        let mut without_client = Vec::new();
        for endpoint in endpoints {
            match self.replicas.get(endpoint) {
                Ok(replica) => replicas.push(replica),
                Err(err) => without_client.push(err.to_string_full()),
            }
        }
        let rotated: Vec<&Arc<Replica>> = (0..replicas.len())
            .map(|i| &replicas[(rotation + i) % replicas.len()])
            .filter(|r| r.is_usable())
            .collect();
        let live: Vec<&Arc<Replica>> = rotated.iter().copied().filter(|r| r.is_live()).collect();
        if rotated.is_empty() {
            let reasons: Vec<String> = replicas
                .iter()
                .map(|r| format!("{}: {}", r.endpoint, r.down_reason()))
                .chain(without_client)
                .collect();
            return Err(unavailable(format!(
                "no usable replica ({})",
                reasons.join("; ")
            )));
        }
        let candidates = if live.is_empty() { rotated } else { live };
        let mut failures = Vec::new();
        let mut overloaded = 0;
        for replica in candidates {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let attempt = remaining.min(self.settings.attempt_timeout);
            let error = match request.attempt(replica, attempt).await {
                Ok(reply) => match request.check(&reply) {
                    Ok(()) => {
                        replica.mark_live();
                        return Ok(reply);
                    }
                    Err(why) => AttemptError::Failed(why),
                },
                Err(AttemptError::Rejected(message)) => {
                    return Err(SearchError::InvalidArgument(message));
                }
                Err(AttemptError::Overloaded(message)) => {
                    overloaded += 1;
                    failures.push(format!("{}: {message}", replica.endpoint));
                    continue;
                }
                Err(err) => err,
            };
            tracing::debug!(shard, endpoint = %replica.endpoint, error = %error.display_full(), "shard attempt failed; trying the next replica");
            self.metrics.failover(shard);
            replica.mark_down(error.to_string_full());
            failures.push(format!("{}: {}", replica.endpoint, error.display_full()));
        }
        if Instant::now() >= deadline {
            return Err(SearchError::DeadlineExceeded {
                timeout_ms: u64::from(request.timeout_ms()),
                what: format!(
                    "shard {shard} did not answer in time ({})",
                    failures.join("; ")
                ),
            });
        }
        if overloaded > 0 && overloaded == failures.len() {
            return Err(SearchError::Overloaded(format!(
                "every replica of shard {shard} is at its bound ({})",
                failures.join("; ")
            )));
        }
        Err(unavailable(format!(
            "no replica answered ({})",
            failures.join("; ")
        )))
    }

    /// Answers the searches of `batch`, in order: each run of them whose combined request
    /// fits the response limit goes to the shards as one request, the runs at once.
    async fn fan_out(&self, batch: Vec<RoutedSearch>) -> Vec<Result<SearchResponse, SearchError>> {
        let runs = within_limit(batch, &self.limit);
        futures::future::join_all(runs.into_iter().map(|run| self.fan_out_combined(run)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends the searches of `batch` to every shard as one combined request (the largest
    /// k, the union of what is included, the latest deadline), then gives each search its
    /// own merged answer: its queries, cut to its k, stripped of what it did not ask for,
    /// with its own tolerance of missing shards.
    async fn fan_out_combined(
        &self,
        batch: Vec<RoutedSearch>,
    ) -> Vec<Result<SearchResponse, SearchError>> {
        let Some(deadline) = batch.iter().map(|s| s.deadline).max() else {
            return Vec::new();
        };
        let mut combined = SearchRequest {
            timeout_ms: hasten_proto::wire_timeout_ms(
                deadline.saturating_duration_since(Instant::now()),
            ),
            ..Default::default()
        };
        let mut asked = Vec::with_capacity(batch.len());
        for search in batch {
            let request = search.request;
            asked.push(Asked {
                queries: request.queries.len(),
                k: request.k as usize,
                include_vectors: request.include_vectors,
                include_texts: request.include_texts,
                allow_partial: request.allow_partial,
            });
            combined.k = combined.k.max(request.k);
            combined.include_vectors |= request.include_vectors;
            combined.include_texts |= request.include_texts;
            combined.queries.extend(request.queries);
        }
        let map = self.replicas.map();
        // The same replica position on every shard, so that batches in flight at once
        // keep to separate replicas.
        let rotation = self.rotation.fetch_add(1, Ordering::Relaxed);
        let combined = &combined;
        let outcomes =
            futures::future::join_all(map.shards.iter().enumerate().map(|(shard, endpoints)| {
                async move {
                    let started = Instant::now();
                    let outcome = self
                        .call_shard(shard, endpoints, combined, deadline, rotation)
                        .await;
                    // Failovers included: the time this shard held the routed search up.
                    self.metrics.observe_shard_fan_out(shard, started.elapsed());
                    outcome
                }
            }))
            .await;
        let mut shards: Vec<Result<std::vec::IntoIter<QueryHits>, SearchError>> = outcomes
            .into_iter()
            .map(|outcome| outcome.map(|response| response.results.into_iter()))
            .collect();
        asked
            .iter()
            .map(|asked| answer_of(asked, &mut shards))
            .collect()
    }

    /// The documents of `ids`, each asked of the shard that holds it, the shards at once.
    async fn fetch_documents(
        &self,
        ids: Vec<u64>,
        contents: &DocumentsRequest,
        deadline: Instant,
    ) -> Result<DocumentsResponse, SearchError> {
        let map = self.replicas.map();
        let split = ids_by_shard(&ids, map.shards.len());
        let rotation = self.rotation.fetch_add(1, Ordering::Relaxed);
        let timeout_ms =
            hasten_proto::wire_timeout_ms(deadline.saturating_duration_since(Instant::now()));
        let asks = map
            .shards
            .iter()
            .zip(split)
            .enumerate()
            .filter(|(_, (_, ids))| !ids.is_empty())
            .map(|(shard, (endpoints, ids))| {
                let request = DocumentsRequest {
                    ids,
                    timeout_ms,
                    ..*contents
                };
                async move {
                    self.call_shard(shard, endpoints, &request, deadline, rotation)
                        .await
                }
            });
        let answers = futures::future::try_join_all(asks).await?;
        Ok(merge_shard_documents(&ids, answers))
    }
}

/// Cuts `batch` into runs of consecutive searches whose combined request fits `limit`, so
/// that no shard is asked for an answer it must refuse. Every search fits alone (checked
/// on arrival), but a combined request takes the largest k and the contents any search
/// asks for, for all their queries.
fn within_limit(batch: Vec<RoutedSearch>, limit: &ResponseLimit) -> Vec<Vec<RoutedSearch>> {
    let mut runs: Vec<(SearchShape, Vec<RoutedSearch>)> = Vec::new();
    for search in batch {
        let shape = SearchShape::of(&search.request);
        match runs.last_mut() {
            Some((combined, run)) if limit.fits(combined.joined(shape)) => {
                *combined = combined.joined(shape);
                run.push(search);
            }
            _ => runs.push((shape, vec![search])),
        }
    }
    runs.into_iter().map(|(_, run)| run).collect()
}

/// One search's answer from the shards' answers to the combined request: takes its
/// queries' hit lists off the front of every shard's (also when it fails, so that the next
/// search finds its own at the front).
fn answer_of(
    asked: &Asked,
    shards: &mut [Result<std::vec::IntoIter<QueryHits>, SearchError>],
) -> Result<SearchResponse, SearchError> {
    let mut answers = Vec::with_capacity(shards.len());
    let mut missing = Vec::new();
    let mut unavailable = None;
    let mut failure = None;
    for (shard, outcome) in shards.iter_mut().enumerate() {
        match outcome {
            Ok(hits) => answers.push(hits.take(asked.queries).collect()),
            Err(err @ SearchError::ShardUnavailable { .. }) if asked.allow_partial => {
                missing.push(shard as u32);
                unavailable.get_or_insert_with(|| err.clone());
            }
            Err(err) => {
                failure.get_or_insert_with(|| err.clone());
            }
        }
    }
    if let Some(err) = failure {
        return Err(err);
    }
    if let (true, Some(err)) = (answers.is_empty(), unavailable) {
        return Err(err);
    }
    let mut results = merge_shard_results(answers, asked.queries, asked.k);
    for hit in results.iter_mut().flat_map(|query| query.hits.iter_mut()) {
        if !asked.include_texts {
            hit.title = String::new();
            hit.text = String::new();
        }
        if !asked.include_vectors {
            hit.vector = Vec::new();
        }
    }
    Ok(SearchResponse {
        results,
        partial: !missing.is_empty(),
        missing_shards: missing,
    })
}

/// The time a request may take: its own `timeout_ms`, or the router's default.
fn request_budget(timeout_ms: u32, settings: &RouterSettings) -> Duration {
    if timeout_ms > 0 {
        Duration::from_millis(u64::from(timeout_ms))
    } else {
        settings.request_timeout
    }
}

/// Merges the hit lists of all shards for `queries` queries (`shards[s][q]`: shard s's hits
/// for query q) into the global top-`k` of each: all hits ranked by score, ties by document
/// id, cut to k.
pub fn merge_shard_results(
    shards: Vec<Vec<QueryHits>>,
    queries: usize,
    k: usize,
) -> Vec<QueryHits> {
    let mut merged: Vec<QueryHits> = (0..queries).map(|_| QueryHits::default()).collect();
    for shard in shards {
        for (into, hits) in merged.iter_mut().zip(shard) {
            into.hits.extend(hits.hits);
        }
    }
    for query in &mut merged {
        query
            .hits
            .sort_by(|a, b| best_first((a.score, a.id), (b.score, b.id)));
        query.hits.truncate(k);
    }
    merged
}

/// The router batches whole searches into one request per shard. As many batches may be
/// in flight as the shard with the fewest live replicas has replicas: each batch keeps to
/// one replica position, so more would queue two batches on one replica.
impl BatchRunner for RouterState {
    type Search = RoutedSearch;

    fn queries(&self, search: &RoutedSearch) -> usize {
        search.request.queries.len()
    }

    fn parallelism(&self) -> usize {
        self.replicas
            .live_replicas()
            .into_iter()
            .min()
            .unwrap_or(1)
            .max(1)
    }

    async fn run(
        self: Arc<Self>,
        batch: Vec<RoutedSearch>,
    ) -> Vec<Result<SearchResponse, SearchError>> {
        self.fan_out(batch).await
    }
}

impl SearchBackend for Router {
    fn info(&self) -> IndexInfo {
        let replicas = &self.state.replicas;
        let documents = replicas
            .shard_infos()
            .iter()
            .flatten()
            .map(|info| info.documents)
            .sum();
        let identity = replicas.identity();
        IndexInfo {
            corpus_version: identity.corpus_version.clone(),
            model_id: identity.model_id.clone(),
            dimension: identity.dimension,
            documents,
            shard_index: 0,
            shard_count: 1,
            max_texts_bytes: self.state.limit.texts_bytes() as u64,
        }
    }

    #[tracing::instrument(name = "route", skip_all, fields(queries = request.queries.len(), k = request.k))]
    async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        // Checked here, as a shard would, so that one bad request cannot fail a batch.
        validated_queries(&request, &self.state.limit)?;
        let budget = request_budget(request.timeout_ms, &self.state.settings);
        let deadline = Instant::now() + budget;
        let search = RoutedSearch { request, deadline };
        let Some(batcher) = &self.batcher else {
            let mut answers = self.state.fan_out(vec![search]).await;
            return answers
                .pop()
                .unwrap_or(Err(SearchError::NoAnswer("the fan-out")));
        };
        match tokio::time::timeout_at(deadline.into(), batcher.search(search, Some(deadline))).await
        {
            Ok(answer) => answer,
            Err(_) => Err(SearchError::DeadlineExceeded {
                timeout_ms: budget.as_millis() as u64,
                what: "the shards did not answer in time".into(),
            }),
        }
    }

    #[tracing::instrument(name = "route_documents", skip_all, fields(ids = request.ids.len()))]
    async fn documents(&self, request: DocumentsRequest) -> Result<DocumentsResponse, SearchError> {
        let ids = validated_ids(&request, &self.state.limit)?;
        let budget = request_budget(request.timeout_ms, &self.state.settings);
        let contents = DocumentsRequest {
            ids: Vec::new(),
            ..request
        };
        self.state
            .fetch_documents(ids, &contents, Instant::now() + budget)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_proto::v1::ScoredDocument;

    fn hit(id: u64, score: f32) -> ScoredDocument {
        ScoredDocument {
            id,
            score,
            ..Default::default()
        }
    }

    #[test]
    fn merge_keeps_the_best_k_with_ties_broken_by_id() {
        let shard = |hits: Vec<ScoredDocument>| vec![QueryHits { hits }];
        let merged = merge_shard_results(
            vec![
                shard(vec![hit(4, 0.9), hit(2, 0.5)]),
                shard(vec![hit(3, 0.9), hit(1, 0.5)]),
            ],
            1,
            3,
        );
        let ids: Vec<u64> = merged[0].hits.iter().map(|h| h.id).collect();
        assert_eq!(ids, vec![3, 4, 1]);
    }

    fn full_hit(id: u64, score: f32) -> ScoredDocument {
        ScoredDocument {
            id,
            score,
            title: format!("t{id}"),
            text: format!("x{id}"),
            vector: vec![score],
        }
    }

    fn asked(queries: usize, k: usize, texts: bool, allow_partial: bool) -> Asked {
        Asked {
            queries,
            k,
            include_vectors: false,
            include_texts: texts,
            allow_partial,
        }
    }

    #[test]
    fn a_combined_answer_is_split_back_into_each_searchs_own() {
        // Two shards answering a combined request of 3 queries (search A: 2 queries with k 1
        // and texts; search B: 1 query with k 2, no texts), k 2 each.
        let shard_answer = |base: u64| -> Vec<QueryHits> {
            (0..3)
                .map(|q| QueryHits {
                    hits: vec![
                        full_hit(base + 10 * q, 0.9 - 0.1 * base as f32),
                        full_hit(base + 10 * q + 1, 0.1),
                    ],
                })
                .collect()
        };
        let mut shards = vec![
            Ok(shard_answer(0).into_iter()),
            Ok(shard_answer(2).into_iter()),
        ];
        let a = answer_of(&asked(2, 1, true, false), &mut shards).unwrap();
        let b = answer_of(&asked(1, 2, false, false), &mut shards).unwrap();
        let ids = |r: &SearchResponse| -> Vec<Vec<u64>> {
            r.results
                .iter()
                .map(|q| q.hits.iter().map(|h| h.id).collect())
                .collect()
        };
        assert_eq!(ids(&a), vec![vec![0], vec![10]]);
        assert_eq!(ids(&b), vec![vec![20, 22]]);
        assert_eq!(a.results[0].hits[0].text, "x0");
        assert!(a.results[0].hits[0].vector.is_empty());
        assert!(
            b.results[0]
                .hits
                .iter()
                .all(|h| h.text.is_empty() && h.title.is_empty())
        );
    }

    fn routed(queries: usize, k: u32, include_vectors: bool, include_texts: bool) -> RoutedSearch {
        RoutedSearch {
            request: SearchRequest {
                queries: vec![Default::default(); queries],
                k,
                include_vectors,
                include_texts,
                ..Default::default()
            },
            deadline: Instant::now(),
        }
    }

    #[test]
    fn a_batch_whose_combined_request_could_not_be_answered_is_cut_into_runs_that_can() {
        let limit = ResponseLimit::new(384, 100_000, 1024, 2);
        // 200 queries with vectors at k = 10, then a search at k = 1000: combined, the 201
        // queries would all get 1000 hits with vectors (~300 MB); the next two join the
        // second run, the last making its texts everyone's.
        let batch = vec![
            routed(200, 10, true, false),
            routed(1, 1000, false, false),
            routed(1, 10, true, false),
            routed(3, 5, false, true),
        ];
        let runs = within_limit(batch, &limit);
        let shapes: Vec<Vec<(usize, u32)>> = runs
            .iter()
            .map(|run| {
                run.iter()
                    .map(|s| (s.request.queries.len(), s.request.k))
                    .collect()
            })
            .collect();
        assert_eq!(
            shapes,
            vec![vec![(200, 10)], vec![(1, 1000), (1, 10), (3, 5)]]
        );
        for run in &runs {
            let combined = run
                .iter()
                .map(|s| SearchShape::of(&s.request))
                .reduce(SearchShape::joined)
                .unwrap();
            assert!(limit.fits(combined));
        }

        let small = vec![routed(1, 10, true, true), routed(1, 10, true, true)];
        assert_eq!(within_limit(small, &limit).len(), 1);
    }

    #[test]
    fn a_lost_shard_fails_only_the_searches_that_do_not_allow_partial_answers() {
        let lost = || SearchError::ShardUnavailable {
            shard: 1,
            reason: "down".into(),
        };
        let answer = vec![
            QueryHits {
                hits: vec![full_hit(1, 0.5)],
            },
            QueryHits {
                hits: vec![full_hit(2, 0.5)],
            },
        ];
        let mut shards = vec![Ok(answer.into_iter()), Err(lost())];
        let strict = answer_of(&asked(1, 1, true, false), &mut shards).unwrap_err();
        assert!(matches!(
            strict,
            SearchError::ShardUnavailable { shard: 1, .. }
        ));
        let partial = answer_of(&asked(1, 1, true, true), &mut shards).unwrap();
        assert!(partial.partial);
        assert_eq!(partial.missing_shards, vec![1]);
        assert_eq!(
            partial.results[0].hits[0].id, 2,
            "the failed search's hits were skipped"
        );
    }
}
