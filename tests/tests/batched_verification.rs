//! RaLMSpec verifies a stride of speculated retrievals in one call to the cloud. Real
//! processes: a `cloud-index serve` over a small SQuAD bundle and the edge's QUIC client;
//! one batched search of several queries must return, for each query, exactly the ids,
//! scores, texts and vectors that a search of that query alone returns.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_edge_node::fallback::quic::{CloudEndpoint, QuicCloudClient};
use hasten_edge_node::fallback::{CloudDocument, CloudSearch};
use hasten_proto::quic::client_config;
use hasten_proto::tls::TrustRoots;
use hasten_tests::{build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index};

const K: usize = 20;

/// Unit queries near (not at) bundle rows, so that each has its own top-k.
fn queries(bundle: &CorpusBundle, n: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            let a = bundle.vector((7 * i) % bundle.len());
            let b = bundle.vector((7 * i + 3) % bundle.len());
            let v: Vec<f32> = a.iter().zip(b).map(|(x, y)| 0.8 * x + 0.2 * y).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| x / norm).collect()
        })
        .collect()
}

fn ids(documents: &[CloudDocument]) -> Vec<u64> {
    documents.iter().map(|d| d.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_search_returns_what_each_single_search_returns() {
    let work = persistent_work_dir("batched-verification").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let trust = TrustRoots::from_pem_file(&dev_cert(&work, "cloud")).unwrap();
    let client = QuicCloudClient::new(
        client_config(&trust, None).unwrap(),
        CloudEndpoint {
            addr: cloud.addr("quic_addr").parse().unwrap(),
            server_name: "localhost".into(),
            timeout: Duration::from_secs(10),
            corpus_version: bundle.manifest.corpus_version.clone(),
        },
    )
    .unwrap();

    for n in [1, 3, 8] {
        let queries = queries(&bundle, n);
        let batched = client.search_batch(&queries, K, None).await.unwrap();
        assert_eq!(batched.len(), n);
        for (query, together) in queries.iter().zip(&batched) {
            let alone = client.search(query, K, None).await.unwrap();
            assert_eq!(together.len(), K);
            assert_eq!(together, &alone, "batch of {n}");
        }
        // Each query has its own answer: a batch answered out of order would fail above.
        if n > 1 {
            assert_ne!(ids(&batched[0]), ids(&batched[1]));
        }
    }
}
