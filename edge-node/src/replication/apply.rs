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
            Some(applied_command::Kind::ShardMap(_)) | None => {}
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
