//! The answer evaluation's report: report.json, report.md (each offered load's table of
//! systems, where their time went, first occurrences, each system's goodput knee) and
//! plots (TTFT CDF per load, goodput against offered rate).

use display_full_error::DisplayFullErrorExt;
use std::path::Path;

use serde::Serialize;

use super::summary::{AnswerSummary, PairedDifference};
use super::systems::{AnswerSystem, BASELINE};
use crate::driver::LoadModel;
use crate::report::{Axes, bounds, cdf_plot, line_plot};

#[derive(Clone, Debug, Serialize)]
pub struct AnswerSystemReport {
    pub name: String,
    pub system: AnswerSystem,
    pub load: LoadModel,
    pub all: AnswerSummary,
    /// Over the questions no earlier question of the workload asked word for word.
    pub first_occurrence: AnswerSummary,
    /// Quality against the baseline at the same load, question by question.
    pub paired_vs_baseline: Option<PairedDifference>,
    pub paired_first_occurrence: Option<PairedDifference>,
    /// Every answer's time to first text, ascending (for the CDF).
    #[serde(skip)]
    pub ttfts_s: Vec<f64>,
}

/// A system's highest goodput over the offered rates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Knee {
    pub system: String,
    pub offered_qps: f64,
    pub goodput: f64,
    /// This goodput over the baseline's knee goodput.
    pub vs_baseline: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AnswerReport {
    pub workload: serde_json::Value,
    pub runs: Vec<AnswerSystemReport>,
    pub knees: Vec<Knee>,
}

/// `open 2 q/s` or `closed 4 clients`.
pub fn load_label(load: &LoadModel) -> String {
    match load {
        LoadModel::Open { rate_qps, .. } => format!("open {rate_qps} q/s"),
        LoadModel::Closed { clients } => format!("closed {clients} clients"),
    }
}

fn offered(load: &LoadModel) -> Option<f64> {
    match load {
        LoadModel::Open { rate_qps, .. } => Some(*rate_qps),
        LoadModel::Closed { .. } => None,
    }
}

/// Each system's open-loop run of highest goodput.
pub fn knees(runs: &[AnswerSystemReport]) -> Vec<Knee> {
    // Each system once, in report order (runs come load by load).
    let mut names: Vec<&str> = Vec::new();
    for run in runs {
        if !names.contains(&run.name.as_str()) {
            names.push(&run.name);
        }
    }
    let mut knees: Vec<Knee> = names
        .iter()
        .filter_map(|name| {
            runs.iter()
                .filter(|r| r.name == *name)
                .filter_map(|r| Some((offered(&r.load)?, r.all.goodput)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(offered_qps, goodput)| Knee {
                    system: name.to_string(),
                    offered_qps,
                    goodput,
                    vs_baseline: None,
                })
        })
        .collect();
    if let Some(base) = knees
        .iter()
        .find(|k| k.system == BASELINE)
        .map(|k| k.goodput)
    {
        for knee in &mut knees {
            knee.vs_baseline = (base > 0.0).then(|| knee.goodput / base);
        }
    }
    knees
}

impl AnswerReport {
    pub fn new(workload: serde_json::Value, runs: Vec<AnswerSystemReport>) -> Self {
        let knees = knees(&runs);
        Self {
            workload,
            runs,
            knees,
        }
    }

    fn loads(&self) -> Vec<LoadModel> {
        let mut loads: Vec<LoadModel> = Vec::new();
        for run in &self.runs {
            if !loads.contains(&run.load) {
                loads.push(run.load);
            }
        }
        loads
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from("# Answers under load\n\n");
        for load in self.loads() {
            let runs: Vec<&AnswerSystemReport> =
                self.runs.iter().filter(|r| r.load == load).collect();
            let base = runs.iter().find(|r| r.name == BASELINE);
            let slo = runs.first().map_or(0.0, |r| r.all.ttft_slo_s);
            out += &format!("## {}\n\n", load_label(&load));
            out += &format!(
                "| system | answered | errors | TTFT p50 s | p95 | p99 | TTFT p50 vs {BASELINE} | ITL p50 ms | answer p50 s | p99 | answers/s | goodput/s (TTFT ≤ {slo} s) | accepted | KV in memory | EM | F1 | contains | ΔF1 vs {BASELINE} (pairs) |\n|{}\n",
                "---|".repeat(18)
            );
            for run in &runs {
                let a = &run.all;
                let speedup = base
                    .filter(|b| a.ttft_s.p50 > 0.0 && b.all.ttft_s.p50 > 0.0)
                    .map_or("-".into(), |b| {
                        format!("{:.2}x", b.all.ttft_s.p50 / a.ttft_s.p50)
                    });
                let paired = run
                    .paired_vs_baseline
                    .map_or("-".into(), |p| format!("{:+.3} ({})", p.f1, p.pairs));
                let accepted = if a.answered > 0 {
                    format!("{:.2}", a.accepted as f64 / a.answered as f64)
                } else {
                    "-".into()
                };
                let memory =
                    a.kv.memory_hit_rate
                        .map_or("-".into(), |h| format!("{h:.2}"));
                out += &format!(
                    "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
                    run.name,
                    a.answered,
                    a.errors,
                    a.ttft_s.p50,
                    a.ttft_s.p95,
                    a.ttft_s.p99,
                    speedup,
                    a.itl_s.p50 * 1e3,
                    a.latency_s.p50,
                    a.latency_s.p99,
                    a.throughput,
                    a.goodput,
                    accepted,
                    memory,
                    a.quality.em,
                    a.quality.f1,
                    a.quality.contains,
                    paired,
                );
            }
            out += "\nWhere the time went (mean ms per answer, as the edge and the KV workers report it):\n\n";
            out += "| system | retrieve | edge queue | worker queue | KV load | assemble | select | recompute | prefill | edge first token | decode | edge total | client TTFT mean |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
            for run in &runs {
                let t = &run.all.stages;
                out += &format!(
                    "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                    run.name,
                    t.retrieve_ms,
                    t.edge_queue_ms,
                    t.worker_queue_ms,
                    t.kv_load_ms,
                    t.assemble_ms,
                    t.select_ms,
                    t.recompute_ms,
                    t.prefill_ms,
                    t.first_token_ms,
                    t.decode_ms,
                    t.total_ms,
                    run.all.ttft_s.mean * 1e3,
                );
            }
            out += "\nFirst occurrences (questions no earlier question asked word for word):\n\n";
            out += &format!(
                "| system | questions | TTFT p50 s | p99 | F1 | ΔF1 vs {BASELINE} (pairs) |\n|---|---|---|---|---|---|\n"
            );
            for run in &runs {
                let f = &run.first_occurrence;
                let paired = run
                    .paired_first_occurrence
                    .map_or("-".into(), |p| format!("{:+.3} ({})", p.f1, p.pairs));
                out += &format!(
                    "| {} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
                    run.name, f.questions, f.ttft_s.p50, f.ttft_s.p99, f.quality.f1, paired
                );
            }
            for run in runs.iter().filter(|r| r.all.errors > 0) {
                out += &format!(
                    "\n{}: {} errors, the first: {}\n",
                    run.name,
                    run.all.errors,
                    run.all.first_error.as_deref().unwrap_or("")
                );
            }
            out += "\n";
        }
        if !self.knees.is_empty() {
            out += &format!(
                "## Goodput knee (each system's highest goodput over the offered rates)\n\n| system | at offered q/s | goodput/s | vs {BASELINE} |\n|---|---|---|---|\n"
            );
            for knee in &self.knees {
                out += &format!(
                    "| {} | {} | {:.3} | {} |\n",
                    knee.system,
                    knee.offered_qps,
                    knee.goodput,
                    knee.vs_baseline.map_or("-".into(), |v| format!("{v:.2}x"))
                );
            }
        }
        out
    }

    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string_full())?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string_full())?;
        std::fs::write(dir.join("report.json"), json).map_err(|e| e.to_string_full())?;
        std::fs::write(dir.join("report.md"), self.markdown()).map_err(|e| e.to_string_full())?;
        for (i, load) in self.loads().iter().enumerate() {
            self.ttft_cdf(load, &dir.join(format!("ttft-cdf-{i}.svg")))?;
        }
        if !self.knees.is_empty() {
            self.goodput_plot(&dir.join("goodput.svg"))?;
        }
        Ok(())
    }

    /// Time to first text, cumulative, per system at one load.
    fn ttft_cdf(&self, load: &LoadModel, path: &Path) -> Result<(), String> {
        let series: Vec<(String, &[f64])> = self
            .runs
            .iter()
            .filter(|r| r.load == *load)
            .map(|r| (r.name.clone(), r.ttfts_s.as_slice()))
            .collect();
        let caption = format!("Time to first token, {}", load_label(load));
        cdf_plot(
            path,
            &caption,
            "time to first token (s)",
            "share of answers",
            &series,
        )
    }

    /// Goodput against offered rate, one line per system.
    fn goodput_plot(&self, path: &Path) -> Result<(), String> {
        let open: Vec<(&AnswerSystemReport, f64)> = self
            .runs
            .iter()
            .filter_map(|r| Some((r, offered(&r.load)?)))
            .collect();
        let lines: Vec<(String, Vec<(f64, f64)>)> = self
            .knees
            .iter()
            .map(|knee| {
                let points = open
                    .iter()
                    .filter(|(r, _)| r.name == knee.system)
                    .map(|(r, x)| (*x, r.all.goodput))
                    .collect();
                (knee.system.clone(), points)
            })
            .collect();
        let (lo_x, hi_x) = bounds(open.iter().map(|(_, x)| *x));
        let (_, hi_y) = bounds(open.iter().map(|(r, x)| r.all.goodput.max(*x)));
        let axes = Axes {
            caption: "Goodput against offered load",
            x: ("offered load (questions/s)", lo_x..hi_x),
            y: ("goodput (answers/s within the TTFT objective)", 0.0..hi_y),
        };
        line_plot(path, &axes, &lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::systems::ANSWER_SYSTEMS;

    fn run(system: usize, rate_qps: f64, goodput: f64) -> AnswerSystemReport {
        let system = ANSWER_SYSTEMS[system];
        AnswerSystemReport {
            name: system.name.to_string(),
            system,
            load: LoadModel::Open { rate_qps, seed: 1 },
            all: AnswerSummary {
                goodput,
                ..Default::default()
            },
            first_occurrence: AnswerSummary::default(),
            paired_vs_baseline: None,
            paired_first_occurrence: None,
            ttfts_s: Vec::new(),
        }
    }

    #[test]
    fn each_system_has_one_knee_at_its_best_goodput() {
        // Two rates, systems interleaved as an evaluation runs them: standard peaks at the
        // lower rate, hasten at the higher.
        let runs = vec![
            run(0, 0.5, 0.4),
            run(3, 0.5, 0.5),
            run(0, 1.0, 0.1),
            run(3, 1.0, 0.9),
        ];
        let knees = knees(&runs);
        assert_eq!(knees.len(), 2, "{knees:?}");
        assert_eq!((knees[0].offered_qps, knees[0].goodput), (0.5, 0.4));
        assert_eq!((knees[1].offered_qps, knees[1].goodput), (1.0, 0.9));
        assert!((knees[1].vs_baseline.unwrap() - 2.25).abs() < 1e-9);
    }
}
