//! Rendezvous assignment of chunks to KV workers: scaling moves only what it must, about
//! 1/(n+1) of the chunks on scale-up, only the leaving worker's on scale-down; and routing
//! sends a request to the worker owning most of its chunks. A modulo assignment, the naive
//! alternative, is shown to fail the same bound.
#![allow(clippy::unwrap_used)]

use hasten_worker_api::kv::routing::{owner, route};
use proptest::prelude::*;

fn workers(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("kv-worker-{i}.kv-pool:7510"))
        .collect()
}

/// Share of `chunks` whose owner differs between the two worker lists (by name).
fn moved(
    before: &[String],
    after: &[String],
    chunks: &[u64],
    assign: impl Fn(&[String], u64) -> usize,
) -> f64 {
    let changed = chunks
        .iter()
        .filter(|&&c| before[assign(before, c)] != after[assign(after, c)])
        .count();
    changed as f64 / chunks.len() as f64
}

proptest! {
    #[test]
    fn scaling_up_moves_about_one_in_n_plus_one_and_only_to_the_new_worker(
        n in 1usize..8,
        seed in any::<u64>(),
    ) {
        let chunks: Vec<u64> = (0..4000u64).map(|i| i.wrapping_mul(seed | 1).wrapping_add(seed)).collect();
        let (before, after) = (workers(n), workers(n + 1));
        for &c in &chunks {
            let (was, now) = (owner(&before, c).unwrap(), owner(&after, c).unwrap());
            prop_assert!(was == now || now == n, "chunk {} moved between old workers", c);
        }
        let share = moved(&before, &after, &chunks, |w, c| owner(w, c).unwrap());
        let expected = 1.0 / (n + 1) as f64;
        prop_assert!((share - expected).abs() < 0.04, "moved {share:.3}, expected about {expected:.3}");
    }

    #[test]
    fn a_worker_leaving_hands_on_only_its_own_chunks(n in 2usize..8, leaving in 0usize..8, seed in any::<u64>()) {
        let leaving = leaving % n;
        let before = workers(n);
        let mut after = before.clone();
        after.remove(leaving);
        for c in (0..2000u64).map(|i| i ^ seed) {
            let was = &before[owner(&before, c).unwrap()];
            let now = &after[owner(&after, c).unwrap()];
            prop_assert!(was == now || *was == before[leaving]);
        }
    }
}

#[test]
fn a_modulo_assignment_moves_far_more_than_one_in_n_plus_one() {
    let chunks: Vec<u64> = (0..4000).collect();
    let modulo = |w: &[String], c: u64| (c % w.len() as u64) as usize;
    // From 4 to 5 workers, c % n keeps a chunk only when c % 4 == c % 5: 1 in 5 stay.
    let share = moved(&workers(4), &workers(5), &chunks, modulo);
    assert!(share > 0.75, "{share}");
}

#[test]
fn a_request_goes_first_to_the_worker_owning_most_of_its_chunks() {
    let pool = workers(4);
    let owned_by = |w: usize| -> Vec<u64> {
        (0..)
            .filter(|&c| owner(&pool, c) == Some(w))
            .take(3)
            .collect()
    };
    // Three chunks of worker 2, one of worker 0.
    let mut chunks = owned_by(2);
    chunks.push(owned_by(0)[0]);
    let order = route(&pool, &chunks);
    assert_eq!(order[0], 2);
    assert_eq!(order[1], 0);
    assert_eq!(order.len(), 4, "every worker stays a fallback");
    // Balanced: chunks spread over the workers about evenly.
    let mut counts = [0usize; 4];
    for c in 0..8000u64 {
        counts[owner(&pool, c).unwrap()] += 1;
    }
    assert!(
        counts.iter().all(|&n| (1700..2300).contains(&n)),
        "{counts:?}"
    );
}
