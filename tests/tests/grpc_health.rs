//! gRPC health checking as load balancers and meshes use it, on real processes: every gRPC
//! server (shard, router, control-plane node, edge) answers `grpc.health.v1.Health/Check`
//! with what its `/readyz` answers, and follows it when readiness changes (the router turns
//! `NOT_SERVING` when its shard has no live replica left).

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hasten_eval::process::{ManagedProcess, binary, cloud_index_route_args};
use hasten_tests::cluster::Cluster;
use hasten_tests::{
    build_small_bundle, dev_cert, grpc_health, grpc_health_becomes, persistent_work_dir,
    start_cloud_index, start_edge,
};

const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Longer than the health service's one-second recheck, with room for a loaded machine.
const FOLLOWS_WITHIN: Duration = Duration::from_secs(15);

/// `/readyz` of the process whose metrics listen on `addr`: its status code.
async fn readyz(addr: &str) -> u16 {
    reqwest::get(format!("http://{addr}/readyz"))
        .await
        .map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grpc_server_answers_health_checks_as_its_readyz() {
    let work = persistent_work_dir("grpc-health").unwrap();
    let (bundle, _) = build_small_bundle(&work, 3, None).unwrap();
    let mut shard = start_cloud_index(&work, "health-shard", &bundle, "127.0.0.1:0").unwrap();
    let router_cert = dev_cert(&work, "health-router");
    let router = ManagedProcess::start(
        "health-router",
        &binary("cloud-index").unwrap(),
        cloud_index_route_args(&[vec![shard.addr("grpc_addr")]], &router_cert),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let control_plane = Cluster::start("grpc-health-cp", 1, 10_000);
    control_plane.leader().await;
    let edge = start_edge(
        &work,
        "health-edge",
        &bundle,
        &router.addr("quic_addr"),
        &router_cert,
        &[],
    )
    .unwrap();

    let servers = [
        ("shard", shard.addr("grpc_addr")),
        ("router", router.addr("grpc_addr")),
        ("control-plane node", control_plane.addresses[&1].clone()),
        ("edge", edge.addr("grpc_addr")),
    ];
    for (name, addr) in &servers {
        let status = grpc_health_becomes(addr, "SERVING", FOLLOWS_WITHIN).await;
        assert_eq!(status, "SERVING", "{name} at {addr}");
    }

    // The router's only shard goes: /readyz says 503, and so does the health service.
    shard.stop();
    let router_grpc = router.addr("grpc_addr");
    let status = grpc_health_becomes(&router_grpc, "NOT_SERVING", FOLLOWS_WITHIN).await;
    assert_eq!(
        (status.as_str(), readyz(&router.addr("metrics_addr")).await),
        ("NOT_SERVING", 503),
        "the router's health and /readyz once its shard is gone"
    );
    // The others were not told anything new.
    assert_eq!(
        grpc_health(&control_plane.addresses[&1]).await.unwrap(),
        "SERVING"
    );
}
