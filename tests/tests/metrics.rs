//! Prometheus metrics of a running edge and cloud index (real processes on loopback): the
//! test drives retrievals, refusals and repeats through the edge and checks that every
//! counter and histogram moved by what the traffic was: how many requests of which kind
//! it sent, and what the replies' outcomes were. Which stages ran is derived from what
//! HaS does (every text is encoded, every query is drafted and validated, every fallback
//! asks the cloud), never from the replies' own timings.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use std::time::Duration;

use hasten_core::encoder::TextEncoder;
use hasten_loadtest::scrape::Scrape;
use hasten_tests::edge::wait_ready;
use hasten_tests::{
    build_small_bundle, dev_cert, model_dir, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::{Value, json};

/// What the test sent and what the replies' outcomes were.
#[derive(Default, Debug)]
struct Seen {
    accepted: u64,
    fallback: u64,
    refused: u64,
    /// Answered requests that came as text (the rest came as vectors).
    texts: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_and_histograms_move_by_what_the_traffic_did() {
    let work = persistent_work_dir("metrics").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    // A strict threshold, so that distinct questions fall back and repeats are accepted.
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &cloud.addr("quic_addr"),
        &dev_cert(&work, "cloud"),
        &["--set", "retrieval.tau=0.9"],
    )
    .unwrap();
    let (edge_addr, cloud_metrics) = (edge.addr("http_addr"), cloud.addr("metrics_addr"));
    let http = reqwest::Client::new();
    wait_ready(&http, &edge_addr, Duration::from_secs(20)).await;
    let ready = http
        .get(format!("http://{cloud_metrics}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "the cloud is not ready");
    let edge_before = Scrape::of(&edge_addr).await.unwrap();
    let cloud_before = Scrape::of(&cloud_metrics).await.unwrap();

    // Distinct questions (mostly fallbacks), each asked twice (the repeat is answered from
    // the cache), two more as ready vectors (never encoded), and requests the edge refuses.
    let questions: Vec<&str> = bundle
        .questions
        .iter()
        .take(12)
        .map(|q| q.question.as_str())
        .collect();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let vectors = encoder.encode(&questions[..2]).unwrap();
    let bodies = questions
        .iter()
        .chain(&questions)
        .map(|question| json!({"query": question, "k": 10}))
        .chain(
            vectors
                .iter()
                .map(|vector| json!({"vector": vector, "k": 10})),
        );
    let mut seen = Seen::default();
    for body in bodies {
        let response = http
            .post(format!("http://{edge_addr}/v1/retrieve"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let reply: Value = response.json().await.unwrap();
        match reply["outcome"].as_str() {
            Some("accepted") => seen.accepted += 1,
            Some("fallback") => seen.fallback += 1,
            other => panic!("outcome {other:?}"),
        }
        seen.texts += u64::from(body.get("query").is_some());
    }
    for bad in [json!({"query": "x", "k": 0}), json!({"qeury": "x"})] {
        let response = http
            .post(format!("http://{edge_addr}/v1/retrieve"))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400);
        seen.refused += 1;
    }
    assert!(seen.fallback >= 6 && seen.accepted >= 6, "{seen:?}");

    let edge_after = Scrape::of(&edge_addr).await.unwrap();
    let cloud_after = Scrape::of(&cloud_metrics).await.unwrap();
    let moved = |before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]| {
        after.value(name, labels) - before.value(name, labels)
    };
    let edge = |name: &str, labels: &[(&str, &str)]| moved(&edge_before, &edge_after, name, labels);
    let cloud =
        |name: &str, labels: &[(&str, &str)]| moved(&cloud_before, &cloud_after, name, labels);
    let answered = (seen.accepted + seen.fallback) as f64;

    // Edge: requests by outcome and error kind, the latency histograms' counts, the stages
    // that ran, the homology score of every answer.
    let requests = "hasten_edge_requests_total";
    assert_eq!(
        edge(requests, &[("outcome", "accepted")]),
        seen.accepted as f64
    );
    assert_eq!(
        edge(requests, &[("outcome", "fallback")]),
        seen.fallback as f64
    );
    assert_eq!(edge(requests, &[("outcome", "error")]), seen.refused as f64);
    assert_eq!(
        edge(
            "hasten_edge_request_errors_total",
            &[("kind", "invalid_argument")]
        ),
        seen.refused as f64
    );
    let duration = "hasten_edge_request_duration_seconds_count";
    assert_eq!(
        edge(duration, &[("outcome", "fallback")]),
        seen.fallback as f64
    );
    assert_eq!(edge(duration, &[("outcome", "error")]), seen.refused as f64);
    // HaS encodes every text (never a vector), drafts from both channels and validates
    // every query, and asks the cloud for every fallback.
    let stages = "hasten_edge_stage_duration_seconds_count";
    assert_eq!(edge(stages, &[("stage", "encode")]), seen.texts as f64);
    for stage in ["cache_channel", "fuzzy_channel", "validation"] {
        assert_eq!(edge(stages, &[("stage", stage)]), answered, "{stage}");
    }
    assert_eq!(
        edge(stages, &[("stage", "cloud_fallback")]),
        seen.fallback as f64
    );
    assert_eq!(edge("hasten_edge_homology_score_count", &[]), answered);
    // Every fallback inserted its query into the cache; the window holds every answer.
    assert_eq!(
        edge_after.value("hasten_edge_cache_entries", &[]),
        seen.fallback as f64
    );
    assert!(edge_after.value("hasten_edge_cache_documents", &[]) >= 10.0);
    assert!(edge_after.value("hasten_edge_cache_bytes", &[]) > 0.0);
    let dar = edge_after.value("hasten_edge_draft_acceptance_ratio", &[]);
    assert!(
        (dar - seen.accepted as f64 / answered).abs() < 1e-9,
        "DAR {dar}"
    );

    // The cloud link was verified, and no replicated entry was ever skipped (there is no
    // control plane).
    assert_eq!(
        edge_after.value("hasten_edge_cloud_link", &[("state", "verified")]),
        1.0
    );
    assert_eq!(
        edge_after.value("hasten_edge_cloud_link", &[("state", "version_mismatch")]),
        0.0
    );

    // Cloud: one search per fallback, one query vector each, timed under its shard.
    let searches = "hasten_cloud_searches_total";
    assert_eq!(
        cloud(searches, &[("role", "shard"), ("outcome", "ok")]),
        seen.fallback as f64
    );
    assert_eq!(
        cloud(
            "hasten_cloud_search_duration_seconds_count",
            &[("role", "shard"), ("shard", "0")]
        ),
        seen.fallback as f64
    );
    assert_eq!(
        cloud("hasten_cloud_batch_queries_sum", &[("role", "shard")]),
        seen.fallback as f64
    );
    assert_eq!(cloud_after.value("hasten_cloud_queue_depth", &[]), 0.0);

    // The process collector on both.
    for scrape in [&edge_after, &cloud_after] {
        assert!(scrape.value("process_resident_memory_bytes", &[]) > 1e6);
        assert!(scrape.value("process_open_fds", &[]) > 0.0);
    }
}
