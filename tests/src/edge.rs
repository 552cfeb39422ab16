//! Talking to a running edge over its JSON API, as a client would.

// Test helpers fail the calling test by panicking.
#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// `POST /v1/retrieve` of `question` with `k`: the status and the body.
pub async fn retrieve(
    http: &reqwest::Client,
    edge: &str,
    question: &str,
    k: usize,
) -> (u16, Value) {
    retrieve_body(http, edge, &json!({"query": question, "k": k})).await
}

/// `POST /v1/retrieve` of `body`: the status and the body.
pub async fn retrieve_body(http: &reqwest::Client, edge: &str, body: &Value) -> (u16, Value) {
    post_json(http, edge, "/v1/retrieve", body).await
}

/// `POST` of the JSON `body` to `path` on the edge: the status and the JSON reply.
pub async fn post_json(
    http: &reqwest::Client,
    edge: &str,
    path: &str,
    body: &Value,
) -> (u16, Value) {
    let response = http
        .post(format!("http://{edge}{path}"))
        .json(body)
        .send()
        .await
        .expect("the edge answers HTTP");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// Opens a streamed chat completion of `body` and leaves after its first event, as a client
/// that gives up does (the connection closes with the reply unread).
pub async fn leave_after_first_event(http: &reqwest::Client, edge: &str, body: &Value) {
    let mut response = http
        .post(format!("http://{edge}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("the edge answers HTTP");
    assert_eq!(response.status().as_u16(), 200);
    assert!(response.chunk().await.expect("a first event").is_some());
}

/// `GET /v1/status`.
pub async fn status(http: &reqwest::Client, edge: &str) -> Value {
    http.get(format!("http://{edge}/v1/status"))
        .send()
        .await
        .expect("the edge answers HTTP")
        .json()
        .await
        .expect("a JSON status")
}

/// Waits up to `limit` until the edge's status satisfies `done`; panics with `what` and
/// the last status otherwise.
pub async fn wait_for(
    http: &reqwest::Client,
    edge: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) {
    let deadline = Instant::now() + limit;
    loop {
        let now = status(http, edge).await;
        if done(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits up to `limit` until the edge's `/readyz` answers 200; panics with its last reason.
pub async fn wait_ready(http: &reqwest::Client, edge: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let response = http
            .get(format!("http://{edge}/readyz"))
            .send()
            .await
            .expect("the edge answers HTTP");
        let status = response.status().as_u16();
        let reason = response.text().await.unwrap_or_default();
        if status == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "edge {edge} not ready: {status} {reason}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
