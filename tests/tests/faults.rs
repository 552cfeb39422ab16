//! Faults with real processes: the cloud index is killed under an edge and restarted.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_tests::edge::{retrieve, retrieve_body};
use hasten_tests::{
    build_small_bundle, free_udp_port, persistent_work_dir, start_edge, write_tls_identity,
};
use loadtest::process::{ManagedProcess, binary, cloud_index_serve_args};
use loadtest::scrape::Scrape;
use serde_json::json;

const K: usize = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The edge's deadline for one cloud request in this test.
const CLOUD_TIMEOUT: Duration = Duration::from_millis(800);

/// A cloud index on a fixed QUIC address with a certificate that survives restarts.
fn start_cloud(
    work: &Path,
    bundle: &Path,
    quic_addr: &str,
    cert: &Path,
    key: &Path,
) -> ManagedProcess {
    let mut args = cloud_index_serve_args(bundle, "127.0.0.1:0", &work.join("unused.pem"));
    let at = args.iter().position(|a| a == "--quic-addr").unwrap();
    args[at + 1] = quic_addr.into();
    args.extend([
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
    ]);
    ManagedProcess::start(
        "cloud",
        &binary("cloud-index").unwrap(),
        args,
        work,
        START_TIMEOUT,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cloud_down_fallbacks_fail_fast_drafts_keep_serving_and_recovery_is_automatic() {
    let work = persistent_work_dir("cloud-down").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let (cert, key) = write_tls_identity(&work, "cloud").unwrap();
    let quic_addr = format!("127.0.0.1:{}", free_udp_port().unwrap());
    let mut cloud = start_cloud(&work, &bundle_dir, &quic_addr, &cert, &key);
    let timeout_ms = CLOUD_TIMEOUT.as_millis().to_string();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &quic_addr,
        &cert,
        &["--cloud-timeout-ms", &timeout_ms],
    )
    .unwrap();
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();
    let question = &bundle.questions[0].question;
    let (code, reply) = retrieve(&http, &edge_addr, question, K).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );

    cloud.stop();
    // What the cache holds is still served...
    let (code, reply) = retrieve(&http, &edge_addr, question, K).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("accepted")),
        "{reply}"
    );
    // ...and a query that needs the cloud fails with 503 within the cloud deadline. Its
    // vector points away from every cached document.
    let away: Vec<f32> = bundle.vector(bundle.len() / 2).iter().map(|x| -x).collect();
    let far = json!({"vector": away, "k": K});
    for _ in 0..2 {
        let started = Instant::now();
        let (code, reply) = retrieve_body(&http, &edge_addr, &far).await;
        assert_eq!(code, 503, "{reply}");
        assert_eq!(reply["error"]["code"], "unavailable");
        assert!(
            started.elapsed() < CLOUD_TIMEOUT + Duration::from_millis(700),
            "503 after {:?}",
            started.elapsed()
        );
    }
    let metrics = Scrape::of(&edge_addr).await.unwrap();
    assert_eq!(
        metrics.value(
            "hasten_edge_request_errors_total",
            &[("kind", "unavailable")]
        ),
        2.0
    );

    // The cloud comes back on its address: the edge reconnects by itself.
    let _cloud = start_cloud(&work, &bundle_dir, &quic_addr, &cert, &key);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, reply) = retrieve_body(&http, &edge_addr, &far).await;
        if code == 200 {
            assert_eq!(reply["outcome"], "fallback", "{reply}");
            break;
        }
        assert_eq!(code, 503, "{reply}");
        assert!(
            Instant::now() < deadline,
            "the edge never reached the restarted cloud"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
