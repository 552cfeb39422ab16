//! The router: the cloud's search API over a sharded corpus.
//!
//! Every search goes to one live replica of every shard at once; each shard answers its
//! exact top-k, and the router merges them by score (ties by document id) into the global
//! top-k, which is exactly what one exact search over the whole corpus returns. A replica
//! that fails or times out is marked down and the shard's next live replica is tried, for as
//! long as the request's deadline allows; a shard with no live replica fails the request with
//! an UNAVAILABLE naming it, or, when the request allows, is left out of a result flagged
//! partial. A background task checks every replica's health and identity (corpus version,
//! model, shard number) and brings recovered replicas back. When every replica of a shard is
//! believed down, each is still tried once (health can lag a restart) before the shard is
//! reported unavailable.
//!
//! Concurrent searches are coalesced ([`crate::batcher`]) into one request per shard, so
//! that every shard searches the same batches and answers them together.
//!
//! The router reads its shard map from a `watch` channel: today fed once from the
//! configuration, later by the control plane, with no change here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hasten_proto::tls::MutualTls;
use hasten_proto::v1::{IndexInfo, QueryHits, SearchRequest, SearchResponse};
use parking_lot::RwLock;
use tokio::sync::watch;

use crate::backend::SearchBackend;
use crate::batcher::{BatchRunner, BatchingSettings, MicroBatcher};
use crate::error::SearchError;
use crate::metrics::CloudMetrics;
use crate::replica::{AttemptError, Replica};
use crate::searcher::{rank_order, validated_queries};

/// Which replicas serve which shard: `shards[i]` lists the endpoints of shard i's replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    pub shards: Vec<Vec<String>>,
}

impl ShardMap {
    /// A map with at least one shard, a replica for every shard, and no endpoint listed twice.
    pub fn new(shards: Vec<Vec<String>>) -> Result<Self, RouterError> {
        if shards.is_empty() {
            return Err(RouterError::InvalidMap(
                "the shard map lists no shard".into(),
            ));
        }
        let mut seen = HashMap::new();
        for (shard, replicas) in shards.iter().enumerate() {
            if replicas.is_empty() {
                return Err(RouterError::InvalidMap(format!(
                    "shard {shard} has no replica"
                )));
            }
            for endpoint in replicas {
                if let Some(other) = seen.insert(endpoint.clone(), shard) {
                    return Err(RouterError::InvalidMap(format!(
                        "{endpoint} is listed for shard {other} and again for shard {shard}"
                    )));
                }
            }
        }
        Ok(Self { shards })
    }
}

/// Timing of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterSettings {
    /// Deadline of a request that names none.
    pub request_timeout: Duration,
    /// Longest one attempt on one replica may take before the next replica is tried.
    pub attempt_timeout: Duration,
    /// Period of the health checks.
    pub health_interval: Duration,
    /// How long start-up waits for every shard to have a replica that answers.
    pub startup_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("invalid shard map: {0}")]
    InvalidMap(String),
    #[error("shard map endpoint: {0}")]
    Endpoint(String),
    #[error("no replica of {0} answered within the start-up timeout")]
    NoReplica(String),
    #[error("{0}")]
    Inconsistent(String),
}

/// What all shards must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CorpusIdentity {
    corpus_version: String,
    model_id: String,
    dimension: u32,
}

impl CorpusIdentity {
    fn of(info: &IndexInfo) -> Self {
        Self {
            corpus_version: info.corpus_version.clone(),
            model_id: info.model_id.clone(),
            dimension: info.dimension,
        }
    }

    /// Why `info`, reported by a replica listed for `shard` of `shard_count`, cannot serve
    /// in this corpus, if it cannot.
    fn mismatch(&self, info: &IndexInfo, shard: usize, shard_count: usize) -> Option<String> {
        if info.corpus_version != self.corpus_version {
            return Some(format!(
                "serves corpus version {}, the other shards serve {}: the shards were built from different corpora; rebuild them together with `cloud-index build --shards {shard_count}`",
                info.corpus_version, self.corpus_version
            ));
        }
        if info.model_id != self.model_id || info.dimension != self.dimension {
            return Some(format!(
                "serves {} vectors of dimension {}, the other shards {} of dimension {}",
                info.model_id, info.dimension, self.model_id, self.dimension
            ));
        }
        if info.shard_index as usize != shard || info.shard_count as usize != shard_count {
            return Some(format!(
                "holds shard {} of {}, but the shard map lists it as shard {shard} of {shard_count}",
                info.shard_index, info.shard_count
            ));
        }
        None
    }
}

/// The replicas the router knows, by endpoint; a map update adds new ones and keeps the
/// connections of those it still lists.
#[derive(Debug)]
struct ReplicaPool {
    replicas: RwLock<HashMap<String, Arc<Replica>>>,
    /// Mutual TLS toward the shards, when the deployment has a CA.
    tls: Option<MutualTls>,
}

impl ReplicaPool {
    fn get(&self, endpoint: &str) -> Result<Arc<Replica>, RouterError> {
        if let Some(replica) = self.replicas.read().get(endpoint) {
            return Ok(Arc::clone(replica));
        }
        let replica =
            Arc::new(Replica::new(endpoint, self.tls.as_ref()).map_err(RouterError::Endpoint)?);
        Ok(Arc::clone(
            self.replicas
                .write()
                .entry(endpoint.to_string())
                .or_insert(replica),
        ))
    }
}

#[derive(Debug)]
struct RouterState {
    map: watch::Receiver<Arc<ShardMap>>,
    pool: ReplicaPool,
    identity: CorpusIdentity,
    settings: RouterSettings,
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
    /// Waits until every shard of the current map has a replica that answers, checks that
    /// all answering replicas serve the same corpus and the shard the map says, then starts
    /// the health checks. With `tls`, shards are reached over mutual TLS.
    pub async fn start(
        map: watch::Receiver<Arc<ShardMap>>,
        settings: RouterSettings,
        batching: Option<BatchingSettings>,
        metrics: CloudMetrics,
        tls: Option<MutualTls>,
    ) -> Result<Self, RouterError> {
        let pool = ReplicaPool {
            replicas: RwLock::default(),
            tls,
        };
        let current = Arc::clone(&map.borrow());
        let identity = establish_identity(&current, &pool, &settings).await?;
        let state = Arc::new(RouterState {
            map,
            pool,
            identity,
            settings,
            rotation: AtomicUsize::new(0),
            metrics: metrics.clone(),
        });
        state.report_replicas();
        tokio::spawn(health_checks(Arc::downgrade(&state)));
        let batcher =
            batching.map(|settings| MicroBatcher::start(Arc::clone(&state), settings, metrics));
        Ok(Self { state, batcher })
    }

    /// Publishes every replica's health to the metrics now (the health checks do so every
    /// interval; a scrape wants what requests found since).
    pub fn report_replicas(&self) {
        self.state.report_replicas();
    }

    /// Shards with no live replica now, for readiness.
    pub fn unavailable_shards(&self) -> Vec<usize> {
        self.state
            .live_replicas()
            .into_iter()
            .enumerate()
            .filter(|(_, live)| *live == 0)
            .map(|(shard, _)| shard)
            .collect()
    }
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
    /// Live replicas of every shard of the current map.
    fn live_replicas(&self) -> Vec<usize> {
        let map = Arc::clone(&self.map.borrow());
        map.shards
            .iter()
            .map(|endpoints| {
                endpoints
                    .iter()
                    .filter(|e| self.pool.get(e).is_ok_and(|r| r.is_live()))
                    .count()
            })
            .collect()
    }

    /// Publishes every replica's health to the metrics.
    fn report_replicas(&self) {
        let map = Arc::clone(&self.map.borrow());
        for (shard, endpoints) in map.shards.iter().enumerate() {
            let replicas: Vec<(String, bool)> = endpoints
                .iter()
                .map(|e| (e.clone(), self.pool.get(e).is_ok_and(|r| r.is_live())))
                .collect();
            self.metrics.set_replicas(shard, &replicas);
        }
    }

    /// Searches `request` on one replica of `shard`, starting with the one `rotation`
    /// points at, moving on to the next while the deadline allows.
    async fn search_shard(
        &self,
        shard: usize,
        endpoints: &[String],
        request: &SearchRequest,
        deadline: Instant,
        rotation: usize,
    ) -> Result<SearchResponse, SearchError> {
        let unavailable = |reason: String| SearchError::ShardUnavailable { shard, reason };
        let replicas = endpoints
            .iter()
            .map(|e| self.pool.get(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unavailable(e.to_string()))?;
        let rotated: Vec<&Arc<Replica>> = (0..replicas.len())
            .map(|i| &replicas[(rotation + i) % replicas.len()])
            .filter(|r| r.is_usable())
            .collect();
        let live: Vec<&Arc<Replica>> = rotated.iter().copied().filter(|r| r.is_live()).collect();
        if rotated.is_empty() {
            let reasons: Vec<String> = replicas
                .iter()
                .map(|r| format!("{}: {}", r.endpoint, r.down_reason()))
                .collect();
            return Err(unavailable(format!(
                "no usable replica ({})",
                reasons.join("; ")
            )));
        }
        let candidates = if live.is_empty() { rotated } else { live };
        let queries = request.queries.len();
        let mut failures = Vec::new();
        let mut overloaded = 0;
        for replica in candidates {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let attempt = remaining.min(self.settings.attempt_timeout);
            let mut shard_request = request.clone();
            shard_request.timeout_ms = hasten_proto::wire_timeout_ms(attempt);
            shard_request.allow_partial = false;
            let error = match replica.search(shard_request, attempt).await {
                Ok(response) if response.results.len() == queries => {
                    replica.mark_live();
                    return Ok(response);
                }
                Ok(response) => AttemptError::Failed(format!(
                    "answered {} result lists for {queries} queries",
                    response.results.len()
                )),
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
            tracing::debug!(shard, endpoint = %replica.endpoint, %error, "shard attempt failed; trying the next replica");
            self.metrics.failover(shard);
            replica.mark_down(error.to_string());
            failures.push(format!("{}: {error}", replica.endpoint));
        }
        if Instant::now() >= deadline {
            return Err(SearchError::DeadlineExceeded {
                timeout_ms: u64::from(request.timeout_ms),
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

    /// Sends the searches of `batch` to every shard as one combined request (the largest
    /// k, the union of what is included, the latest deadline), then gives each search its
    /// own merged answer: its queries, cut to its k, stripped of what it did not ask for,
    /// with its own tolerance of missing shards.
    async fn fan_out(&self, batch: Vec<RoutedSearch>) -> Vec<Result<SearchResponse, SearchError>> {
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
        let map = Arc::clone(&self.map.borrow());
        // The same replica position on every shard, so that batches in flight at once
        // keep to separate replicas.
        let rotation = self.rotation.fetch_add(1, Ordering::Relaxed);
        let combined = &combined;
        let outcomes =
            futures::future::join_all(map.shards.iter().enumerate().map(|(shard, endpoints)| {
                self.search_shard(shard, endpoints, combined, deadline, rotation)
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
fn request_budget(request: &SearchRequest, settings: &RouterSettings) -> Duration {
    if request.timeout_ms > 0 {
        Duration::from_millis(u64::from(request.timeout_ms))
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
        query.hits.sort_by(rank_order);
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
        self.live_replicas().into_iter().min().unwrap_or(1).max(1)
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
        let map = Arc::clone(&self.state.map.borrow());
        let documents = map
            .shards
            .iter()
            .filter_map(|replicas| {
                replicas
                    .iter()
                    .filter_map(|e| self.state.pool.get(e).ok()?.last_info())
                    .map(|info| info.documents)
                    .next()
            })
            .sum();
        let identity = &self.state.identity;
        IndexInfo {
            corpus_version: identity.corpus_version.clone(),
            model_id: identity.model_id.clone(),
            dimension: identity.dimension,
            documents,
            shard_index: 0,
            shard_count: 1,
        }
    }

    #[tracing::instrument(name = "route", skip_all, fields(queries = request.queries.len(), k = request.k))]
    async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        // Checked here, as a shard would, so that one bad request cannot fail a batch.
        validated_queries(&request, self.state.identity.dimension as usize)?;
        let budget = request_budget(&request, &self.state.settings);
        let deadline = Instant::now() + budget;
        let search = RoutedSearch { request, deadline };
        let Some(batcher) = &self.batcher else {
            let mut answers = self.state.fan_out(vec![search]).await;
            return answers
                .pop()
                .unwrap_or_else(|| Err(SearchError::Task("the fan-out gave no answer".into())));
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
}

/// Asks every replica of `map` for its description until each shard has one that answers;
/// fails at once when two answering replicas disagree about the corpus or a replica holds
/// another shard than the map says.
async fn establish_identity(
    map: &ShardMap,
    pool: &ReplicaPool,
    settings: &RouterSettings,
) -> Result<CorpusIdentity, RouterError> {
    let give_up = Instant::now() + settings.startup_timeout;
    let shard_count = map.shards.len();
    loop {
        let mut identity: Option<(CorpusIdentity, String)> = None;
        let mut waiting = Vec::new();
        for (shard, endpoints) in map.shards.iter().enumerate() {
            let mut answered = false;
            for endpoint in endpoints {
                let replica = pool.get(endpoint)?;
                let info = match replica.info(settings.attempt_timeout).await {
                    Ok(info) => info,
                    Err(err) => {
                        replica.mark_down(err.to_string());
                        continue;
                    }
                };
                let (expected, first) = identity.get_or_insert_with(|| {
                    (
                        CorpusIdentity::of(&info),
                        format!("shard {shard} ({endpoint})"),
                    )
                });
                if let Some(why) = expected.mismatch(&info, shard, shard_count) {
                    return Err(RouterError::Inconsistent(format!(
                        "refusing to start: shard {shard} replica {endpoint} {why} (compared with {first})"
                    )));
                }
                replica.mark_live();
                answered = true;
            }
            if !answered {
                let reasons: Vec<String> = endpoints
                    .iter()
                    .filter_map(|e| pool.get(e).ok())
                    .map(|r| format!("{}: {}", r.endpoint, r.down_reason()))
                    .collect();
                waiting.push(format!("shard {shard} ({})", reasons.join("; ")));
            }
        }
        match identity {
            Some((identity, _)) if waiting.is_empty() => return Ok(identity),
            _ if Instant::now() >= give_up => {
                return Err(RouterError::NoReplica(waiting.join(", ")));
            }
            _ => {
                tracing::info!(waiting = %waiting.join(", "), "waiting for shard replicas");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Checks every replica of the current map each interval: a replica is live when it
/// answers and serves the router's corpus and the shard the map lists it for.
async fn health_checks(state: Weak<RouterState>) {
    let Some(interval) = state.upgrade().map(|s| s.settings.health_interval) else {
        return;
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let map = Arc::clone(&state.map.borrow());
        let shard_count = map.shards.len();
        let timeout = state.settings.attempt_timeout.min(interval);
        let checks = map
            .shards
            .iter()
            .enumerate()
            .flat_map(|(shard, endpoints)| {
                let state = &state;
                endpoints.iter().map(move |endpoint| async move {
                    let replica = match state.pool.get(endpoint) {
                        Ok(replica) => replica,
                        Err(err) => {
                            tracing::warn!(%endpoint, %err, "shard map endpoint unusable");
                            return;
                        }
                    };
                    match replica.info(timeout).await {
                        Ok(info) => match state.identity.mismatch(&info, shard, shard_count) {
                            Some(why) => {
                                tracing::error!(shard, %endpoint, %why, "replica refused");
                                replica.mark_down(why);
                            }
                            None => replica.mark_live(),
                        },
                        Err(err) => replica.mark_down(err.to_string()),
                    }
                })
            });
        futures::future::join_all(checks).await;
        state.report_replicas();
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
    fn shard_maps_need_replicas_and_distinct_endpoints() {
        assert!(ShardMap::new(vec![]).is_err());
        assert!(ShardMap::new(vec![vec!["a:1".into()], vec![]]).is_err());
        let twice = ShardMap::new(vec![vec!["a:1".into()], vec!["a:1".into()]]);
        assert!(twice.unwrap_err().to_string().contains("again for shard 1"));
        ShardMap::new(vec![vec!["a:1".into(), "b:1".into()], vec!["c:1".into()]]).unwrap();
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
