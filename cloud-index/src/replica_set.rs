//! The replicas behind a router: a client for every endpoint of the current shard map, the
//! corpus every replica must serve, and the checks that keep each replica's health current.
//!
//! The map comes from a `watch` channel ([`crate::shard_map`]). A replica is tried only once
//! a check has seen it serve the router's corpus and the shard the map lists it for, so a
//! new map's replicas are checked as soon as it arrives; replicas the map no longer lists
//! are dropped with their connections and metrics.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hasten_proto::tls::MutualTls;
use hasten_proto::v1::IndexInfo;
use parking_lot::RwLock;
use tokio::sync::watch;

use crate::metrics::CloudMetrics;
use crate::replica::Replica;
use crate::shard_map::ShardMap;

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
    #[error("no client for shard map endpoint `{endpoint}`")]
    Endpoint {
        endpoint: String,
        #[source]
        source: hasten_proto::control::EndpointError,
    },
    #[error("no replica of {0} answered within the start-up timeout")]
    NoReplica(String),
    #[error("{0}")]
    Inconsistent(String),
}

/// What all shards must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusIdentity {
    pub corpus_version: String,
    pub model_id: String,
    pub dimension: u32,
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

/// The replica clients, by endpoint: made on first use, kept while the map lists them.
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
            Replica::new(endpoint, self.tls.as_ref()).map_err(|source| RouterError::Endpoint {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(Arc::clone(
            self.replicas
                .write()
                .entry(endpoint.to_string())
                .or_insert_with(|| Arc::new(replica)),
        ))
    }

    /// Drops the replicas of endpoints `map` does not list (and their connections).
    fn retain_listed(&self, map: &ShardMap) {
        self.replicas
            .write()
            .retain(|endpoint, _| map.shards.iter().flatten().any(|e| e == endpoint));
    }
}

/// Every replica of the current shard map and the corpus they serve.
#[derive(Debug)]
pub struct ReplicaSet {
    map: watch::Receiver<Arc<ShardMap>>,
    pool: ReplicaPool,
    identity: CorpusIdentity,
    settings: RouterSettings,
    metrics: CloudMetrics,
}

impl ReplicaSet {
    /// Waits until every shard of the current map has a replica that answers, checks that
    /// all answering replicas serve the same corpus and the shard the map says, then checks
    /// every replica each health interval and whenever the map changes. With `tls`, shards
    /// are reached over mutual TLS.
    pub async fn start(
        map: watch::Receiver<Arc<ShardMap>>,
        settings: RouterSettings,
        metrics: CloudMetrics,
        tls: Option<MutualTls>,
    ) -> Result<Arc<Self>, RouterError> {
        let pool = ReplicaPool {
            replicas: RwLock::default(),
            tls,
        };
        let current = Arc::clone(&map.borrow());
        let identity = establish_identity(&current, &pool, &settings).await?;
        let set = Arc::new(Self {
            map,
            pool,
            identity,
            settings,
            metrics,
        });
        set.report();
        tokio::spawn(health_checks(Arc::downgrade(&set)));
        tokio::spawn(follow_map(Arc::downgrade(&set), set.map.clone()));
        Ok(set)
    }

    /// The shard map in force now.
    pub fn map(&self) -> Arc<ShardMap> {
        Arc::clone(&self.map.borrow())
    }

    /// The corpus every replica must serve, as found at start.
    pub fn identity(&self) -> &CorpusIdentity {
        &self.identity
    }

    /// The replica at `endpoint`.
    pub fn get(&self, endpoint: &str) -> Result<Arc<Replica>, RouterError> {
        self.pool.get(endpoint)
    }

    /// What each shard of the current map last said it serves (through the first of its
    /// replicas that answered a check); `None` for a shard none has answered yet.
    pub fn shard_infos(&self) -> Vec<Option<IndexInfo>> {
        self.map()
            .shards
            .iter()
            .map(|endpoints| endpoints.iter().find_map(|e| self.get(e).ok()?.last_info()))
            .collect()
    }

    /// Live replicas of every shard of the current map.
    pub fn live_replicas(&self) -> Vec<usize> {
        self.map()
            .shards
            .iter()
            .map(|endpoints| {
                endpoints
                    .iter()
                    .filter(|e| self.get(e).is_ok_and(|r| r.is_live()))
                    .count()
            })
            .collect()
    }

    /// Publishes every replica's health to the metrics.
    pub fn report(&self) {
        for (shard, endpoints) in self.map().shards.iter().enumerate() {
            let replicas: Vec<(String, bool)> = endpoints
                .iter()
                .map(|e| (e.clone(), self.get(e).is_ok_and(|r| r.is_live())))
                .collect();
            self.metrics.set_replicas(shard, &replicas);
        }
    }

    /// Checks every replica of the current map: it is live when it answers and serves the
    /// router's corpus and the shard the map lists it for, refused when it serves something
    /// else, and down after failing several checks in a row. Replicas of endpoints the map
    /// no longer lists are dropped.
    async fn check(&self) {
        let map = self.map();
        self.pool.retain_listed(&map);
        let shard_count = map.shards.len();
        let timeout = self
            .settings
            .attempt_timeout
            .min(self.settings.health_interval);
        let checks = map
            .shards
            .iter()
            .enumerate()
            .flat_map(|(shard, endpoints)| {
                endpoints.iter().map(move |endpoint| async move {
                    let replica = match self.get(endpoint) {
                        Ok(replica) => replica,
                        Err(err) => {
                            tracing::warn!(%endpoint, error = %err.display_full(), "shard map endpoint unusable");
                            return;
                        }
                    };
                    match replica.info(timeout).await {
                        Ok(info) => match self.identity.mismatch(&info, shard, shard_count) {
                            Some(why) => {
                                tracing::error!(shard, %endpoint, %why, "replica refused");
                                replica.refuse(why);
                            }
                            None => replica.mark_live(),
                        },
                        Err(err) => replica.check_failed(err.to_string_full()),
                    }
                })
            });
        futures::future::join_all(checks).await;
        self.report();
    }

    /// Drops the health metrics of every replica `previous` listed that `current` does not
    /// list for the same shard.
    fn forget_unlisted(&self, previous: &ShardMap, current: &ShardMap) {
        for (shard, endpoints) in previous.shards.iter().enumerate() {
            let listed = current.shards.get(shard);
            for endpoint in endpoints {
                if !listed.is_some_and(|listed| listed.contains(endpoint)) {
                    self.metrics.forget_replica(shard, endpoint);
                }
            }
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
                        replica.mark_down(err.to_string_full());
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

/// Checks every replica of the current map each interval.
async fn health_checks(set: Weak<ReplicaSet>) {
    let Some(interval) = set.upgrade().map(|s| s.settings.health_interval) else {
        return;
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(set) = set.upgrade() else {
            return;
        };
        set.check().await;
    }
}

/// Follows the shard map: when it changes, forgets the metrics of replicas it no longer
/// lists and checks the replicas at once, so that one only the new map lists serves after
/// one check instead of up to an interval later.
async fn follow_map(set: Weak<ReplicaSet>, mut map: watch::Receiver<Arc<ShardMap>>) {
    let mut previous = Arc::clone(&map.borrow_and_update());
    while map.changed().await.is_ok() {
        let Some(set) = set.upgrade() else {
            return;
        };
        let current = Arc::clone(&map.borrow_and_update());
        set.forget_unlisted(&previous, &current);
        set.check().await;
        previous = current;
    }
}
