//! Random and clustered unit vectors, and a brute-force top-k, for the index tests.

use crate::vector::dot;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub(super) fn unit_vectors(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * d);
    for _ in 0..n {
        let v: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let norm = dot(&v, &v).sqrt();
        out.extend(v.iter().map(|x| x / norm));
    }
    out
}

pub(super) fn brute_force(vectors: &[f32], d: usize, query: &[f32], k: usize) -> Vec<u64> {
    let mut scored: Vec<(u64, f32)> = vectors
        .chunks(d)
        .enumerate()
        .map(|(i, v)| (i as u64, dot(v, query)))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.into_iter().take(k).map(|(id, _)| id).collect()
}

/// Unit vectors around `topics` random centres, as text embeddings cluster by topic.
pub(super) fn clustered_vectors(n: usize, d: usize, topics: usize, seed: u64) -> Vec<f32> {
    let centres = unit_vectors(topics, d, seed);
    let noise = unit_vectors(n, d, seed + 1);
    let mut out = Vec::with_capacity(n * d);
    for (i, jitter) in noise.chunks(d).enumerate() {
        let centre = &centres[(i % topics) * d..][..d];
        let v: Vec<f32> = centre
            .iter()
            .zip(jitter)
            .map(|(c, j)| c + 0.6 * j)
            .collect();
        let norm = dot(&v, &v).sqrt();
        out.extend(v.iter().map(|x| x / norm));
    }
    out
}
