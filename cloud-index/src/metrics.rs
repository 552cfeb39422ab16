//! The cloud tier's Prometheus metrics, for shards and routers alike (label `role`).

use std::time::Duration;

use hasten_core::metrics::LATENCY_BUCKETS;
use hasten_core::metrics::prometheus::{
    self, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Query vectors per batch: powers of two up to a request's limit (1024).
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Which kind of cloud server reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Shard,
    Router,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::Shard => "shard",
            Role::Router => "router",
        }
    }
}

/// Metrics of one cloud server.
#[derive(Clone, Debug)]
pub struct CloudMetrics {
    role: Role,
    searches: IntCounterVec,
    document_requests: IntCounterVec,
    duration: HistogramVec,
    /// Query vectors per batch.
    pub batch_queries: Histogram,
    /// Searches waiting to be batched.
    pub queue_depth: IntGauge,
    replica_up: IntGaugeVec,
    live_replicas: IntGaugeVec,
    failovers: IntCounterVec,
}

impl CloudMetrics {
    pub fn register(registry: &Registry, role: Role) -> Result<Self, prometheus::Error> {
        let searches = IntCounterVec::new(
            Opts::new(
                "hasten_cloud_searches_total",
                "Searches answered, by outcome",
            ),
            &["role", "outcome"],
        )?;
        let document_requests = IntCounterVec::new(
            Opts::new(
                "hasten_cloud_document_requests_total",
                "Documents-by-id requests answered, by outcome",
            ),
            &["role", "outcome"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "hasten_cloud_search_duration_seconds",
                "Search latency; a router reports shard=\"all\" for whole searches and each shard's fan-out under its index",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["role", "shard"],
        )?;
        let batch_queries = HistogramVec::new(
            HistogramOpts::new("hasten_cloud_batch_queries", "Query vectors per batch")
                .buckets(BATCH_BUCKETS.to_vec()),
            &["role"],
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "hasten_cloud_queue_depth",
                "Searches waiting to join a batch",
            ),
            &["role"],
        )?;
        let replica_up = IntGaugeVec::new(
            Opts::new(
                "hasten_cloud_replica_up",
                "1 when the router believes a shard replica serves",
            ),
            &["shard", "endpoint"],
        )?;
        let live_replicas = IntGaugeVec::new(
            Opts::new(
                "hasten_cloud_shard_live_replicas",
                "Live replicas of each shard, as the router sees them",
            ),
            &["shard"],
        )?;
        let failovers = IntCounterVec::new(
            Opts::new(
                "hasten_cloud_failovers_total",
                "Shard attempts that failed over to another replica or gave up",
            ),
            &["shard"],
        )?;
        registry.register(Box::new(searches.clone()))?;
        registry.register(Box::new(document_requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(batch_queries.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        if role == Role::Router {
            registry.register(Box::new(replica_up.clone()))?;
            registry.register(Box::new(live_replicas.clone()))?;
            registry.register(Box::new(failovers.clone()))?;
        }
        let label = [role.label()];
        // Every outcome's series exists from the start: an error ratio reads 0, not "no
        // data", until the first error.
        for outcome in ["ok", "error"] {
            searches.with_label_values(&[role.label(), outcome]);
            document_requests.with_label_values(&[role.label(), outcome]);
        }
        Ok(Self {
            role,
            searches,
            document_requests,
            duration,
            batch_queries: batch_queries.with_label_values(&label),
            queue_depth: queue_depth.with_label_values(&label),
            replica_up,
            live_replicas,
            failovers,
        })
    }

    /// A whole search answered by this server: `shard` is a shard's own index, or "all"
    /// for a router.
    pub fn observe_search(&self, shard: &str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.searches
            .with_label_values(&[self.role.label(), outcome])
            .inc();
        self.duration
            .with_label_values(&[self.role.label(), shard])
            .observe(took.as_secs_f64());
    }

    /// A documents-by-id request answered by this server.
    pub fn observe_documents(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.document_requests
            .with_label_values(&[self.role.label(), outcome])
            .inc();
    }

    /// One shard's part of a routed search.
    pub fn observe_shard_fan_out(&self, shard: usize, took: Duration) {
        self.duration
            .with_label_values(&[self.role.label(), &shard.to_string()])
            .observe(took.as_secs_f64());
    }

    pub fn failover(&self, shard: usize) {
        self.failovers
            .with_label_values(&[&shard.to_string()])
            .inc();
    }

    /// The router's view of one shard's replicas: `(endpoint, live)` each.
    pub fn set_replicas(&self, shard: usize, replicas: &[(String, bool)]) {
        let shard = shard.to_string();
        for (endpoint, live) in replicas {
            self.replica_up
                .with_label_values(&[shard.as_str(), endpoint])
                .set(i64::from(*live));
        }
        let live = replicas.iter().filter(|(_, live)| *live).count();
        self.live_replicas
            .with_label_values(&[shard.as_str()])
            .set(live as i64);
        // The shard's failover count exists (at 0) from its first health report on.
        self.failovers.with_label_values(&[shard.as_str()]);
    }

    /// Drops the health series of a replica the shard map no longer lists for `shard`.
    pub fn forget_replica(&self, shard: usize, endpoint: &str) {
        // An error only says the series was never set: nothing to forget.
        let _ = self
            .replica_up
            .remove_label_values(&[shard.to_string().as_str(), endpoint]);
    }
}
