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
//! The router reads its shard map from a `watch` channel: today fed once from the
//! configuration, later by the control plane, with no change here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hasten_proto::v1::{IndexInfo, QueryHits, SearchRequest, SearchResponse};
use parking_lot::RwLock;
use tokio::sync::watch;

use crate::backend::SearchBackend;
use crate::error::SearchError;
use crate::replica::{AttemptError, Replica};
use crate::searcher::{check_request_shape, rank_order};

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
#[derive(Debug, Default)]
struct ReplicaPool {
    replicas: RwLock<HashMap<String, Arc<Replica>>>,
}

impl ReplicaPool {
    fn get(&self, endpoint: &str) -> Result<Arc<Replica>, RouterError> {
        if let Some(replica) = self.replicas.read().get(endpoint) {
            return Ok(Arc::clone(replica));
        }
        let replica = Arc::new(Replica::new(endpoint).map_err(RouterError::Endpoint)?);
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
}

/// Scatter-gather search over a sharded corpus.
#[derive(Clone, Debug)]
pub struct Router {
    state: Arc<RouterState>,
}

impl Router {
    /// Waits until every shard of the current map has a replica that answers, checks that
    /// all answering replicas serve the same corpus and the shard the map says, then starts
    /// the health checks.
    pub async fn start(
        map: watch::Receiver<Arc<ShardMap>>,
        settings: RouterSettings,
    ) -> Result<Self, RouterError> {
        let pool = ReplicaPool::default();
        let current = Arc::clone(&map.borrow());
        let identity = establish_identity(&current, &pool, &settings).await?;
        let state = Arc::new(RouterState {
            map,
            pool,
            identity,
            settings,
            rotation: AtomicUsize::new(0),
        });
        tokio::spawn(health_checks(Arc::downgrade(&state)));
        Ok(Self { state })
    }

    async fn search_shard(
        &self,
        shard: usize,
        endpoints: &[String],
        request: &SearchRequest,
        deadline: Instant,
    ) -> Result<SearchResponse, SearchError> {
        let unavailable = |reason: String| SearchError::ShardUnavailable { shard, reason };
        let replicas = endpoints
            .iter()
            .map(|e| self.state.pool.get(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unavailable(e.to_string()))?;
        let start = self.state.rotation.fetch_add(1, Ordering::Relaxed);
        let rotated: Vec<&Arc<Replica>> = (0..replicas.len())
            .map(|i| &replicas[(start + i) % replicas.len()])
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
        for replica in candidates {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let attempt = remaining.min(self.state.settings.attempt_timeout);
            let mut shard_request = request.clone();
            shard_request.timeout_ms = u32::try_from(attempt.as_millis()).unwrap_or(u32::MAX);
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
                Err(err) => err,
            };
            tracing::debug!(shard, endpoint = %replica.endpoint, %error, "shard attempt failed; trying the next replica");
            replica.mark_down(error.to_string());
            failures.push(format!("{}: {error}", replica.endpoint));
        }
        if Instant::now() >= deadline {
            return Err(SearchError::DeadlineExceeded {
                timeout_ms: request_budget(request, &self.state.settings).as_millis() as u64,
                what: format!(
                    "shard {shard} did not answer in time ({})",
                    failures.join("; ")
                ),
            });
        }
        Err(unavailable(format!(
            "no replica answered ({})",
            failures.join("; ")
        )))
    }
}

/// The time a request may take: its own `timeout_ms`, or the router's default.
fn request_budget(request: &SearchRequest, settings: &RouterSettings) -> Duration {
    if request.timeout_ms > 0 {
        Duration::from_millis(u64::from(request.timeout_ms))
    } else {
        settings.request_timeout
    }
}

/// Merges the answers of all shards for `queries` queries into the global top-`k` of each:
/// all hits ranked by score, ties by document id, cut to k.
pub fn merge_shard_results(
    shards: Vec<SearchResponse>,
    queries: usize,
    k: usize,
) -> Vec<QueryHits> {
    let mut merged: Vec<QueryHits> = (0..queries).map(|_| QueryHits::default()).collect();
    for response in shards {
        for (into, hits) in merged.iter_mut().zip(response.results) {
            into.hits.extend(hits.hits);
        }
    }
    for query in &mut merged {
        query.hits.sort_by(rank_order);
        query.hits.truncate(k);
    }
    merged
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
        check_request_shape(&request)?;
        let deadline = Instant::now() + request_budget(&request, &self.state.settings);
        let map = Arc::clone(&self.state.map.borrow());
        let outcomes = futures::future::join_all(
            map.shards
                .iter()
                .enumerate()
                .map(|(shard, endpoints)| self.search_shard(shard, endpoints, &request, deadline)),
        )
        .await;
        let mut answers = Vec::with_capacity(outcomes.len());
        let mut missing = Vec::new();
        let mut first_unavailable = None;
        for (shard, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(response) => answers.push(response),
                Err(err @ SearchError::ShardUnavailable { .. }) if request.allow_partial => {
                    missing.push(shard as u32);
                    first_unavailable.get_or_insert(err);
                }
                Err(err) => return Err(err),
            }
        }
        if let (true, Some(err)) = (answers.is_empty(), first_unavailable) {
            return Err(err);
        }
        Ok(SearchResponse {
            results: merge_shard_results(answers, request.queries.len(), request.k as usize),
            partial: !missing.is_empty(),
            missing_shards: missing,
        })
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
        let shard = |hits: Vec<ScoredDocument>| SearchResponse {
            results: vec![QueryHits { hits }],
            ..Default::default()
        };
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
}
