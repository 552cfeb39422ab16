//! The end check: waiting until the nodes agree, then comparing them with what was committed.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::tls::MutualTls;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::control::{CommittedEntries, SETTLE_TIMEOUT, snapshot_of};
use crate::processes::Restartable;

/// After a pause for every node to catch up, compares what was committed with what each
/// node holds until all hold every entry the soak saw committed at one applied index, the
/// soak's subscriber has seen every entry they hold, and every proposal an edge had
/// acknowledged is among the committed entries, or until [`SETTLE_TIMEOUT`]; the last
/// comparison and the seconds from the first comparison to the last.
pub(crate) async fn settle(
    addresses: &[String],
    tls: &MutualTls,
    edges: &[Restartable],
    committed: &Mutex<CommittedEntries>,
) -> Result<(Settled, f64)> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settle_started = Instant::now();
    let settled = loop {
        let expected = committed.lock().clone();
        let attempt = async {
            let nodes = compare_nodes(addresses, tls, &expected).await?;
            let mut acknowledged = 0.0;
            let mut dropped = 0.0;
            for edge in edges {
                let metrics = Scrape::of(&edge.addr("metrics_addr")).await?;
                acknowledged += metrics.value("hasten_edge_proposals_total", &[("result", "sent")]);
                dropped += metrics.value("hasten_edge_proposals_total", &[("result", "dropped")]);
            }
            anyhow::Ok(Settled {
                expected: expected.clone(),
                nodes,
                acknowledged,
                dropped,
            })
        }
        .await;
        let done = attempt.as_ref().is_ok_and(Settled::is_settled);
        if done || settle_started.elapsed() >= SETTLE_TIMEOUT {
            break attempt?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    Ok((settled, settle_started.elapsed().as_secs_f64()))
}

/// The end-of-run comparison.
pub(crate) struct Settled {
    pub(crate) expected: CommittedEntries,
    pub(crate) nodes: NodeComparison,
    pub(crate) acknowledged: f64,
    pub(crate) dropped: f64,
}

impl Settled {
    /// Nothing more is expected to arrive: the nodes agree and hold everything the soak saw
    /// committed, the soak saw everything they hold, and every acknowledged proposal is in.
    fn is_settled(&self) -> bool {
        self.nodes.same_applied_index
            && self.nodes.missing == 0
            && self.nodes.unseen == 0
            && self.acknowledged as usize <= self.expected.inserted
    }
}

pub(crate) struct NodeComparison {
    pub(crate) reports: Vec<Value>,
    /// Committed entries missing from a node, summed over the nodes.
    pub(crate) missing: usize,
    /// Entries a node holds that the soak's subscriber has not seen (yet), summed.
    pub(crate) unseen: usize,
    pub(crate) same_applied_index: bool,
}

/// Each node's entries against the ones the soak saw committed.
async fn compare_nodes(
    addresses: &[String],
    tls: &MutualTls,
    expected: &CommittedEntries,
) -> Result<NodeComparison> {
    let mut reports = Vec::new();
    let (mut missing_total, mut unseen_total) = (0, 0);
    let mut applied = HashSet::new();
    for (index, address) in addresses.iter().enumerate() {
        let state = snapshot_of(address, tls).await?;
        let held: HashSet<u64> = state.entries.iter().map(|e| e.id).collect();
        let missing = expected.live.difference(&held).count();
        let unseen = held.difference(&expected.live).count();
        missing_total += missing;
        unseen_total += unseen;
        applied.insert(state.applied_index);
        reports.push(json!({
            "node": format!("node-{}", index + 1),
            "address": address,
            "applied_index": state.applied_index,
            "entries": held.len(),
            "missing_committed_entries": missing,
            "entries_not_seen_committed_by_the_soak": unseen,
        }));
    }
    Ok(NodeComparison {
        reports,
        missing: missing_total,
        unseen: unseen_total,
        same_applied_index: applied.len() == 1,
    })
}
