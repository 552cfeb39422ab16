//! Admission control with real processes: an edge and a cloud index with small bounds on
//! searches in flight refuse the excess of a burst at once (HTTP 429 with Retry-After,
//! gRPC RESOURCE_EXHAUSTED) instead of queueing it, count every refusal in their metrics,
//! and serve normally once the burst is over.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{QueryVector, SearchRequest};
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index_with, start_edge,
};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_beyond_the_bounds_are_refused_at_once_and_counted() {
    let work = persistent_work_dir("admission").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index_with(
        &work,
        "cloud",
        &bundle_dir,
        "127.0.0.1:0",
        &[
            "--set",
            "server.max_in_flight=1",
            "--set",
            "batching.enabled=false",
        ]
        .map(String::from),
    )
    .unwrap();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &cloud.addr("quic_addr"),
        &dev_cert(&work, "cloud"),
        &[
            "--set",
            "server.max_in_flight=2",
            "--set",
            "retrieval.tau=0.9",
        ],
    )
    .unwrap();
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();

    // A burst of distinct questions at the edge: each is answered or refused at once.
    let questions: Vec<String> = bundle
        .questions
        .iter()
        .take(24)
        .map(|q| q.question.clone())
        .collect();
    let replies = futures::future::join_all(questions.iter().map(|question| {
        let (http, edge_addr) = (http.clone(), edge_addr.clone());
        async move {
            let response = http
                .post(format!("http://{edge_addr}/v1/retrieve"))
                .json(&json!({"query": question}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap();
            (status, retry_after, body)
        }
    }))
    .await;
    let mut refused_here = 0;
    let mut refused_by_cloud = 0;
    let mut answered = 0;
    for (status, retry_after, body) in &replies {
        match status {
            200 => answered += 1,
            429 => {
                assert_eq!(body["error"]["code"], "overloaded", "{body}");
                assert_eq!(retry_after.as_ref().unwrap(), "1");
                let message = body["error"]["message"].as_str().unwrap();
                if message.contains("cloud index is overloaded") {
                    refused_by_cloud += 1;
                } else {
                    assert!(message.contains("in flight at this edge"), "{message}");
                    refused_here += 1;
                }
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(answered >= 1, "nothing answered");
    assert!(
        refused_here >= 1,
        "the edge refused nothing of a burst of 24 with 2 slots"
    );

    let edge_metrics = Scrape::of(&edge_addr).await.unwrap();
    assert_eq!(
        edge_metrics.value(
            "hasten_edge_request_errors_total",
            &[("kind", "overloaded")]
        ),
        f64::from(refused_here + refused_by_cloud)
    );
    let cloud_metrics = Scrape::of(&cloud.addr("metrics_addr")).await.unwrap();
    assert_eq!(
        cloud_metrics.value("hasten_cloud_searches_total", &[("outcome", "error")]),
        f64::from(refused_by_cloud)
    );

    // Straight to the cloud over gRPC: bursts beyond one search in flight. A small index
    // answers a search in microseconds, so one burst may happen to arrive one request at a
    // time; each request carries many queries to hold its slot longer, and a few bursts are
    // sent until one overlaps. Without the bound every request of every burst is answered.
    let cloud_client = CloudIndexClient::connect(format!("http://{}", cloud.addr("grpc_addr")))
        .await
        .unwrap();
    let (mut ok, mut exhausted) = (0, 0);
    for _burst in 0..10 {
        let outcomes = futures::future::join_all((0..32).map(|request| {
            let mut client = cloud_client.clone();
            let queries = (0..64)
                .map(|q| QueryVector {
                    values: bundle.vector((request * 7 + q) % bundle.len()).to_vec(),
                })
                .collect();
            async move {
                client
                    .search(SearchRequest {
                        queries,
                        k: 10,
                        include_texts: true,
                        ..Default::default()
                    })
                    .await
            }
        }))
        .await;
        for outcome in &outcomes {
            match outcome {
                Ok(_) => ok += 1,
                Err(status) if status.code() == tonic::Code::ResourceExhausted => exhausted += 1,
                Err(status) => panic!("unexpected {status:?}"),
            }
        }
        if exhausted >= 1 {
            break;
        }
    }
    assert!(
        exhausted >= 1 && ok >= 1,
        "{ok} answered, {exhausted} refused"
    );

    // The bounds hold no leaked slots: once the bursts are over, requests are served.
    let response = http
        .post(format!("http://{edge_addr}/v1/retrieve"))
        .json(&json!({"query": questions[0]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}
