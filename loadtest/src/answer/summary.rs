//! Scoring an answer run from its records: time to first text, gaps between text chunks and
//! whole-answer latency (HDR histograms, from each query's intended send time), throughput
//! and goodput at a TTFT objective, retrieval outcomes, where chunk KV came from, answer
//! quality against gold (EM, F1, contains), the mean stage times, and each system's paired
//! quality difference against a baseline.

use std::collections::HashMap;
use std::time::Duration;

use hasten_eval::metrics::{best_of, contains, exact_match, f1};
use serde::Serialize;

use super::exchange::AnswerReply;
use crate::driver::Sent;
use crate::scoring::histogram_of;

/// One answered (or failed) question.
pub type AnswerRecord = Sent<AnswerReply>;

/// Percentiles of a latency, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub samples: usize,
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(values: impl IntoIterator<Item = Duration>) -> Self {
        let histogram = histogram_of(values);
        if histogram.is_empty() {
            return Self::default();
        }
        let s = |us: u64| us as f64 / 1e6;
        Self {
            samples: histogram.len() as usize,
            mean: histogram.mean() / 1e6,
            p50: s(histogram.value_at_quantile(0.50)),
            p95: s(histogram.value_at_quantile(0.95)),
            p99: s(histogram.value_at_quantile(0.99)),
            max: s(histogram.max()),
        }
    }
}

/// Mean answer quality against the gold answers (the best over each question's aliases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Quality {
    pub em: f64,
    pub f1: f64,
    pub contains: f64,
}

impl Quality {
    /// One answer's scores; none when the question has no gold answer.
    pub fn of(answer: &str, gold: &[String]) -> Option<Self> {
        let em = best_of(answer, gold, exact_match)?;
        Some(Self {
            em: f64::from(u8::from(em)),
            f1: f64::from(best_of(answer, gold, f1)?),
            contains: f64::from(u8::from(best_of(answer, gold, contains)?)),
        })
    }
}

/// Mean milliseconds per stage over the answers that report them: the edge's retrieval,
/// its queue, then the backend; KV workers split their prefill further.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StageMeans {
    pub answers: usize,
    pub retrieve_ms: f64,
    pub edge_queue_ms: f64,
    pub worker_queue_ms: f64,
    pub kv_load_ms: f64,
    pub assemble_ms: f64,
    pub select_ms: f64,
    pub recompute_ms: f64,
    /// The backend's prefill as a whole (KV workers: load to recompute).
    pub prefill_ms: f64,
    /// From the edge receiving the request to its first text.
    pub first_token_ms: f64,
    pub decode_ms: f64,
    /// The edge's whole handling.
    pub total_ms: f64,
}

/// Chunks by where a KV worker found their KV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct KvSources {
    pub memory: u64,
    pub disk: u64,
    pub computed: u64,
    /// Memory hits over all chunks (`None` when no answer went through KV workers).
    pub memory_hit_rate: Option<f64>,
}

/// Paired difference of a system against the baseline over the questions both answered:
/// mean of (system - baseline), in the metric's unit (F1 in [0, 1]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PairedDifference {
    pub pairs: usize,
    pub em: f64,
    pub f1: f64,
    pub contains: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AnswerSummary {
    pub questions: usize,
    pub answered: usize,
    pub errors: usize,
    /// The first error's text, to tell what failed.
    pub first_error: Option<String>,
    pub ttft_s: Percentiles,
    /// Gaps between text chunks.
    pub itl_s: Percentiles,
    pub latency_s: Percentiles,
    /// Answers per second over the run's wall time.
    pub throughput: f64,
    /// Answers per second whose first text came within the objective.
    pub goodput: f64,
    pub ttft_slo_s: f64,
    pub accepted: usize,
    pub fallback: usize,
    pub kv: KvSources,
    pub quality: Quality,
    pub stages: StageMeans,
}

/// Time to first text; an answer with no text at all waited its whole latency for nothing.
fn ttft(record: &AnswerRecord) -> Option<Duration> {
    let reply = record.result.as_ref().ok()?;
    Some(reply.first_text.unwrap_or(record.latency))
}

/// Answers per second that came without error and whose first text came within `slo`.
pub fn goodput(records: &[AnswerRecord], wall: Duration, slo: Duration) -> f64 {
    let good = records
        .iter()
        .filter(|r| ttft(r).is_some_and(|t| t <= slo))
        .count();
    good as f64 / wall.as_secs_f64().max(1e-9)
}

fn quality_of(record: &AnswerRecord) -> Option<Quality> {
    let reply = record.result.as_ref().ok()?;
    Quality::of(&reply.text, &record.question.answers)
}

/// `system` against `baseline`, question by question (by workload sequence number), over
/// the questions both answered with a gold answer to score against.
pub fn paired_difference(system: &[AnswerRecord], baseline: &[AnswerRecord]) -> PairedDifference {
    let base: HashMap<usize, Quality> = baseline
        .iter()
        .filter_map(|r| Some((r.question.seq, quality_of(r)?)))
        .collect();
    let mut sum = PairedDifference::default();
    for record in system {
        let (Some(mine), Some(theirs)) = (quality_of(record), base.get(&record.question.seq))
        else {
            continue;
        };
        sum.pairs += 1;
        sum.em += mine.em - theirs.em;
        sum.f1 += mine.f1 - theirs.f1;
        sum.contains += mine.contains - theirs.contains;
    }
    let n = sum.pairs.max(1) as f64;
    PairedDifference {
        pairs: sum.pairs,
        em: sum.em / n,
        f1: sum.f1 / n,
        contains: sum.contains / n,
    }
}

fn mean_of<T>(items: &[T], value: impl Fn(&T) -> f64) -> f64 {
    if items.is_empty() {
        return 0.0;
    }
    items.iter().map(value).sum::<f64>() / items.len() as f64
}

pub fn summarize(records: &[AnswerRecord], wall: Duration, slo: Duration) -> AnswerSummary {
    let replies: Vec<&AnswerReply> = records
        .iter()
        .filter_map(|r| r.result.as_ref().ok())
        .collect();
    let scored: Vec<Quality> = records.iter().filter_map(quality_of).collect();
    let timings: Vec<_> = replies.iter().filter_map(|r| r.timings).collect();
    let kv: Vec<_> = timings.iter().filter_map(|t| t.kv).collect();
    let (memory, disk, computed) = kv.iter().fold((0u64, 0u64, 0u64), |(m, d, c), k| {
        (
            m + u64::from(k.memory_hits),
            d + u64::from(k.disk_hits),
            c + u64::from(k.computed_chunks),
        )
    });
    let chunks = memory + disk + computed;
    // Stage times per answer that reports timings (a KV stage counts 0 for answers that
    // went elsewhere).
    let per_answer =
        |ms: &mut dyn Iterator<Item = f64>| ms.sum::<f64>() / timings.len().max(1) as f64;
    let wall_s = wall.as_secs_f64().max(1e-9);
    AnswerSummary {
        questions: records.len(),
        answered: replies.len(),
        errors: records.len() - replies.len(),
        first_error: records
            .iter()
            .find_map(|r| r.result.as_ref().err().cloned()),
        ttft_s: Percentiles::of(records.iter().filter_map(ttft)),
        itl_s: Percentiles::of(replies.iter().flat_map(|r| r.gaps.iter().copied())),
        latency_s: Percentiles::of(
            records
                .iter()
                .filter(|r| r.result.is_ok())
                .map(|r| r.latency),
        ),
        throughput: replies.len() as f64 / wall_s,
        goodput: goodput(records, wall, slo),
        ttft_slo_s: slo.as_secs_f64(),
        accepted: replies
            .iter()
            .filter(|r| r.retrieval.as_deref() == Some("accepted"))
            .count(),
        fallback: replies
            .iter()
            .filter(|r| r.retrieval.as_deref() == Some("fallback"))
            .count(),
        kv: KvSources {
            memory,
            disk,
            computed,
            memory_hit_rate: (chunks > 0).then(|| memory as f64 / chunks as f64),
        },
        quality: Quality {
            em: mean_of(&scored, |q| q.em),
            f1: mean_of(&scored, |q| q.f1),
            contains: mean_of(&scored, |q| q.contains),
        },
        stages: StageMeans {
            answers: timings.len(),
            retrieve_ms: per_answer(&mut timings.iter().map(|t| t.retrieve_ms)),
            edge_queue_ms: per_answer(&mut timings.iter().map(|t| t.queue_ms)),
            worker_queue_ms: per_answer(&mut kv.iter().map(|k| k.queue_ms)),
            kv_load_ms: per_answer(&mut kv.iter().map(|k| k.load_ms)),
            assemble_ms: per_answer(&mut kv.iter().map(|k| k.assemble_ms)),
            select_ms: per_answer(&mut kv.iter().map(|k| k.select_ms)),
            recompute_ms: per_answer(&mut kv.iter().map(|k| k.recompute_ms)),
            prefill_ms: per_answer(&mut timings.iter().map(|t| t.prefill_ms)),
            first_token_ms: per_answer(&mut timings.iter().map(|t| t.first_token_ms)),
            decode_ms: per_answer(&mut timings.iter().map(|t| t.decode_ms)),
            total_ms: per_answer(&mut timings.iter().map(|t| t.total_ms)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadQuery;

    fn record(seq: usize, ttft_ms: Option<u64>, text: &str, gold: &str) -> AnswerRecord {
        let question = WorkloadQuery {
            seq,
            day: 0,
            question: format!("question {seq}"),
            answers: vec![gold.to_string()],
            entity: "e".into(),
            source: "test".into(),
            relation: None,
            gold_passage: None,
            popularity: Default::default(),
        };
        let result = match ttft_ms {
            Some(ms) => Ok(AnswerReply {
                text: text.into(),
                first_text: Some(Duration::from_millis(ms)),
                ..Default::default()
            }),
            None => Err("HTTP 429: overloaded".into()),
        };
        AnswerRecord {
            question,
            edge: 0,
            latency: Duration::from_millis(ttft_ms.unwrap_or(5) + 100),
            sent: Duration::ZERO,
            result,
        }
    }

    #[test]
    fn goodput_counts_answers_within_the_objective_and_never_errors() {
        // Four answers (two within 1 s), and two refusals that came back at once: over a
        // 2 s run, goodput is 2 / 2 s = 1 answer/s. Counting the fast refusals as good would
        // make it 2.
        let records = vec![
            record(0, Some(300), "a", "a"),
            record(1, Some(1_000), "a", "a"),
            record(2, Some(1_001), "a", "a"),
            record(3, Some(4_000), "a", "a"),
            record(4, None, "", "a"),
            record(5, None, "", "a"),
        ];
        let wall = Duration::from_secs(2);
        let slo = Duration::from_secs(1);
        assert_eq!(goodput(&records, wall, slo), 1.0);
        let summary = summarize(&records, wall, slo);
        assert_eq!((summary.answered, summary.errors), (4, 2));
        assert_eq!(summary.throughput, 2.0);
        assert_eq!(summary.ttft_s.samples, 4, "errors have no first token");
        assert!(summary.first_error.unwrap().contains("429"));
    }

    #[test]
    fn paired_difference_is_over_questions_both_systems_answered() {
        let baseline = vec![
            record(0, Some(10), "Denver Broncos", "Denver Broncos"), // F1 1
            record(1, Some(10), "Carolina", "Carolina Panthers"),    // F1 2/3
            record(2, Some(10), "x", "y"),                           // F1 0
            record(3, None, "", "z"),                                // refused
        ];
        let system = vec![
            record(0, Some(10), "the Broncos", "Denver Broncos"), // F1 2/3
            record(1, Some(10), "Carolina Panthers", "Carolina Panthers"), // F1 1
            record(2, None, "", "y"),                             // refused: not paired
            record(3, Some(10), "z", "z"),                        // baseline refused
        ];
        let paired = paired_difference(&system, &baseline);
        assert_eq!(paired.pairs, 2);
        assert!((paired.f1 - 0.0).abs() < 1e-6, "{paired:?}");
        assert!((paired.em - 0.0).abs() < 1e-9);
        let swapped = paired_difference(&baseline[..1], &system[..1]);
        assert!((swapped.f1 - (1.0 - 2.0 / 3.0)).abs() < 1e-6, "{swapped:?}");
        assert_eq!(swapped.em, 1.0);
    }
}
