//! Multi-perspective sampling: k-means finds the clusters, and every subset takes exactly one
//! document from each.
#![allow(clippy::expect_used)]

#[path = "../../lm/tests/support/mod.rs"]
mod support;

mod common;

use hasten_rag::cluster::kmeans;
use hasten_rag::speculative::document_subsets;
use hasten_rag::subsets::covers_each_cluster_once;
use hasten_rag::{AnswerMode, AnswerRequest, SpeculativeSettings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn request(clustering: bool, drafts: usize, seed: u64) -> AnswerRequest {
    AnswerRequest {
        mode: AnswerMode::Speculative,
        speculative: SpeculativeSettings {
            drafts,
            clusters: 2,
            clustering,
            seed,
            ..SpeculativeSettings::default()
        },
        ..AnswerRequest::new("Which river is longest?", common::clustered_documents())
    }
}

/// The documents' true clusters: even indices are rivers, odd ones mountains.
fn true_assignments() -> Vec<usize> {
    (0..6).map(|i| i % 2).collect()
}

#[test]
fn every_subset_holds_exactly_one_document_from_each_cluster() {
    for seed in 0..8 {
        let subsets = document_subsets(&request(true, 5, seed)).expect("subsets");
        assert_eq!(subsets.len(), 5);
        for subset in &subsets {
            assert!(
                covers_each_cluster_once(subset, &true_assignments(), 2),
                "seed {seed}: {subset:?} of {subsets:?}"
            );
        }
        // 3 x 3 = 9 possible subsets: 5 can all be different.
        let distinct: std::collections::HashSet<_> = subsets.iter().collect();
        assert_eq!(distinct.len(), 5, "seed {seed}: {subsets:?}");
    }
}

#[test]
fn subsets_drawn_without_clustering_fail_the_one_per_cluster_check() {
    // The broken variant (the paper's "random sampling without clustering" ablation): pairs
    // of documents drawn from all six, so some pair two rivers or two mountains.
    for seed in 0..8 {
        let subsets = document_subsets(&request(false, 8, seed)).expect("subsets");
        assert_eq!(subsets.len(), 8);
        assert!(subsets.iter().all(|s| s.len() == 2));
        assert!(
            subsets
                .iter()
                .any(|s| !covers_each_cluster_once(s, &true_assignments(), 2)),
            "seed {seed}: every random subset happened to span both clusters: {subsets:?}"
        );
    }
}

#[test]
fn kmeans_separates_obvious_clusters() {
    // Three tight groups around orthogonal directions in 16 dimensions, shuffled.
    let mut rng = StdRng::seed_from_u64(9);
    let mut vectors = Vec::new();
    let mut truth = Vec::new();
    for i in 0..30 {
        let group = (i * 7) % 3;
        let mut v: Vec<f32> = (0..16).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        v[group * 5] += 1.0;
        vectors.push(v);
        truth.push(group);
    }
    for seed in 0..10 {
        let clustering = kmeans(&vectors, 3, seed).expect("kmeans");
        assert_eq!(clustering.clusters.len(), 3);
        // Same partition up to labels: two points share a cluster exactly when they share
        // a group.
        for a in 0..vectors.len() {
            for b in 0..vectors.len() {
                assert_eq!(
                    clustering.assignments[a] == clustering.assignments[b],
                    truth[a] == truth[b],
                    "seed {seed}: points {a} and {b}"
                );
            }
        }
    }
}

#[test]
fn kmeans_on_the_documents_finds_rivers_and_mountains() {
    let vectors: Vec<Vec<f32>> = common::clustered_documents()
        .into_iter()
        .map(|d| d.vector.expect("vector"))
        .collect();
    let clustering = kmeans(&vectors, 2, 1).expect("kmeans");
    assert_eq!(clustering.clusters, vec![vec![0, 2, 4], vec![1, 3, 5]]);
}
