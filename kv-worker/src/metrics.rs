//! The worker's metrics: time to first token and recomputed tokens by mode, where chunk KV
//! came from, load time, memory held per tier, failures by kind.

use std::time::Duration;

use hasten_core::metrics::prometheus::{
    self, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use hasten_core::metrics::{GENERATION_BUCKETS, INTER_TOKEN_BUCKETS, LATENCY_BUCKETS, register};

use crate::worker::{Generated, TierUsage, WorkerInfo};

#[derive(Debug)]
pub struct KvMetrics {
    first_token: HistogramVec,
    duration: HistogramVec,
    inter_token: HistogramVec,
    recomputed: IntCounterVec,
    context: IntCounterVec,
    chunks: IntCounterVec,
    load: HistogramVec,
    tier_bytes: IntGaugeVec,
    errors: IntCounterVec,
    queue: IntGauge,
    preprocessed: IntGaugeVec,
}

impl KvMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label])
        };
        Ok(Self {
            first_token: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hasten_kv_time_to_first_token_seconds",
                        "From receiving a request to its first token (queue and loads included), by mode",
                    )
                    .buckets(GENERATION_BUCKETS.to_vec()),
                    &["mode"],
                )?,
            )?,
            duration: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hasten_kv_answer_duration_seconds",
                        "From receiving a request to its last token (queue included), by mode",
                    )
                    .buckets(GENERATION_BUCKETS.to_vec()),
                    &["mode"],
                )?,
            )?,
            inter_token: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hasten_kv_time_per_output_token_seconds",
                        "An answer's decode time over its tokens after the first, by mode",
                    )
                    .buckets(INTER_TOKEN_BUCKETS.to_vec()),
                    &["mode"],
                )?,
            )?,
            recomputed: register(
                registry,
                counter(
                    "hasten_kv_recomputed_tokens_total",
                    "Context tokens computed for requests (all of them in full-prefill), by mode",
                    "mode",
                )?,
            )?,
            context: register(
                registry,
                counter(
                    "hasten_kv_context_tokens_total",
                    "Context tokens of answered requests, by mode",
                    "mode",
                )?,
            )?,
            chunks: register(
                registry,
                counter(
                    "hasten_kv_chunks_total",
                    "Chunks of answered requests by where their KV came from (memory, disk, computed)",
                    "from",
                )?,
            )?,
            load: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hasten_kv_load_seconds",
                        "Resolving a request's chunks to their KV, by where the slowest came from",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["from"],
                )?,
            )?,
            tier_bytes: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("hasten_kv_tier_bytes", "Chunk KV bytes held, by memory tier"),
                    &["tier"],
                )?,
            )?,
            errors: register(
                registry,
                counter(
                    "hasten_kv_errors_total",
                    "Refused or failed requests, by reason",
                    "reason",
                )?,
            )?,
            queue: register(
                registry,
                IntGauge::new(
                    "hasten_kv_queue",
                    "Requests waiting for the model (the one generating excluded)",
                )?,
            )?,
            preprocessed: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "hasten_kv_preprocessed_chunks",
                        "Chunks of each held corpus version with both variants stored, and the total",
                    ),
                    &["corpus_version", "state"],
                )?,
            )?,
        })
    }

    /// One answer, `queued` before the model took it.
    pub fn observe(&self, mode: &str, generated: &Generated, queued: Duration) {
        let timings = &generated.answer.timings;
        self.first_token
            .with_label_values(&[mode])
            .observe((queued + timings.first_token).as_secs_f64());
        self.duration
            .with_label_values(&[mode])
            .observe((queued + timings.total).as_secs_f64());
        if let Some(after_first) = generated
            .answer
            .tokens
            .len()
            .checked_sub(1)
            .filter(|n| *n > 0)
        {
            let decode = timings.total.saturating_sub(timings.first_token);
            self.inter_token
                .with_label_values(&[mode])
                .observe(decode.as_secs_f64() / after_first as f64);
        }
        self.recomputed
            .with_label_values(&[mode])
            .inc_by(generated.answer.recomputed.len() as u64);
        self.context
            .with_label_values(&[mode])
            .inc_by(generated.answer.context_tokens as u64);
        for (from, n) in [
            ("memory", generated.memory_hits),
            ("disk", generated.disk_hits),
            ("computed", generated.computed_chunks),
        ] {
            self.chunks.with_label_values(&[from]).inc_by(n as u64);
        }
        let slowest = if generated.computed_chunks > 0 {
            "computed"
        } else if generated.disk_hits > 0 {
            "disk"
        } else {
            "memory"
        };
        self.load
            .with_label_values(&[slowest])
            .observe(generated.load.as_secs_f64());
    }

    /// Bytes held per memory tier.
    pub fn observe_tiers(&self, tiers: &[TierUsage]) {
        for tier in tiers {
            self.tier_bytes
                .with_label_values(&[tier.name])
                .set(tier.used as i64);
        }
    }

    /// Tier usage and preprocessing progress, as `Info` reports them.
    pub fn observe_info(&self, info: &WorkerInfo) {
        self.observe_tiers(&info.tiers);
        for (version, progress) in &info.corpora {
            let done = progress.full_reuse.min(progress.similarity);
            self.preprocessed
                .with_label_values(&[version.as_str(), "done"])
                .set(done as i64);
            self.preprocessed
                .with_label_values(&[version.as_str(), "total"])
                .set(progress.chunks as i64);
        }
    }

    pub fn observe_error(&self, reason: &str) {
        self.errors.with_label_values(&[reason]).inc();
    }

    pub fn set_queue(&self, waiting: usize) {
        self.queue.set(waiting as i64);
    }
}
