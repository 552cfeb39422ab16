//! Metrics of `/v1/answer`: answers and failures, time to first token, decode speed and the
//! queue for the language model, by mode.

use std::time::Duration;

use hasten_core::metrics::prometheus::{
    self, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use hasten_core::metrics::{GENERATION_BUCKETS, INTER_TOKEN_BUCKETS, TOKEN_RATE_BUCKETS, register};

use super::Answered;
use crate::api::EdgeError;

#[derive(Debug)]
pub struct AnswerMetrics {
    answers: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    first_token: HistogramVec,
    inter_token: HistogramVec,
    decode_rate: HistogramVec,
    generated: IntCounterVec,
    cancelled: IntCounter,
    queue: IntGauge,
}

impl AnswerMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let by_mode = |name: &str, help: &str, buckets: &[f64]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                &["mode"],
            )
        };
        Ok(Self {
            answers: register(
                registry,
                IntCounterVec::new(
                    Opts::new("hasten_edge_answers_total", "Answers generated, by mode"),
                    &["mode"],
                )?,
            )?,
            errors: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_answer_errors_total",
                        "Failed answer requests by kind",
                    ),
                    &["kind"],
                )?,
            )?,
            duration: register(
                registry,
                by_mode(
                    "hasten_edge_answer_duration_seconds",
                    "Answer latency end to end (retrieval, queue, generation), by mode",
                    GENERATION_BUCKETS,
                )?,
            )?,
            first_token: register(
                registry,
                by_mode(
                    "hasten_edge_answer_first_token_seconds",
                    "Time to the answer's first text (retrieval and queue included), by mode",
                    GENERATION_BUCKETS,
                )?,
            )?,
            inter_token: register(
                registry,
                by_mode(
                    "hasten_edge_answer_time_per_output_token_seconds",
                    "An answer's decode time over its tokens after the first, by mode",
                    INTER_TOKEN_BUCKETS,
                )?,
            )?,
            decode_rate: register(
                registry,
                by_mode(
                    "hasten_edge_answer_decode_tokens_per_second",
                    "Tokens generated per second of decoding, per answer, by mode",
                    TOKEN_RATE_BUCKETS,
                )?,
            )?,
            generated: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "hasten_edge_answer_generated_tokens_total",
                        "Tokens generated, by mode",
                    ),
                    &["mode"],
                )?,
            )?,
            cancelled: register(
                registry,
                IntCounter::new(
                    "hasten_answer_cancelled_total",
                    "Answers whose client went away before the end; their generation stopped",
                )?,
            )?,
            queue: register(
                registry,
                IntGauge::new(
                    "hasten_edge_answer_queue",
                    "Answers waiting for the language model (the one generating excluded)",
                )?,
            )?,
        })
    }

    pub(crate) fn observe(&self, answered: &Answered, took: Duration) {
        let mode = answered.mode.name();
        self.answers.with_label_values(&[mode]).inc();
        self.duration
            .with_label_values(&[mode])
            .observe(took.as_secs_f64());
        self.first_token
            .with_label_values(&[mode])
            .observe(answered.first_token().as_secs_f64());
        if let Some(rate) = answered.answer.decode_rate() {
            self.decode_rate.with_label_values(&[mode]).observe(rate);
        }
        // Speculative answers decode drafts, not the answer's tokens one by one.
        let answer = &answered.answer;
        if answered.mode == hasten_rag::AnswerMode::Standard && answer.generated_tokens > 1 {
            let per_token =
                answer.timings.decode.as_secs_f64() / (answer.generated_tokens - 1) as f64;
            self.inter_token
                .with_label_values(&[mode])
                .observe(per_token);
        }
        self.generated
            .with_label_values(&[mode])
            .inc_by(answered.answer.generated_tokens as u64);
    }

    pub(crate) fn observe_error(&self, error: &EdgeError) {
        self.errors.with_label_values(&[error.kind()]).inc();
    }

    pub(crate) fn observe_cancelled(&self) {
        self.cancelled.inc();
    }

    pub(crate) fn set_queue(&self, waiting: usize) {
        self.queue.set(waiting as i64);
    }
}
