//! Per-system outcomes, their summary against full prefill, and the printed table.

use hasten_bench::mean;
use hasten_kv_worker::FusionSettings;
use serde::Serialize;

pub struct Outcome {
    pub ttft_s: f64,
    /// Assembly, selection and the recompute pass, seconds.
    pub stages: [f64; 3],
    pub f1: f32,
    pub em: bool,
    /// The answer, normalized (for agreement with full prefill).
    pub normalized: String,
    /// KL(full prefill || this) of the first token (0 for full prefill itself).
    pub kl: f64,
    /// Per layer, against full prefill (empty for full prefill itself).
    pub deviation: Vec<f64>,
    pub context_tokens: usize,
    pub recomputed_tokens: usize,
}

#[derive(Serialize)]
pub struct Summary {
    pub system: String,
    pub mode: String,
    pub ratio: f64,
    pub queries: usize,
    pub ttft_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    /// Mean seconds of assembly, selection and the recompute (or full prefill) pass.
    pub assemble_s: f64,
    pub select_s: f64,
    pub recompute_s: f64,
    /// Full prefill's mean time to first token over this system's.
    pub speedup: f64,
    pub f1: f64,
    pub em: f64,
    /// This system's F1 over full prefill's.
    pub recovered_f1: f64,
    pub agreement_with_full_prefill: f64,
    pub first_token_kl: f64,
    pub kv_deviation: f64,
    pub kv_deviation_per_layer: Vec<f64>,
    pub context_tokens: f64,
    pub recomputed_tokens: f64,
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(0.0)
}

impl Summary {
    pub fn of(
        name: &str,
        settings: FusionSettings,
        outcomes: &[Outcome],
        full: &[Outcome],
    ) -> Self {
        let ttft: Vec<f64> = outcomes.iter().map(|o| o.ttft_s).collect();
        let f1 = mean(outcomes.iter().map(|o| f64::from(o.f1)));
        let full_f1 = mean(full.iter().map(|o| f64::from(o.f1)));
        let full_ttft = mean(full.iter().map(|o| o.ttft_s));
        let layers = outcomes.first().map_or(0, |o| o.deviation.len());
        let per_layer: Vec<f64> = (0..layers)
            .map(|l| mean(outcomes.iter().map(|o| o.deviation[l])))
            .collect();
        Self {
            system: name.to_string(),
            mode: format!("{:?}", settings.mode),
            ratio: settings.ratio,
            queries: outcomes.len(),
            ttft_s: mean(ttft.iter().copied()),
            ttft_p50_s: quantile(&ttft, 0.5),
            ttft_p90_s: quantile(&ttft, 0.9),
            assemble_s: mean(outcomes.iter().map(|o| o.stages[0])),
            select_s: mean(outcomes.iter().map(|o| o.stages[1])),
            recompute_s: mean(outcomes.iter().map(|o| o.stages[2])),
            speedup: full_ttft / mean(ttft.iter().copied()).max(f64::MIN_POSITIVE),
            f1,
            em: mean(outcomes.iter().map(|o| f64::from(u8::from(o.em)))),
            recovered_f1: if full_f1 > 0.0 {
                f1 / full_f1
            } else {
                f64::NAN
            },
            agreement_with_full_prefill: mean(
                outcomes
                    .iter()
                    .zip(full)
                    .map(|(o, f)| f64::from(u8::from(o.normalized == f.normalized))),
            ),
            first_token_kl: mean(outcomes.iter().map(|o| o.kl)),
            kv_deviation: mean(per_layer.iter().copied()),
            kv_deviation_per_layer: per_layer,
            context_tokens: mean(outcomes.iter().map(|o| o.context_tokens as f64)),
            recomputed_tokens: mean(outcomes.iter().map(|o| o.recomputed_tokens as f64)),
        }
    }
}

pub fn print_table(summaries: &[Summary]) {
    println!(
        "{:<24} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>7} {:>9} {:>8} {:>7}",
        "system",
        "ttft s",
        "x full",
        "F1",
        "EM",
        "F1 rec",
        "agree",
        "KL",
        "KV dev",
        "context",
        "recomp"
    );
    for s in summaries {
        println!(
            "{:<24} {:>8.3} {:>8.2} {:>6.3} {:>6.3} {:>6.2} {:>9.3} {:>7.3} {:>9.2} {:>8.0} {:>7.0}",
            s.system,
            s.ttft_s,
            s.speedup,
            s.f1,
            s.em,
            s.recovered_f1,
            s.agreement_with_full_prefill,
            s.first_token_kl,
            s.kv_deviation,
            s.context_tokens,
            s.recomputed_tokens
        );
    }
}
