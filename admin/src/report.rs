//! `hasten-admin status`: every node's view of the group, as a table or as JSON.

use std::fmt::Write;

use serde::Serialize;

use crate::cluster::NodeReport;

/// One row of the status: a node's view, or why it did not answer.
#[derive(Debug, Serialize, PartialEq)]
pub struct NodeRow {
    pub address: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub view: Option<NodeView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct NodeView {
    pub id: u64,
    pub role: String,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Entries behind the highest commit index any node reported.
    pub lag: u64,
    pub first_log_index: u64,
    pub cached_entries: u64,
    /// Edges streaming from this node.
    pub subscribers: u64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct MemberRow {
    pub id: u64,
    pub address: String,
}

/// The group as the reachable nodes see it.
#[derive(Debug, Serialize, PartialEq)]
pub struct GroupStatus {
    pub nodes: Vec<NodeRow>,
    /// The leader most nodes name (0: none known).
    pub leader_id: u64,
    pub leader_address: String,
    /// The members as the leader (else the first reachable node) lists them.
    pub members: Vec<MemberRow>,
    /// Subscribed edges over every node.
    pub subscribers: u64,
}

impl GroupStatus {
    pub fn from_reports(reports: Vec<NodeReport>) -> Self {
        let head = reports
            .iter()
            .filter_map(|r| r.status.as_ref().ok())
            .map(|s| s.commit_index)
            .max()
            .unwrap_or(0);
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for status in reports.iter().filter_map(|r| r.status.as_ref().ok()) {
            if status.leader_id == 0 {
                continue;
            }
            match votes.iter_mut().find(|(id, _)| *id == status.leader_id) {
                Some((_, n)) => *n += 1,
                None => votes.push((status.leader_id, 1)),
            }
        }
        let leader_id = votes
            .iter()
            .max_by_key(|(id, n)| (*n, std::cmp::Reverse(*id)))
            .map_or(0, |(id, _)| *id);
        let statuses: Vec<_> = reports
            .iter()
            .filter_map(|r| r.status.as_ref().ok())
            .collect();
        let spokesman = statuses
            .iter()
            .find(|s| s.id == leader_id)
            .or_else(|| statuses.first());
        let leader_address = statuses
            .iter()
            .find(|s| s.leader_id == leader_id && !s.leader_address.is_empty())
            .map(|s| s.leader_address.clone())
            .unwrap_or_default();
        let members = spokesman.map_or_else(Vec::new, |s| {
            let mut members: Vec<MemberRow> = s
                .members
                .iter()
                .map(|m| MemberRow {
                    id: m.id,
                    address: m.address.clone(),
                })
                .collect();
            members.sort_by_key(|m| m.id);
            members
        });
        let subscribers = statuses.iter().map(|s| s.subscribers).sum();
        let nodes = reports
            .into_iter()
            .map(|report| match report.status {
                Ok(s) => NodeRow {
                    address: report.address,
                    view: Some(NodeView {
                        id: s.id,
                        lag: head.saturating_sub(s.applied_index),
                        role: s.role,
                        term: s.term,
                        commit_index: s.commit_index,
                        applied_index: s.applied_index,
                        first_log_index: s.first_log_index,
                        cached_entries: s.cached_entries,
                        subscribers: s.subscribers,
                    }),
                    error: None,
                },
                Err(error) => NodeRow {
                    address: report.address,
                    view: None,
                    error: Some(error),
                },
            })
            .collect();
        Self {
            nodes,
            leader_id,
            leader_address,
            members,
            subscribers,
        }
    }

    pub fn table(&self) -> String {
        let header = [
            "ADDRESS",
            "ID",
            "ROLE",
            "TERM",
            "COMMIT",
            "APPLIED",
            "LAG",
            "FIRST LOG",
            "ENTRIES",
            "EDGES",
        ];
        let rows: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| match (&n.view, &n.error) {
                (Some(v), _) => vec![
                    n.address.clone(),
                    v.id.to_string(),
                    v.role.clone(),
                    v.term.to_string(),
                    v.commit_index.to_string(),
                    v.applied_index.to_string(),
                    v.lag.to_string(),
                    v.first_log_index.to_string(),
                    v.cached_entries.to_string(),
                    v.subscribers.to_string(),
                ],
                (None, error) => vec![
                    n.address.clone(),
                    format!("unreachable: {}", error.as_deref().unwrap_or("no answer")),
                ],
            })
            .collect();
        let mut out = table(&header, &rows);
        let leader = if self.leader_id == 0 {
            "none known".to_string()
        } else {
            format!("{} ({})", self.leader_id, self.leader_address)
        };
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.id, m.address))
            .collect();
        let _ = writeln!(out, "\nleader: {leader}");
        let _ = writeln!(out, "members: {}", members.join(", "));
        let _ = writeln!(out, "subscribed edges: {}", self.subscribers);
        out
    }
}

/// Left-aligned columns; a row shorter than the header (an unreachable node) runs its
/// last cell across the rest.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows.iter().filter(|r| r.len() == header.len()) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        text.trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_proto::v1::{Member, NodeStatus};

    fn node(id: u64, role: &str, commit: u64, applied: u64, leader: u64) -> NodeReport {
        NodeReport {
            address: format!("10.0.0.{id}:7400"),
            status: Ok(NodeStatus {
                id,
                role: role.into(),
                term: 4,
                commit_index: commit,
                applied_index: applied,
                leader_id: leader,
                leader_address: format!("10.0.0.{leader}:7400"),
                members: (1..=3)
                    .rev()
                    .map(|id| Member {
                        id,
                        address: format!("10.0.0.{id}:7400"),
                    })
                    .collect(),
                first_log_index: 1,
                cached_entries: 7,
                subscribers: id,
            }),
        }
    }

    #[test]
    fn lag_is_measured_from_the_highest_commit_and_the_leader_is_the_majoritys() {
        let status = GroupStatus::from_reports(vec![
            node(1, "follower", 90, 80, 2),
            node(2, "leader", 100, 100, 2),
            NodeReport {
                address: "10.0.0.3:7400".into(),
                status: Err("connection refused".into()),
            },
        ]);
        assert_eq!(status.leader_id, 2);
        assert_eq!(status.leader_address, "10.0.0.2:7400");
        let lag = |i: usize| status.nodes[i].view.as_ref().map(|v| v.lag);
        assert_eq!(lag(0), Some(20));
        assert_eq!(lag(1), Some(0));
        assert_eq!(status.nodes[2].error.as_deref(), Some("connection refused"));
        assert_eq!(status.subscribers, 3);
        let ids: Vec<u64> = status.members.iter().map(|m| m.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        let table = status.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("ADDRESS"), "{table}");
        assert!(
            lines[1].contains("follower") && lines[1].contains(" 20 "),
            "{table}"
        );
        assert!(
            lines[3].contains("unreachable: connection refused"),
            "{table}"
        );
        assert!(table.contains("leader: 2 (10.0.0.2:7400)"), "{table}");
    }
}
