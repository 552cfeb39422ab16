//! Faults with real processes: the cloud index is killed under an edge and restarted, with a
//! certificate it is given and with the dev certificate it generates itself.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, cloud_index_serve_args};
use hasten_loadtest::control_plane::free_loopback_port;
use hasten_loadtest::scrape::Scrape;
use hasten_tests::edge::{retrieve, retrieve_body};
use hasten_tests::{build_small_bundle, persistent_work_dir, start_edge, write_tls_identity};
use serde_json::json;

const K: usize = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The edge's deadline for one cloud request in this test.
const CLOUD_TIMEOUT: Duration = Duration::from_millis(800);

/// A cloud index on a fixed QUIC address; without `--tls-cert`/`--tls-key` in `extra` it
/// serves a dev certificate kept at `dev_cert`.
fn start_cloud_at(
    work: &Path,
    bundle: &Path,
    quic_addr: &str,
    dev_cert: &Path,
    extra: &[String],
) -> ManagedProcess {
    let mut args = cloud_index_serve_args(bundle, "127.0.0.1:0", dev_cert);
    let at = args.iter().position(|a| a == "--quic-addr").unwrap();
    args[at + 1] = quic_addr.into();
    args.extend_from_slice(extra);
    ManagedProcess::start(
        "cloud",
        &binary("cloud-index").unwrap(),
        args,
        work,
        START_TIMEOUT,
    )
    .unwrap()
}

/// A cloud index on a fixed QUIC address with a certificate that survives restarts.
fn start_cloud(
    work: &Path,
    bundle: &Path,
    quic_addr: &str,
    cert: &Path,
    key: &Path,
) -> ManagedProcess {
    let tls = [
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
    ];
    start_cloud_at(work, bundle, quic_addr, &work.join("unused.pem"), &tls)
}

/// Retries `body` on the edge for up to 15 s until it answers 200 with a fallback (the edge
/// reconnecting to a restarted cloud); panics with the last reply otherwise.
async fn wait_for_fallback(http: &reqwest::Client, edge_addr: &str, body: &serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, reply) = retrieve_body(http, edge_addr, body).await;
        if code == 200 {
            assert_eq!(reply["outcome"], "fallback", "{reply}");
            return;
        }
        assert_eq!(code, 503, "{reply}");
        assert!(
            Instant::now() < deadline,
            "the edge never reached the restarted cloud: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cloud_down_fallbacks_fail_fast_drafts_keep_serving_and_recovery_is_automatic() {
    let work = persistent_work_dir("cloud-down").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let (cert, key) = write_tls_identity(&work, "cloud").unwrap();
    let quic_addr = format!("127.0.0.1:{}", free_loopback_port().unwrap());
    let mut cloud = start_cloud(&work, &bundle_dir, &quic_addr, &cert, &key);
    let timeout_ms = CLOUD_TIMEOUT.as_millis().to_string();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &quic_addr,
        &cert,
        &["--set", &format!("cloud.timeout_ms={timeout_ms}")],
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
    wait_for_fallback(&http, &edge_addr, &far).await;
}

/// The edge reads the cloud's certificate file once, at start. A cloud without a
/// configured certificate used to generate a new one on every start, so after a restart
/// every edge failed its handshake (`BadSignature`) until it was restarted too. The dev
/// certificate's key is now kept beside it (owner-only) and the pair reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_restarted_with_its_dev_certificate_keeps_serving_its_edges() {
    let work = persistent_work_dir("cloud-dev-cert-restart").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let dev_cert = work.join("cloud-dev-cert.pem");
    let dev_key = work.join("cloud-dev-cert.pem.key");
    // A pair left by an earlier run would hide the first start's generation.
    let _ = std::fs::remove_file(&dev_cert);
    let _ = std::fs::remove_file(&dev_key);
    let quic_addr = format!("127.0.0.1:{}", free_loopback_port().unwrap());
    let mut cloud = start_cloud_at(&work, &bundle_dir, &quic_addr, &dev_cert, &[]);
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &quic_addr,
        &dev_cert,
        &["--set", "cloud.timeout_ms=800"],
    )
    .unwrap();
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();
    let (code, reply) = retrieve(&http, &edge_addr, &bundle.questions[0].question, K).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );

    cloud.stop();
    let _cloud = start_cloud_at(&work, &bundle_dir, &quic_addr, &dev_cert, &[]);
    // A query no cached one answers, so that it needs the restarted cloud.
    let away: Vec<f32> = bundle.vector(bundle.len() / 2).iter().map(|x| -x).collect();
    wait_for_fallback(&http, &edge_addr, &json!({"vector": away, "k": K})).await;
    let mode = std::fs::metadata(&dev_key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the dev key is readable by others");
}
