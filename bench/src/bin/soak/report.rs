//! The report's per-phase figures.

use std::collections::BTreeMap;
use std::time::Duration;

use hasten_bench::Latencies;
use serde_json::{Value, json};

use crate::edges::{EdgeSample, longest_unchanged_s};
use crate::load::Answer;
use crate::schedule::PHASES;

pub(crate) fn phase_report(
    answers: &[Answer],
    samples: &[EdgeSample],
    duration: Duration,
) -> Vec<Value> {
    PHASES
        .iter()
        .enumerate()
        .map(|(index, plan)| {
            let mut latencies = Latencies::default();
            let mut fallbacks = Latencies::default();
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            let mut count = 0;
            for answer in answers.iter().filter(|a| a.phase == index) {
                count += 1;
                latencies.record(answer.latency);
                if answer.kind == "fallback" {
                    fallbacks.record(answer.latency);
                }
                *kinds.entry(answer.kind.as_str()).or_default() += 1;
            }
            let errors: usize = kinds
                .iter()
                .filter(|(kind, _)| !matches!(**kind, "accepted" | "fallback"))
                .map(|(_, n)| n)
                .sum();
            let ends_at = PHASES.get(index + 1).map_or(1.0, |next| next.starts_at);
            let in_phase: Vec<&EdgeSample> = samples.iter().filter(|s| s.phase == index).collect();
            let edges_applied: Vec<Value> = (0..in_phase.first().map_or(0, |s| s.applied.len()))
                .map(|e| {
                    json!({
                        "edge": format!("edge-{e}"),
                        "first": in_phase.first().and_then(|s| s.applied[e]),
                        "last": in_phase.last().and_then(|s| s.applied[e]),
                        "longest_unchanged_s": longest_unchanged_s(samples, index, e),
                    })
                })
                .collect();
            json!({
                "phase": plan.name,
                "from_s": duration.mul_f64(plan.starts_at).as_secs_f64(),
                "to_s": duration.mul_f64(ends_at).as_secs_f64(),
                "queries": count,
                "errors": errors,
                "error_rate": if count == 0 { 0.0 } else { errors as f64 / count as f64 },
                "by_kind": kinds,
                "p50_ms": latencies.quantile_ms(0.5),
                "p95_ms": latencies.quantile_ms(0.95),
                "p99_ms": latencies.quantile_ms(0.99),
                // The answers that went through the cloud tier and, replicated, the control
                // plane: the path the faults hit.
                "fallback_p50_ms": fallbacks.quantile_ms(0.5),
                "fallback_p99_ms": fallbacks.quantile_ms(0.99),
                // Each edge's applied control-plane index, sampled every second.
                "edge_applied_index": edges_applied,
            })
        })
        .collect()
}
