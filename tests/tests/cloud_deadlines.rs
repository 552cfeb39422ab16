//! Bug: with the cloud dead or hung, fallbacks overran their deadline (503 after up to
//! 4 s with a 2 s cloud timeout): connecting was serialised under the connection's lock and
//! a request that timed out took that lock again to drop the connection. Real processes:
//! an edge with a 1 s cloud timeout (the cloud-only policy, so that every query falls
//! back), several fallbacks at once, against a stopped (SIGSTOP) and a killed cloud, each
//! with the edge's connection still established and after it was dropped; every fallback
//! must end within its deadline.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_tests::edge::{retrieve_body, wait_ready};
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::{Value, json};

const K: usize = 10;
const CLOUD_TIMEOUT: Duration = Duration::from_millis(1000);
/// What a fallback may take beyond the cloud timeout: the request's own handling on a busy
/// 2-core machine, not a second timeout.
const MARGIN: Duration = Duration::from_millis(400);
const AT_ONCE: usize = 6;
/// Time between the requests of a batch: later ones arrive while earlier ones connect,
/// which is when waiting for the connection's lock used to add a second timeout.
const STAGGER: Duration = Duration::from_millis(150);

/// Queries as ready vectors (the bundle's own rows).
fn queries(bundle: &CorpusBundle, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"vector": bundle.vector(i % bundle.len()), "k": K}))
        .collect()
}

/// Sends the queries [`STAGGER`] apart, all in flight together; returns each one's status
/// and how long it took.
async fn fallbacks_at_once(
    http: &reqwest::Client,
    edge: &str,
    queries: &[Value],
) -> Vec<(u16, Duration)> {
    let asked = queries.iter().enumerate().map(|(i, query)| {
        let (http, edge, query) = (http.clone(), edge.to_string(), query.clone());
        tokio::spawn(async move {
            tokio::time::sleep(STAGGER * i as u32).await;
            let started = Instant::now();
            let (code, _) = retrieve_body(&http, &edge, &query).await;
            (code, started.elapsed())
        })
    });
    let mut answers = Vec::new();
    for answer in futures::future::join_all(asked).await {
        answers.push(answer.unwrap());
    }
    answers
}

fn assert_within_deadline(what: &str, answers: &[(u16, Duration)]) {
    for (code, took) in answers {
        assert_eq!(*code, 503, "{what}: {answers:?}");
        assert!(
            *took <= CLOUD_TIMEOUT + MARGIN,
            "{what}: a fallback took {took:?}, the deadline is {CLOUD_TIMEOUT:?}: {answers:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_keep_their_deadline_when_the_cloud_hangs_or_dies() {
    let work = persistent_work_dir("cloud-deadlines").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let mut cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let timeout_ms = CLOUD_TIMEOUT.as_millis().to_string();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &cloud.addr("quic_addr"),
        &dev_cert(&work, "cloud"),
        &[
            "--set",
            &format!("cloud.timeout_ms={timeout_ms}"),
            "--set",
            "retrieval.policy=cloud-only",
        ],
    )
    .unwrap();
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();
    wait_ready(&http, &edge_addr, Duration::from_secs(20)).await;
    let queries = queries(&bundle, 4 * AT_ONCE);
    let mut batches = queries.chunks(AT_ONCE);
    // The link works: the edge's connection is established.
    let (code, reply) = retrieve_body(&http, &edge_addr, &queries[0]).await;
    assert_eq!(code, 200, "{reply}");

    // A hung cloud: first on the established connection, then on the new connection the
    // edge opens after dropping the timed-out one.
    cloud.signal("STOP").unwrap();
    let hung_connected = fallbacks_at_once(&http, &edge_addr, batches.next().unwrap()).await;
    let hung_reconnecting = fallbacks_at_once(&http, &edge_addr, batches.next().unwrap()).await;
    cloud.signal("CONT").unwrap();
    assert_within_deadline("cloud stopped, connection established", &hung_connected);
    assert_within_deadline("cloud stopped, connecting anew", &hung_reconnecting);

    // The cloud answers again on the same connection or a new one.
    let (code, reply) = retrieve_body(&http, &edge_addr, &queries[1]).await;
    assert_eq!(code, 200, "the edge did not recover: {reply}");

    // A dead cloud, the same two ways.
    cloud.stop();
    let dead_connected = fallbacks_at_once(&http, &edge_addr, batches.next().unwrap()).await;
    let dead_reconnecting = fallbacks_at_once(&http, &edge_addr, batches.next().unwrap()).await;
    assert_within_deadline("cloud killed, connection established", &dead_connected);
    assert_within_deadline("cloud killed, connecting anew", &dead_reconnecting);
}
