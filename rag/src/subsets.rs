//! Document subsets for the drafts: one document from every cluster (multi-perspective
//! sampling), or k documents drawn from all of them (the ablation without clustering).
//!
//! Subsets are distinct while the space of subsets allows: a small space is enumerated and
//! shuffled, a large one sampled with rejection. Each subset lists its documents in
//! ascending index (retrieval rank) order.

use std::collections::HashSet;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Spaces up to this many subsets are enumerated (exactly distinct); larger ones are
/// sampled, where a repeat is unlikely anyway.
const ENUMERATION_LIMIT: usize = 4096;
/// Draws per wanted subset before rejection sampling accepts repeats.
const ATTEMPTS_PER_SUBSET: usize = 32;

/// `m` subsets, each holding one document from every cluster.
pub fn one_per_cluster(clusters: &[Vec<usize>], m: usize, rng: &mut StdRng) -> Vec<Vec<usize>> {
    if clusters.is_empty() || clusters.iter().any(Vec::is_empty) {
        return Vec::new();
    }
    let total = clusters
        .iter()
        .try_fold(1usize, |acc, c| acc.checked_mul(c.len()));
    let draw = |rng: &mut StdRng| -> Vec<usize> {
        clusters
            .iter()
            .map(|c| c[rng.random_range(0..c.len())])
            .collect()
    };
    match total {
        Some(total) if total <= ENUMERATION_LIMIT => {
            let all = (0..total)
                .map(|mut index| {
                    // Mixed-radix digits of `index`: one choice per cluster.
                    clusters
                        .iter()
                        .map(|c| {
                            let pick = c[index % c.len()];
                            index /= c.len();
                            pick
                        })
                        .collect()
                })
                .collect();
            shuffled_cycle(all, m, rng)
        }
        _ => rejection(m, rng, draw),
    }
}

/// `m` subsets of `size` documents out of `n`, ignoring clusters: the paper's "random
/// sampling without clustering" ablation.
pub fn without_clustering(n: usize, size: usize, m: usize, rng: &mut StdRng) -> Vec<Vec<usize>> {
    if size == 0 || size > n {
        return Vec::new();
    }
    let draw = |rng: &mut StdRng| rand::seq::index::sample(rng, n, size).into_vec();
    match binomial(n, size) {
        Some(total) if total <= ENUMERATION_LIMIT => shuffled_cycle(combinations(n, size), m, rng),
        _ => rejection(m, rng, draw),
    }
}

/// True when `subset` holds exactly one member of every cluster (`assignments[i]` is the
/// cluster of document i): the property multi-perspective sampling guarantees.
pub fn covers_each_cluster_once(subset: &[usize], assignments: &[usize], clusters: usize) -> bool {
    let mut seen = vec![0usize; clusters];
    for &document in subset {
        match assignments.get(document).and_then(|&c| seen.get_mut(c)) {
            Some(count) => *count += 1,
            None => return false,
        }
    }
    seen.iter().all(|&count| count == 1)
}

/// Every subset once in a seeded random order, then again (only when m exceeds them all).
fn shuffled_cycle(mut all: Vec<Vec<usize>>, m: usize, rng: &mut StdRng) -> Vec<Vec<usize>> {
    all.shuffle(rng);
    all.iter_mut().for_each(|s| s.sort_unstable());
    all.iter().cycle().take(m).cloned().collect()
}

fn rejection(
    m: usize,
    rng: &mut StdRng,
    mut draw: impl FnMut(&mut StdRng) -> Vec<usize>,
) -> Vec<Vec<usize>> {
    let mut seen = HashSet::new();
    let mut subsets = Vec::with_capacity(m);
    let mut attempts = 0;
    while subsets.len() < m {
        let mut subset = draw(rng);
        subset.sort_unstable();
        attempts += 1;
        if seen.insert(subset.clone()) || attempts > m * ATTEMPTS_PER_SUBSET {
            subsets.push(subset);
        }
    }
    subsets
}

/// All `size`-element subsets of 0..n in lexicographic order.
fn combinations(n: usize, size: usize) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    let mut current: Vec<usize> = (0..size).collect();
    loop {
        all.push(current.clone());
        // The rightmost position that can still move right.
        let Some(i) = (0..size).rev().find(|&i| current[i] < n - size + i) else {
            return all;
        };
        current[i] += 1;
        for j in i + 1..size {
            current[j] = current[j - 1] + 1;
        }
    }
}

/// n choose k, or None past usize.
fn binomial(n: usize, k: usize) -> Option<usize> {
    let k = k.min(n - k);
    (0..k).try_fold(1usize, |acc, i| acc.checked_mul(n - i).map(|v| v / (i + 1)))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn combinations_and_binomials_agree() {
        for n in 1..8 {
            for k in 1..=n {
                let all = combinations(n, k);
                assert_eq!(Some(all.len()), binomial(n, k), "{n} choose {k}");
                assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len());
            }
        }
    }

    #[test]
    fn subsets_are_distinct_while_possible_then_repeat() {
        let mut rng = StdRng::seed_from_u64(3);
        let clusters = vec![vec![0, 1], vec![2, 3]];
        let subsets = one_per_cluster(&clusters, 6, &mut rng);
        assert_eq!(subsets.len(), 6);
        let distinct: HashSet<_> = subsets.iter().take(4).collect();
        assert_eq!(distinct.len(), 4, "{subsets:?}");
    }

    #[test]
    fn large_spaces_are_sampled_distinct() {
        let mut rng = StdRng::seed_from_u64(4);
        let clusters: Vec<Vec<usize>> = (0..6).map(|c| (c * 10..c * 10 + 10).collect()).collect();
        let subsets = one_per_cluster(&clusters, 16, &mut rng);
        let assignments: Vec<usize> = (0..60).map(|i| i / 10).collect();
        assert!(
            subsets
                .iter()
                .all(|s| covers_each_cluster_once(s, &assignments, 6))
        );
        assert_eq!(subsets.iter().collect::<HashSet<_>>().len(), 16);
        let random = without_clustering(60, 6, 16, &mut rng);
        assert!(random.iter().all(|s| s.len() == 6));
        assert_eq!(random.iter().collect::<HashSet<_>>().len(), 16);
    }
}
