//! Scaling the control plane up as the chart does: three founders form the group; a
//! fourth node started with `--join true --auto-join true` and every member's address (the
//! chart's rendering for an ordinal past the founding replicas) asks the group to add it,
//! becomes a voter and catches up with what was committed before it existed; restarted, it
//! stays one member. A node started with `--join true` alone is not added: auto-join is
//! what adds it.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_proto::v1::{CacheEntry, ControlCommand, ProposeRequest, control_command};
use hasten_tests::cluster::Cluster;

async fn members_of(cluster: &Cluster, id: u64) -> Vec<u64> {
    let mut members: Vec<u64> = cluster
        .status(id)
        .await
        .map(|s| s.members.iter().map(|m| m.id).collect())
        .unwrap_or_default();
    members.sort_unstable();
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ordinal_joins_the_group_the_founders_formed() {
    let mut cluster = Cluster::start("cp-scaling", 3, 10_000);
    let leader = cluster.leader().await;
    cluster.register_corpus("v1", 2, 100).await;
    let index = cluster
        .client(leader)
        .await
        .propose(ProposeRequest {
            commands: vec![ControlCommand {
                kind: Some(control_command::Kind::Insert(CacheEntry {
                    origin: "edge".into(),
                    origin_seq: 1,
                    vector: vec![1.0, 0.0],
                    document_ids: vec![7],
                    tenant: "default".into(),
                    corpus_version: "v1".into(),
                    ..CacheEntry::default()
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .index;

    cluster.auto_join_node(4);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let joined = members_of(&cluster, leader).await == [1, 2, 3, 4];
        let caught_up = cluster
            .status(4)
            .await
            .is_some_and(|s| s.applied_index >= index && s.cached_entries == 1);
        if joined && caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 never joined and caught up: leader's members {:?}, node 4 {:?}",
            members_of(&cluster, leader).await,
            cluster.status(4).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Restarted with the same flags, it finds itself a member and stays one member.
    cluster.kill(4);
    cluster.auto_join_node(4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.leader().await;
    assert_eq!(members_of(&cluster, leader).await, [1, 2, 3, 4]);

    // Without auto-join a new node waits for an operator: nothing adds it.
    cluster.join_node(5);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(members_of(&cluster, leader).await, [1, 2, 3, 4]);
}
