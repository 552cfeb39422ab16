//! Spherical k-means over document vectors: Speculative RAG's multi-perspective grouping.
//!
//! Cosine similarity on unit vectors, k-means++ seeding from a seeded RNG and ties broken
//! by index, so the same vectors and seed always give the same clusters.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{RagError, Result};

/// Lloyd iterations before giving up on convergence; a few dozen documents settle in a
/// handful.
const MAX_ITERATIONS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clustering {
    /// The cluster of each input vector.
    pub assignments: Vec<usize>,
    /// The members of each cluster in ascending order; clusters are ordered by their first
    /// member, so labels do not depend on the seed's choice of initial centroids.
    pub clusters: Vec<Vec<usize>>,
}

/// Clusters `vectors` into exactly `k` non-empty groups by cosine similarity.
pub fn kmeans(vectors: &[Vec<f32>], k: usize, seed: u64) -> Result<Clustering> {
    let n = vectors.len();
    if k == 0 || k > n {
        return Err(RagError::invalid(
            "speculative.clusters",
            format!("is {k}; it must be between 1 and the number of vectors ({n})"),
        ));
    }
    let dimension = vectors.first().map_or(0, Vec::len);
    if vectors.iter().any(|v| v.len() != dimension) {
        return Err(RagError::invalid(
            "documents",
            "vectors must all have one dimension",
        ));
    }
    let _span = tracing::debug_span!("rag_kmeans", n, k, dimension).entered();
    let points: Vec<Vec<f32>> = vectors.iter().map(|v| unit(v)).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut centroids = seed_centroids(&points, k, &mut rng);
    let mut assignments = vec![usize::MAX; n];
    for _ in 0..MAX_ITERATIONS {
        let mut next: Vec<usize> = points.iter().map(|p| nearest(p, &centroids)).collect();
        fill_empty_clusters(&points, &mut next, &mut centroids);
        if next == assignments {
            break;
        }
        assignments = next;
        for (cluster, centroid) in centroids.iter_mut().enumerate() {
            let mean = mean_of(&points, &assignments, cluster, dimension);
            // A mean of opposite vectors has no direction: keep the old centroid.
            if norm(&mean) > 0.0 {
                *centroid = unit(&mean);
            }
        }
    }
    Ok(relabel(&assignments, k))
}

/// k-means++: the first centroid uniformly, each next one with probability proportional to
/// its squared cosine distance from the nearest centroid chosen so far.
fn seed_centroids(points: &[Vec<f32>], k: usize, rng: &mut StdRng) -> Vec<Vec<f32>> {
    let n = points.len();
    let mut chosen = vec![rng.random_range(0..n)];
    while chosen.len() < k {
        let weights: Vec<f64> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if chosen.contains(&i) {
                    return 0.0;
                }
                let distance = chosen
                    .iter()
                    .map(|&c| (1.0 - dot(p, &points[c])).max(0.0) as f64)
                    .fold(f64::INFINITY, f64::min);
                distance * distance
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let next = if total > 0.0 {
            let mut target = rng.random::<f64>() * total;
            let mut pick = None;
            for (i, w) in weights.iter().enumerate() {
                if *w > 0.0 {
                    pick = Some(i);
                    if target < *w {
                        break;
                    }
                    target -= w;
                }
            }
            pick
        } else {
            None
        };
        // Duplicates only (every distance 0): any point not yet chosen, uniformly.
        let next = next.unwrap_or_else(|| {
            let free: Vec<usize> = (0..n).filter(|i| !chosen.contains(i)).collect();
            free[rng.random_range(0..free.len())]
        });
        chosen.push(next);
    }
    chosen.into_iter().map(|i| points[i].clone()).collect()
}

/// The most similar centroid; the lowest index wins a tie.
fn nearest(point: &[f32], centroids: &[Vec<f32>]) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, centroid) in centroids.iter().enumerate() {
        let similarity = dot(point, centroid);
        if similarity > best.1 {
            best = (i, similarity);
        }
    }
    best.0
}

/// Gives every empty cluster the point least similar to its centroid among clusters with
/// more than one member, so that exactly k clusters come out (every subset then draws from
/// k clusters).
fn fill_empty_clusters(points: &[Vec<f32>], assignments: &mut [usize], centroids: &mut [Vec<f32>]) {
    for cluster in 0..centroids.len() {
        if assignments.contains(&cluster) {
            continue;
        }
        let mut sizes = vec![0usize; centroids.len()];
        for &a in assignments.iter() {
            sizes[a] += 1;
        }
        let farthest = (0..points.len())
            .filter(|&i| sizes[assignments[i]] > 1)
            .min_by(|&a, &b| {
                let sa = dot(&points[a], &centroids[assignments[a]]);
                let sb = dot(&points[b], &centroids[assignments[b]]);
                sa.total_cmp(&sb)
            });
        if let Some(point) = farthest {
            assignments[point] = cluster;
            centroids[cluster] = points[point].clone();
        }
    }
}

fn mean_of(
    points: &[Vec<f32>],
    assignments: &[usize],
    cluster: usize,
    dimension: usize,
) -> Vec<f32> {
    let mut sum = vec![0.0f32; dimension];
    for (point, _) in points
        .iter()
        .zip(assignments)
        .filter(|(_, a)| **a == cluster)
    {
        for (s, x) in sum.iter_mut().zip(point) {
            *s += x;
        }
    }
    sum
}

/// Clusters renumbered by first member, members ascending.
fn relabel(assignments: &[usize], k: usize) -> Clustering {
    let mut order: Vec<usize> = Vec::with_capacity(k);
    for &a in assignments {
        if !order.contains(&a) {
            order.push(a);
        }
    }
    let label = |a: usize| order.iter().position(|&o| o == a).unwrap_or(0);
    let assignments: Vec<usize> = assignments.iter().map(|&a| label(a)).collect();
    let mut clusters = vec![Vec::new(); order.len()];
    for (i, &a) in assignments.iter().enumerate() {
        clusters[a].push(i);
    }
    Clustering {
        assignments,
        clusters,
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(v: &[f32]) -> f32 {
    dot(v, v).sqrt()
}

/// `v` scaled to length 1 (a zero vector stays zero: similar to nothing).
fn unit(v: &[f32]) -> Vec<f32> {
    let n = norm(v);
    if n > 0.0 {
        v.iter().map(|x| x / n).collect()
    } else {
        v.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cluster_is_non_empty_even_with_duplicate_vectors() {
        let vectors = vec![vec![1.0, 0.0]; 4];
        let clustering = kmeans(&vectors, 3, 7).expect("kmeans");
        assert_eq!(clustering.clusters.len(), 3);
        assert!(clustering.clusters.iter().all(|c| !c.is_empty()));
    }

    #[test]
    fn the_same_seed_gives_the_same_clusters() {
        let vectors: Vec<Vec<f32>> = (0..12)
            .map(|i| vec![(i as f32).cos(), (i as f32 * 0.7).sin(), 0.3])
            .collect();
        assert_eq!(
            kmeans(&vectors, 3, 11).expect("a"),
            kmeans(&vectors, 3, 11).expect("b")
        );
    }

    #[test]
    fn k_out_of_range_is_refused() {
        let vectors = vec![vec![1.0, 0.0]; 2];
        assert!(kmeans(&vectors, 0, 0).is_err());
        assert!(kmeans(&vectors, 3, 0).is_err());
    }
}
