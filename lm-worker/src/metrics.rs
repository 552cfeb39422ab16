//! The worker's metrics: answers and failures, time to first text, decode speed, generated
//! tokens and the queue, by mode.

use std::time::Duration;

use hasten_core::metrics::prometheus::{
    self, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
};
use hasten_core::metrics::{GENERATION_BUCKETS, TOKEN_RATE_BUCKETS, register};
use hasten_rag::{Answer, AnswerMode};

#[derive(Debug)]
pub struct WorkerMetrics {
    answers: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    first_token: HistogramVec,
    decode_rate: HistogramVec,
    generated: IntCounterVec,
    queue: IntGauge,
}

impl WorkerMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let by_mode = |name: &str, help: &str, buckets: &[f64]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                &["mode"],
            )
        };
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label])
        };
        Ok(Self {
            answers: register(
                registry,
                counter(
                    "hasten_worker_answers_total",
                    "Answers generated, by mode",
                    "mode",
                )?,
            )?,
            errors: register(
                registry,
                counter(
                    "hasten_worker_errors_total",
                    "Refused or failed answer requests, by kind",
                    "kind",
                )?,
            )?,
            duration: register(
                registry,
                by_mode(
                    "hasten_worker_answer_duration_seconds",
                    "From receiving a request to its whole answer (queue included), by mode",
                    GENERATION_BUCKETS,
                )?,
            )?,
            first_token: register(
                registry,
                by_mode(
                    "hasten_worker_first_token_seconds",
                    "From receiving a request to its first text (queue included), by mode",
                    GENERATION_BUCKETS,
                )?,
            )?,
            decode_rate: register(
                registry,
                by_mode(
                    "hasten_worker_decode_tokens_per_second",
                    "Tokens generated per second of decoding, per answer, by mode",
                    TOKEN_RATE_BUCKETS,
                )?,
            )?,
            generated: register(
                registry,
                counter(
                    "hasten_worker_generated_tokens_total",
                    "Tokens generated, by mode",
                    "mode",
                )?,
            )?,
            queue: register(
                registry,
                IntGauge::new(
                    "hasten_worker_queue",
                    "Answers waiting for the language model (the one generating excluded)",
                )?,
            )?,
        })
    }

    /// An answer that took `took` from arrival, its first text `first_text` after arrival.
    pub fn observe(
        &self,
        mode: AnswerMode,
        answer: &Answer,
        first_text: Option<Duration>,
        took: Duration,
    ) {
        let mode = mode.name();
        self.answers.with_label_values(&[mode]).inc();
        self.duration
            .with_label_values(&[mode])
            .observe(took.as_secs_f64());
        if let Some(first) = first_text {
            self.first_token
                .with_label_values(&[mode])
                .observe(first.as_secs_f64());
        }
        if let Some(rate) = answer.decode_rate() {
            self.decode_rate.with_label_values(&[mode]).observe(rate);
        }
        self.generated
            .with_label_values(&[mode])
            .inc_by(answer.generated_tokens as u64);
    }

    pub fn observe_error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    pub fn set_queue(&self, waiting: usize) {
        self.queue.set(waiting as i64);
    }
}
