//! RaLMSpec against `ralm-seq` on a tiny random-weight model: equal tokens and documents for
//! every stride and technique, also when the speculator is wrong half the time; a verifier
//! that never finds a mismatch diverges; OS3 picks the brute-force argmax of its objective.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;

use hasten_lm::LanguageModel;
use hasten_lm::testing::{TinyArch, load_tiny};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::os3::{Verified, objective};
use super::speculative::run_with_verifier;
use super::*;
use crate::retriever::RetrievedDocument;
use crate::test_corpus::{FaissRetriever, TrigramEncoder, corpus};

/// Right as often as the cache, except that half its guesses are a random document it saw.
struct Adversarial {
    cache: LocalDocumentCache,
    seen: Vec<RetrievedDocument>,
    rng: StdRng,
}

impl Speculator for Adversarial {
    fn speculate(&mut self, query: &[f32]) -> Option<RetrievedDocument> {
        let guess = self.cache.speculate(query)?;
        if self.rng.random_bool(0.5) {
            Some(self.seen[self.rng.random_range(0..self.seen.len())].clone())
        } else {
            Some(guess)
        }
    }

    fn observe(&mut self, documents: &[RetrievedDocument]) {
        self.seen.extend(documents.iter().cloned());
        self.cache.observe(documents);
    }
}

fn adversarial() -> Adversarial {
    Adversarial {
        cache: LocalDocumentCache::new(),
        seen: Vec::new(),
        rng: StdRng::seed_from_u64(9),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    model: Arc<LanguageModel>,
    exact: FaissRetriever,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model = load_tiny(dir.path(), TinyArch::Llama, 21);
    Fixture {
        _dir: dir,
        model,
        exact: FaissRetriever::new(corpus()),
    }
}

const QUESTION: &str = "Which river?";

fn settings() -> RalmSettings {
    RalmSettings {
        max_new_tokens: 48,
        ..RalmSettings::default()
    }
}

fn every_setting() -> Vec<SpeculationSettings> {
    let mut all = Vec::new();
    let strides = [1, 2, 3, 8]
        .map(Stride::Fixed)
        .into_iter()
        .chain([Stride::Os3(Os3Settings::default())]);
    for stride in strides {
        for prefetch in [1, 20] {
            for asynchronous in [false, true] {
                all.push(SpeculationSettings {
                    stride,
                    prefetch,
                    asynchronous,
                });
            }
        }
    }
    all
}

#[test]
fn speculative_runs_equal_the_sequential_run() {
    let f = fixture();
    let generator = RalmGenerator::new(&f.model, QUESTION, settings()).unwrap();
    let sequential = run_sequential(&generator, &TrigramEncoder, &f.exact).unwrap();
    assert!(sequential.tokens.len() >= 24, "{:?}", sequential.tokens);
    let distinct: std::collections::BTreeSet<u64> = sequential.documents.iter().copied().collect();
    assert!(distinct.len() >= 3, "retrieval never moved: {distinct:?}");
    let mut rollbacks = 0;
    for settings in every_setting() {
        let speculators: [Box<dyn Speculator>; 2] =
            [Box::new(LocalDocumentCache::new()), Box::new(adversarial())];
        for (name, mut speculator) in ["cache", "adversarial"].into_iter().zip(speculators) {
            let out = run_speculative(
                &generator,
                &TrigramEncoder,
                &f.exact,
                speculator.as_mut(),
                &settings,
            )
            .unwrap();
            assert_eq!(out.tokens, sequential.tokens, "{name} {settings:?}");
            assert_eq!(out.documents, sequential.documents, "{name} {settings:?}");
            let stats = out.speculation.unwrap();
            assert!(stats.accepted <= stats.speculated, "{stats:?}");
            assert!(stats.exact_calls <= out.documents.len(), "{stats:?}");
            rollbacks += stats.rollbacks;
        }
    }
    assert!(
        rollbacks > 0,
        "no setting ever rolled back: the test proves nothing"
    );
}

#[test]
fn verification_saves_exact_calls_when_speculation_is_right() {
    let f = fixture();
    let generator = RalmGenerator::new(&f.model, QUESTION, settings()).unwrap();
    let sequential = run_sequential(&generator, &TrigramEncoder, &f.exact).unwrap();
    let out = run_speculative(
        &generator,
        &TrigramEncoder,
        &f.exact,
        &mut LocalDocumentCache::new(),
        &SpeculationSettings {
            stride: Stride::Fixed(8),
            prefetch: 48,
            asynchronous: false,
        },
    )
    .unwrap();
    // Prefetching the whole corpus makes the cache's nearest document the exact top-1.
    let stats = out.speculation.unwrap();
    assert_eq!(stats.rollbacks, 0, "{stats:?}");
    assert!(
        stats.exact_calls * 4 <= sequential.documents.len() + 8,
        "{} exact calls for {} retrievals",
        stats.exact_calls,
        sequential.documents.len()
    );
}

/// The twin: commit speculated steps without comparing them with the exact retrieval.
#[test]
fn a_verifier_that_never_rolls_back_diverges() {
    let f = fixture();
    let generator = RalmGenerator::new(&f.model, QUESTION, settings()).unwrap();
    let sequential = run_sequential(&generator, &TrigramEncoder, &f.exact).unwrap();
    let out = run_with_verifier(
        &generator,
        &TrigramEncoder,
        &f.exact,
        &mut adversarial(),
        &SpeculationSettings::default(),
        |_, _| None,
    )
    .unwrap();
    assert_ne!(out.documents, sequential.documents);
    assert_ne!(out.tokens, sequential.tokens);
}

/// Independent of the scheduler's code: the estimates from the recorded verifications as
/// the paper defines them, and the objective at every stride.
fn brute_force_stride(history: &[Verified], settings: Os3Settings, asynchronous: bool) -> usize {
    let window = &history[history.len().saturating_sub(settings.window)..];
    if window.is_empty() {
        return 1;
    }
    let n = window.len() as f64;
    let a = window.iter().map(|v| v.step_seconds).sum::<f64>() / n;
    let b = window.iter().map(|v| v.verify_seconds).sum::<f64>() / n;
    let matched: usize = window.iter().map(|v| v.matched).sum();
    let failed = window.iter().filter(|v| v.matched < v.stride).count();
    let gamma = if matched + failed == 0 {
        0.0
    } else {
        (matched as f64 / (matched + failed) as f64).min(settings.gamma_max)
    };
    let values: Vec<f64> = (1..=settings.max_stride)
        .map(|s| objective(s, a, b, gamma, asynchronous))
        .collect();
    let best = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    1 + values.iter().position(|&v| v == best).unwrap()
}

#[test]
fn os3_picks_the_brute_force_argmax_on_recorded_latencies() {
    let settings = Os3Settings::default();
    let mut rng = StdRng::seed_from_u64(3);
    let mut chosen = std::collections::BTreeSet::new();
    for asynchronous in [false, true] {
        for _ in 0..50 {
            let mut scheduler = StrideScheduler::new(settings, asynchronous);
            let mut history = Vec::new();
            assert_eq!(scheduler.next_stride(), 1);
            for _ in 0..rng.random_range(1..12) {
                let stride = rng.random_range(1..=8);
                let verified = Verified {
                    stride,
                    matched: rng.random_range(0..=stride),
                    step_seconds: rng.random_range(0.01..0.3),
                    verify_seconds: rng.random_range(0.05..1.5),
                };
                scheduler.record(verified);
                history.push(verified);
                let expected = brute_force_stride(&history, settings, asynchronous);
                assert_eq!(scheduler.next_stride(), expected, "{history:?}");
                chosen.insert(expected);
            }
        }
    }
    assert!(
        chosen.len() >= 4,
        "the histories never moved the stride: {chosen:?}"
    );
}

#[test]
fn os3_grows_the_stride_when_verification_is_slow_and_speculation_right() {
    let mut scheduler = StrideScheduler::new(Os3Settings::default(), false);
    for _ in 0..5 {
        scheduler.record(Verified {
            stride: 4,
            matched: 4,
            step_seconds: 0.05,
            verify_seconds: 1.0,
        });
    }
    let slow = scheduler.next_stride();
    for _ in 0..5 {
        scheduler.record(Verified {
            stride: 4,
            matched: 0,
            step_seconds: 0.05,
            verify_seconds: 1.0,
        });
    }
    assert!(slow >= 4, "{slow}");
    assert_eq!(scheduler.next_stride(), 1);
}
