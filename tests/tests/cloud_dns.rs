//! An edge follows the cloud's DNS name, as a Kubernetes Service's name follows its pods: a
//! real edge process is given `cloud_addr = hasten-cloud.test:PORT`, which it resolves
//! through the system's resolver on every connection. The name lives in an `/etc/hosts` of
//! the edge's own (a private mount namespace from `unshare`, the file bind-mounted over
//! /etc/hosts), which the test rewrites in place, as cluster DNS would change its answer.
//!
//! The cloud first at 127.0.0.2 answers; stopped, the edge's requests fail (nothing else
//! serves the name there); with the name moved to a cloud at 127.0.0.3 on the same port,
//! they are answered again with no restart. An edge that resolved once at start would keep
//! failing.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hasten_eval::process::{ManagedProcess, binary, edge_serve_args};
use hasten_tests::{build_small_bundle, model_dir, persistent_work_dir, write_tls_identity};
use serde_json::json;

const NAME: &str = "hasten-cloud.test";
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Writes the edge's hosts file in place (the bind mount follows the inode, not the path).
fn point_name_at(hosts: &Path, ip: &str) {
    let system = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    std::fs::write(hosts, format!("{system}\n{ip} {NAME}\n")).unwrap();
}

fn start_cloud(
    work: &Path,
    name: &str,
    bundle: &Path,
    quic_addr: &str,
    identity: &(std::path::PathBuf, std::path::PathBuf),
) -> ManagedProcess {
    let args = [
        "serve".to_string(),
        "--bundle".into(),
        bundle.display().to_string(),
        "--quic-addr".into(),
        quic_addr.into(),
        "--grpc-addr".into(),
        "127.0.0.1:0".into(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--tls-cert".into(),
        identity.0.display().to_string(),
        "--tls-key".into(),
        identity.1.display().to_string(),
    ];
    ManagedProcess::start(
        name,
        &binary("cloud-index").unwrap(),
        args,
        work,
        START_TIMEOUT,
    )
    .unwrap()
}

/// Whether one cloud-only retrieval through the edge is answered.
async fn answered(http: &reqwest::Client, edge: &str) -> bool {
    http.post(format!("http://{edge}/v1/retrieve"))
        .json(&json!({"query": "Who was the first president of the United States?", "k": 3}))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_follows_the_clouds_name_to_its_new_address() {
    let work = persistent_work_dir("cloud-dns").unwrap();
    let (bundle, _) = build_small_bundle(&work, 3, None).unwrap();
    let identity = write_tls_identity(&work, "cloud").unwrap();
    let first = start_cloud(&work, "cloud-a", &bundle, "127.0.0.2:0", &identity);
    let port = first
        .addr("quic_addr")
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    let hosts = work.join("edge-hosts");
    point_name_at(&hosts, "127.0.0.2");

    // The edge in a mount namespace of its own, where `hosts` is its /etc/hosts. A user
    // namespace (`--map-root-user`) lets the mount happen without privileges.
    let unshare = Path::new("/usr/bin/unshare");
    assert!(
        unshare.exists(),
        "this test needs util-linux's unshare to give the edge its own /etc/hosts"
    );
    let edge_binary = binary("edge-node").unwrap();
    let mut args = vec![
        "--mount".to_string(),
        "--map-root-user".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#.into(),
        "sh".into(),
        hosts.display().to_string(),
        edge_binary.display().to_string(),
    ];
    args.extend(edge_serve_args(
        &bundle,
        &model_dir(),
        &format!("{NAME}:{port}"),
        &identity.0,
    ));
    args.extend(["--set".into(), "retrieval.policy=cloud-only".into()]);
    let edge = ManagedProcess::start("edge", unshare, args, &work, START_TIMEOUT).unwrap();
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(
        answered(&http, &edge_addr).await,
        "the edge does not reach the cloud by name: {}",
        edge.log_tail()
    );

    // The second cloud on the same port at another address; the name still points at the
    // first, which stops: nothing answers the edge.
    let _second = start_cloud(
        &work,
        "cloud-b",
        &bundle,
        &format!("127.0.0.3:{port}"),
        &identity,
    );
    drop(first);
    assert!(
        !answered(&http, &edge_addr).await,
        "the edge was answered with the cloud its name points at stopped"
    );

    point_name_at(&hosts, "127.0.0.3");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answered(&http, &edge_addr).await {
        assert!(
            Instant::now() < deadline,
            "the edge did not follow {NAME} to 127.0.0.3 within 30 s: {}",
            edge.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
