//! The documents an edge holding a fraction of the corpus lacks: a replicated entry names
//! its documents by id, and those outside this edge's share are fetched from the cloud in
//! batches (the cloud's documents-by-id call) and kept with the entry while it is cached.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::time::Duration;

use hasten_core::retry::RetryDelays;

use crate::caches::TenantCaches;
use crate::fallback::{CloudDocument, CloudError, CloudSearch};
use crate::has::EdgeDocument;

/// Ids per documents-by-id request: a burst of replicated entries (a restart's catch-up)
/// travels in a few requests of ~0.5 MB each.
pub const FETCH_BATCH: usize = 256;

/// Waits after a failed fetch, doubling up to [`MAX_RETRY_WAIT`], with jitter.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(100);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// Fetches the documents `caches` misses from `cloud` as entries name them, for the edge's
/// lifetime. A failed fetch is retried with backoff.
pub async fn fetch_missing_documents<C: CloudSearch>(caches: &TenantCaches, cloud: &C) {
    let mut waits = RetryDelays::new(FIRST_RETRY_WAIT, MAX_RETRY_WAIT);
    loop {
        match fetch_once(caches, cloud).await {
            Ok(Some(_)) => waits.reset(),
            Ok(None) => caches.missing_added().await,
            Err(err) => {
                let wait = waits.next_delay();
                tracing::warn!(error = %err.display_full(), retry_in = ?wait, "fetching cached entries' documents failed");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Fetches one batch of the documents `caches` misses and attaches them; `None` when none
/// is missing. Documents the cloud does not hold are dropped (their entries still vote);
/// on failure the batch goes back on the queue.
pub async fn fetch_once<C: CloudSearch>(
    caches: &TenantCaches,
    cloud: &C,
) -> Result<Option<usize>, CloudError> {
    let ids = caches.take_missing(FETCH_BATCH);
    if ids.is_empty() {
        return Ok(None);
    }
    let found = cloud
        .documents(&ids)
        .await
        .inspect_err(|_| caches.requeue_missing(&ids))?;
    let documents = usable(found, caches.documents().dimension());
    let attached = caches.attach_documents(&documents);
    tracing::debug!(
        asked = ids.len(),
        found = documents.len(),
        attached,
        "documents fetched from the cloud"
    );
    Ok(Some(attached))
}

/// The fetched documents whose vectors fit this edge's corpus.
fn usable(found: Vec<CloudDocument>, dimension: usize) -> Vec<Arc<EdgeDocument>> {
    found
        .into_iter()
        .filter(|d| d.vector.len() == dimension)
        .map(|d| {
            Arc::new(EdgeDocument {
                id: d.id,
                title: d.title,
                text: d.text,
                vector: d.vector,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caches::{Eviction, ReplicatedEntry};
    use crate::fixture::{CORPUS_VERSION, Fixture, Setup, fixture, topics};
    use crate::has::in_edge_share;
    use crate::retrieval::Outcome;
    use crate::tenants::Tenant;
    use hasten_core::DocId;

    const FRACTION: f64 = 0.5;

    /// An edge following a control plane that holds `FRACTION` of 8 topics of 12 documents;
    /// returns it, the topic centres and the corpus size.
    fn edge_holding_a_share() -> (Fixture, Vec<Vec<f32>>, usize) {
        let (vectors, titles, centres) = topics(8, 12, 16);
        let setup = Setup {
            eviction: Eviction::FromLog,
            corpus_fraction: FRACTION,
            ..Setup::default()
        };
        (fixture(&vectors, &titles, setup), centres, vectors.len())
    }

    #[tokio::test]
    async fn an_entry_naming_documents_outside_the_share_serves_them_once_fetched() {
        let (edge, centres, corpus) = edge_holding_a_share();
        let ids: Vec<DocId> = (24..34).collect();
        let outside: Vec<DocId> = ids
            .iter()
            .copied()
            .filter(|&id| !in_edge_share(id, FRACTION))
            .collect();
        assert!(!outside.is_empty() && outside.len() < ids.len());
        assert!(edge.caches.documents().len() < corpus);
        edge.caches.insert_replicated(ReplicatedEntry {
            id: 1 << 16,
            tenant: Tenant::default_tenant(),
            text: Some("another edge's question".into()),
            vector: centres[2].clone(),
            document_ids: ids.clone(),
            corpus_version: CORPUS_VERSION.into(),
        });
        assert_eq!(edge.caches.missing_len(), outside.len());
        let served = |reply: &crate::retrieval::Retrieval| -> Vec<DocId> {
            reply.documents.iter().map(|d| d.id).collect()
        };

        // Before the fetch, the entry's outside documents can be neither drafted nor
        // served: the draft shares too few documents with it to be accepted.
        let before = edge.ask(&Tenant::default_tenant(), &centres[2], 10).await;
        assert_eq!(before.outcome, Outcome::Fallback);

        let attached = fetch_once(&edge.caches, edge.engine.cloud()).await.unwrap();
        assert_eq!(attached, Some(outside.len()));
        assert_eq!(edge.caches.missing_len(), 0);
        assert_eq!(
            fetch_once(&edge.caches, edge.engine.cloud()).await.unwrap(),
            None
        );

        let after = edge.ask(&Tenant::default_tenant(), &centres[2], 10).await;
        assert_eq!(after.outcome, Outcome::Accepted);
        let mut ids_after = served(&after);
        ids_after.sort_unstable();
        assert_eq!(
            ids_after, ids,
            "the whole cached result, outside documents included"
        );
        for doc in after.documents.iter().filter(|d| outside.contains(&d.id)) {
            assert_eq!(doc.text, format!("t2 document {}", doc.id));
        }
    }

    #[tokio::test]
    async fn documents_of_an_entry_evicted_before_the_fetch_are_not_kept() {
        let (edge, centres, _) = edge_holding_a_share();
        edge.caches.insert_replicated(ReplicatedEntry {
            id: 1 << 16,
            tenant: Tenant::default_tenant(),
            text: None,
            vector: centres[3].clone(),
            document_ids: (36..46).collect(),
            corpus_version: CORPUS_VERSION.into(),
        });
        assert!(edge.caches.missing_len() > 0);
        edge.caches.remove(&[1 << 16]);
        assert_eq!(
            fetch_once(&edge.caches, edge.engine.cloud()).await.unwrap(),
            Some(0)
        );
        assert_eq!(edge.sizes(), (0, 0));
    }
}
