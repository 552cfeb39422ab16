//! Applying the control plane's committed stream at an edge: each event's wire form is
//! turned into cache operations here, and nowhere else.

use hasten_proto::v1::{CommittedEvent, ControlState, StoredEntry, applied_command};

use crate::caches::ReplicatedEntry;
use crate::fallback::CloudSearch;
use crate::retrieval::RetrievalEngine;
use crate::tenants::Tenant;

/// A stored entry as the edge's caches take it; `None` for a record without an entry.
fn replicated(stored: StoredEntry) -> Option<ReplicatedEntry> {
    let entry = stored.entry?;
    Some(ReplicatedEntry {
        id: stored.id,
        tenant: Tenant::new(&entry.tenant),
        text: entry.text,
        vector: entry.vector,
        document_ids: entry.document_ids,
        corpus_version: entry.corpus_version,
    })
}

/// The workers of `pool`'s assignments an event carries, in the order they took effect: the
/// whole state's, then those its commands set.
pub fn kv_pool_workers(event: &CommittedEvent, pool: &str) -> Vec<Vec<String>> {
    let from_state = event.state.iter().flat_map(|state| state.kv_pools.iter());
    let from_commands = event
        .applied
        .iter()
        .filter_map(|applied| match &applied.kind {
            Some(applied_command::Kind::KvPool(assignment)) => Some(assignment),
            _ => None,
        });
    from_state
        .chain(from_commands)
        .filter(|assignment| assignment.pool == pool)
        .map(|assignment| assignment.workers.clone())
        .collect()
}

/// Applies one committed event: the whole state when the stream had to restart from it,
/// then each command's removals and additions, in order.
pub fn apply<C: CloudSearch>(engine: &RetrievalEngine<C>, event: CommittedEvent) {
    let caches = engine.caches();
    if let Some(state) = event.state {
        install(engine, state);
    }
    for command in event.applied {
        caches.remove(&command.removed);
        match command.kind {
            Some(applied_command::Kind::Inserted(stored)) => {
                if let Some(entry) = replicated(stored) {
                    caches.insert_replicated(entry);
                }
            }
            Some(applied_command::Kind::Config(config)) => {
                if let Some(tau) = config.tau {
                    engine.set_tau(tau);
                    tracing::info!(tau, "homology threshold changed by the control plane");
                }
            }
            Some(applied_command::Kind::Carried(carried)) => {
                let entries = carried.entries.into_iter().filter_map(replicated).collect();
                caches.carry_over(&carried.from_version, &carried.to_version, entries);
            }
            Some(applied_command::Kind::ShardMap(_) | applied_command::Kind::KvPool(_)) | None => {}
        }
    }
}

/// Replaces everything cached with the control plane's whole state.
fn install<C: CloudSearch>(engine: &RetrievalEngine<C>, state: ControlState) {
    let caches = engine.caches();
    caches.clear();
    if let Some(tau) = state.config.and_then(|c| c.tau) {
        engine.set_tau(tau);
    }
    let entries = state.entries.len();
    for entry in state.entries.into_iter().filter_map(replicated) {
        caches.insert_replicated(entry);
    }
    tracing::info!(
        index = state.applied_index,
        entries,
        "installed the control plane's state"
    );
}

#[cfg(test)]
mod kv_pool_tests {
    use hasten_proto::v1::{AppliedCommand, ControlState, KvPoolAssignment};

    use super::*;

    fn assignment(pool: &str, workers: &[&str]) -> KvPoolAssignment {
        KvPoolAssignment {
            pool: pool.into(),
            workers: workers.iter().map(|w| w.to_string()).collect(),
            assignment_version: "v".into(),
        }
    }

    #[test]
    fn only_the_edges_pool_is_followed_state_first_then_commands() {
        let event = CommittedEvent {
            index: 9,
            state: Some(ControlState {
                kv_pools: vec![
                    assignment("rag/wiki", &["a:1"]),
                    assignment("rag/news", &["n:1"]),
                ],
                ..ControlState::default()
            }),
            applied: vec![
                AppliedCommand {
                    kind: Some(applied_command::Kind::KvPool(assignment(
                        "rag/news",
                        &["n:2"],
                    ))),
                    removed: Vec::new(),
                },
                AppliedCommand {
                    kind: Some(applied_command::Kind::KvPool(assignment(
                        "rag/wiki",
                        &["a:1", "b:1"],
                    ))),
                    removed: Vec::new(),
                },
            ],
        };
        assert_eq!(
            kv_pool_workers(&event, "rag/wiki"),
            vec![
                vec!["a:1".to_string()],
                vec!["a:1".to_string(), "b:1".to_string()]
            ]
        );
        assert!(kv_pool_workers(&event, "other/pool").is_empty());
    }
}
