//! What the KV-worker benchmarks share: HotpotQA questions over their own paragraphs as chunk
//! ids of a bundle, request streams drawn day by day from a popularity model, the default
//! model file and percentiles.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hasten_core::bundle::CorpusBundle;
use hasten_loadtest::popularity::DailyPopularity;
use rand::SeedableRng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;

use crate::questions::Question;

/// Each question's paragraphs as ids of `bundle`'s documents (by title: a HotpotQA title
/// names one paragraph).
pub fn chunk_ids(questions: &[Question], bundle: &CorpusBundle) -> Result<Vec<Vec<u64>>> {
    let by_title: HashMap<&str, u64> = bundle
        .documents
        .iter()
        .map(|d| (d.title.as_str(), d.id))
        .collect();
    questions
        .iter()
        .map(|q| {
            q.documents
                .iter()
                .map(|d| {
                    by_title
                        .get(d.title.as_str())
                        .copied()
                        .with_context(|| format!("paragraph `{}` is not in the bundle", d.title))
                })
                .collect()
        })
        .collect()
}

/// `requests` entity indexes drawn by each day's weights, the same number each day, seeded.
pub fn draw_stream(popularity: &DailyPopularity, requests: usize, seed: u64) -> Result<Vec<usize>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let per_day = requests.div_ceil(popularity.days.len().max(1));
    let mut stream = Vec::with_capacity(requests);
    for day in &popularity.days {
        let weights = WeightedIndex::new(day.iter().map(|(_, w)| *w))?;
        for _ in 0..per_day.min(requests - stream.len()) {
            stream.push(day[weights.sample(&mut rng)].0);
        }
    }
    Ok(stream)
}

/// `model`, or SmolLM2-135M-Instruct under `$HASTEN_LM_DIR`.
pub fn model_path(model: Option<&Path>) -> Result<PathBuf> {
    match model {
        Some(path) => Ok(path.to_path_buf()),
        None => Ok(PathBuf::from(std::env::var_os("HASTEN_LM_DIR").context(
            "--model not given and HASTEN_LM_DIR unset: point either at the GGUF model",
        )?)
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")),
    }
}

/// The `q` quantile of ascending `sorted` (nearest rank); NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}
