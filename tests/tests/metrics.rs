//! Prometheus metrics of a running edge and cloud index (real processes on loopback): the
//! test drives retrievals, refusals and repeats through the edge and checks that every
//! counter and histogram moved by what the replies themselves say happened.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
};
use loadtest::scrape::Scrape;
use serde_json::{Value, json};

/// What the replies said, counted by the test.
#[derive(Default, Debug)]
struct Seen {
    accepted: u64,
    fallback: u64,
    refused: u64,
    encoded: u64,
    cache_channel: u64,
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
        &["--tau", "0.9"],
    )
    .unwrap();
    let (edge_addr, cloud_metrics) = (edge.addr("http_addr"), cloud.addr("metrics_addr"));
    let http = reqwest::Client::new();
    for addr in [&edge_addr, &cloud_metrics] {
        let ready = http
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 200, "{addr} not ready");
    }
    let edge_before = Scrape::of(&edge_addr).await.unwrap();
    let cloud_before = Scrape::of(&cloud_metrics).await.unwrap();

    // Distinct questions (mostly fallbacks), each asked twice (the repeat is answered from
    // the cache), and requests the edge refuses.
    let questions: Vec<&str> = bundle
        .questions
        .iter()
        .take(12)
        .map(|q| q.question.as_str())
        .collect();
    let mut seen = Seen::default();
    for question in questions.iter().chain(&questions) {
        let response = http
            .post(format!("http://{edge_addr}/v1/retrieve"))
            .json(&json!({"query": question, "k": 10}))
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
        let timings = &reply["timings_us"];
        seen.encoded += u64::from(timings["encode_us"].as_u64().unwrap() > 0);
        seen.cache_channel += u64::from(timings["cache_channel_us"].as_u64().unwrap() > 0);
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
    let stages = "hasten_edge_stage_duration_seconds_count";
    assert_eq!(edge(stages, &[("stage", "encode")]), seen.encoded as f64);
    assert_eq!(
        edge(stages, &[("stage", "cache_channel")]),
        seen.cache_channel as f64
    );
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
