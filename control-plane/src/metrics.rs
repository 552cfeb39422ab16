//! The control-plane node's Prometheus metrics: Raft's progress and health, proposals,
//! snapshots, the log, subscribers, and the time from proposal to apply.

use std::time::Duration;

use hasten_core::metrics::LATENCY_BUCKETS;
use hasten_core::metrics::prometheus::{
    self, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry,
};

/// The node's metrics; the node task sets Raft's after every turn.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    pub term: IntGauge,
    pub commit_index: IntGauge,
    pub applied_index: IntGauge,
    pub is_leader: IntGauge,
    pub has_leader: IntGauge,
    pub is_voter: IntGauge,
    pub leader_changes: IntCounter,
    proposals: IntCounterVec,
    pub snapshots: IntCounter,
    pub snapshot_bytes: IntGauge,
    pub log_entries: IntGauge,
    pub subscribers: IntGauge,
    /// From a proposal's arrival at this node to its apply here.
    pub replication_lag: Histogram,
    /// Time on the node's thread per Raft `Ready` in each phase: `persist` (log write and
    /// fdatasync), `apply` (state machine, events for subscribers), `compact` (taking the
    /// state for a snapshot and truncating the log; the snapshot is written beside).
    ready_phases: HistogramVec,
}

/// A phase of handling one Raft `Ready`.
#[derive(Clone, Copy, Debug)]
pub enum ReadyPhase {
    Persist,
    Apply,
    Compact,
}

impl ReadyPhase {
    fn label(self) -> &'static str {
        match self {
            Self::Persist => "persist",
            Self::Apply => "apply",
            Self::Compact => "compact",
        }
    }
}

impl NodeMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let counter = IntCounter::new(name, help)?;
            registry.register(Box::new(counter.clone()))?;
            Ok(counter)
        };
        let proposals = IntCounterVec::new(
            Opts::new(
                "hasten_cp_proposals_total",
                "Proposals made at this node, by result: committed and applied, or dropped",
            ),
            &["result"],
        )?;
        registry.register(Box::new(proposals.clone()))?;
        let replication_lag = Histogram::with_opts(
            HistogramOpts::new(
                "hasten_cp_replication_lag_seconds",
                "Time from a proposal's arrival to its apply on the node that proposed it",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(replication_lag.clone()))?;
        let ready_phases = HistogramVec::new(
            HistogramOpts::new(
                "hasten_cp_ready_phase_seconds",
                "Time on the Raft thread per Ready in each phase: persist (log write and \
                 fdatasync), apply (state machine and subscriber events), compact (taking the \
                 snapshot's state, truncating the log; the snapshot is written beside)",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["phase"],
        )?;
        registry.register(Box::new(ready_phases.clone()))?;
        Ok(Self {
            term: gauge("hasten_cp_term", "Raft term")?,
            commit_index: gauge(
                "hasten_cp_commit_index",
                "Highest log index known committed",
            )?,
            applied_index: gauge(
                "hasten_cp_applied_index",
                "Highest log index applied to the cache state machine",
            )?,
            is_leader: gauge("hasten_cp_is_leader", "1 while this node leads")?,
            has_leader: gauge("hasten_cp_has_leader", "1 while this node knows a leader")?,
            is_voter: gauge(
                "hasten_cp_is_voter",
                "1 while this node is a voting member of the group",
            )?,
            leader_changes: counter(
                "hasten_cp_leader_changes_total",
                "Times this node saw the leader change",
            )?,
            proposals,
            snapshots: counter(
                "hasten_cp_snapshots_total",
                "State-machine snapshots taken (log compactions)",
            )?,
            snapshot_bytes: gauge("hasten_cp_snapshot_bytes", "Size of the last snapshot")?,
            log_entries: gauge(
                "hasten_cp_log_entries",
                "Entries in the Raft log since the last snapshot",
            )?,
            subscribers: gauge(
                "hasten_cp_subscribers",
                "Edges streaming committed events from this node",
            )?,
            replication_lag,
            ready_phases,
        })
    }

    pub fn ready_phase(&self, phase: ReadyPhase, took: Duration) {
        self.ready_phases
            .with_label_values(&[phase.label()])
            .observe(took.as_secs_f64());
    }

    pub fn proposal_committed(&self, lag: Duration) {
        self.proposals.with_label_values(&["committed"]).inc();
        self.replication_lag.observe(lag.as_secs_f64());
    }

    pub fn proposal_dropped(&self) {
        self.proposals.with_label_values(&["dropped"]).inc();
    }

    /// Whether the node can serve clients: a voting member that knows its leader.
    pub fn readiness(&self) -> Result<(), String> {
        if self.is_voter.get() == 0 {
            return Err("not a voting member (yet)".into());
        }
        if self.has_leader.get() == 0 {
            return Err("no known leader".into());
        }
        Ok(())
    }
}
