//! A KV pool's assignment through the Raft control plane, with real control-plane processes
//! on loopback: the operator's publisher proposes it (to a node that is down first, then to
//! the live ones), every node applies it, and a follower of the committed stream running the
//! edge's code moves a real `KvPool` to the assignment's workers (routing over them from then
//! on). An assignment the control plane refuses (a worker listed twice) comes back refused
//! and changes nothing.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_edge_node::replication::apply::kv_pool_workers;
use hasten_kv_operator::publish::{AssignmentPublisher, ControlPlanePublisher, PublishError};
use hasten_proto::control::{self, FollowStatus};
use hasten_proto::v1::KvPoolAssignment;
use hasten_tests::cluster::Cluster;
use hasten_worker_api::kv::KvPool;
use hasten_worker_api::kv::Variant;
use hasten_worker_api::kv::routing::KvRouting;
use hasten_worker_api::kv::{FusionMode, FusionSettings};

fn assignment(workers: &[&str], version: &str) -> KvPoolAssignment {
    KvPoolAssignment {
        pool: "rag/wiki".into(),
        workers: workers.iter().map(|w| w.to_string()).collect(),
        assignment_version: version.into(),
    }
}

async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_assignment_reaches_every_node_and_the_edges_kv_pool() {
    let cluster = Cluster::start("kv-pool-assignment", 3, 10_000);
    cluster.leader().await;
    let nodes: Vec<String> = cluster.addresses.values().cloned().collect();

    // Nothing listens on the discard port: the publisher must move on to the next node.
    let mut endpoints = vec!["127.0.0.1:9".to_string()];
    endpoints.extend(nodes.iter().cloned());
    let publisher = ControlPlanePublisher::new(endpoints, cluster.access.clone());

    // The edge's pool, started with the list its configuration gave it.
    let pool = Arc::new(
        KvPool::connect_lazy(
            &["wiki-0.wiki.rag.svc:7510".to_string()],
            None,
            "v1".into(),
            FusionSettings {
                mode: FusionMode::FusionRag,
                ratio: 0.15,
            },
            Variant::Similarity,
            KvRouting::KvAware,
        )
        .unwrap(),
    );
    let followed = Arc::clone(&pool);
    tokio::spawn(control::follow(
        nodes.clone(),
        cluster.access.clone(),
        "edge-under-test".into(),
        Arc::new(FollowStatus::default()),
        move |event| {
            for workers in kv_pool_workers(&event, "rag/wiki") {
                followed.set_workers(&workers).unwrap();
            }
        },
    ));

    let three = [
        "wiki-0.wiki.rag.svc:7510",
        "wiki-1.wiki.rag.svc:7510",
        "wiki-2.wiki.rag.svc:7510",
    ];
    publisher.publish(assignment(&three, "a1")).await.unwrap();
    for id in 1..=3u64 {
        eventually(&format!("node {id} to hold the assignment"), async || {
            cluster
                .state(id)
                .await
                .kv_pools
                .iter()
                .any(|a| a.pool == "rag/wiki" && a.assignment_version == "a1" && a.workers == three)
        })
        .await;
    }
    eventually("the edge's pool to follow", async || {
        pool.workers() == three
    })
    .await;

    let refused = publisher
        .publish(assignment(
            &["wiki-0.wiki.rag.svc:7510", "wiki-0.wiki.rag.svc:7510"],
            "bad",
        ))
        .await
        .unwrap_err();
    assert!(matches!(refused, PublishError::Refused(_)), "{refused}");

    // A scale-down to two workers moves the pool again; the refused one never arrived.
    let two = &three[..2];
    publisher.publish(assignment(two, "a2")).await.unwrap();
    eventually("the edge's pool to shrink", async || pool.workers() == two).await;
    let state = cluster.state(1).await;
    assert_eq!(state.kv_pools.len(), 1);
    assert_eq!(state.kv_pools[0].assignment_version, "a2");
}
