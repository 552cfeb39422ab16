//! The edge reaches its cloud by name: a `cloud-index serve` process on loopback and the
//! edge's QUIC client addressed as `localhost:PORT` (resolved by the system's resolver at
//! each connection attempt) searches as one addressed by IP, and a name that does not
//! resolve is an error naming it, not a hang.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edge_node::fallback::quic::{CloudEndpoint, QuicCloudClient};
use edge_node::fallback::{CloudError, CloudSearch};
use hasten_core::bundle::CorpusBundle;
use hasten_proto::quic::client_config;
use hasten_proto::tls::TrustRoots;
use hasten_tests::{build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_addressed_by_name_answers_as_by_ip() {
    let work = persistent_work_dir("cloud-name").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let trust = TrustRoots::from_pem_file(&dev_cert(&work, "cloud")).unwrap();
    let client = |addr: String| {
        QuicCloudClient::new(
            client_config(&trust, None).unwrap(),
            CloudEndpoint {
                addr,
                server_name: "localhost".into(),
                timeout: Duration::from_secs(10),
                corpus_version: bundle.manifest.corpus_version.clone(),
            },
        )
        .unwrap()
    };
    let by_ip = cloud.addr("quic_addr");
    let port = by_ip.rsplit_once(':').unwrap().1;
    let query = bundle.vector(5).to_vec();
    let expected = client(by_ip.clone())
        .search(&query, 10, None)
        .await
        .unwrap();
    let by_name = client(format!("localhost:{port}"));
    by_name.verify_link().await.unwrap();
    assert_eq!(by_name.search(&query, 10, None).await.unwrap(), expected);

    let nowhere = client(format!("no-such-cloud.invalid:{port}"));
    let error = nowhere.verify_link().await.unwrap_err();
    assert!(
        matches!(&error, CloudError::Resolve { addr, .. } if addr.starts_with("no-such-cloud.invalid")),
        "{error}"
    );
}
