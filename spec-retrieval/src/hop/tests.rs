//! SpecHop against the sequential agent with a deterministic agent whose every move depends
//! on what it read, over faiss exact search with a round trip: the strict verifier gives the
//! sequential trajectory for k 1/2/3/5 with speculators always, never and half the time
//! right, or without any guess (the hop then waits and nothing runs past it); never more than k hops await verification; a verifier that accepts anything
//! (Jaccard threshold 0) diverges.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::retriever::{ExactRetriever, RetrievedDocument};
use crate::test_corpus::{FaissRetriever, TrigramEncoder, corpus};
use crate::{SpecError, StepResult};
use hasten_core::index::IndexError;

/// Searches for the question and what it read last; reads the first two documents' titles
/// and first words; answers with everything it read.
struct ScriptedAgent {
    hops: usize,
}

impl HopAgent for ScriptedAgent {
    fn act(&self, question: &str, hops: &[Hop], must_answer: bool) -> StepResult<Action> {
        if must_answer || hops.len() >= self.hops {
            let read: Vec<&str> = hops.iter().map(|h| h.sub_answer.as_str()).collect();
            return Ok(Action::Answer(read.join(" | ")));
        }
        let last = hops.last().map_or("", |h| h.sub_answer.as_str());
        Ok(Action::Search(format!("{question} {last}")))
    }

    fn read(
        &self,
        _question: &str,
        _hops: &[Hop],
        _query: &str,
        documents: &[RetrievedDocument],
    ) -> StepResult<String> {
        Ok(documents
            .iter()
            .take(2)
            .map(|d| {
                let words: Vec<&str> = d.text.split_whitespace().take(3).collect();
                format!("{} {}", d.title, words.join(" "))
            })
            .collect::<Vec<_>>()
            .join(" "))
    }
}

#[derive(Clone, Copy, Debug)]
enum Accuracy {
    Always,
    Never,
    Half,
    /// No guess at all (an edge whose cache and fuzzy channel found nothing).
    Nothing,
}

/// The exact answer (without the round trip), or the same documents in reverse order,
/// which the strict verifier rejects.
struct Guess {
    exact: Arc<FaissRetriever>,
    accuracy: Accuracy,
    rng: StdRng,
}

impl HopSpeculator for Guess {
    type Error = IndexError;

    fn speculate(&mut self, query: &[f32], k: usize) -> Result<Vec<RetrievedDocument>, IndexError> {
        let mut documents = self
            .exact
            .search_now(&[query.to_vec()], k)
            .unwrap()
            .pop()
            .unwrap();
        let right = match self.accuracy {
            Accuracy::Always => true,
            Accuracy::Never => false,
            Accuracy::Half => self.rng.random_bool(0.5),
            Accuracy::Nothing => return Ok(Vec::new()),
        };
        if !right {
            documents.reverse();
        }
        Ok(documents)
    }
}

struct Fixture {
    exact: Arc<FaissRetriever>,
    agent: ScriptedAgent,
    settings: HopSettings,
}

fn fixture() -> Fixture {
    let mut exact = FaissRetriever::new(corpus());
    exact.latency = Duration::from_millis(15);
    Fixture {
        exact: Arc::new(exact),
        agent: ScriptedAgent { hops: 4 },
        settings: HopSettings {
            k_documents: 3,
            max_hops: 6,
        },
    }
}

const QUESTION: &str = "Which river flows north?";

fn sequential(f: &Fixture) -> HopOutcome {
    run_sequential_agent(
        &f.agent,
        QUESTION,
        &TrigramEncoder,
        f.exact.as_ref(),
        &f.settings,
    )
    .unwrap()
}

fn spechop(
    f: &Fixture,
    accuracy: Accuracy,
    k: usize,
    verifier: Verifier,
) -> Result<HopOutcome, SpecError<IndexError>> {
    let exact: Arc<dyn ExactRetriever<Error = IndexError>> = f.exact.clone();
    let mut guess = Guess {
        exact: Arc::clone(&f.exact),
        accuracy,
        rng: StdRng::seed_from_u64(k as u64),
    };
    run_spechop(
        &f.agent,
        QUESTION,
        &TrigramEncoder,
        &exact,
        &mut guess,
        &f.settings,
        k,
        verifier,
    )
}

#[test]
fn strict_spechop_follows_the_sequential_trajectory() {
    let f = fixture();
    let sequential = sequential(&f);
    assert_eq!(sequential.hops.len(), 4);
    let queries: std::collections::BTreeSet<&Vec<u64>> =
        sequential.hops.iter().map(|h| &h.documents).collect();
    assert!(queries.len() >= 2, "every hop read the same documents");
    for k in [1, 2, 3, 5] {
        for accuracy in [
            Accuracy::Always,
            Accuracy::Never,
            Accuracy::Half,
            Accuracy::Nothing,
        ] {
            let out = spechop(&f, accuracy, k, Verifier::Strict).unwrap();
            let what = format!("k {k}, {accuracy:?}");
            assert_eq!(out.answer, sequential.answer, "{what}");
            assert_eq!(out.hops, sequential.hops, "{what}");
            let stats = out.speculation.unwrap();
            assert!(stats.max_live <= k, "{what}: {stats:?}");
            match accuracy {
                Accuracy::Always => {
                    assert_eq!(
                        (stats.committed, stats.discarded),
                        (4, 0),
                        "{what}: {stats:?}"
                    );
                    assert_eq!(
                        stats.max_live,
                        k.min(4),
                        "{what}: the pipeline never filled"
                    );
                }
                Accuracy::Never => assert_eq!(stats.committed, 0, "{what}: {stats:?}"),
                Accuracy::Half => {}
                Accuracy::Nothing => assert_eq!(
                    (stats.speculated, stats.discarded, stats.max_live),
                    (0, 0, 1),
                    "{what}: a hop without a guess ran ahead: {stats:?}"
                ),
            }
        }
    }
}

/// The twin: a verifier that accepts any sub-answer commits hops read from wrong documents.
#[test]
fn a_verifier_that_accepts_anything_diverges() {
    let f = fixture();
    let sequential = sequential(&f);
    let out = spechop(&f, Accuracy::Never, 2, Verifier::Jaccard(0.0)).unwrap();
    assert_ne!(out.hops, sequential.hops);
    assert_ne!(out.answer, sequential.answer);
}

#[test]
fn jaccard_compares_normalised_token_sets() {
    assert_eq!(token_set_jaccard("The Nile, north!", "north the NILE"), 1.0);
    assert_eq!(token_set_jaccard("", ""), 1.0);
    assert!((token_set_jaccard("a b c", "a b d") - 0.5).abs() < 1e-9);
    assert_eq!(token_set_jaccard("a", "b"), 0.0);
}

#[test]
fn spechop_refuses_zero_threads() {
    assert!(spechop(&fixture(), Accuracy::Always, 0, Verifier::Strict).is_err());
}
