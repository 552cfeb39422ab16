//! Sharded exact search in process: shard bundles cut by `write_shards`, each searched by
//! faiss, merged by the router's merge, must equal a brute-force exact search over the whole
//! corpus, ties included; and micro-batched searches must answer exactly what single
//! searches answer.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hasten_cloud_index::ExactSearcher;
use hasten_cloud_index::batcher::{BatchingSettings, MicroBatcher};
use hasten_cloud_index::metrics::{CloudMetrics, Role};
use hasten_cloud_index::router::merge_shard_results;
use hasten_core::bundle::{CorpusBundle, write_shards};
use hasten_core::corpus::Document;
use hasten_proto::v1::{QueryVector, SearchRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIMENSION: usize = 8;

/// Document vectors and queries with four entries of ±0.5 (unit norm exactly, as a bundle's
/// vectors must be, and left exact by the shard's normalisation): every score is a
/// multiple of 0.25, computed exactly in any summation order, and most scores are tied with
/// many others.
fn tied_corpus(n: usize, seed: u64) -> (Vec<Document>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let documents = (0..n as u64)
        .map(|id| Document {
            id,
            title: format!("t{id}"),
            text: format!("passage {id}"),
        })
        .collect();
    let vectors = (0..n).flat_map(|_| tied_vector(&mut rng)).collect();
    (documents, vectors)
}

fn tied_vector(rng: &mut StdRng) -> Vec<f32> {
    let mut q = vec![0.0f32; DIMENSION];
    let mut placed = 0;
    while placed < 4 {
        let i = rng.random_range(0..DIMENSION);
        if q[i] == 0.0 {
            q[i] = if rng.random_bool(0.5) { 0.5 } else { -0.5 };
            placed += 1;
        }
    }
    q
}

/// Exact top-k over everything: score descending, ties by ascending id.
fn brute_force(vectors: &[f32], query: &[f32], k: usize) -> Vec<(u64, f32)> {
    let mut all: Vec<(u64, f32)> = vectors
        .chunks(DIMENSION)
        .enumerate()
        .map(|(id, v)| (id as u64, v.iter().zip(query).map(|(a, b)| a * b).sum()))
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(k);
    all
}

fn request(queries: &[Vec<f32>], k: usize) -> SearchRequest {
    SearchRequest {
        queries: queries
            .iter()
            .map(|q| QueryVector { values: q.clone() })
            .collect(),
        k: k as u32,
        ..Default::default()
    }
}

fn shard_searchers(
    dir: &std::path::Path,
    documents: &[Document],
    vectors: &[f32],
    shards: u32,
) -> Vec<ExactSearcher> {
    let out = dir.join(format!("s{shards}"));
    write_shards(&out, vec![], documents, vectors, DIMENSION, shards).unwrap();
    (0..shards)
        .map(|i| {
            let bundle = CorpusBundle::load(&out.join(format!("shard-{i}"))).unwrap();
            ExactSearcher::new(bundle).unwrap()
        })
        .collect()
}

#[test]
fn merged_shard_answers_equal_the_exact_global_top_k_ties_included() {
    let dir = tempfile::tempdir().unwrap();
    let (documents, vectors) = tied_corpus(700, 11);
    let mut rng = StdRng::seed_from_u64(5);
    // 3 queries take faiss's per-query path, 32 its matrix-product path.
    let batches: Vec<Vec<Vec<f32>>> = [3, 32]
        .iter()
        .map(|&n| (0..n).map(|_| tied_vector(&mut rng)).collect())
        .collect();
    let (mut cases, mut tied_cases) = (0, 0);
    for shards in [1, 2, 3, 5] {
        let searchers = shard_searchers(dir.path(), &documents, &vectors, shards);
        for k in [1, 7, 10, 64] {
            for queries in &batches {
                let req = request(queries, k);
                let answers = searchers
                    .iter()
                    .map(|s| s.search(&req).unwrap().results)
                    .collect();
                let merged = merge_shard_results(answers, queries.len(), k);
                for (query, hits) in queries.iter().zip(&merged) {
                    let got: Vec<(u64, f32)> = hits.hits.iter().map(|h| (h.id, h.score)).collect();
                    let expected = brute_force(&vectors, query, k);
                    let kth = expected[k - 1].1;
                    cases += 1;
                    // Tied past the cut: some document outside the top k scores the k-th score.
                    if brute_force(&vectors, query, k + 1)[k].1 == kth {
                        tied_cases += 1;
                    }
                    assert_eq!(got, expected, "S={shards} k={k} nq={}", queries.len());
                }
            }
        }
    }
    assert!(
        tied_cases * 2 > cases,
        "the data must tie at the cut in most cases to test tie-breaking: {tied_cases} of {cases}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn micro_batched_searches_answer_what_single_searches_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (documents, vectors) = tied_corpus(500, 3);
    let searcher = shard_searchers(dir.path(), &documents, &vectors, 1)
        .pop()
        .unwrap();
    let searcher = Arc::new(searcher);
    let registry = hasten_core::metrics::registry().unwrap();
    let metrics = CloudMetrics::register(&registry, Role::Shard).unwrap();
    let batcher = MicroBatcher::start(
        Arc::clone(&searcher),
        BatchingSettings {
            max_queries: 64,
            max_wait: Duration::from_millis(20),
            queue: 1024,
        },
        metrics.clone(),
    );
    let mut rng = StdRng::seed_from_u64(9);
    let requests: Vec<SearchRequest> = (0..48)
        .map(|i| {
            let queries: Vec<Vec<f32>> = (0..1 + i % 3).map(|_| tied_vector(&mut rng)).collect();
            let mut req = request(&queries, 1 + (i * 7) % 30);
            req.include_texts = i % 2 == 0;
            req.include_vectors = i % 4 == 0;
            req
        })
        .collect();
    let answers = futures::future::join_all(requests.iter().map(|req| {
        let batcher = batcher.clone();
        let prepared = searcher.prepare(req).unwrap();
        async move { batcher.search(prepared, None).await.unwrap() }
    }))
    .await;
    for (req, answer) in requests.iter().zip(answers) {
        assert_eq!(answer, searcher.search(req).unwrap());
    }
    let batches = batcher.counters().batches.load(Ordering::Relaxed);
    assert_eq!(batcher.counters().searches.load(Ordering::Relaxed), 48);
    // 96 query vectors in batches of at most 64: at least 2 faiss calls, far fewer than 48.
    assert!((2..=8).contains(&batches), "{batches} batches");
    // The metrics saw the same batches, every query vector, and an empty queue after.
    assert_eq!(metrics.batch_queries.get_sample_count(), batches);
    assert_eq!(metrics.batch_queries.get_sample_sum(), 96.0);
    assert_eq!(metrics.queue_depth.get(), 0);

    let expired = searcher.prepare(&requests[0]).unwrap();
    let err = batcher
        .search(expired, Some(Instant::now() - Duration::from_millis(1)))
        .await
        .unwrap_err();
    assert!(err.to_string_full().contains("deadline"), "{err}");
}
