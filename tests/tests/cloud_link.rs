//! The edge's link to its cloud, with a `cloud-index serve` process on loopback and the
//! edge's QUIC client: a cloud addressed as `localhost:PORT` (resolved by the system's
//! resolver at each connection attempt) answers as one addressed by IP, a name that does
//! not resolve is an error naming it, and a certificate replaced on disk is served by the
//! next handshake without a restart.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_edge_node::fallback::quic::{CloudEndpoint, QuicCloudClient};
use hasten_edge_node::fallback::{CloudError, CloudSearch};
use hasten_loadtest::scrape::Scrape;
use hasten_proto::quic::client_config;
use hasten_proto::tls::TrustRoots;
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_cloud_index_with,
    write_tls_identity,
};

/// The edge's client for the cloud at `addr` serving `bundle`, trusting the PEM `trust`.
fn cloud_client(addr: String, trust: &Path, bundle: &CorpusBundle) -> QuicCloudClient {
    QuicCloudClient::new(
        client_config(&TrustRoots::from_pem_file(trust).unwrap(), None).unwrap(),
        CloudEndpoint {
            addr,
            server_name: "localhost".into(),
            timeout: Duration::from_secs(10),
            corpus_version: bundle.manifest.corpus_version.clone(),
        },
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_addressed_by_name_answers_as_by_ip() {
    let work = persistent_work_dir("cloud-name").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let trust = dev_cert(&work, "cloud");
    let by_ip = cloud.addr("quic_addr");
    let port = by_ip.rsplit_once(':').unwrap().1;
    let query = bundle.vector(5).to_vec();
    let expected = cloud_client(by_ip.clone(), &trust, &bundle)
        .search(&query, 10, None)
        .await
        .unwrap();
    let by_name = cloud_client(format!("localhost:{port}"), &trust, &bundle);
    by_name.verify_link().await.unwrap();
    assert_eq!(by_name.search(&query, 10, None).await.unwrap(), expected);

    let nowhere = cloud_client(format!("no-such-cloud.invalid:{port}"), &trust, &bundle);
    let error = nowhere.verify_link().await.unwrap_err();
    assert!(
        matches!(&error, CloudError::Resolve { addr, .. } if addr.starts_with("no-such-cloud.invalid")),
        "{error}"
    );
}

/// The files are replaced as an operator or a Secret volume would, certificate then key:
/// the check in between may find a certificate with the old key, which must be refused
/// while the old pair keeps serving. A server that read its certificate once (the code
/// before) fails the first assertion after the swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_is_served_by_the_next_handshake() {
    let work = persistent_work_dir("cloud-certificate-reload").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let tls = work.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let (served_cert, served_key) = write_tls_identity(&tls, "served").unwrap();
    let first = tls.join("first.crt");
    std::fs::copy(&served_cert, &first).unwrap();
    let cloud = start_cloud_index_with(
        &work,
        "cloud",
        &bundle_dir,
        "127.0.0.1:0",
        &[
            "--tls-cert".into(),
            served_cert.display().to_string(),
            "--tls-key".into(),
            served_key.display().to_string(),
        ],
    )
    .unwrap();
    let addr = cloud.addr("quic_addr");
    cloud_client(addr.clone(), &first, &bundle)
        .verify_link()
        .await
        .unwrap();

    let (renewed_cert, renewed_key) = write_tls_identity(&tls, "renewed").unwrap();
    let second = tls.join("second.crt");
    std::fs::copy(&renewed_cert, &second).unwrap();
    std::fs::rename(&renewed_cert, &served_cert).unwrap();
    std::fs::rename(&renewed_key, &served_key).unwrap();
    // Past the server's look-at-most-once-a-second interval.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cloud_client(addr.clone(), &second, &bundle)
        .verify_link()
        .await
        .expect("the renewed certificate is served without a restart");
    assert!(
        cloud_client(addr.clone(), &first, &bundle)
            .verify_link()
            .await
            .is_err(),
        "the replaced certificate is no longer served"
    );
    let served = Scrape::of(&cloud.addr("metrics_addr"))
        .await
        .unwrap()
        .value("hasten_tls_reloads_total", &[("outcome", "served")]);
    assert_eq!(served, 1.0);
}
