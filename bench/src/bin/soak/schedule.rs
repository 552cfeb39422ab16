//! The fault schedule: the phases of the run and the fault each one injects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use hasten_proto::tls::MutualTls;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::control::{CommittedEntries, catch_up, leader_of, status_of};
use crate::edges::{EdgeSample, edge_links, followed_node, longest_unchanged_s, status_client};
use crate::topology::Topology;

/// Which replica each cloud fault hits: (shard, replica).
const KILLED_REPLICA: (usize, usize) = (0, 0);
const HUNG_REPLICA: (usize, usize) = (1, 0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Nothing,
    KillReplica,
    RestartReplica,
    HangReplica,
    ResumeReplica,
    KillLeader,
    RestartNodes,
    HangFollower,
    ResumeFollower,
}

pub(crate) struct Phase {
    pub(crate) name: &'static str,
    /// Share of the run at which the phase starts (and its fault is injected).
    pub(crate) starts_at: f64,
    fault: Fault,
}

/// The phases of the run; each lasts until the next starts.
pub(crate) const PHASES: [Phase; 9] = [
    Phase {
        name: "steady",
        starts_at: 0.0,
        fault: Fault::Nothing,
    },
    Phase {
        name: "replica down",
        starts_at: 0.12,
        fault: Fault::KillReplica,
    },
    Phase {
        name: "replica back",
        starts_at: 0.24,
        fault: Fault::RestartReplica,
    },
    Phase {
        name: "cloud replica hung",
        starts_at: 0.32,
        fault: Fault::HangReplica,
    },
    Phase {
        name: "cloud replica resumed",
        starts_at: 0.44,
        fault: Fault::ResumeReplica,
    },
    Phase {
        name: "follower hung",
        starts_at: 0.52,
        fault: Fault::HangFollower,
    },
    Phase {
        name: "follower resumed",
        starts_at: 0.64,
        fault: Fault::ResumeFollower,
    },
    Phase {
        name: "leader down",
        starts_at: 0.76,
        fault: Fault::KillLeader,
    },
    Phase {
        name: "leader back",
        starts_at: 0.88,
        fault: Fault::RestartNodes,
    },
];

/// The frozen control-plane follower, while it is frozen.
pub(crate) struct HungFollower {
    /// The phase it was frozen in.
    pub(crate) phase: usize,
    pub(crate) node: usize,
    /// The node that led when it was frozen.
    pub(crate) leader: usize,
    /// The node each edge followed then, by its log.
    pub(crate) following: Vec<Option<usize>>,
    pub(crate) start: FollowerMark,
}

/// What the hung-follower phase saw at one of its ends.
pub(crate) struct FollowerMark {
    pub(crate) at_s: f64,
    pub(crate) leader_commit_index: Option<u64>,
    pub(crate) committed_inserts: usize,
    pub(crate) edges: Vec<Option<(u64, bool)>>,
}

async fn follower_mark(
    started: Instant,
    leader: &str,
    tls: &MutualTls,
    committed: &Mutex<CommittedEntries>,
    admin_urls: &[String],
) -> FollowerMark {
    let at_s = started.elapsed().as_secs_f64();
    let leader_commit_index = status_of(leader, tls).await.ok().map(|s| s.commit_index);
    let committed_inserts = committed.lock().inserted;
    let edges = edge_links(&status_client(), admin_urls).await;
    FollowerMark {
        at_s,
        leader_commit_index,
        committed_inserts,
        edges,
    }
}

/// What the schedule leaves for the report.
pub(crate) struct Injected {
    /// Each fault as it was injected: when, in which phase, what.
    pub(crate) faults: Vec<Value>,
    /// The hung-follower phase's report, once the follower has been resumed.
    pub(crate) follower_report: Value,
    /// How long the resumed follower took to apply what the leader had committed when it
    /// was resumed.
    pub(crate) caught_up: Option<JoinHandle<Option<f64>>>,
}

/// Starts each phase at its share of `duration` from `started`, moving `phase` on and
/// injecting the phase's fault.
pub(crate) async fn run_schedule(
    topology: &mut Topology,
    phase: &AtomicUsize,
    started: Instant,
    duration: Duration,
    committed: &Mutex<CommittedEntries>,
    samples: &Mutex<Vec<EdgeSample>>,
) -> Result<Injected> {
    let Topology {
        replicas,
        nodes,
        edges,
        cp_addresses,
        soak_client,
        admin_urls,
        ..
    } = topology;
    let mut faults = Vec::new();
    let mut hung_follower: Option<HungFollower> = None;
    let mut follower_report = Value::Null;
    let mut caught_up = None;
    for (index, phase_plan) in PHASES.iter().enumerate().skip(1) {
        tokio::time::sleep_until(started + duration.mul_f64(phase_plan.starts_at)).await;
        phase.store(index, Ordering::Relaxed);
        let at = started.elapsed().as_secs_f64();
        let fault = match phase_plan.fault {
            Fault::Nothing => phase_plan.name.to_string(),
            Fault::KillReplica => {
                let replica = &mut replicas[KILLED_REPLICA.0][KILLED_REPLICA.1];
                replica.kill();
                format!("cloud replica {} killed", replica.name)
            }
            Fault::RestartReplica => {
                let replica = &mut replicas[KILLED_REPLICA.0][KILLED_REPLICA.1];
                replica.restart()?;
                format!("cloud replica {} restarted", replica.name)
            }
            Fault::HangReplica => {
                let replica = &mut replicas[HUNG_REPLICA.0][HUNG_REPLICA.1];
                replica.freeze()?;
                format!("cloud replica {} frozen (SIGSTOP)", replica.name)
            }
            Fault::ResumeReplica => {
                let replica = &mut replicas[HUNG_REPLICA.0][HUNG_REPLICA.1];
                replica.resume()?;
                format!("cloud replica {} resumed (SIGCONT)", replica.name)
            }
            Fault::KillLeader => {
                let leader = leader_of(cp_addresses, soak_client).await?;
                nodes[leader].kill();
                format!("control-plane leader node-{} killed", leader + 1)
            }
            Fault::RestartNodes => {
                let mut restarted = Vec::new();
                for node in nodes.iter_mut() {
                    if node.process.is_none() {
                        node.restart()?;
                        restarted.push(node.name.clone());
                    }
                }
                format!("control-plane {} restarted", restarted.join(", "))
            }
            Fault::HangFollower => {
                let leader = leader_of(cp_addresses, soak_client).await?;
                // Prefer the follower the edges follow: the hang then hits their streams.
                let following: Vec<Option<usize>> = edges
                    .iter()
                    .map(|edge| edge.log().and_then(|log| followed_node(&log, cp_addresses)))
                    .collect();
                let candidates: Vec<usize> = (0..nodes.len())
                    .filter(|&n| n != leader && nodes[n].process.is_some())
                    .collect();
                let target = candidates
                    .iter()
                    .copied()
                    .max_by_key(|&n| {
                        (
                            following.iter().filter(|f| **f == Some(n)).count(),
                            std::cmp::Reverse(n),
                        )
                    })
                    .context("no running control-plane follower to freeze")?;
                let mark = follower_mark(
                    started,
                    &cp_addresses[leader],
                    soak_client,
                    committed,
                    admin_urls,
                )
                .await;
                nodes[target].freeze()?;
                hung_follower = Some(HungFollower {
                    phase: index,
                    node: target,
                    leader,
                    following,
                    start: mark,
                });
                format!(
                    "control-plane follower node-{} frozen (SIGSTOP); node-{} leads",
                    target + 1,
                    leader + 1
                )
            }
            Fault::ResumeFollower => match hung_follower.take() {
                Some(hung) => {
                    // Measured before the node runs again: what happened while it was frozen.
                    let end = follower_mark(
                        started,
                        &cp_addresses[hung.leader],
                        soak_client,
                        committed,
                        admin_urls,
                    )
                    .await;
                    nodes[hung.node].resume()?;
                    if let Some(index) = end.leader_commit_index {
                        caught_up = Some(tokio::spawn(catch_up(
                            cp_addresses[hung.node].clone(),
                            soak_client.clone(),
                            index,
                        )));
                    }
                    follower_report = follower_phase_report(&hung, &end, &samples.lock());
                    format!(
                        "control-plane follower node-{} resumed (SIGCONT)",
                        hung.node + 1
                    )
                }
                None => "no follower was frozen".to_string(),
            },
        };
        tracing::info!(phase = phase_plan.name, at_s = at, %fault, "fault schedule");
        faults.push(json!({"at_s": at, "phase": phase_plan.name, "fault": fault}));
    }
    Ok(Injected {
        faults,
        follower_report,
        caught_up,
    })
}

/// What the hung-follower phase showed: entries committed while the node was frozen and
/// each edge's applied index at the start and end of the phase.
fn follower_phase_report(hung: &HungFollower, end: &FollowerMark, samples: &[EdgeSample]) -> Value {
    let start = &hung.start;
    let edges: Vec<Value> = (0..start.edges.len().max(end.edges.len()))
        .map(|e| {
            let at = |mark: &FollowerMark| mark.edges.get(e).copied().flatten();
            let (first, last) = (at(start), at(end));
            json!({
                "edge": format!("edge-{e}"),
                "following_at_start": hung.following.get(e).copied().flatten().map(|n| format!("node-{}", n + 1)),
                "applied_index_start": first.map(|(index, _)| index),
                "applied_index_end": last.map(|(index, _)| index),
                "advanced": matches!((first, last), (Some((a, _)), Some((b, _))) if b > a),
                "subscribed_at_end": last.map(|(_, subscribed)| subscribed),
                "behind_leader_at_end": match (end.leader_commit_index, last) {
                    (Some(commit), Some((index, _))) => Some(commit.saturating_sub(index)),
                    _ => None,
                },
                "longest_unchanged_s": longest_unchanged_s(samples, hung.phase, e),
            })
        })
        .collect();
    json!({
        "node": format!("node-{}", hung.node + 1),
        "leader": format!("node-{}", hung.leader + 1),
        "from_s": start.at_s,
        "to_s": end.at_s,
        // As the soak's own subscriber saw them.
        "committed_inserts_during": end.committed_inserts.saturating_sub(start.committed_inserts),
        "leader_commit_index_start": start.leader_commit_index,
        "leader_commit_index_end": end.leader_commit_index,
        "log_entries_committed_during": match (start.leader_commit_index, end.leader_commit_index) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
        "edges": edges,
    })
}
