//! Mutual TLS between real processes: a shard server behind a router, a three-node control
//! plane and edges, each with a certificate from the deployment's CA
//! (`hasten_proto::tls::DevAuthority`, the code behind `hasten-loadtest dev-certs`). A peer
//! whose certificate comes from another CA, or that shows none, is refused on every link.
//! Each process reports its certificates' expiry as a metric. A CA rotation (extra trusted
//! CAs, `tls_extra_ca`) keeps a group whole when done in the runbook's order.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, cloud_index_route_args, tls_args};
use hasten_loadtest::control_plane::{free_loopback_port, node_args};
use hasten_loadtest::scrape::Scrape;
use hasten_proto::control::{ControlAccess, GrpcTarget, MAX_MESSAGE_BYTES, connect, grpc_endpoint};
use hasten_proto::tls::{DevAuthority, Identity, MutualTls, TlsPaths, TrustRoots};
use hasten_proto::v1::InfoRequest;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{
    ControlCommand, CorpusFacts, ProposeRequest, StatusRequest, control_command,
};
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::{retrieve, status, wait_for};
use hasten_tests::{
    build_small_bundle, persistent_work_dir, start_cloud_index_with, start_edge, start_router,
};
use serde_json::json;

const K: usize = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);

fn names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

/// Our CA's certificates for the three components, and a stranger's edge certificate.
fn certificates(work: &Path) -> (TlsPaths, TlsPaths, TlsPaths, TlsPaths) {
    let ours = DevAuthority::new("deployment CA").unwrap();
    let mut issued = ours
        .write_bundle(
            &work.join("tls"),
            &["cloud", "control-plane", "edge"],
            &names(),
        )
        .unwrap()
        .into_iter();
    let stranger = DevAuthority::new("another CA").unwrap();
    let foreign = stranger
        .write_bundle(&work.join("tls-foreign"), &["edge"], &names())
        .unwrap()
        .remove(0);
    let cloud = issued.next().unwrap();
    let control_plane = issued.next().unwrap();
    let edge = issued.next().unwrap();
    // The stranger trusts our CA, so the only thing wrong is its own certificate.
    let stranger_edge = TlsPaths {
        ca: edge.ca.clone(),
        ..foreign
    };
    (cloud, control_plane, edge, stranger_edge)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_needs_a_certificate_from_the_deployments_ca() {
    let work = persistent_work_dir("mutual-tls").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let (cloud_tls, cp_tls, edge_tls, stranger_tls) = certificates(&work);

    let cloud = start_cloud_index_with(
        &work,
        "cloud",
        &bundle_dir,
        "127.0.0.1:0",
        &tls_args(&cloud_tls),
    )
    .unwrap();
    // The edges reach the shard through a router, which dials it over mutual TLS.
    let route = |name: &str, paths: &TlsPaths, startup_timeout_s: &str| {
        let shards = [vec![cloud.addr("grpc_addr")]];
        let mut args = cloud_index_route_args(&shards, &work.join("unused.pem"));
        args.extend(tls_args(paths));
        args.extend([
            "--set".into(),
            format!("startup_timeout_s={startup_timeout_s}"),
        ]);
        ManagedProcess::start(
            name,
            &binary("cloud-index").unwrap(),
            args,
            &work,
            START_TIMEOUT,
        )
    };
    // A router with the stranger's certificate never gets an answer from the shard, so it
    // gives up at start.
    assert!(route("router-stranger", &stranger_tls, "3").is_err());
    let log = std::fs::read_to_string(work.join("router-stranger.log")).unwrap();
    assert!(log.contains("no replica of shard 0"), "{log}");
    let router = route("router", &cloud_tls, "60").unwrap();

    let addresses: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_loopback_port().unwrap()))
        .collect();
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let dir = work.join(format!("node-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut args = node_args(id, &addresses, &dir);
        args.extend(["--set".into(), "tick_ms=50".into()]);
        args.extend(tls_args(&cp_tls));
        nodes.push(
            ManagedProcess::start(
                &format!("node-{id}"),
                &binary("control-plane").unwrap(),
                args,
                &work,
                START_TIMEOUT,
            )
            .unwrap(),
        );
    }

    let edge_flags = |paths: &TlsPaths| {
        let mut extra = tls_args(paths);
        for address in &addresses {
            extra.extend(["--control-plane".to_string(), address.clone()]);
        }
        extra.extend(["--set".into(), "cloud.timeout_ms=1000".into()]);
        extra
    };
    let start = |name: &str, extra: Vec<String>| {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        start_edge(
            &work,
            name,
            &bundle_dir,
            &router.addr("quic_addr"),
            &cloud_tls.ca,
            &extra,
        )
        .unwrap()
    };
    let trusted = start("edge-trusted", edge_flags(&edge_tls));
    let stranger = start("edge-stranger", edge_flags(&stranger_tls));
    let http = reqwest::Client::new();
    let question = &bundle.questions[0].question;

    // A trusted edge reaches the cloud over QUIC (edge to router, router to shard), and its
    // fallback comes back through the
    // control plane: the proposal committed on a quorum of peers talking mutual TLS.
    let trusted_addr = trusted.addr("http_addr");
    let (code, reply) = retrieve(&http, &trusted_addr, question, K).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );
    wait_for(
        &http,
        &trusted_addr,
        "the entry never came back",
        WAIT,
        |s| s["cached_queries"] == 1 && s["control_plane"]["subscribed"] == true,
    )
    .await;

    // The stranger's QUIC handshake fails, so its fallback cannot be served...
    let stranger_addr = stranger.addr("http_addr");
    let (code, reply) = retrieve(&http, &stranger_addr, question, K).await;
    assert_eq!(code, 503, "{reply}");
    // ...and the control plane never lets it subscribe, nor sends it the trusted edge's entry.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = status(&http, &stranger_addr).await;
    assert_eq!(seen["control_plane"]["subscribed"], json!(false), "{seen}");
    assert_eq!(seen["cached_queries"], json!(0), "{seen}");

    // Direct gRPC callers: no certificate, or plaintext, is refused by both servers; our
    // own certificate is accepted.
    let trusted_client = MutualTls::load(&edge_tls).unwrap();
    let ca_only = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(std::fs::read(&edge_tls.ca).unwrap()),
    );
    let cp = &addresses[0];
    let (shard_grpc, router_grpc) = (cloud.addr("grpc_addr"), router.addr("grpc_addr"));
    for (address, what) in [
        (cp.as_str(), "control plane"),
        (shard_grpc.as_str(), "cloud"),
        (router_grpc.as_str(), "cloud"),
    ] {
        let without_certificate =
            tonic::transport::Endpoint::from_shared(format!("https://{address}"))
                .unwrap()
                .tls_config(ca_only.clone())
                .unwrap();
        let plaintext = grpc_endpoint(address, None).unwrap();
        let with_ours = grpc_endpoint(address, Some(&trusted_client)).unwrap();
        for (endpoint, allowed) in [
            (GrpcTarget::from(without_certificate), false),
            (plaintext, false),
            (with_ours, true),
        ] {
            let answered = match endpoint.connect().await {
                Err(_) => false,
                Ok(channel) if what == "cloud" => CloudIndexClient::new(channel)
                    .info(InfoRequest {})
                    .await
                    .is_ok(),
                Ok(channel) => ControlPlaneClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .status(StatusRequest {})
                    .await
                    .is_ok(),
            };
            assert_eq!(answered, allowed, "{what} at {address}");
        }
    }

    // Every process reports when the certificate files it loaded expire (the dev CA's
    // ten years and its certificates' one tell the two apart).
    let expiries = |paths: &TlsPaths| {
        let identity = Identity::from_pem_files(&paths.cert, &paths.key).unwrap();
        let ca = TrustRoots::from_pem_file(&paths.ca).unwrap();
        (identity.expires_at().unwrap(), ca.expires_at())
    };
    for (metrics, paths, what) in [
        (cloud.addr("metrics_addr"), &cloud_tls, "shard"),
        (router.addr("metrics_addr"), &cloud_tls, "router"),
        (nodes[0].addr("metrics_addr"), &cp_tls, "control-plane node"),
        (trusted_addr.clone(), &edge_tls, "edge"),
    ] {
        let scrape = Scrape::of(&metrics).await.unwrap();
        let (certificate, ca) = expiries(paths);
        assert!(certificate < ca, "{what}: {certificate} {ca}");
        for (label, expected) in [("certificate", certificate), ("ca", ca)] {
            assert_eq!(
                scrape.value(
                    "hasten_tls_certificate_expiry_timestamp_seconds",
                    &[("certificate", label)]
                ),
                expected as f64,
                "{what}: {label}"
            );
        }
    }
    drop(nodes);
}

/// A CA rotation in the runbook's three steps, one node restarted at a time, on a real
/// three-node group: trust the new CA beside the old one, then reissue every certificate from
/// the new CA while still trusting the old one, then drop the old one. After every restart the
/// group agrees on a leader and replicates to the restarted node. Skipping the first step
/// (a node restarted straight onto the new CA) cuts that node off, which the test also shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_one_node_at_a_time_keeps_the_group_whole() {
    let work = persistent_work_dir("ca-rotation").unwrap();
    let issue = |dir: &str, name: &str| {
        DevAuthority::new(name)
            .unwrap()
            .write_bundle(&work.join(dir), &["node", "operator"], &names())
            .unwrap()
    };
    let (old, new) = (issue("tls-old", "old CA"), issue("tls-new", "new CA"));
    let with_extra = |paths: &TlsPaths, extra: &TlsPaths| TlsPaths {
        extra_ca: Some(extra.ca.clone()),
        ..paths.clone()
    };
    let trust_both_old_certificate = with_extra(&old[0], &new[0]);
    let trust_both_new_certificate = with_extra(&new[0], &old[0]);

    let old_flags = tls_args(&old[0]);
    let old_flags: Vec<&str> = old_flags.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start_with("ca-rotation", 3, 10_000, &old_flags);
    // The operator's client trusts both CAs throughout and shows the certificate every node
    // trusts at the time.
    cluster.access.tls = Some(MutualTls::load(&with_extra(&old[1], &new[1])).unwrap());
    cluster.register_corpus("v0", 4, 10).await;

    // Straight onto the new CA: the others refuse node 1's certificate and node 1 theirs, so
    // it never learns a leader nor what the group commits.
    cluster.restart_with(1, tls_args(&new[0]));
    let cut_off = ControlAccess {
        tls: Some(MutualTls::load(&with_extra(&new[1], &old[1])).unwrap()),
        token: None,
    };
    let index = propose_on_leader_of(&cluster, &[2, 3], "cut-off").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = connect(&cluster.addresses[&1], &cut_off)
        .await
        .unwrap()
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        seen.applied_index < index && seen.leader_id == 0,
        "a node on the new CA alone still took part: {seen:?}"
    );

    let mut step = 0;
    for (phase, paths) in [
        ("trust both", &trust_both_old_certificate),
        ("reissue", &trust_both_new_certificate),
        ("drop the old CA", &new[0]),
    ] {
        // From the last step on, nodes trust only the new CA.
        if phase == "drop the old CA" {
            cluster.access.tls = Some(MutualTls::load(&with_extra(&new[1], &old[1])).unwrap());
        }
        for id in 1..=3 {
            cluster.restart_with(id, tls_args(paths));
            step += 1;
            // A leader every node agrees on, and an entry committed and applied on all
            // three, the restarted one included.
            cluster.leader().await;
            cluster.register_corpus(&format!("v{step}"), 4, 10).await;
        }
    }
}

/// Proposes a corpus registration on whichever of `ids` leads; returns its index.
async fn propose_on_leader_of(cluster: &Cluster, ids: &[u64], version: &str) -> u64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        for id in ids {
            let leads = cluster
                .status(*id)
                .await
                .is_some_and(|s| s.leader_id == *id);
            if leads {
                return cluster
                    .client(*id)
                    .await
                    .propose(ProposeRequest {
                        commands: vec![ControlCommand {
                            kind: Some(control_command::Kind::RegisterCorpus(CorpusFacts {
                                corpus_version: version.into(),
                                dimension: 4,
                                max_document_id: 10,
                            })),
                        }],
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .index;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no leader among {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `issued` to `cert` and `key` the way a Secret's volume changes: each file
/// replaced whole by a rename.
fn replace_pair(issued: &hasten_proto::tls::IssuedCertificate, cert: &Path, key: &Path) {
    for (pem, path) in [(&issued.cert_pem, cert), (&issued.key_pem, key)] {
        let staged = path.with_extension("new");
        std::fs::write(&staged, pem).unwrap();
        std::fs::rename(&staged, path).unwrap();
    }
}

/// Whether a gRPC client with our CA's certificate, expecting the server to be `name`,
/// gets the control-plane node at `address` to answer.
async fn answers_as(address: &str, name: &str, ca: &str, client: &TlsPaths) -> bool {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(&client.cert).unwrap(),
            std::fs::read(&client.key).unwrap(),
        ))
        .domain_name(name);
    let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
    else {
        return false;
    };
    ControlPlaneClient::new(channel)
        .status(StatusRequest {})
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_grpc_certificate_is_served_by_the_next_handshake() {
    let work = persistent_work_dir("grpc-certificate-reload").unwrap();
    let tls = work.join("tls");
    let _ = std::fs::remove_dir_all(&tls);
    std::fs::create_dir_all(&tls).unwrap();
    let ca = DevAuthority::new("deployment CA").unwrap();
    let client = ca
        .write_bundle(&tls, &["client"], &names())
        .unwrap()
        .remove(0);
    // The served certificate and its renewal carry different names, so a client can tell
    // which one it was shown.
    let (cert, key) = (tls.join("served.crt"), tls.join("served.key"));
    let first = ca
        .issue("control plane", &["first.hasten.test".into()])
        .unwrap();
    replace_pair(&first, &cert, &key);
    let address = format!("127.0.0.1:{}", free_loopback_port().unwrap());
    let dir = work.join("node-1");
    let _ = std::fs::remove_dir_all(&dir);
    let mut args = node_args(1, std::slice::from_ref(&address), &dir);
    args.extend(tls_args(&TlsPaths {
        ca: client.ca.clone(),
        extra_ca: None,
        cert: cert.clone(),
        key: key.clone(),
    }));
    let node = ManagedProcess::start(
        "node-1",
        &binary("control-plane").unwrap(),
        args,
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    assert!(answers_as(&address, "first.hasten.test", ca.ca_pem(), &client).await);
    assert!(!answers_as(&address, "renewed.hasten.test", ca.ca_pem(), &client).await);

    let renewed = ca
        .issue("control plane", &["renewed.hasten.test".into()])
        .unwrap();
    replace_pair(&renewed, &cert, &key);
    // Past the server's look-at-most-once-a-second interval.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        answers_as(&address, "renewed.hasten.test", ca.ca_pem(), &client).await,
        "the renewed certificate is served without a restart"
    );
    assert!(
        !answers_as(&address, "first.hasten.test", ca.ca_pem(), &client).await,
        "the replaced certificate is no longer served"
    );
    let scrape = Scrape::of(&node.addr("metrics_addr")).await.unwrap();
    assert_eq!(
        scrape.value("hasten_tls_reloads_total", &[("outcome", "served")]),
        1.0
    );
}

/// Moves every file of `staged` over its namesake in `dir`, each replaced whole by a rename
/// as a Secret's volume changes.
fn replace_files(staged: &Path, dir: &Path) {
    for entry in std::fs::read_dir(staged).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), dir.join(entry.file_name())).unwrap();
    }
}

/// A CA rotated under running processes, files replaced on disk and nothing restarted for
/// it: the cloud trusts client certificates from the new CA and shows its renewed
/// certificate from the next handshake (a new edge with the new files is answered), and an
/// edge that was running shows its renewed client certificate and trusts the new CA when it
/// next connects (the cloud restarted on the new files answers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_ca_and_renewed_client_certificates_are_used_without_restarts() {
    let work = persistent_work_dir("tls-rotation").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;
    let tls = work.join("tls");
    let staged = work.join("tls-staged");
    for dir in [&tls, &staged] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let first_ca = DevAuthority::new("first CA").unwrap();
    let issued = first_ca
        .write_bundle(&tls, &["cloud", "edge"], &names())
        .unwrap();
    let (cloud_tls, edge_tls) = (issued[0].clone(), issued[1].clone());
    let start_cloud = |name: &str, quic_addr: &str| {
        let mut extra = tls_args(&cloud_tls);
        extra.extend(["--quic-addr".into(), quic_addr.into()]);
        let mut args = hasten_eval::process::cloud_index_serve_args(
            &bundle_dir,
            "127.0.0.1:0",
            &work.join("unused.pem"),
        );
        // The helper's `--quic-addr` is replaced by the fixed one.
        let at = args.iter().position(|a| a == "--quic-addr").unwrap();
        args.drain(at..at + 2);
        args.extend(extra);
        ManagedProcess::start(
            name,
            &binary("cloud-index").unwrap(),
            args,
            &work,
            START_TIMEOUT,
        )
        .unwrap()
    };
    let cloud = start_cloud("cloud-1", "127.0.0.1:0");
    let quic_addr = cloud.addr("quic_addr");
    let start = |name: &str| {
        let mut extra = tls_args(&edge_tls);
        extra.extend(["--set".into(), "retrieval.policy=cloud-only".into()]);
        extra.extend(["--set".into(), "cloud.timeout_ms=1000".into()]);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        start_edge(&work, name, &bundle_dir, &quic_addr, &edge_tls.ca, &extra).unwrap()
    };
    let http = reqwest::Client::new();
    let running = start("edge-running");
    let running_addr = running.addr("http_addr");
    let (code, reply) = retrieve(&http, &running_addr, question, K).await;
    assert_eq!(code, 200, "{reply}");

    // The rotation: a new CA, and every certificate reissued by it, replacing the files.
    let second_ca = DevAuthority::new("second CA").unwrap();
    second_ca
        .write_bundle(&staged, &["cloud", "edge"], &names())
        .unwrap();
    replace_files(&staged, &tls);
    // Past the look-at-most-once-a-second interval.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A new edge holds only the second CA's material: the cloud, not restarted, must both
    // trust its certificate and show one the second CA issued.
    let fresh = start("edge-fresh");
    let (code, reply) = retrieve(&http, &fresh.addr("http_addr"), question, K).await;
    assert_eq!(
        code, 200,
        "the running cloud refused the new CA's edge: {reply}"
    );
    drop(fresh);

    // The cloud restarts on the rotated files (as a rolled pod would); the running edge
    // reconnects and must show its renewed certificate and trust the new CA to be answered.
    drop(cloud);
    let _cloud = start_cloud("cloud-2", &quic_addr);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (code, reply) = retrieve(&http, &running_addr, question, K).await;
        if code == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the running edge never reconnected with its renewed certificate: {reply}\n{}",
            running.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let scrape = Scrape::of(&running_addr).await.unwrap();
    assert_eq!(
        scrape.value("hasten_tls_reloads_total", &[("outcome", "served")]),
        1.0,
        "one reload of the edge's client TLS"
    );
}

/// A gRPC client under mutual TLS follows a CA rotation without a restart: a router dials
/// its shard with the router's certificate; every file is replaced by the new CA's and the
/// shard restarts on them (as a rolled pod would), and the router, not restarted, reaches
/// it again with its renewed certificate and the new CA's trust, while serving its own
/// renewed certificate to a client that trusts only the new CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_follows_a_rotated_ca_without_a_restart() {
    let work = persistent_work_dir("grpc-client-rotation").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let tls = work.join("tls");
    let staged = work.join("tls-staged");
    for dir in [&tls, &staged] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let issued = DevAuthority::new("first CA")
        .unwrap()
        .write_bundle(&tls, &["shard", "router"], &names())
        .unwrap();
    let (shard_tls, router_tls) = (issued[0].clone(), issued[1].clone());
    let shard_addr = format!("127.0.0.1:{}", free_loopback_port().unwrap());
    let start_shard = |name: &str| {
        start_cloud_index_with(&work, name, &bundle_dir, &shard_addr, &tls_args(&shard_tls))
            .unwrap()
    };
    let shard = start_shard("shard-1");
    let mut extra = tls_args(&router_tls);
    extra.extend(["--set".into(), "health_interval_ms=300".into()]);
    let router = start_router(&work, "router", &[vec![shard_addr.clone()]], &extra).unwrap();
    let readyz = format!("http://{}/readyz", router.addr("metrics_addr"));
    let http = reqwest::Client::new();
    let ready = |http: reqwest::Client, url: String| async move {
        http.get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    };
    assert!(ready(http.clone(), readyz.clone()).await);

    DevAuthority::new("second CA")
        .unwrap()
        .write_bundle(&staged, &["shard", "router"], &names())
        .unwrap();
    replace_files(&staged, &tls);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(shard);
    let _shard = start_shard("shard-2");

    let deadline = tokio::time::Instant::now() + WAIT;
    while !ready(http.clone(), readyz.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the router never reached the shard with its renewed certificate:\n{}",
            router.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A client holding only the new CA's material is answered by the router.
    let pem = |path: &Path| std::fs::read(path).unwrap();
    let client_tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem(&shard_tls.ca)))
        .identity(tonic::transport::Identity::from_pem(
            pem(&shard_tls.cert),
            pem(&shard_tls.key),
        ))
        .domain_name("localhost");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://{}", router.addr("grpc_addr")))
            .unwrap()
            .tls_config(client_tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
    CloudIndexClient::new(channel)
        .info(InfoRequest {})
        .await
        .unwrap();
}
