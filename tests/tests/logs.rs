//! Logs as a cluster's pipeline reads them, from a real edge process: with
//! `--log-format json` every line the edge writes is one JSON object, each HTTP request
//! carries an id (the client's `x-request-id` when it sent one, else a new UUID) echoed on
//! the response, and the warning a failed request logs names that id.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::{Value, json};

/// `POST /v1/retrieve` of `question` with `request_id` as `x-request-id` when given: the
/// status and the id the response carries.
async fn retrieve_with_id(
    http: &reqwest::Client,
    edge: &str,
    question: &str,
    request_id: Option<&str>,
) -> (u16, String) {
    let mut request = http
        .post(format!("http://{edge}/v1/retrieve"))
        .json(&json!({"query": question, "k": 3}));
    if let Some(id) = request_id {
        request = request.header("x-request-id", id);
    }
    let response = request.send().await.unwrap();
    let id = response
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (response.status().as_u16(), id)
}

/// Whether `line` (a JSON log object) was written inside the HTTP request `request_id`.
fn in_request(line: &Value, request_id: &str) -> bool {
    line["spans"].as_array().is_some_and(|spans| {
        spans
            .iter()
            .any(|span| span["name"] == "http" && span["request_id"] == request_id)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_each_request_by_its_id() {
    let work = persistent_work_dir("logs-json").unwrap();
    let (bundle, _) = build_small_bundle(&work, 3, None).unwrap();
    let mut cloud = start_cloud_index(&work, "logs-cloud", &bundle, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "logs-cloud");
    let edge = start_edge(
        &work,
        "logs-edge",
        &bundle,
        &cloud.addr("quic_addr"),
        &cert,
        // At tau 1 only exact repeats are answered at the edge: a new question needs the
        // cloud.
        &[
            "--log-format",
            "json",
            "--set",
            "cloud.timeout_ms=1500",
            "--set",
            "retrieval.tau=1",
        ],
    )
    .unwrap();
    let http_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();

    // The client's id comes back; without one, the edge makes a UUID.
    let (status, echoed) = retrieve_with_id(
        &http,
        &http_addr,
        "Who wrote the first article?",
        Some("client-7"),
    )
    .await;
    assert_eq!((status, echoed.as_str()), (200, "client-7"));
    let (status, made) = retrieve_with_id(&http, &http_addr, "And the second?", None).await;
    assert_eq!(status, 200);
    assert!(
        made.len() == 36 && made.chars().filter(|c| *c == '-').count() == 4,
        "not a UUID: {made:?}"
    );

    // With the cloud gone, a question the edge cannot answer alone fails, and its warning
    // names the request.
    cloud.stop();
    let (status, _) = retrieve_with_id(
        &http,
        &http_addr,
        "A question no cached one resembles, about sea otters and tax law",
        Some("client-8"),
    )
    .await;
    assert!(
        status >= 500,
        "the edge answered {status} without its cloud"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    let log = std::fs::read_to_string(&edge.log).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string()),
        "a line without level or timestamp"
    );
    let failed: Vec<&Value> = lines.iter().filter(|l| in_request(l, "client-8")).collect();
    assert!(
        failed
            .iter()
            .any(|l| l["level"] == "WARN" && l["message"] == "request failed"),
        "no warning names request client-8; its lines: {failed:?}\nlog:\n{log}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| in_request(l, "client-7") && l["level"] == "WARN"),
        "the answered request logged a warning"
    );
}
