//! What the evaluation reports: each system's answer to each question, and each system's
//! accuracy and latency over all of them.

use std::collections::BTreeMap;
use std::path::Path;

use hasten_eval::metrics;
use hasten_eval::paired::{PairedDifference, RESAMPLES, paired_difference};
use hasten_rag::Answer;
use serde::Serialize;

#[derive(Serialize)]
pub struct Outcome {
    pub system: &'static str,
    pub answer: String,
    pub latency_s: f64,
    exact_match: bool,
    f1: f32,
    contains: bool,
    prefill_s: f64,
    decode_s: f64,
    verify_s: f64,
    generated_tokens: usize,
    /// Tokens the drafter wrote, all drafts together (0 in standard mode).
    drafted_tokens: usize,
    /// Drafts written (0 in standard mode).
    drafts: usize,
    /// The best F1 of any draft's answer (speculative mode): what a perfect verifier would
    /// score, which separates the drafter's misses from the verifier's.
    #[serde(skip_serializing_if = "Option::is_none")]
    best_draft_f1: Option<f32>,
    documents_used: Vec<usize>,
    /// Speculative mode: every draft with its F1 and the verifier's scores, so that other
    /// ways of choosing among the same drafts can be compared afterwards
    /// (bench/specrag-selection.py).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    draft_outcomes: Vec<DraftOutcome>,
}

/// One draft as the evaluation saw it.
#[derive(Serialize)]
struct DraftOutcome {
    answer: String,
    rationale: String,
    f1: f32,
    draft_logprob: f32,
    consistency_logprob: f32,
    reflection_logprob: f32,
}

impl Outcome {
    pub fn new(system: &'static str, answer: &Answer, latency_s: f64, golds: &[String]) -> Self {
        let text = answer.text.trim();
        let draft_outcomes = answer
            .drafts
            .iter()
            .map(|d| DraftOutcome {
                answer: d.answer.trim().to_string(),
                rationale: d.rationale.clone(),
                f1: metrics::best_of(d.answer.trim(), golds, metrics::f1).unwrap_or(0.0),
                draft_logprob: d.draft_logprob,
                consistency_logprob: d.consistency_logprob,
                reflection_logprob: d.reflection_logprob,
            })
            .collect::<Vec<_>>();
        Self {
            system,
            answer: text.to_string(),
            latency_s,
            exact_match: metrics::best_of(text, golds, metrics::exact_match).unwrap_or(false),
            f1: metrics::best_of(text, golds, metrics::f1).unwrap_or(0.0),
            contains: metrics::best_of(text, golds, metrics::contains).unwrap_or(false),
            prefill_s: answer.timings.prefill.as_secs_f64(),
            decode_s: answer.timings.decode.as_secs_f64(),
            verify_s: answer.timings.verify.as_secs_f64(),
            // Every token decoded: the answer's, and in speculative mode all drafts'.
            generated_tokens: answer.generated_tokens + answer.drafting.generated_tokens,
            drafted_tokens: answer.drafting.generated_tokens,
            drafts: answer.drafts.len(),
            best_draft_f1: draft_outcomes.iter().map(|d| d.f1).reduce(f32::max),
            documents_used: answer.documents_used.clone(),
            draft_outcomes,
        }
    }
}

#[derive(Serialize)]
pub struct QuestionReport {
    pub index: usize,
    pub question: String,
    pub gold: Vec<String>,
    /// Encoding the question and searching the bundle, when the passages were retrieved
    /// (the same for every system, so not in any system's latency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrieval_s: Option<f64>,
    /// The passages' titles, best first, when they were retrieved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passages: Vec<String>,
    /// Whether some passage holds a gold answer.
    pub answer_in_passages: bool,
    pub encoding_s: f64,
    pub outcomes: Vec<Outcome>,
}

/// A system's figures over every question: exactly the per-system keys of the report.
#[derive(Serialize)]
pub struct SystemReport {
    pub name: &'static str,
    accuracy_em: f64,
    accuracy_f1: f64,
    accuracy_contains: f64,
    pub avg_latency_s: f64,
    p50_s: f64,
    p99_s: f64,
    queries: usize,
    /// Speculative systems: tokens the drafter wrote per draft.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_draft: Option<f64>,
    /// Speculative systems: the mean over questions of the best draft's F1 (a perfect
    /// verifier's F1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_draft_f1: Option<f64>,
}

/// The nearest-rank percentile `p` (0-100) of `sorted`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarise(name: &'static str, outcomes: &[&Outcome]) -> SystemReport {
    let n = outcomes.len().max(1) as f64;
    let mut latencies: Vec<f64> = outcomes.iter().map(|o| o.latency_s).collect();
    latencies.sort_by(f64::total_cmp);
    SystemReport {
        name,
        accuracy_em: outcomes.iter().filter(|o| o.exact_match).count() as f64 / n,
        accuracy_f1: outcomes.iter().map(|o| f64::from(o.f1)).sum::<f64>() / n,
        accuracy_contains: outcomes.iter().filter(|o| o.contains).count() as f64 / n,
        avg_latency_s: latencies.iter().sum::<f64>() / n,
        p50_s: percentile(&latencies, 50.0),
        p99_s: percentile(&latencies, 99.0),
        queries: outcomes.len(),
        tokens_per_draft: {
            let drafts: usize = outcomes.iter().map(|o| o.drafts).sum();
            (drafts > 0).then(|| {
                outcomes.iter().map(|o| o.drafted_tokens).sum::<usize>() as f64 / drafts as f64
            })
        },
        best_draft_f1: {
            let best: Vec<f64> = outcomes
                .iter()
                .filter_map(|o| o.best_draft_f1.map(f64::from))
                .collect();
            (!best.is_empty()).then(|| best.iter().sum::<f64>() / best.len() as f64)
        },
    }
}

/// Every other system's F1 minus `baseline`'s, question by question (the questions both
/// answered), with its bootstrap interval: "no lower F1" is a claim about this interval.
pub fn f1_against(
    reports: &[QuestionReport],
    baseline: &str,
) -> BTreeMap<&'static str, PairedDifference> {
    let mut differences: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for report in reports {
        let Some(base) = report.outcomes.iter().find(|o| o.system == baseline) else {
            continue;
        };
        for outcome in report.outcomes.iter().filter(|o| o.system != baseline) {
            differences
                .entry(outcome.system)
                .or_default()
                .push(f64::from(outcome.f1) - f64::from(base.f1));
        }
    }
    differences
        .into_iter()
        .filter_map(|(system, d)| Some((system, paired_difference(&d, RESAMPLES, 0)?)))
        .collect()
}

pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

pub fn print_table(systems: &[SystemReport], ratios: &BTreeMap<&'static str, f64>) {
    println!(
        "{:<26} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8} {:>11} {:>7}",
        "system", "EM", "F1", "contains", "avg s", "p50 s", "p99 s", "x standard", "queries"
    );
    for s in systems {
        let ratio = ratios
            .get(s.name)
            .map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
        println!(
            "{:<26} {:>6.3} {:>6.3} {:>8.3} {:>9.2} {:>8.2} {:>8.2} {:>11} {:>7}",
            s.name,
            s.accuracy_em,
            s.accuracy_f1,
            s.accuracy_contains,
            s.avg_latency_s,
            s.p50_s,
            s.p99_s,
            ratio,
            s.queries
        );
    }
    for s in systems {
        if let (Some(tokens), Some(best)) = (s.tokens_per_draft, s.best_draft_f1) {
            println!(
                "{}: {tokens:.1} tokens per draft; best draft's F1 {best:.3} (a perfect verifier's)",
                s.name
            );
        }
    }
}

pub fn print_paired(differences: &BTreeMap<&'static str, PairedDifference>, baseline: &str) {
    for (system, d) in differences {
        println!(
            "{system}: F1 {:+.3} against {baseline} (95% bootstrap {:+.3}..{:+.3}, {} questions)",
            d.mean, d.low, d.high, d.pairs
        );
    }
}
