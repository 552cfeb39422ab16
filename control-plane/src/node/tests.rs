//! Three nodes in one process over the in-memory transport, each with its own store:
//! elections, commits, and what a waiting proposal hears when leadership moves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::metrics::prometheus::Registry;
use hasten_proto::v1::{CacheEntry, ControlCommand, CorpusFacts, control_command};

use super::*;
use crate::transport::memory::{MemoryNetwork, MemoryTransport};

const TICK: Duration = Duration::from_millis(10);
const ELECTION_TICKS: usize = 10;

struct Group {
    _dirs: Vec<tempfile::TempDir>,
    network: Arc<MemoryNetwork>,
    nodes: BTreeMap<u64, NodeHandle>,
    registries: BTreeMap<u64, Registry>,
}

fn settings(id: u64, max_log_entries: u64) -> NodeSettings {
    NodeSettings {
        id,
        tick: TICK,
        election_ticks: ELECTION_TICKS,
        heartbeat_ticks: 2,
        max_log_entries,
        max_log_bytes: 64 << 20,
        retained_events: 64,
    }
}

fn start_group(size: u64) -> Group {
    start_group_compacting_at(size, 10_000)
}

/// A group whose nodes compact once their logs hold `max_log_entries` applied entries.
fn start_group_compacting_at(size: u64, max_log_entries: u64) -> Group {
    let network = Arc::new(MemoryNetwork::default());
    let members: BTreeMap<u64, String> = (1..=size).map(|id| (id, format!("node-{id}"))).collect();
    let mut dirs = Vec::new();
    let mut nodes = BTreeMap::new();
    let mut registries = BTreeMap::new();
    for id in 1..=size {
        let dir = tempfile::tempdir().unwrap();
        let storage = RaftStorage::open(dir.path(), id).unwrap();
        let registry = Registry::new();
        let metrics = NodeMetrics::register(&registry).unwrap();
        registries.insert(id, registry);
        let network_for_node = Arc::clone(&network);
        let node = start(
            settings(id, max_log_entries),
            storage,
            &members,
            false,
            metrics,
            |addresses, requests| {
                network_for_node.join(id, requests);
                MemoryTransport {
                    me: id,
                    network: network_for_node,
                    addresses: addresses.into_iter().collect(),
                }
            },
        )
        .unwrap();
        dirs.push(dir);
        nodes.insert(id, node);
    }
    Group {
        _dirs: dirs,
        network,
        nodes,
        registries,
    }
}

impl Group {
    /// Waits until the nodes in `among` agree on a leader among them.
    async fn leader(&self, among: &[u64]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut leaders = Vec::new();
            for id in among {
                leaders.push(self.nodes[id].status().await.unwrap().leader_id);
            }
            if leaders[0] != 0
                && among.contains(&leaders[0])
                && leaders.iter().all(|l| *l == leaders[0])
            {
                return leaders[0];
            }
            assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
            tokio::time::sleep(TICK).await;
        }
    }

    /// `hasten_cp_proposals_total{result}` of node `id`.
    fn proposals(&self, id: u64, result: &str) -> f64 {
        self.registries[&id]
            .gather()
            .iter()
            .filter(|family| family.name() == "hasten_cp_proposals_total")
            .flat_map(|family| family.get_metric())
            .filter(|metric| {
                metric
                    .get_label()
                    .iter()
                    .any(|l| l.name() == "result" && l.value() == result)
            })
            .map(|metric| metric.get_counter().get_value())
            .sum()
    }

    fn follower(&self, leader: u64) -> u64 {
        *self.nodes.keys().find(|id| **id != leader).unwrap()
    }
}

/// Registers the corpus the test's entries belong to.
async fn register(node: &NodeHandle) {
    node.propose(vec![ControlCommand {
        kind: Some(control_command::Kind::RegisterCorpus(CorpusFacts {
            corpus_version: "v1".into(),
            dimension: 2,
            max_document_id: 1_000,
        })),
    }])
    .await
    .unwrap();
}

/// Registers the corpus through `leader` and waits until every node applied it: a
/// follower admits an entry only once it knows the corpus.
async fn register_everywhere(group: &Group, leader: u64) {
    register(&group.nodes[&leader]).await;
    let commit_index = group.nodes[&leader].status().await.unwrap().commit_index;
    wait_applied(group, commit_index).await;
}

fn entry(seq: u64) -> Vec<ControlCommand> {
    vec![ControlCommand {
        kind: Some(control_command::Kind::Insert(CacheEntry {
            origin: "edge".into(),
            origin_seq: seq,
            vector: vec![1.0, 0.0],
            document_ids: vec![seq],
            tenant: "default".into(),
            corpus_version: "v1".into(),
            ..CacheEntry::default()
        })),
    }]
}

/// Waits until every node has applied `index`.
async fn wait_applied(group: &Group, index: u64) {
    for node in group.nodes.values() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while node.status().await.unwrap().applied_index < index {
            assert!(Instant::now() < deadline, "not applied everywhere");
            tokio::time::sleep(TICK).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_made_on_a_follower_commits_on_every_node() {
    let group = start_group(3);
    let leader = group.leader(&[1, 2, 3]).await;
    let follower = group.follower(leader);
    register_everywhere(&group, leader).await;
    let index = group.nodes[&follower].propose(entry(1)).await.unwrap();
    wait_applied(&group, index).await;
    for node in group.nodes.values() {
        assert_eq!(node.state().await.unwrap().into_state().entries.len(), 1);
    }
}

/// How long a caller may wait for the answer to a proposal lost with its leader: a new
/// election (randomised in [election, 2 x election) ticks, pre-vote first) and a margin,
/// far below any client's proposal timeout.
fn answer_within() -> Duration {
    TICK * (ELECTION_TICKS as u32) * 6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_forwarded_to_a_lost_leader_is_answered_stale_at_once() {
    let group = start_group(3);
    let leader = group.leader(&[1, 2, 3]).await;
    let follower = group.follower(leader);
    register_everywhere(&group, leader).await;
    // The leader is cut off: a follower still forwards to it until the others elect anew.
    group.network.isolate(leader);
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        group.nodes[&follower].propose(entry(1)),
    )
    .await
    .expect("the proposal was never answered");
    let took = started.elapsed();
    match answer {
        // The follower gave the lost leader up (pre-vote: no leader in the same term) or
        // already follows a new one.
        Err(NodeError::Stale { leader: now, .. }) => {
            assert_ne!(now, leader, "still the lost leader");
        }
        // An election may already have moved the follower to the new leader before the
        // proposal arrived: then it commits.
        Ok(_) => {}
        Err(other) => panic!("unexpected answer {other}"),
    }
    assert!(took < answer_within(), "answered after {took:?}");
    group.network.heal(leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_with_proposals_waiting_answers_them_when_it_steps_down() {
    let group = start_group(3);
    let leader = group.leader(&[1, 2, 3]).await;
    register(&group.nodes[&leader]).await;
    group.network.isolate(leader);
    // The isolated leader appends these but can never commit them; check-quorum makes it
    // step down within an election timeout, and it must tell its callers then.
    let started = Instant::now();
    let proposals: Vec<_> = (1..=3)
        .map(|seq| {
            let node = group.nodes[&leader].clone();
            tokio::spawn(async move { node.propose(entry(seq)).await })
        })
        .collect();
    for proposal in proposals {
        let answer = tokio::time::timeout(Duration::from_secs(30), proposal)
            .await
            .expect("a waiting proposal was never answered")
            .unwrap();
        assert!(matches!(answer, Err(NodeError::Stale { .. })), "{answer:?}");
    }
    assert!(
        started.elapsed() < answer_within(),
        "{:?}",
        started.elapsed()
    );
    // The others went on with a leader of their own, and the dropped proposals were
    // counted.
    let others: Vec<u64> = group
        .nodes
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    let new_leader = group.leader(&others).await;
    assert_ne!(new_leader, leader);
    assert_eq!(group.proposals(leader, "dropped"), 3.0);
}

/// Bug: the members' compactions were staggered only until the first snapshot, which every
/// node takes at index 1 alike; from then on all three compacted at the same index, each
/// snapshot costing all members CPU at once. A size-triggered compaction now keeps each
/// member's own phase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_compact_at_different_indexes() {
    let group = start_group_compacting_at(3, 30);
    let leader = group.leader(&[1, 2, 3]).await;
    register_everywhere(&group, leader).await;
    let mut last = 0;
    for seq in 1..=150 {
        last = group.nodes[&leader].propose(entry(seq)).await.unwrap();
    }
    wait_applied(&group, last).await;
    let mut points = Vec::new();
    for node in group.nodes.values() {
        points.push(node.status().await.unwrap().first_log_index);
    }
    assert!(
        points.iter().all(|p| *p > 1),
        "a node never compacted: {points:?}"
    );
    let mut distinct = points.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        3,
        "members compacted at the same index: {points:?}"
    );
}
