//! Shared pieces of Hasten's benchmarks: seeded synthetic data shaped like an embedding
//! corpus, latency percentiles, and the JSON report every benchmark binary leaves.

// Benchmarks take no outside input; a failed set-up should abort loudly.
#![allow(clippy::expect_used)]

pub mod etcd;
pub mod kv_workload;
pub mod latency;
pub mod questions;
pub mod retrieval;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};

/// Unit vectors in `topics` clusters of `per_topic` members: members are the topic centre
/// plus Gaussian noise of standard deviation `spread` per dimension, re-normalised. Row r
/// belongs to topic r / per_topic. Returns (centres, members), row-major.
pub fn clustered_vectors(
    topics: usize,
    per_topic: usize,
    dimension: usize,
    spread: f32,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let unit = Normal::new(0.0f32, 1.0).expect("standard normal");
    let mut centres = Vec::with_capacity(topics * dimension);
    for _ in 0..topics {
        let v: Vec<f32> = (0..dimension).map(|_| unit.sample(&mut rng)).collect();
        centres.extend(normalised(v));
    }
    let mut members = Vec::with_capacity(topics * per_topic * dimension);
    for centre in centres.chunks(dimension) {
        for _ in 0..per_topic {
            let v: Vec<f32> = centre
                .iter()
                .map(|c| c + spread * unit.sample(&mut rng))
                .collect();
            members.extend(normalised(v));
        }
    }
    (centres, members)
}

fn normalised(v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// Microsecond-resolution latency recorder.
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"),
        }
    }
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.histogram
            .saturating_record(d.as_nanos() as u64 / 1_000);
    }

    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The latency at quantile `q` (0..=1), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.histogram.value_at_quantile(q) as f64 / 1_000.0
    }

    /// Adds every latency recorded in `other`.
    pub fn merge(&mut self, other: &Latencies) {
        // Both histograms share the same bounds, so adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
    }

    /// `p50 / p99 / max` in microseconds.
    pub fn summary(&self) -> String {
        format!(
            "n={} p50={}us p99={}us max={}us",
            self.histogram.len(),
            self.histogram.value_at_quantile(0.5),
            self.histogram.value_at_quantile(0.99),
            self.histogram.max()
        )
    }
}

/// Writes `report` to `<work>/report.json` and prints it.
pub fn write_report(work: &Path, report: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    let path = work.join("report.json");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{text}");
    Ok(())
}

/// Writes `report` to `<dir>/report.json`, creating `dir`; returns the file's path. For
/// reports too long to print (per-run records).
pub fn save_report(dir: &Path, report: &serde_json::Value) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The mean of `values`; 0 when there are none.
pub fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    sum / n.max(1) as f64
}

/// A bar over `len` items of work named `what` (hidden when stderr is not a terminal).
pub fn progress_bar(what: &str, len: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} [{{bar:30}}] {{pos}}/{{len}} {{elapsed_precise}} eta {{eta}} {{msg}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}
