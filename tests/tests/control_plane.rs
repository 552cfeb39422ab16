//! The Raft control plane as real processes on loopback: three `control-plane` nodes with
//! their own sled directories, talking gRPC. Leaders are killed under a stream of proposals
//! and nodes restart from sled.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_edge_node::replication::{ControlPlaneLink, CorpusIdentity};
use hasten_edge_node::retrieval::CacheReplication;
use hasten_edge_node::tenants::Tenant;
use hasten_proto::control::{ControlClient, endpoint};
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{
    CacheEntry, CommittedEvent, ControlCommand, ControlState, MemberRequest, ProposeRequest,
    SubscribeRequest, applied_command, control_command,
};
use hasten_tests::cluster::Cluster;
const DIMENSION: usize = 8;
const CORPUS: &str = "test-corpus";

/// Registers the corpus of [`entry`]'s entries.
async fn register(cluster: &Cluster) {
    cluster
        .register_corpus(CORPUS, DIMENSION as u32, 1_000_000)
        .await;
}

fn entry(origin: &str, seq: u64) -> ControlCommand {
    ControlCommand {
        kind: Some(control_command::Kind::Insert(CacheEntry {
            origin: origin.into(),
            origin_seq: seq,
            text: Some(format!("question {seq} from {origin}")),
            vector: (0..DIMENSION).map(|i| (seq + i as u64) as f32).collect(),
            document_ids: (0..3).map(|d| seq * 10 + d).collect(),
            tenant: "default".into(),
            corpus_version: CORPUS.into(),
        })),
    }
}

/// (id, (origin, seq)) of each cached entry, oldest first.
fn entries_by_id(state: &ControlState) -> Vec<(u64, (String, u64))> {
    state
        .entries
        .iter()
        .map(|e| {
            let entry = e.entry.as_ref().unwrap();
            (e.id, (entry.origin.clone(), entry.origin_seq))
        })
        .collect()
}

/// (origin, seq) of each cached entry, oldest first.
fn keys(state: &ControlState) -> Vec<(String, u64)> {
    entries_by_id(state)
        .into_iter()
        .map(|(_, key)| key)
        .collect()
}

fn follower_of(cluster: &Cluster, leader: u64) -> u64 {
    *cluster.nodes.keys().find(|id| **id != leader).unwrap()
}

/// Proposals node `id` committed, from its `/metrics`.
async fn committed_at(cluster: &Cluster, id: u64) -> u64 {
    let page = reqwest::get(format!(
        "http://{}/metrics",
        cluster.nodes[&id].addr("metrics_addr")
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    page.lines()
        .find_map(|line| line.strip_prefix("hasten_cp_proposals_total{result=\"committed\"} "))
        .map_or(0, |count| count.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_names_the_leader_and_an_edge_proposes_there_from_then_on() {
    let cluster = Cluster::start("control-plane-leader-hint", 3, 10_000);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let follower = follower_of(&cluster, leader);
    let propose = async |id: u64, seq: u64| {
        cluster
            .client(id)
            .await
            .propose(ProposeRequest {
                commands: vec![entry("edge-a", seq)],
            })
            .await
            .unwrap()
            .into_inner()
    };
    assert_eq!(
        propose(follower, 1).await.leader_address,
        cluster.addresses[&leader]
    );
    assert_eq!(
        propose(leader, 2).await.leader_address,
        "",
        "the leader names no other"
    );

    // An edge's link that knows the follower only: its first proposal (the corpus
    // registration) goes there, every later one to the leader the answer named.
    let before = (
        committed_at(&cluster, follower).await,
        committed_at(&cluster, leader).await,
    );
    let corpus = CorpusIdentity {
        version: CORPUS.into(),
        dimension: DIMENSION,
        max_document_id: 1_000_000,
    };
    let link = ControlPlaneLink::start(
        "edge-b",
        corpus,
        vec![cluster.addresses[&follower].clone()],
        cluster.access.clone(),
    );
    for seq in 1..=5u64 {
        link.propose(
            &Tenant::default_tenant(),
            Some(format!("question {seq} from edge-b")),
            &[seq as f32; DIMENSION],
            vec![seq],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster.state(leader).await.entries.len() < 2 + seq as usize {
            assert!(
                Instant::now() < deadline,
                "entry {seq} of the edge never committed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let after = (
        committed_at(&cluster, follower).await,
        committed_at(&cluster, leader).await,
    );
    assert_eq!(
        after.0 - before.0,
        1,
        "only the registration went through the follower"
    );
    assert_eq!(
        after.1 - before.1,
        5,
        "the edge's entries went to the leader"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_is_elected_and_every_node_applies_the_same_entries_in_order() {
    let cluster = Cluster::start("control-plane-order", 3, 10_000);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let follower = follower_of(&cluster, leader);
    let mut client = cluster.client(follower).await;
    let mut last = 0;
    for seq in 1..=20 {
        let origin = if seq % 2 == 0 { "edge-a" } else { "edge-b" };
        last = client
            .propose(ProposeRequest {
                commands: vec![entry(origin, seq)],
            })
            .await
            .unwrap()
            .into_inner()
            .index;
    }
    // One proposal carrying several commands commits as one log entry.
    let batch = client
        .propose(ProposeRequest {
            commands: (21..=25).map(|s| entry("edge-c", s)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .index;
    assert_eq!(batch, last + 1, "a batch of five is one log entry");
    // A retried proposal (same origin and sequence) is applied once.
    client
        .propose(ProposeRequest {
            commands: vec![entry("edge-c", 25)],
        })
        .await
        .unwrap();
    let states = {
        let status = cluster.status(leader).await.unwrap();
        cluster.applied_everywhere(status.commit_index).await;
        let mut states = Vec::new();
        for id in cluster.nodes.keys() {
            states.push(keys(&cluster.state(*id).await));
        }
        states
    };
    assert_eq!(states[0].len(), 25, "{:?}", states[0]);
    assert!(states.iter().all(|s| *s == states[0]), "{states:?}");
    // A bad proposal is refused with a reason, not committed.
    let mut bad = entry("edge-a", 99);
    if let Some(control_command::Kind::Insert(e)) = &mut bad.kind {
        e.document_ids.clear();
    }
    let err = client
        .propose(ProposeRequest {
            commands: vec![bad],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("no documents"), "{}", err.message());
}

/// The failover test's proposals: at most one per interval (1,500 in its 6 s), and never
/// more than this many, far below the cache's capacity of 5,000, so none is evicted.
const MAX_PROPOSALS: u64 = 2_000;
const PROPOSAL_INTERVAL: Duration = Duration::from_millis(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_load_loses_no_acknowledged_entry() {
    let mut cluster = Cluster::start("control-plane-failover", 3, 50);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let survivors: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    let addresses: Vec<String> = survivors
        .iter()
        .map(|id| cluster.addresses[id].clone())
        .collect();
    // A steady stream of proposals to the followers (retrying on the other one), each
    // acknowledged sequence number recorded.
    let producer = tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        let mut seq = 0;
        let started = Instant::now();
        // Paced, and fewer entries than the tenant's cache holds: beyond its capacity
        // (DEFAULT_CACHE_CAPACITY) the oldest are evicted (FIFO), acknowledged or not. An
        // unpaced run once proposed over 5,000 in the 6 s, and the first five acknowledged
        // entries were evicted.
        let mut pace = tokio::time::interval(PROPOSAL_INTERVAL);
        while started.elapsed() < Duration::from_secs(6) && seq < MAX_PROPOSALS {
            pace.tick().await;
            seq += 1;
            for address in addresses.iter().cycle().take(4) {
                let Ok(channel) = endpoint(address, None).unwrap().connect().await else {
                    continue;
                };
                let mut request = tonic::Request::new(ProposeRequest {
                    commands: vec![entry("edge-load", seq)],
                });
                request.set_timeout(Duration::from_secs(3));
                if ControlPlaneClient::new(channel)
                    .propose(request)
                    .await
                    .is_ok()
                {
                    acknowledged.push(seq);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        acknowledged
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(leader);
    let acknowledged = producer.await.unwrap();
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    assert!(
        acknowledged.len() > 20,
        "only {} proposals acknowledged",
        acknowledged.len()
    );
    let commit = cluster.status(new_leader).await.unwrap().commit_index;
    cluster.applied_everywhere(commit).await;
    let expect = |state: &ControlState, who: &str| {
        let held: std::collections::HashSet<u64> = keys(state).iter().map(|(_, s)| *s).collect();
        let lost: Vec<u64> = acknowledged
            .iter()
            .copied()
            .filter(|s| !held.contains(s))
            .collect();
        assert!(lost.is_empty(), "{who} lacks acknowledged entries {lost:?}");
    };
    for id in &survivors {
        expect(&cluster.state(*id).await, &format!("node {id}"));
    }
    // The killed leader restarts from its sled directory and catches up (through a
    // snapshot: the log was compacted every 50 entries meanwhile).
    cluster.start_node(leader);
    cluster.applied_everywhere(commit).await;
    let restarted = cluster.state(leader).await;
    expect(&restarted, "the restarted node");
    assert_eq!(keys(&restarted), keys(&cluster.state(new_leader).await));
}

/// Applies a committed stream the way an edge does; returns the (origin, seq) cache.
async fn follow(
    client: &mut ControlClient,
    from: u64,
    cache: &mut Vec<(u64, (String, u64))>,
    until: u64,
) -> u64 {
    let mut stream = subscribe(client, from).await;
    read_until(&mut stream, from.saturating_sub(1), cache, until).await
}

async fn subscribe(client: &mut ControlClient, from: u64) -> tonic::Streaming<CommittedEvent> {
    client
        .subscribe(SubscribeRequest {
            from_index: from,
            subscriber: "test".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Applies events after `applied` to `cache` until `until` is applied; returns the last
/// applied index.
async fn read_until(
    stream: &mut tonic::Streaming<CommittedEvent>,
    mut applied: u64,
    cache: &mut Vec<(u64, (String, u64))>,
    until: u64,
) -> u64 {
    while applied < until {
        let event: CommittedEvent = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the stream stalled")
            .unwrap()
            .unwrap();
        assert!(event.index > applied, "events out of order");
        if let Some(state) = event.state {
            *cache = entries_by_id(&state);
        }
        for applied_command in event.applied {
            cache.retain(|(id, _)| !applied_command.removed.contains(id));
            if let Some(applied_command::Kind::Inserted(stored)) = applied_command.kind {
                let entry = stored.entry.unwrap();
                cache.push((stored.id, (entry.origin, entry.origin_seq)));
            }
        }
        applied = event.index;
    }
    applied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resumes_and_after_compaction_installs_the_state() {
    let cluster = Cluster::start("control-plane-subscribe", 3, 30);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let mut client = cluster.client(leader).await;
    // Shrink the cache so eviction decisions are part of what must match.
    client
        .propose(ProposeRequest {
            commands: vec![ControlCommand {
                kind: Some(control_command::Kind::Config(
                    hasten_proto::v1::RuntimeConfig {
                        tau: None,
                        cache_capacity: Some(40),
                    },
                )),
            }],
        })
        .await
        .unwrap();
    let propose = async |client: &mut ControlClient, seqs: std::ops::RangeInclusive<u64>| {
        let mut index = 0;
        for seq in seqs {
            index = client
                .propose(ProposeRequest {
                    commands: vec![entry("edge-a", seq)],
                })
                .await
                .unwrap()
                .into_inner()
                .index;
        }
        index
    };
    let first = propose(&mut client, 1..=10).await;
    let mut follower = cluster.client(follower_of(&cluster, leader)).await;
    let mut cache = Vec::new();
    let applied = follow(&mut follower, 1, &mut cache, first).await;
    // While the subscriber is away, far more than the log keeps is committed.
    let last = propose(&mut client, 11..=120).await;
    follow(&mut follower, applied + 1, &mut cache, last).await;
    let expected = entries_by_id(&cluster.state(leader).await);
    assert_eq!(expected.len(), 40);
    assert_eq!(cache, expected);
    let status = cluster.status(leader).await.unwrap();
    assert!(
        status.first_log_index > applied + 1,
        "the log was not compacted: {status:?}"
    );
}

/// Proposes `entry(origin, seq)` through `client` until it commits (a partition or an
/// election may make attempts fail); returns the index it committed at.
async fn propose_until_committed(client: &mut ControlClient, origin: &str, seq: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = ProposeRequest {
            commands: vec![entry(origin, seq)],
        };
        match client.propose(request).await {
            Ok(reply) => return reply.into_inner().index,
            Err(status) => {
                assert!(
                    Instant::now() < deadline,
                    "entry {seq} never committed: {status}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_catches_up_through_a_snapshot_after_the_partition_heals() {
    let (cluster, relays) = Cluster::start_isolatable("control-plane-partition", 3, 20, 3).await;
    register(&cluster).await;
    let mut client = cluster.client(1).await;
    let mut last = 0;
    for seq in 1..=5 {
        last = propose_until_committed(&mut client, "edge-a", seq).await;
    }
    cluster.applied_everywhere(last).await;
    // An edge following the node that will be cut off, read only after the partition heals.
    let mut subscriber = subscribe(&mut cluster.client(3).await, 1).await;
    let mut followed = Vec::new();
    let seen = read_until(&mut subscriber, 0, &mut followed, last).await;

    for relay in &relays {
        relay.cut();
    }
    // The majority (nodes 1 and 2) keeps committing, electing a new leader if node 3 led.
    for seq in 6..=60 {
        last = propose_until_committed(&mut client, "edge-a", seq).await;
    }
    let isolated = cluster.status(3).await.unwrap();
    assert!(
        isolated.applied_index < last,
        "the isolated node applied {} of {last}",
        isolated.applied_index
    );
    let majority = cluster.status(1).await.unwrap();
    assert!(
        majority.first_log_index > isolated.applied_index + 1,
        "{majority:?}"
    );

    for relay in &relays {
        relay.heal();
    }
    cluster.applied_everywhere(last).await;
    let expected = keys(&cluster.state(1).await);
    assert_eq!(expected.len(), 60);
    for id in [2, 3] {
        assert_eq!(keys(&cluster.state(id).await), expected, "node {id}");
    }
    // The node jumped over the compacted entries with the leader's snapshot; its subscriber
    // must get that state rather than miss what the snapshot covered.
    read_until(&mut subscriber, seen, &mut followed, last).await;
    assert_eq!(
        followed.into_iter().map(|(_, key)| key).collect::<Vec<_>>(),
        expected
    );
    let log = std::fs::read_to_string(&cluster.nodes[&3].log).unwrap();
    assert!(
        log.contains("installed a snapshot from the leader"),
        "the isolated node caught up without the snapshot the compacted log requires"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_another_leaves_while_entries_commit() {
    let mut cluster = Cluster::start("control-plane-membership", 3, 20);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let mut client = cluster.client(leader).await;
    for seq in 1..=30 {
        propose_until_committed(&mut client, "edge-a", seq).await;
    }
    let members = async |cluster: &Cluster, id: u64| -> Vec<u64> {
        let mut ids: Vec<u64> = cluster
            .status(id)
            .await
            .unwrap()
            .members
            .iter()
            .map(|m| m.id)
            .collect();
        ids.sort_unstable();
        ids
    };

    cluster.join_node(4);
    let added = client
        .add_node(MemberRequest {
            id: 4,
            address: cluster.addresses[&4].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.members.len(), 4, "{added:?}");
    let mut last = 0;
    for seq in 31..=40 {
        last = propose_until_committed(&mut client, "edge-a", seq).await;
    }
    // The new node learned the compacted past through a snapshot and the rest from the log.
    cluster.applied_everywhere(last).await;
    let expected = keys(&cluster.state(leader).await);
    assert_eq!(expected.len(), 40);
    assert_eq!(keys(&cluster.state(4).await), expected);
    assert_eq!(members(&cluster, 4).await, vec![1, 2, 3, 4]);

    let leaving = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != 4)
        .unwrap();
    client
        .remove_node(MemberRequest {
            id: leaving,
            address: String::new(),
        })
        .await
        .unwrap();
    cluster.kill(leaving);
    for seq in 41..=50 {
        last = propose_until_committed(&mut client, "edge-a", seq).await;
    }
    cluster.applied_everywhere(last).await;
    let remaining: Vec<u64> = [1, 2, 3, 4]
        .into_iter()
        .filter(|id| *id != leaving)
        .collect();
    for id in cluster.nodes.keys() {
        assert_eq!(members(&cluster, *id).await, remaining, "node {id}");
        assert_eq!(keys(&cluster.state(*id).await).len(), 50, "node {id}");
    }
    // Adding needs the new member's address.
    let refused = client
        .add_node(MemberRequest {
            id: 9,
            address: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}

/// Bug: a proposal forwarded to a leader that then vanished waited for the propose timeout
/// and was never counted. Now every proposal waiting when leadership moves is answered at
/// once with a clear error, and counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_in_flight_when_the_leader_hangs_are_answered_long_before_the_timeout() {
    // A propose timeout far beyond an election (tick 50 ms x 10), so that an answer within
    // a few seconds can only come from the node noticing the leadership change.
    let propose_timeout = Duration::from_secs(30);
    let mut cluster = Cluster::start_with(
        "control-plane-stale",
        3,
        10_000,
        &["--set", "propose_timeout_ms=30000"],
    );
    let leader = cluster.leader().await;
    register(&cluster).await;
    let follower = follower_of(&cluster, leader);
    let metrics = cluster.nodes[&follower].addr("metrics_addr");
    let dropped = || async {
        hasten_loadtest::scrape::Scrape::of(&metrics)
            .await
            .unwrap()
            .value("hasten_cp_proposals_total", &[("result", "dropped")])
    };
    let dropped_before = dropped().await;
    // The leader hangs: the follower still believes in it for an election timeout and
    // forwards what it is given; those proposals are lost with it.
    cluster.pause(leader);
    let started = Instant::now();
    let proposals: Vec<_> = (1..=8u64)
        .map(|seq| {
            let address = cluster.addresses[&follower].clone();
            tokio::spawn(async move {
                let channel = endpoint(&address, None).unwrap().connect().await.unwrap();
                let answer = ControlPlaneClient::new(channel)
                    .propose(ProposeRequest {
                        commands: vec![entry("edge-stale", seq)],
                    })
                    .await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut stale = 0;
    for proposal in proposals {
        let (answer, took) = proposal.await.unwrap();
        assert!(
            took < propose_timeout / 4,
            "a proposal was answered only after {took:?}: {answer:?}"
        );
        match answer {
            Ok(_) => {}
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                assert!(
                    status.message().contains("leadership changed"),
                    "{}",
                    status.message()
                );
                stale += 1;
            }
        }
    }
    assert!(stale > 0, "no proposal was caught in flight");
    assert!(
        dropped().await - dropped_before >= f64::from(stale),
        "stale proposals were not counted as dropped"
    );
    // The others elected a new leader meanwhile; the hung one is gone for good.
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
}

/// Bug: SIGTERM never finished on a node with a subscribed edge (its stream kept the server
/// draining), so the node kept its store's lock and could not be restarted, while the edge
/// believed it was still subscribed. Now subscriber streams end on shutdown, the drain is
/// bounded, and the node restarts on its directory at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_subscriptions_and_the_node_restarts_on_its_store() {
    let mut cluster = Cluster::start("control-plane-sigterm", 3, 10_000);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let node = follower_of(&cluster, leader);
    let mut client = cluster.client(leader).await;
    let committed = client
        .propose(ProposeRequest {
            commands: vec![entry("edge-sigterm", 1)],
        })
        .await
        .unwrap()
        .into_inner()
        .index;
    cluster.applied_everywhere(committed).await;
    let mut subscriber = cluster.client(node).await;
    let mut stream = subscribe(&mut subscriber, 1).await;
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.index >= 1);

    let started = Instant::now();
    let exited = tokio::task::block_in_place(|| cluster.terminate(node, Duration::from_secs(15)));
    let status = exited.expect("the node did not exit within 15 s of SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The subscriber learns the stream is over instead of waiting on a silent one.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the subscription stayed open");

    // The store's lock is free: the node restarts on its directory and catches up.
    cluster.start_node(node);
    let last = client
        .propose(ProposeRequest {
            commands: vec![entry("edge-sigterm", 2)],
        })
        .await
        .unwrap()
        .into_inner()
        .index;
    cluster.applied_everywhere(last).await;
    assert_eq!(keys(&cluster.state(node).await).len(), 2);
}

/// Bug: a node restarted on a lost (empty) data directory panicked in its Raft task
/// (`to_commit ... is out of range`) while the process kept answering `/healthz`. Now the
/// process exits non-zero and says how to recover, and that recovery (docs/operations.md,
/// "Recovering a control-plane node") brings the node back with everything committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_store_exits_and_recovers_as_the_readme_says() {
    let mut cluster = Cluster::start("control-plane-lost-store", 3, 10_000);
    let leader = cluster.leader().await;
    register(&cluster).await;
    let mut client = cluster.client(leader).await;
    let mut last = 0;
    for seq in 1..=20 {
        last = propose_until_committed(&mut client, "edge-lost", seq).await;
    }
    cluster.applied_everywhere(last).await;
    let lost = follower_of(&cluster, leader);
    cluster.kill(lost);
    std::fs::remove_dir_all(cluster.work.join(format!("node-{lost}"))).unwrap();

    // Started again as a founding member on an empty directory: the leader's commit index
    // is beyond its log, and the process must end rather than serve as a member.
    cluster.start_node(lost);
    let node = cluster.nodes.get_mut(&lost).unwrap();
    let exited = tokio::task::block_in_place(|| node.wait_exit(Duration::from_secs(20)));
    let status = exited.expect("the node kept running without a usable log");
    assert!(!status.success(), "{status}");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("Recovering a control-plane node"),
        "the log does not say how to recover"
    );
    cluster.kill(lost);

    // The recovery: remove it, empty its directory, start it to join, add it back.
    client
        .remove_node(MemberRequest {
            id: lost,
            address: String::new(),
        })
        .await
        .unwrap();
    cluster.join_node(lost);
    client
        .add_node(MemberRequest {
            id: lost,
            address: cluster.addresses[&lost].clone(),
        })
        .await
        .unwrap();
    let last = propose_until_committed(&mut client, "edge-lost", 21).await;
    cluster.applied_everywhere(last).await;
    assert_eq!(keys(&cluster.state(lost).await).len(), 21);
}
