//! The router follows the shard map the control plane replicates, as real processes on
//! loopback: a router started with replica A in its configuration and a control-plane node
//! to follow moves to replica B once a `ShardMap` command listing only B commits, refuses a
//! map with another shard count on the way, and keeps answering, exactly as before, when A
//! is gone.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, cloud_index_route_args};
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{
    ControlCommand, ProposeRequest, QueryVector, SearchRequest, ShardMap, ShardReplicas,
    control_command,
};
use hasten_tests::cluster::Cluster;
use hasten_tests::{build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index};

const START_TIMEOUT: Duration = Duration::from_secs(120);

fn shard_map_command(shards: &[&[&str]]) -> ProposeRequest {
    let map = ShardMap {
        shards: shards
            .iter()
            .map(|endpoints| ShardReplicas {
                endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            })
            .collect(),
    };
    ProposeRequest {
        commands: vec![ControlCommand {
            kind: Some(control_command::Kind::ShardMap(map)),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_moves_to_the_replicas_the_control_plane_lists() {
    let work = persistent_work_dir("shard-map").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cluster = Cluster::start("shard-map-control-plane", 1, 10_000);
    let mut a = start_cloud_index(&work, "replica-a", &bundle_dir, "127.0.0.1:0").unwrap();
    let a_endpoint = a.addr("grpc_addr");

    let mut args = cloud_index_route_args(&[vec![a_endpoint.clone()]], &dev_cert(&work, "router"));
    args.extend(
        [
            "--control-plane",
            &cluster.addresses[&1],
            "--set",
            "health_interval_ms=200",
            "--set",
            "startup_timeout_s=20",
        ]
        .map(String::from),
    );
    let router = ManagedProcess::start(
        "router",
        &binary("cloud-index").unwrap(),
        &args,
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let mut cloud = CloudIndexClient::connect(format!("http://{}", router.addr("grpc_addr")))
        .await
        .unwrap();
    let request = SearchRequest {
        queries: vec![QueryVector {
            values: bundle.vector(bundle.len() / 3).to_vec(),
        }],
        k: 10,
        include_texts: true,
        ..Default::default()
    };
    let from_a = cloud.search(request.clone()).await.unwrap().into_inner();
    assert_eq!(from_a.results[0].hits.len(), 10);

    let b = start_cloud_index(&work, "replica-b", &bundle_dir, "127.0.0.1:0").unwrap();
    let b_endpoint = b.addr("grpc_addr");
    cluster.leader().await;
    let mut control = cluster.client(1).await;
    // A map of two shards for a corpus the router serves as one: refused, A stays. Waited
    // for before the next map: a router that subscribes after both committed would see only
    // the latest state, and never this map.
    control
        .propose(shard_map_command(&[&[&b_endpoint], &[&a_endpoint]]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(&router.log).unwrap();
        if log.contains("refused") && log.contains("has 2 shards") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two-shard map was not refused:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    control
        .propose(shard_map_command(&[&[&b_endpoint]]))
        .await
        .unwrap();

    // The router lists B (and checked it) once it applied the map; A's series is gone.
    let metrics = router.addr("metrics_addr");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let scrape = Scrape::of(&metrics).await.unwrap();
        let b_up = scrape.value("hasten_cloud_replica_up", &[("endpoint", &b_endpoint)]);
        if b_up == 1.0 {
            let text = reqwest::get(format!("http://{metrics}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(
                !text.contains(&format!("endpoint=\"{a_endpoint}\"")),
                "the router still reports A:\n{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the router never took up B:\n{}",
            router.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.stop();
    let from_b = cloud.search(request).await.unwrap().into_inner();
    assert_eq!(from_b, from_a);
}
