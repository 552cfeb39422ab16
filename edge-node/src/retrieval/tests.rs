use std::collections::BTreeMap;

use super::*;
use crate::caches::{CacheStats, Eviction};
use crate::fixture::{Fixture, Setup, along, fixture, topics};

const D: usize = 16;
const K: usize = 4;

/// 8 topics of 12 documents; returns the fixture and the topic centres.
fn topic_edge(setup: Setup) -> (Fixture, Vec<Vec<f32>>) {
    let (vectors, titles, centres) = topics(8, 12, D);
    (fixture(&vectors, &titles, setup), centres)
}

/// `centres[t]` nudged along another axis: close to topic t, not identical.
fn near(centres: &[Vec<f32>], t: usize, by: f32) -> Vec<f32> {
    let mut v = centres[t].clone();
    v[D - 1] += by;
    crate::fixture::unit(v)
}

fn me() -> Tenant {
    Tenant::default_tenant()
}

#[tokio::test]
async fn a_fallback_caches_its_best_depth_documents_and_an_accepted_draft_caches_nothing() {
    let (edge, centres) = topic_edge(Setup::default());
    let first = edge.ask_text(&me(), "about topic 0", &centres[0], K).await;
    assert_eq!(first.outcome, Outcome::Fallback);
    assert_eq!(first.documents.len(), K);
    assert!(first.timings.cloud.is_some() && first.timings.encode.is_some());
    // The entry holds the validation depth's 10 documents, not the request's k.
    assert_eq!(edge.sizes(), (1, 10));

    let second = edge.ask(&me(), &near(&centres, 0, 0.1), K).await;
    assert_eq!(second.outcome, Outcome::Accepted);
    assert!(second.homology_score >= 0.2);
    assert_eq!(
        second.matched_query.and_then(|m| m.text).as_deref(),
        Some("about topic 0")
    );
    assert_eq!(
        edge.sizes(),
        (1, 10),
        "an accepted draft must not touch the cache"
    );
    assert!(second.timings.cloud.is_none());
    assert_eq!(edge.calls(), 1);

    let other = edge.ask(&me(), &centres[3], K).await;
    assert_eq!(other.outcome, Outcome::Fallback);
    assert_eq!(edge.sizes(), (2, 20));
    assert_eq!(edge.calls(), 2);
}

/// Two topics on axes 0 and 1, nine documents each, and a bridge document between them
/// (on axis 0 mostly): topic 0's exact top 10 holds the bridge, and a question leaning to
/// the bridge from topic 1's side ranks it first among topic 1's documents.
fn bridged_edge() -> (Fixture, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut vectors = Vec::new();
    let mut titles = Vec::new();
    for topic in 0..2 {
        for j in 0..9 {
            vectors.push(along(D, &[(topic, 1.0), (2 + j, 0.3)]));
            titles.push(format!("t{topic}"));
        }
    }
    vectors.push(along(D, &[(0, 1.0), (1, 0.8)]));
    titles.push("bridge".into());
    let edge = fixture(&vectors, &titles, Setup::default());
    let topic_0 = along(D, &[(0, 1.0)]);
    let sibling_0 = along(D, &[(0, 1.0), (11, 0.2)]);
    let leaning = along(D, &[(1, 1.0), (0, 0.9)]);
    (edge, topic_0, sibling_0, leaning)
}

#[tokio::test]
async fn the_verdict_does_not_depend_on_k() {
    let bridge = 18;
    let mut scores = Vec::new();
    for k in [1, 3, 10, 50] {
        let (edge, topic_0, sibling_0, leaning) = bridged_edge();
        let cached = edge.ask(&me(), &topic_0, k).await;
        assert_eq!(cached.outcome, Outcome::Fallback);
        // Whatever k asked, the entry holds the validation depth's documents.
        assert_eq!(edge.sizes(), (1, 10), "k = {k}");
        assert!(
            edge.caches
                .get(&me())
                .unwrap()
                .read()
                .hot
                .contains_document(bridge)
        );
        // The leaning question's draft ranks the bridge first, so at k <= 4 a threshold on
        // k would accept it on that one shared document. Its best 10 share only the
        // bridge with the cached query: 1 vote of 10, below tau = 0.2.
        let leaning_reply = edge.ask(&me(), &leaning, k).await;
        assert_eq!(leaning_reply.outcome, Outcome::Fallback, "k = {k}");
        assert_eq!(edge.calls(), 2);
        let sibling = edge.ask(&me(), &sibling_0, k).await;
        assert_eq!(sibling.outcome, Outcome::Accepted, "k = {k}");
        assert_eq!(sibling.documents.len(), k.min(19));
        scores.push((leaning_reply.homology_score, sibling.homology_score));
    }
    assert!((scores[0].0 - 0.1).abs() < 1e-9, "{scores:?}");
    assert!(scores.iter().all(|s| *s == scores[0]), "{scores:?}");
}

#[tokio::test]
async fn eviction_takes_unreferenced_documents_out_of_the_cache_channel() {
    let (edge, centres) = topic_edge(Setup {
        eviction: Eviction::Fifo(1),
        ..Setup::default()
    });
    let first = edge.ask(&me(), &centres[0], K).await;
    let first_ids: Vec<DocId> = first.documents.iter().map(|d| d.id).collect();
    let cache = edge.caches.get(&me()).unwrap();
    assert!(
        first_ids
            .iter()
            .all(|id| cache.read().channel.contains(*id))
    );
    edge.ask(&me(), &centres[5], K).await;
    let state = cache.read();
    assert_eq!(state.hot.len(), 1);
    for id in &first_ids {
        assert!(
            !state.channel.contains(*id),
            "document {id} of the evicted query is still cached"
        );
        assert!(!state.hot.contains_document(*id));
    }
    let hits = state.channel.search(&centres[0], 20).unwrap();
    assert!(
        hits.iter().all(|h| !first_ids.contains(&h.id)),
        "evicted documents still searchable"
    );
    assert_eq!(state.channel.indexed(), 10);
}

#[tokio::test]
async fn a_tenant_is_never_accepted_through_another_tenants_cache() {
    let (acme, globex) = (Tenant::new("acme"), Tenant::new("globex"));
    let (edge, centres) = topic_edge(Setup {
        tenants: vec![acme.clone(), globex.clone()],
        ..Setup::default()
    });
    let first = edge.ask(&acme, &centres[2], K).await;
    assert_eq!(first.outcome, Outcome::Fallback);
    // The homologous question is accepted for the tenant who asked the first...
    let again = edge.ask(&acme, &near(&centres, 2, 0.1), K).await;
    assert_eq!(again.outcome, Outcome::Accepted);
    // ...but another tenant's draft finds nothing to validate it: the cloud answers.
    let other = edge.ask(&globex, &near(&centres, 2, 0.1), K).await;
    assert_eq!(other.outcome, Outcome::Fallback);
    assert_eq!(edge.calls(), 2);
    let stats: BTreeMap<Tenant, CacheStats> = edge.caches.stats().into_iter().collect();
    assert_eq!((stats[&acme].queries, stats[&globex].queries), (1, 1));
    assert!(edge.caches.get(&me()).is_err());
}

#[tokio::test]
async fn cloud_only_never_caches() {
    let (edge, centres) = topic_edge(Setup {
        policy: RetrievalPolicy::CloudOnly,
        ..Setup::default()
    });
    for _ in 0..2 {
        assert_eq!(
            edge.ask(&me(), &centres[1], K).await.outcome,
            Outcome::Fallback
        );
    }
    assert_eq!(edge.sizes(), (0, 0));
}

#[tokio::test]
async fn exact_cache_reuses_only_an_identical_text_and_answers_before_encoding() {
    let (edge, centres) = topic_edge(Setup {
        policy: RetrievalPolicy::ExactCache,
        ..Setup::default()
    });
    let first = edge.ask_text(&me(), "about topic 2", &centres[2], K).await;
    assert_eq!(first.outcome, Outcome::Fallback);
    // `no_encoder` panics if asked: a repeat is answered from the text alone.
    let request = RetrievalRequest {
        tenant: me(),
        query: Query::Text("  About   TOPIC 2 ".into()),
        k: K,
        deadline: None,
        trace: false,
    };
    let hit = edge
        .engine
        .retrieve(request, crate::fixture::no_encoder)
        .await
        .unwrap();
    assert_eq!(hit.outcome, Outcome::Accepted);
    assert!(hit.timings.encode.is_none());
    let ids = |r: &Retrieval| r.documents.iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(ids(&hit), ids(&first));
    let punctuated = edge.ask_text(&me(), "about topic 2?", &centres[2], K).await;
    assert_eq!(punctuated.outcome, Outcome::Fallback);
    // A homologous but different text is not an exact repeat: the cloud answers.
    let other = edge
        .ask_text(&me(), "more about topic 2", &near(&centres, 2, 0.05), K)
        .await;
    assert_eq!(other.outcome, Outcome::Fallback);
    assert_eq!(edge.calls(), 3);
}

#[tokio::test]
async fn semantic_cache_reuses_the_nearest_query_above_the_threshold() {
    let (edge, centres) = topic_edge(Setup {
        policy: RetrievalPolicy::SemanticCache,
        ..Setup::default()
    });
    edge.ask_text(&me(), "topic 4", &centres[4], K).await;
    let close = edge.ask(&me(), &near(&centres, 4, 0.1), K).await;
    assert_eq!(close.outcome, Outcome::Accepted);
    assert!(close.homology_score >= 0.95, "{}", close.homology_score);
    assert_eq!(
        close.matched_query.and_then(|m| m.text).as_deref(),
        Some("topic 4")
    );
    let far = edge.ask(&me(), &near(&centres, 4, 0.6), K).await;
    assert_eq!(
        far.outcome,
        Outcome::Fallback,
        "similarity {}",
        far.homology_score
    );
    assert!(far.homology_score < 0.95);
    assert_eq!(edge.calls(), 2);
}

/// Topic 0's question cached, then topic 3's asked. Validated on the draft with the fuzzy
/// channel, topic 3 shares nothing with the cache and falls back; validated on the cache
/// channel alone, whose only documents are topic 0's, it matches topic 0's question on all
/// ten (the paper's cold-start false match) and is served topic 3's documents all the same.
#[tokio::test]
async fn validation_without_the_fuzzy_channel_matches_whatever_the_cache_holds() {
    for fuzzy_in_validation in [true, false] {
        let (edge, centres) = topic_edge(Setup {
            fuzzy_in_validation,
            ..Setup::default()
        });
        edge.ask(&me(), &centres[0], K).await;
        let reply = edge.ask(&me(), &centres[3], K).await;
        if fuzzy_in_validation {
            assert_eq!(reply.outcome, Outcome::Fallback);
            assert_eq!(edge.calls(), 2);
        } else {
            assert_eq!(reply.outcome, Outcome::Accepted);
            assert!((reply.homology_score - 1.0).abs() < 1e-9);
            assert_eq!(edge.calls(), 1);
        }
        assert!(reply.documents.iter().all(|d| d.title == "t3"), "{reply:?}");
    }
}

/// Topic 0's question caches its best 10 of 12 documents. A sibling question asking for
/// 12 is accepted either way; with the fuzzy channel in the draft it is served all 12 of
/// topic 0, without it only the 10 the cache channel holds.
#[tokio::test]
async fn drafts_without_the_fuzzy_channel_hold_only_cached_documents() {
    for fuzzy_in_draft in [true, false] {
        let (edge, centres) = topic_edge(Setup {
            fuzzy_in_draft,
            ..Setup::default()
        });
        let cached = edge.ask(&me(), &centres[0], K).await;
        assert_eq!(cached.outcome, Outcome::Fallback);
        let cache = edge.caches.get(&me()).unwrap();
        let reply = edge.ask(&me(), &near(&centres, 0, 0.1), 12).await;
        assert_eq!(reply.outcome, Outcome::Accepted);
        assert!(reply.documents.iter().all(|d| d.title == "t0"), "{reply:?}");
        let uncached = reply
            .documents
            .iter()
            .filter(|d| !cache.read().hot.contains_document(d.id))
            .count();
        if fuzzy_in_draft {
            assert_eq!((reply.documents.len(), uncached), (12, 2));
        } else {
            assert_eq!((reply.documents.len(), uncached), (10, 0));
        }
    }
}

#[tokio::test]
async fn edge_ivf_answers_from_the_fuzzy_channel_alone() {
    let (edge, centres) = topic_edge(Setup {
        policy: RetrievalPolicy::EdgeIvf,
        ..Setup::default()
    });
    let r = edge.ask(&me(), &centres[6], K).await;
    assert_eq!(r.outcome, Outcome::Accepted);
    assert!(
        r.documents.iter().all(|d| d.title == "t6"),
        "{:?}",
        r.documents
    );
    assert_eq!(edge.calls(), 0);
    assert_eq!(edge.sizes(), (0, 0));
}

#[tokio::test]
async fn cache_bytes_grow_with_entries_and_stay_flat_under_eviction() {
    let (edge, centres) = topic_edge(Setup {
        eviction: Eviction::Fifo(2),
        ..Setup::default()
    });
    let bytes = |edge: &Fixture| edge.caches.total().bytes;
    let empty = bytes(&edge);
    edge.ask(&me(), &centres[0], K).await;
    let one = bytes(&edge);
    edge.ask(&me(), &centres[3], K).await;
    let two = bytes(&edge);
    edge.ask(&me(), &centres[5], K).await;
    let still_two = bytes(&edge);
    assert!(empty < one && one < two, "{empty} {one} {two}");
    let ratio = still_two as f64 / two as f64;
    assert!((0.9..1.1).contains(&ratio), "{two} vs {still_two}");
}

/// What the topic edge (under `hybrid_similarity`) answers `query` after falling back on
/// `cached`.
async fn after_one_fallback(
    hybrid_similarity: Option<f32>,
    cached: &[f32],
    query: &[f32],
) -> Outcome {
    let (edge, _) = topic_edge(Setup {
        hybrid_similarity,
        ..Setup::default()
    });
    assert_eq!(edge.ask(&me(), cached, K).await.outcome, Outcome::Fallback);
    edge.ask(&me(), query, K).await.outcome
}

#[tokio::test]
async fn hybrid_validation_lets_only_similar_cached_queries_vote() {
    let (_, centres) = topic_edge(Setup::default());
    let centre = &centres[0];
    let homologous = near(&centres, 0, 0.5);
    let paraphrase = near(&centres, 0, 0.1);
    let similarity = |v: &[f32]| hasten_core::vector::dot(centre, v);
    // Below the fixture's semantic threshold (0.95) and above it.
    assert!(similarity(&homologous) < 0.9 && similarity(&paraphrase) > 0.99);
    // Homology alone accepts the homologous query; hybrid validation only when the cached
    // query is similar enough to vote.
    let accepted = Outcome::Accepted;
    assert_eq!(
        after_one_fallback(None, centre, &homologous).await,
        accepted
    );
    assert_eq!(
        after_one_fallback(Some(0.8), centre, &homologous).await,
        accepted
    );
    assert_eq!(
        after_one_fallback(Some(0.95), centre, &homologous).await,
        Outcome::Fallback
    );
    // No cached query may vote at sigma 1, but a paraphrase is accepted on its similarity.
    assert_eq!(
        after_one_fallback(Some(1.0), centre, &paraphrase).await,
        accepted
    );
}
