//! A control-plane group of real `control-plane` processes on loopback, for tests.

// A test helper fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hasten_eval::process::{ManagedProcess, binary};
use hasten_loadtest::control_plane::{free_loopback_port, node_args};
use hasten_proto::control::{ControlAccess, ControlClient, connect};
use hasten_proto::v1::{
    ControlCommand, ControlState, CorpusFacts, NodeStatus, ProposeRequest, SnapshotRequest,
    StatusRequest, control_command,
};

use crate::persistent_work_dir;
use crate::relay::Relay;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Nodes 1..=size founded together, each with its own sled directory.
pub struct Cluster {
    pub work: PathBuf,
    pub addresses: BTreeMap<u64, String>,
    pub nodes: BTreeMap<u64, ManagedProcess>,
    max_log_entries: u64,
    /// Flags every node gets beyond the defaults here.
    extra: Vec<String>,
    /// Flags that replace `extra` for one node (set by `restart_with`).
    node_flags: BTreeMap<u64, Vec<String>>,
    /// The peer addresses each node is given, when they differ from `addresses` (a node
    /// reached through relays).
    views: BTreeMap<u64, Vec<String>>,
    /// How this test's clients reach the nodes (the token, when the nodes require one).
    pub access: ControlAccess,
}

impl Cluster {
    pub fn start(name: &str, size: u64, max_log_entries: u64) -> Self {
        Self::start_with(name, size, max_log_entries, &[])
    }

    /// Like `start`, with `extra` flags for every node.
    pub fn start_with(name: &str, size: u64, max_log_entries: u64, extra: &[&str]) -> Self {
        let mut cluster = Self::prepare(name, size, max_log_entries);
        cluster.extra = extra.iter().map(|a| a.to_string()).collect();
        for id in 1..=size {
            cluster.start_node(id);
        }
        cluster
    }

    /// Like `start`, but every connection between node `isolated` and the others runs
    /// through relays: cutting them partitions the node off while the test still reaches
    /// every node directly.
    pub async fn start_isolatable(
        name: &str,
        size: u64,
        max_log_entries: u64,
        isolated: u64,
    ) -> (Self, Vec<Relay>) {
        let mut cluster = Self::prepare(name, size, max_log_entries);
        let mut relays = Vec::new();
        let mut inward = None;
        for (id, address) in &cluster.addresses {
            let relay = Relay::start(address.clone()).await.unwrap();
            if *id == isolated {
                inward = Some(relay.address.clone());
            }
            relays.push((*id, relay));
        }
        let direct: Vec<String> = cluster.addresses.values().cloned().collect();
        for id in 1..=size {
            let view = (1..=size)
                .map(|peer| {
                    let through = relays.iter().find(|(r, _)| *r == peer);
                    match through {
                        // The isolated node reaches the others through their relays.
                        Some((_, relay)) if id == isolated && peer != isolated => {
                            relay.address.clone()
                        }
                        // The others reach the isolated node through its relay.
                        _ if id != isolated && peer == isolated => inward.clone().unwrap(),
                        _ => direct[(peer - 1) as usize].clone(),
                    }
                })
                .collect();
            cluster.views.insert(id, view);
        }
        for id in 1..=size {
            cluster.start_node(id);
        }
        (cluster, relays.into_iter().map(|(_, r)| r).collect())
    }

    fn prepare(name: &str, size: u64, max_log_entries: u64) -> Self {
        let work = persistent_work_dir(name).unwrap();
        // Raft state of an earlier run names other ports: start from empty directories.
        for id in 1..=size {
            let _ = std::fs::remove_dir_all(work.join(format!("node-{id}")));
        }
        let addresses: BTreeMap<u64, String> = (1..=size)
            .map(|id| (id, format!("127.0.0.1:{}", free_loopback_port().unwrap())))
            .collect();
        Self {
            work,
            addresses,
            nodes: BTreeMap::new(),
            max_log_entries,
            extra: Vec::new(),
            node_flags: BTreeMap::new(),
            views: BTreeMap::new(),
            access: ControlAccess::default(),
        }
    }

    pub fn start_node(&mut self, id: u64) {
        self.start_node_with(id, &[]);
    }

    fn start_node_with(&mut self, id: u64, extra: &[&str]) {
        let addresses: Vec<String> = self
            .views
            .get(&id)
            .cloned()
            .unwrap_or_else(|| self.addresses.values().cloned().collect());
        let mut args = node_args(id, &addresses, &self.work.join(format!("node-{id}")));
        args.extend([
            "--set".to_string(),
            "tick_ms=50".into(),
            "--set".into(),
            format!("max_log_entries={}", self.max_log_entries),
            // Every compaction discards all events, so that subscribers that resume
            // behind one exercise the whole-state path.
            "--set".into(),
            "retained_events=0".into(),
        ]);
        args.extend(
            self.node_flags
                .get(&id)
                .unwrap_or(&self.extra)
                .iter()
                .cloned(),
        );
        args.extend(extra.iter().map(|a| a.to_string()));
        let process = ManagedProcess::start(
            &format!("node-{id}"),
            &binary("control-plane").unwrap(),
            &args,
            &self.work,
            START_TIMEOUT,
        )
        .unwrap();
        self.nodes.insert(id, process);
    }

    /// Starts node `id` empty, waiting to be added to the group (`AddNode` on the leader).
    pub fn join_node(&mut self, id: u64) {
        let _ = std::fs::remove_dir_all(self.work.join(format!("node-{id}")));
        let address = format!("127.0.0.1:{}", free_loopback_port().unwrap());
        self.addresses.insert(id, address);
        self.start_node_with(id, &["--join", "true"]);
    }

    /// Starts node `id` on its address with an empty data directory and `extra` flags: a
    /// member whose volume was lost, started again as its pod would be.
    pub fn start_wiped(&mut self, id: u64, extra: &[&str]) {
        let _ = std::fs::remove_dir_all(self.work.join(format!("node-{id}")));
        self.start_node_with(id, extra);
    }

    /// Starts node `id` with `--join true --auto-join true`, as the chart starts the
    /// ordinals a scale-up adds: it asks the group to add it. A new id starts empty on a
    /// new address; a known one (a restart) keeps its address and data.
    pub fn auto_join_node(&mut self, id: u64) {
        if !self.addresses.contains_key(&id) {
            let _ = std::fs::remove_dir_all(self.work.join(format!("node-{id}")));
            let address = format!("127.0.0.1:{}", free_loopback_port().unwrap());
            self.addresses.insert(id, address);
        }
        self.start_node_with(id, &["--join", "true", "--auto-join", "true"]);
    }

    /// Stops node `id` (SIGTERM) and starts it again on its data with `flags` instead of
    /// the flags every node gets.
    pub fn restart_with(&mut self, id: u64, flags: Vec<String>) {
        self.terminate(id, Duration::from_secs(10));
        self.node_flags.insert(id, flags);
        self.start_node(id);
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(mut node) = self.nodes.remove(&id) {
            node.stop();
        }
    }

    /// Asks node `id` to stop (SIGTERM) and waits up to `limit` for it to exit; returns its
    /// exit status, or `None` when it did not exit (it is killed then).
    pub fn terminate(&mut self, id: u64, limit: Duration) -> Option<std::process::ExitStatus> {
        self.nodes.remove(&id)?.terminate(limit)
    }

    /// Freezes node `id` (SIGSTOP): it holds its sockets but answers nothing, as a hung
    /// process does.
    pub fn pause(&self, id: u64) {
        self.nodes[&id].signal("STOP").unwrap();
    }

    /// Lets a paused node run again (SIGCONT).
    pub fn resume(&self, id: u64) {
        self.nodes[&id].signal("CONT").unwrap();
    }

    pub async fn client(&self, id: u64) -> ControlClient {
        connect(&self.addresses[&id], &self.access).await.unwrap()
    }

    pub async fn status(&self, id: u64) -> Option<NodeStatus> {
        let mut client = connect(&self.addresses[&id], &self.access).await.ok()?;
        client
            .status(StatusRequest {})
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    /// Waits until every running node agrees on one leader; returns its id.
    pub async fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut leaders = Vec::new();
            for id in self.nodes.keys() {
                if let Some(status) = self.status(*id).await {
                    leaders.push(status.leader_id);
                }
            }
            if leaders.len() == self.nodes.len()
                && leaders[0] != 0
                && leaders.iter().all(|l| *l == leaders[0])
                && self.nodes.contains_key(&leaders[0])
            {
                return leaders[0];
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {:?}: {leaders:?}",
                self.nodes.keys().collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn state(&self, id: u64) -> ControlState {
        self.client(id)
            .await
            .snapshot(SnapshotRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    /// Registers corpus `version` (`dimension`-d vectors, ids up to `max_document_id`) on
    /// the leader and waits until every node has applied it: entries of a corpus are
    /// admitted only once it is registered.
    pub async fn register_corpus(&self, version: &str, dimension: u32, max_document_id: u64) {
        let leader = self.leader().await;
        let index = self
            .client(leader)
            .await
            .propose(ProposeRequest {
                commands: vec![ControlCommand {
                    kind: Some(control_command::Kind::RegisterCorpus(CorpusFacts {
                        corpus_version: version.into(),
                        dimension,
                        max_document_id,
                    })),
                }],
            })
            .await
            .unwrap()
            .into_inner()
            .index;
        self.applied_everywhere(index).await;
    }

    /// Waits until every running node has applied at least `index`.
    pub async fn applied_everywhere(&self, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for id in self.nodes.keys() {
            loop {
                let applied = self.status(*id).await.map_or(0, |s| s.applied_index);
                if applied >= index {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} applied {applied}, expected {index}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
