//! The operator's own metrics (reconciles, failures by reason, duration, leadership) and
//! per-pool gauges that the chart's alerts read (replicas, ready, preprocessing age and progress).

use std::time::Duration;

use hasten_core::metrics::prometheus::{
    self, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use hasten_core::metrics::{LATENCY_BUCKETS, register};

#[derive(Debug, Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    pub leader: IntGauge,
    publications: IntCounterVec,
    pool_replicas: IntGaugeVec,
    pool_ready: IntGaugeVec,
    preprocessing_age: GaugeVec,
    preprocessing_done: IntGaugeVec,
}

impl OperatorMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let pool = &["namespace", "pool"];
        Ok(Self {
            reconciles: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_kv_operator_reconciles_total",
                        "Reconciles of KvWorkerPools, by result (ok, error)",
                    ),
                    &["result"],
                )?,
            )?,
            failures: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_kv_operator_reconcile_errors_total",
                        "Failed reconciles, by reason (conflict, api, render, finalizer, object)",
                    ),
                    &["reason"],
                )?,
            )?,
            duration: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hasten_kv_operator_reconcile_duration_seconds",
                        "Seconds per reconcile, by result",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["result"],
                )?,
            )?,
            leader: register(
                registry,
                IntGauge::new(
                    "hasten_kv_operator_leader",
                    "1 while this replica holds the leader lease and reconciles, else 0",
                )?,
            )?,
            publications: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_kv_operator_assignment_publications_total",
                        "Assignments proposed to the control plane, by result (committed, refused, unreachable)",
                    ),
                    &["result"],
                )?,
            )?,
            pool_replicas: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("hasten_kv_pool_replicas", "Worker pods a pool asks for"),
                    pool,
                )?,
            )?,
            pool_ready: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "hasten_kv_pool_ready_replicas",
                        "Worker pods ready to serve",
                    ),
                    pool,
                )?,
            )?,
            preprocessing_age: register(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "hasten_kv_pool_preprocessing_seconds",
                        "Age of the pool's running preprocessing Job (0 when none runs)",
                    ),
                    pool,
                )?,
            )?,
            preprocessing_done: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "hasten_kv_pool_preprocessing_step_done",
                        "Entries done of the running preprocessing Job's current step, as its pod last logged (0 before its first progress line and when none runs); a value that stops changing is a stalled Job",
                    ),
                    pool,
                )?,
            )?,
        })
    }

    pub fn reconciled(&self, elapsed: Duration, failure: Option<&'static str>) {
        let result = if failure.is_some() { "error" } else { "ok" };
        self.reconciles.with_label_values(&[result]).inc();
        self.duration
            .with_label_values(&[result])
            .observe(elapsed.as_secs_f64());
        if let Some(reason) = failure {
            self.failures.with_label_values(&[reason]).inc();
        }
    }

    pub fn published(&self, failure: Option<&crate::publish::PublishError>) {
        let result = match failure {
            None => "committed",
            Some(crate::publish::PublishError::Refused(_)) => "refused",
            Some(crate::publish::PublishError::Unreachable(_)) => "unreachable",
        };
        self.publications.with_label_values(&[result]).inc();
    }

    /// A pool's gauges: replicas asked for and ready, its running Job's age in seconds and
    /// entries done of the Job's current step (both 0 when none runs).
    pub fn pool(&self, namespace: &str, pool: &str, replicas: i32, ready: i32, job: (f64, u64)) {
        let labels = &[namespace, pool];
        let (age, done) = job;
        self.pool_replicas
            .with_label_values(labels)
            .set(i64::from(replicas));
        self.pool_ready
            .with_label_values(labels)
            .set(i64::from(ready));
        self.preprocessing_age.with_label_values(labels).set(age);
        self.preprocessing_done
            .with_label_values(labels)
            .set(i64::try_from(done).unwrap_or(i64::MAX));
    }

    /// Drops a deleted pool's series.
    pub fn forget(&self, namespace: &str, pool: &str) {
        let labels = &[namespace, pool];
        let _ = self.pool_replicas.remove_label_values(labels);
        let _ = self.pool_ready.remove_label_values(labels);
        let _ = self.preprocessing_age.remove_label_values(labels);
        let _ = self.preprocessing_done.remove_label_values(labels);
    }
}
