//! The edge's Prometheus metrics: requests by outcome and error kind, latency end to end and
//! per stage, the homology score, the cache's size, the draft acceptance rate over a
//! sliding window, the cloud link, the control-plane link with the replicated entries
//! this edge could not use, and the documents an edge holding a share fetches by id.

use std::collections::VecDeque;
use std::time::Duration;

use hasten_core::metrics::prometheus::{
    self, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use hasten_core::metrics::{LATENCY_BUCKETS, register};
use parking_lot::Mutex;

use crate::api::EdgeError;
use crate::caches::{CacheStats, SkipReason};
use crate::fallback::quic::CloudLink;
use crate::replication::LinkReport;
use crate::retrieval::{Outcome, Retrieval};
use crate::tenants::Tenant;

/// The `tenant` label of a request refused before its token was checked.
const NO_TENANT: &str = "";

/// Requests the draft acceptance rate is computed over: enough that one request moves it
/// by 0.1%, few enough that it follows a workload shift within seconds at production rates.
pub const DAR_WINDOW: usize = 1000;

/// Homology scores are votes / validation depth, so tenths at the default depth of 10;
/// finer buckets serve other depths.
const SCORE_BUCKETS: &[f64] = &[
    0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
];

/// The outcomes of the last [`DAR_WINDOW`] answers, with a running count of acceptances so
/// that each answer costs O(1).
#[derive(Debug, Default)]
struct AnswerWindow {
    outcomes: VecDeque<bool>,
    accepted: usize,
}

impl AnswerWindow {
    /// Records one answer; returns the share accepted in the window.
    fn push(&mut self, accepted: bool) -> f64 {
        if self.outcomes.len() == DAR_WINDOW && self.outcomes.pop_front() == Some(true) {
            self.accepted -= 1;
        }
        self.outcomes.push_back(accepted);
        self.accepted += usize::from(accepted);
        self.accepted as f64 / self.outcomes.len() as f64
    }
}

/// The edge's metrics.
#[derive(Debug)]
pub struct EdgeMetrics {
    requests: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    stages: HistogramVec,
    homology: Histogram,
    cache_entries: IntGaugeVec,
    cache_documents: IntGaugeVec,
    cache_bytes: IntGaugeVec,
    dar: Gauge,
    recent: Mutex<AnswerWindow>,
    subscribed: IntGauge,
    applied_index: IntGauge,
    proposals: IntCounterVec,
    /// Link counts already added to `proposals` (the link counts since start).
    proposals_seen: Mutex<(u64, u64)>,
    cloud_link: IntGaugeVec,
    skipped: IntCounterVec,
    /// Skip counts already added to `skipped`, by reason.
    skipped_seen: Mutex<[u64; 3]>,
    connections_refused: IntCounterVec,
    documents_held: IntGauge,
    documents_fetched: IntCounter,
    /// The caches' fetch count already added to `documents_fetched`.
    documents_fetched_seen: Mutex<u64>,
    documents_pending: IntGauge,
}

/// The documents of an edge's share and those its cached entries name outside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DocumentCounts {
    /// Documents of the edge's share in its store.
    pub held: usize,
    /// Documents of cached entries fetched from the cloud by id since start.
    pub fetched: u64,
    /// Such documents waiting to be fetched.
    pub pending: usize,
}

impl EdgeMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let latency = |name: &str, help: &str| {
            HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec())
        };
        let gauge = |name: &str, help: &str| IntGauge::new(name, help);
        let per_tenant =
            |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["tenant"]);
        Ok(Self {
            requests: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_requests_total",
                        "Retrieval requests by tenant and outcome: accepted draft, cloud fallback, error",
                    ),
                    &["tenant", "outcome"],
                )?,
            )?,
            errors: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_request_errors_total",
                        "Failed requests by kind",
                    ),
                    &["kind"],
                )?,
            )?,
            duration: register(
                registry,
                HistogramVec::new(
                    latency(
                        "hasten_edge_request_duration_seconds",
                        "Retrieval latency end to end, by outcome",
                    ),
                    &["outcome"],
                )?,
            )?,
            stages: register(
                registry,
                HistogramVec::new(
                    latency(
                        "hasten_edge_stage_duration_seconds",
                        "Latency of each stage that ran",
                    ),
                    &["stage"],
                )?,
            )?,
            homology: register(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "hasten_edge_homology_score",
                        "Score each acceptance was decided on (HaS: shared documents / k)",
                    )
                    .buckets(SCORE_BUCKETS.to_vec()),
                )?,
            )?,
            cache_entries: register(
                registry,
                per_tenant("hasten_edge_cache_entries", "Cached queries, by tenant")?,
            )?,
            cache_documents: register(
                registry,
                per_tenant(
                    "hasten_edge_cache_documents",
                    "Documents the cache refers to, by tenant",
                )?,
            )?,
            cache_bytes: register(
                registry,
                per_tenant(
                    "hasten_edge_cache_bytes",
                    "Bytes the cache holds, by tenant",
                )?,
            )?,
            dar: register(
                registry,
                Gauge::new(
                    "hasten_edge_draft_acceptance_ratio",
                    "Share of the last 1000 answered requests served by an accepted draft",
                )?,
            )?,
            recent: Mutex::new(AnswerWindow::default()),
            subscribed: register(
                registry,
                gauge(
                    "hasten_edge_control_plane_subscribed",
                    "1 while the edge streams committed cache events from a control-plane node",
                )?,
            )?,
            applied_index: register(
                registry,
                gauge(
                    "hasten_edge_control_plane_applied_index",
                    "Index of the last control-plane event applied to the cache",
                )?,
            )?,
            proposals: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_proposals_total",
                        "Fallback results offered to the control plane: sent, or dropped (a full queue, or refused by the control plane)",
                    ),
                    &["result"],
                )?,
            )?,
            proposals_seen: Mutex::new((0, 0)),
            cloud_link: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "hasten_edge_cloud_link",
                        "1 for the state of the link to the cloud index as the last connection left it (unknown, verified, unreachable, version_mismatch)",
                    ),
                    &["state"],
                )?,
            )?,
            skipped: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_replicated_entries_skipped_total",
                        "Replicated cache entries this edge did not cache, by reason (tenant, corpus_version, malformed)",
                    ),
                    &["reason"],
                )?,
            )?,
            skipped_seen: Mutex::new([0; 3]),
            connections_refused: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_http_connections_refused_total",
                        "HTTP connections closed at once for being beyond max_connections, by listener (api, admin)",
                    ),
                    &["listener"],
                )?,
            )?,
            documents_held: register(
                registry,
                gauge(
                    "hasten_edge_documents_held",
                    "Documents of the edge's share of the corpus (corpus_fraction) in its store",
                )?,
            )?,
            documents_fetched: register(
                registry,
                IntCounter::new(
                    "hasten_edge_documents_fetched_total",
                    "Documents of cached entries outside the edge's share, fetched from the cloud by id",
                )?,
            )?,
            documents_fetched_seen: Mutex::new(0),
            documents_pending: register(
                registry,
                gauge(
                    "hasten_edge_documents_pending",
                    "Documents of cached entries outside the edge's share waiting to be fetched from the cloud",
                )?,
            )?,
        })
    }

    /// The counter of HTTP connections `listener` (`api` or `admin`) closed for being
    /// beyond its bound.
    pub fn connections_refused(&self, listener: &str) -> IntCounter {
        self.connections_refused.with_label_values(&[listener])
    }

    /// One answered request of `tenant`.
    pub fn observe_retrieval(&self, tenant: &Tenant, retrieval: &Retrieval, took: Duration) {
        let accepted = retrieval.outcome == Outcome::Accepted;
        let outcome = if accepted { "accepted" } else { "fallback" };
        self.requests
            .with_label_values(&[tenant.as_str(), outcome])
            .inc();
        self.duration
            .with_label_values(&[outcome])
            .observe(took.as_secs_f64());
        self.homology.observe(retrieval.homology_score);
        let t = &retrieval.timings;
        for (stage, took) in [
            ("encode", t.encode),
            ("cache_channel", t.cache_channel),
            ("fuzzy_channel", t.fuzzy_channel),
            ("validation", t.validation),
            ("cloud_fallback", t.cloud),
        ] {
            if let Some(took) = took {
                self.stages
                    .with_label_values(&[stage])
                    .observe(took.as_secs_f64());
            }
        }
        let ratio = self.recent.lock().push(accepted);
        self.dar.set(ratio);
    }

    /// One failed request (of `tenant`, once its token was checked), refused at parsing or
    /// failed in the engine.
    pub fn observe_error(&self, tenant: Option<&Tenant>, error: &EdgeError, took: Duration) {
        let kind = error.kind();
        self.requests
            .with_label_values(&[tenant.map_or(NO_TENANT, Tenant::as_str), "error"])
            .inc();
        self.errors.with_label_values(&[kind]).inc();
        self.duration
            .with_label_values(&["error"])
            .observe(took.as_secs_f64());
    }

    /// Scrape-time values: each tenant's cache size, the documents held and fetched
    /// (counts since start), the cloud link, replicated entries skipped (counts since start,
    /// by reason) and the control-plane link's state.
    pub fn refresh(
        &self,
        caches: &[(Tenant, CacheStats)],
        documents: DocumentCounts,
        link: Option<LinkReport>,
        cloud: &CloudLink,
        skipped: &[(SkipReason, u64)],
    ) {
        self.documents_held.set(documents.held as i64);
        self.documents_pending.set(documents.pending as i64);
        follow_count(
            &self.documents_fetched,
            &mut self.documents_fetched_seen.lock(),
            documents.fetched,
        );
        let current = cloud.label();
        for state in CloudLink::LABELS {
            self.cloud_link
                .with_label_values(&[state])
                .set(i64::from(state == current));
        }
        {
            let mut seen = self.skipped_seen.lock();
            for (reason, count) in skipped {
                follow_count(
                    &self.skipped.with_label_values(&[reason.label()]),
                    &mut seen[*reason as usize],
                    *count,
                );
            }
        }
        for (tenant, cache) in caches {
            let label = [tenant.as_str()];
            self.cache_entries
                .with_label_values(&label)
                .set(cache.queries as i64);
            self.cache_documents
                .with_label_values(&label)
                .set(cache.documents as i64);
            self.cache_bytes
                .with_label_values(&label)
                .set(cache.bytes as i64);
        }
        let Some(link) = link else {
            return;
        };
        self.subscribed.set(i64::from(link.subscribed));
        self.applied_index.set(link.applied_index as i64);
        let mut seen = self.proposals_seen.lock();
        follow_count(
            &self.proposals.with_label_values(&["sent"]),
            &mut seen.0,
            link.proposed,
        );
        follow_count(
            &self.proposals.with_label_values(&["dropped"]),
            &mut seen.1,
            link.dropped,
        );
    }
}

/// Brings `counter` up to `count`, a count since start kept elsewhere, of which `seen` was
/// already added: a counter never goes back, even if the count does.
fn follow_count(counter: &IntCounter, seen: &mut u64, count: u64) {
    counter.inc_by(count.saturating_sub(*seen));
    *seen = (*seen).max(count);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_count_is_added_once_and_never_goes_back() {
        let counter = IntCounter::new("followed", "test").unwrap();
        let mut seen = 0;
        follow_count(&counter, &mut seen, 3);
        follow_count(&counter, &mut seen, 3);
        assert_eq!(counter.get(), 3);
        follow_count(&counter, &mut seen, 1);
        follow_count(&counter, &mut seen, 5);
        assert_eq!(counter.get(), 5);
    }

    #[test]
    fn the_acceptance_window_forgets_what_slid_out() {
        let mut window = AnswerWindow::default();
        assert_eq!(window.push(true), 1.0);
        assert_eq!(window.push(false), 0.5);
        for _ in 0..DAR_WINDOW - 2 {
            window.push(false);
        }
        // The first answer, the only acceptance, slides out now.
        assert_eq!(window.push(false), 0.0);
        assert_eq!(window.push(true), 1.0 / DAR_WINDOW as f64);
    }
}
