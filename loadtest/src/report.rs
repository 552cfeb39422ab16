//! The evaluation report: `report.json` (machine-readable), `report.md` (the HaS paper's
//! table layout, each system against cloud-only) and SVG plots (latency/accuracy Pareto
//! front of the threshold sweeps, latency CDF per system).

use display_full_error::DisplayFullErrorExt;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::draft_loss::{self, DraftLosses, TracedQueries, draft_losses};
use crate::scoring::{FallbackBreakdown, Summary, pair_with_baseline};

/// What an edge's status says of its documents at the end of a run: held (its share of the
/// corpus plus those attached to cached entries), fetched by id from the cloud since it
/// started (per tenant cache that references them), and still waiting to be fetched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EdgeDocuments {
    pub held: u64,
    pub fetched: u64,
    pub pending: u64,
}

impl EdgeDocuments {
    /// Reads an edge's `/v1/status` reply; `None` when it has no document fields.
    pub fn from_status(status: &serde_json::Value) -> Option<Self> {
        Some(Self {
            held: status["held_documents"].as_u64()?,
            fetched: status["fetched_documents"].as_u64()?,
            pending: status["pending_documents"].as_u64()?,
        })
    }
}

impl std::ops::Add for EdgeDocuments {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            held: self.held + other.held,
            fetched: self.fetched + other.fetched,
            pending: self.pending + other.pending,
        }
    }
}

/// One system at one parameter setting.
#[derive(Clone, Debug, Serialize)]
pub struct SystemReport {
    pub name: String,
    pub params: serde_json::Value,
    pub queries: usize,
    pub errors: usize,
    pub accepted: usize,
    pub fallback: usize,
    pub avg_latency_s: f64,
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    pub throughput_qps: f64,
    pub dar: f64,
    /// Accepted through a query another edge fell back on (replicated edges).
    pub cross_edge_accepted: usize,
    /// `null` when nothing was accepted.
    pub car: Option<f64>,
    pub doc_hit_rate: f64,
    pub doc_hit_rate_at_da: Option<f64>,
    pub latency_at_da_s: Option<f64>,
    pub latency_at_dr_s: Option<f64>,
    /// Where fallbacks spent their time (see [`FallbackBreakdown`]).
    pub fallback_breakdown: Option<FallbackBreakdown>,
    pub gold_recall_at_k: f64,
    /// Against cloud-only on the same queries (see [`Summary::paired_dhr_drop`]).
    pub paired_dhr_drop: Option<f64>,
    /// The same figures over first occurrences (texts no earlier query asked).
    pub first_occurrence: Summary,
    /// Per-query hits of the whole run, for pairing.
    #[serde(skip)]
    pub all: Summary,
    pub cached_queries: usize,
    pub cache_bytes: usize,
    /// `null` when nothing was cached.
    pub cache_bytes_per_1000_entries: Option<f64>,
    pub edge_rss_bytes: Option<u64>,
    /// Documents the edges hold and fetched from the cloud by id, summed over the edges
    /// (`null` when none reported them).
    pub edge_documents: Option<EdgeDocuments>,
    /// Sorted latencies (seconds) for the CDF plot; not serialised.
    #[serde(skip)]
    pub latencies_s: Vec<f64>,
    /// Where accepted drafts lost the gold passage, against cloud-only (first
    /// occurrences; `null` without draft traces or a cloud-only run).
    pub draft_losses: Option<DraftLosses>,
    /// Each answered first occurrence, for the breakdown; not serialised.
    #[serde(skip)]
    pub traced: TracedQueries,
}

impl SystemReport {
    pub fn new(
        name: &str,
        params: serde_json::Value,
        summary: Summary,
        first_occurrence: Summary,
        throughput_qps: f64,
    ) -> Self {
        Self {
            name: name.to_string(),
            params,
            queries: summary.queries,
            errors: summary.errors,
            accepted: summary.accepted,
            fallback: summary.fallback,
            avg_latency_s: summary.avg_latency_s,
            p50_s: summary.p50_s,
            p95_s: summary.p95_s,
            p99_s: summary.p99_s,
            max_s: summary.max_s,
            throughput_qps,
            dar: summary.dar,
            cross_edge_accepted: summary.cross_edge_accepted,
            car: summary.car,
            doc_hit_rate: summary.doc_hit_rate,
            doc_hit_rate_at_da: summary.doc_hit_rate_at_da,
            latency_at_da_s: summary.latency_at_da_s,
            latency_at_dr_s: summary.latency_at_dr_s,
            fallback_breakdown: summary.fallback_breakdown,
            gold_recall_at_k: summary.gold_recall_at_k,
            paired_dhr_drop: None,
            first_occurrence,
            all: summary,
            cached_queries: 0,
            cache_bytes: 0,
            cache_bytes_per_1000_entries: None,
            edge_rss_bytes: None,
            edge_documents: None,
            latencies_s: Vec::new(),
            draft_losses: None,
            traced: TracedQueries::new(),
        }
    }

    /// `name` plus its swept parameter, e.g. `has tau=0.2`.
    pub fn label(&self) -> String {
        match self.params.as_object() {
            Some(params) if !params.is_empty() => {
                let parts: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{} {}", self.name, parts.join(" "))
            }
            _ => self.name.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub workload: serde_json::Value,
    pub systems: Vec<SystemReport>,
}

fn change(value: f64, baseline: f64) -> String {
    if baseline == 0.0 {
        "-".into()
    } else {
        format!("{:+.2}%", 100.0 * (value - baseline) / baseline)
    }
}

fn fmt_opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "-".into(), f)
}

impl Report {
    pub fn baseline(&self) -> Option<&SystemReport> {
        self.systems.iter().find(|s| s.name == "cloud-only")
    }

    /// Fills every system's paired DHR drop (all queries and first occurrences) and its
    /// draft losses against cloud-only's run; nothing without one.
    pub fn pair_with_baseline(&mut self) {
        let Some(baseline) = self.baseline().cloned() else {
            return;
        };
        for system in &mut self.systems {
            pair_with_baseline(&mut system.all, &baseline.all);
            system.paired_dhr_drop = system.all.paired_dhr_drop;
            pair_with_baseline(&mut system.first_occurrence, &baseline.first_occurrence);
            system.draft_losses = draft_losses(&system.traced, &baseline.traced);
        }
    }

    /// The paper's table: each system's values, then its change against cloud-only.
    pub fn markdown(&self) -> String {
        let mut out = String::from("# Hasten evaluation\n\n");
        out.push_str(&format!(
            "Workload: `{}`\n\n",
            serde_json::to_string(&self.workload).unwrap_or_default()
        ));
        out.push_str(
            "| system | AvgL (s) | Doc. hit rate | gold R@k | DAR | x-edge | CAR | DHR@DA | L@DA (s) | L@DR (s) | p50 (s) | p95 (s) | p99 (s) | max (s) | q/s | cache MB / 1k entries | edge RSS (MB) |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let baseline = self.baseline();
        for s in &self.systems {
            out.push_str(&format!(
                "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.1} | {} | {} |\n",
                s.label(),
                s.avg_latency_s,
                s.doc_hit_rate,
                s.gold_recall_at_k,
                s.dar,
                s.cross_edge_accepted,
                fmt_opt(s.car, |v| format!("{v:.4}")),
                fmt_opt(s.doc_hit_rate_at_da, |v| format!("{v:.4}")),
                fmt_opt(s.latency_at_da_s, |v| format!("{v:.4}")),
                fmt_opt(s.latency_at_dr_s, |v| format!("{v:.4}")),
                s.p50_s,
                s.p95_s,
                s.p99_s,
                s.max_s,
                s.throughput_qps,
                fmt_opt(s.cache_bytes_per_1000_entries, |v| format!("{:.2}", v / 1e6)),
                s.edge_rss_bytes.map_or_else(|| "-".into(), |b| format!("{:.0}", b as f64 / 1e6)),
            ));
            if let Some(b) = baseline.filter(|b| b.name != s.name) {
                out.push_str(&format!(
                    "| | {} | {:+.2} pt | {:+.2} pt | | | | | | | {} | {} | {} | | | | |\n",
                    change(s.avg_latency_s, b.avg_latency_s),
                    100.0 * (s.doc_hit_rate - b.doc_hit_rate),
                    100.0 * (s.gold_recall_at_k - b.gold_recall_at_k),
                    change(s.p50_s, b.p50_s),
                    change(s.p95_s, b.p95_s),
                    change(s.p99_s, b.p99_s),
                ));
            }
        }
        out.push_str(
            "\nAvgL: mean latency seen by the client, network included. DAR: drafts accepted \
             (for caches: hits). x-edge: drafts accepted through a query that fell back on \
             another edge of the system (replication at work). CAR: accepted drafts validated by a query about the same \
             entity. DHR@DA: hit rate of accepted drafts. gold R@k: a returned passage is the \
             question's own (SQuAD: its paragraph; else a passage of the subject's article \
             holding an answer). Second rows: change against cloud-only (latency in %, rates \
             in points).\n",
        );
        out.push_str(&self.first_occurrence_markdown());
        out.push_str(&self.fallback_markdown());
        out.push_str(&self.documents_markdown());
        out.push_str(&self.draft_loss_markdown());
        out
    }

    /// Where each HaS run's accepted drafts lost the gold passage.
    fn draft_loss_markdown(&self) -> String {
        let tables: String = self
            .systems
            .iter()
            .filter_map(|s| Some(draft_loss::markdown(&s.label(), s.draft_losses.as_ref()?)))
            .collect();
        if tables.is_empty() {
            return tables;
        }
        format!(
            "\n## Where accepted drafts lose the gold passage (first occurrences, against cloud-only)\n\n\
             Accepted drafts by the cached query that validated them; of those without a gold \
             passage, whether cloud-only's answer to the same query held one and, if so, \
             whether a channel found it (the exact re-rank then cut it) or none did, and whether \
             the validating query's cached result held it.\n{tables}"
        )
    }

    /// The headline table: first occurrences only, with the paired drop against cloud-only.
    fn first_occurrence_markdown(&self) -> String {
        let chance = self.workload["stats"]["same_entity_chance"].as_f64();
        let mut out = String::from(
            "\n## First occurrences (query texts no earlier query asked)\n\n\
             | system | queries | AvgL (s) | vs cloud-only | DHR | paired DHR drop (pt) | gold R@k | DAR | CAR | DHR@DA | L@DA (s) | L@DR (s) | p99 (s) |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let baseline = self.baseline().map(|b| &b.first_occurrence);
        for s in &self.systems {
            let f = &s.first_occurrence;
            out.push_str(&format!(
                "| {} | {} | {:.4} | {} | {:.4} | {} | {:.4} | {:.4} | {} | {} | {} | {} | {:.4} |\n",
                s.label(),
                f.queries,
                f.avg_latency_s,
                baseline.map_or_else(|| "-".into(), |b| change(f.avg_latency_s, b.avg_latency_s)),
                f.doc_hit_rate,
                fmt_opt(f.paired_dhr_drop, |v| format!("{:+.2}", 100.0 * v)),
                f.gold_recall_at_k,
                f.dar,
                fmt_opt(f.car, |v| format!("{v:.4}")),
                fmt_opt(f.doc_hit_rate_at_da, |v| format!("{v:.4}")),
                fmt_opt(f.latency_at_da_s, |v| format!("{v:.4}")),
                fmt_opt(f.latency_at_dr_s, |v| format!("{v:.4}")),
                f.p99_s,
            ));
        }
        out.push_str(&format!(
            "\nCAR chance level (two queries of the workload about one entity): {}.\n",
            fmt_opt(chance, |v| format!("{v:.4}"))
        ));
        out
    }

    /// Where fallbacks spent their time, for every system that fell back with timings.
    fn fallback_markdown(&self) -> String {
        let rows = self.systems.iter().filter_map(|s| {
            let b = s.fallback_breakdown.as_ref()?;
            Some(format!(
                "| {} | {} | {} | {:.4} | {:.4} | {:.4} | {:.4} |\n",
                s.label(),
                b.fallbacks,
                fmt_opt(s.latency_at_dr_s, |v| format!("{v:.4}")),
                b.edge_s,
                b.cloud_s,
                b.cache_update_s,
                b.outside_edge_s,
            ))
        });
        section(
            "\n## Where fallbacks spend their time (means over fallbacks, seconds)\n\n\
             | system | fallbacks | L@DR | at the edge | of which the cloud call | of which the cache update | outside the edge |\n\
             |---|---|---|---|---|---|---|\n",
            rows,
            "\nAt the edge: the edge's own handling, as its replies report it. Outside the \
             edge: the client's latency less that (the client-edge network and any wait before \
             the edge's handler).\n",
        )
    }

    /// Documents fetched by id, for every system whose edges fetched any.
    fn documents_markdown(&self) -> String {
        let rows = self.systems.iter().filter_map(|s| {
            let d = s.edge_documents.filter(|d| d.fetched + d.pending > 0)?;
            Some(format!(
                "| {} | {} | {} | {} |\n",
                s.label(),
                d.held,
                d.fetched,
                d.pending
            ))
        });
        section(
            "\n## Documents by id (summed over the edges, at the end of the run)\n\n\
             | system | held | fetched from the cloud | still pending |\n|---|---|---|---|\n",
            rows,
            "\nAn edge that holds a share of the corpus fetches the documents of replicated \
             entries outside its share by id; they stay while an entry references them.\n",
        )
    }

    /// Writes report.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string_full())?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string_full())?;
        std::fs::write(dir.join("report.json"), json).map_err(|e| e.to_string_full())?;
        std::fs::write(dir.join("report.md"), self.markdown()).map_err(|e| e.to_string_full())?;
        self.pareto_plot(&dir.join("pareto.svg"))?;
        self.cdf_plot(&dir.join("latency-cdf.svg"))?;
        Ok(())
    }

    /// Average latency against document hit rate: one line per swept system, points for
    /// the rest. Up and to the left is better.
    fn pareto_plot(&self, path: &Path) -> Result<(), String> {
        let mut names: Vec<&str> = self.systems.iter().map(|s| s.name.as_str()).collect();
        names.dedup();
        let lines: Vec<(String, Vec<(f64, f64)>)> = names
            .iter()
            .map(|name| {
                let points = self
                    .systems
                    .iter()
                    .filter(|s| s.name == *name)
                    .map(|s| (s.avg_latency_s, s.doc_hit_rate))
                    .collect();
                (name.to_string(), points)
            })
            .collect();
        let (lo_x, hi_x) = bounds(self.systems.iter().map(|s| s.avg_latency_s));
        let (lo_y, hi_y) = bounds(self.systems.iter().map(|s| s.doc_hit_rate));
        let axes = Axes {
            caption: "Latency / accuracy: threshold sweeps",
            x: ("average latency (s)", lo_x..hi_x),
            y: ("document hit rate", lo_y..hi_y),
        };
        line_plot(path, &axes, &lines)
    }

    /// Cumulative distribution of latency per system.
    fn cdf_plot(&self, path: &Path) -> Result<(), String> {
        let series: Vec<(String, &[f64])> = self
            .systems
            .iter()
            .map(|s| (s.label(), s.latencies_s.as_slice()))
            .collect();
        cdf_plot(
            path,
            "Latency CDF",
            "latency (s)",
            "share of queries",
            &series,
        )
    }
}

/// A chart's caption and its axes' descriptions and ranges.
pub(crate) struct Axes<'a> {
    pub caption: &'a str,
    pub x: (&'a str, std::ops::Range<f64>),
    pub y: (&'a str, std::ops::Range<f64>),
}

/// One line with its points marked per `(label, points)`, points sorted by x.
pub(crate) fn line_plot(
    path: &Path,
    axes: &Axes<'_>,
    lines: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string_full())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(axes.caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(axes.x.1.clone(), axes.y.1.clone())
        .map_err(|e| e.to_string_full())?;
    chart
        .configure_mesh()
        .x_desc(axes.x.0)
        .y_desc(axes.y.0)
        .draw()
        .map_err(|e| e.to_string_full())?;
    for (i, (label, points)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut points = points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string_full())?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string_full())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string_full())?;
    root.present().map_err(|e| e.to_string_full())
}

/// The cumulative distribution of each `(label, ascending values)`.
pub(crate) fn cdf_plot(
    path: &Path,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, &[f64])],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string_full())?;
    let (_, hi_x) = bounds(
        series
            .iter()
            .filter_map(|(_, values)| values.last().copied()),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..hi_x, 0.0..1.0)
        .map_err(|e| e.to_string_full())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string_full())?;
    for (i, (label, values)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let n = values.len().max(1) as f64;
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(j, &v)| (v, (j + 1) as f64 / n))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string_full())?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string_full())?;
    root.present().map_err(|e| e.to_string_full())
}

/// A plotting range around `values` with 5% margins (a unit range when empty or flat).
pub(crate) fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-3);
    ((lo - pad).max(0.0), hi + pad)
}

/// A markdown table under `head`, followed by `foot`; nothing when it has no rows.
fn section(head: &str, rows: impl Iterator<Item = String>, foot: &str) -> String {
    let rows: String = rows.collect();
    if rows.is_empty() {
        String::new()
    } else {
        format!("{head}{rows}{foot}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn system(name: &str, params: serde_json::Value, latency: f64, dhr: f64) -> SystemReport {
        // Ten queries; the first round(10 * dhr) hit, the first five are first occurrences.
        let hits: BTreeMap<usize, bool> = (0..10)
            .map(|seq| (seq, (seq as f64) < (10.0 * dhr).round()))
            .collect();
        let summary = Summary {
            queries: 10,
            avg_latency_s: latency,
            doc_hit_rate: dhr,
            hits: hits.clone(),
            ..Summary::default()
        };
        let first = Summary {
            queries: 5,
            avg_latency_s: latency * 2.0,
            hits: hits.into_iter().take(5).collect(),
            ..summary.clone()
        };
        let mut s = SystemReport::new(name, params, summary, first, 5.0);
        s.latencies_s = vec![latency / 2.0, latency, latency * 2.0];
        s
    }

    #[test]
    fn markdown_compares_each_system_with_cloud_only_and_files_are_written() {
        let mut report = Report {
            workload: serde_json::json!({"queries": 10, "stats": {"same_entity_chance": 0.125}}),
            systems: vec![
                system("cloud-only", serde_json::json!({}), 0.2, 0.9),
                system("has", serde_json::json!({"tau": 0.2}), 0.1, 0.7),
                system("has", serde_json::json!({"tau": 0.4}), 0.15, 0.9),
            ],
        };
        report.pair_with_baseline();
        // tau 0.2 misses queries 7 and 8 that cloud-only hits; none of the first five.
        assert_eq!(report.systems[1].paired_dhr_drop, Some(0.2));
        assert_eq!(
            report.systems[1].first_occurrence.paired_dhr_drop,
            Some(0.0)
        );
        assert_eq!(report.systems[2].paired_dhr_drop, Some(0.0));
        let md = report.markdown();
        assert!(md.contains("| has tau=0.2 | 0.1000 | 0.7000"), "{md}");
        assert!(md.contains("-50.00%") && md.contains("-20.00 pt"), "{md}");
        assert!(
            md.contains("| has tau=0.2 | 5 | 0.2000 | -50.00% | 0.7000 | +0.00 |"),
            "{md}"
        );
        assert!(
            md.contains("CAR chance level (two queries of the workload about one entity): 0.1250"),
            "{md}"
        );
        assert!(!md.contains("Where fallbacks"), "{md}");
        report.systems[0].fallback_breakdown = Some(FallbackBreakdown {
            fallbacks: 3,
            edge_s: 0.05,
            cloud_s: 0.04,
            cache_update_s: 0.001,
            outside_edge_s: 0.15,
        });
        report.systems[0].latency_at_dr_s = Some(0.2);
        let md = report.markdown();
        assert!(
            md.contains("| cloud-only | 3 | 0.2000 | 0.0500 | 0.0400 | 0.0010 | 0.1500 |"),
            "{md}"
        );
        let dir = tempfile::tempdir().unwrap();
        report.write(dir.path()).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
                .unwrap();
        assert_eq!(json["systems"][1]["name"], "has");
        assert!(json["systems"][0]["car"].is_null());
        assert_eq!(json["systems"][1]["paired_dhr_drop"], 0.2);
        assert_eq!(json["systems"][1]["first_occurrence"]["queries"], 5);
        assert!(json["systems"][1]["first_occurrence"].get("hits").is_none());
        for plot in ["pareto.svg", "latency-cdf.svg"] {
            let svg = std::fs::read_to_string(dir.path().join(plot)).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains("has"), "{plot}");
        }
    }

    #[test]
    fn documents_fetched_by_id_are_summed_over_edges_and_shown_only_when_fetched() {
        let status = |held: u64, fetched: u64, pending: u64| {
            serde_json::json!({"cached_queries": 3, "held_documents": held,
                "fetched_documents": fetched, "pending_documents": pending})
        };
        let a = EdgeDocuments::from_status(&status(100, 7, 1)).unwrap();
        let b = EdgeDocuments::from_status(&status(120, 0, 0)).unwrap();
        assert_eq!(
            a + b,
            EdgeDocuments {
                held: 220,
                fetched: 7,
                pending: 1
            }
        );
        assert_eq!(
            EdgeDocuments::from_status(&serde_json::json!({"cached_queries": 3})),
            None
        );
        let mut report = Report {
            workload: serde_json::json!({"queries": 10}),
            systems: vec![
                system(
                    "has-replicated",
                    serde_json::json!({"corpus_fraction": 1.0}),
                    0.1,
                    0.7,
                ),
                system(
                    "has-replicated",
                    serde_json::json!({"corpus_fraction": 0.1}),
                    0.1,
                    0.7,
                ),
            ],
        };
        report.systems[0].edge_documents = Some(b);
        assert!(!report.markdown().contains("Documents by id"));
        report.systems[1].edge_documents = Some(a + b);
        let md = report.markdown();
        assert!(
            md.contains("| has-replicated corpus_fraction=0.1 | 220 | 7 | 1 |"),
            "{md}"
        );
        assert!(!md.contains("corpus_fraction=1 | 120"), "{md}");
    }
}
