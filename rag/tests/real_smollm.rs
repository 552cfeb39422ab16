//! Both modes on the real SmolLM2-135M-Instruct (drafter and verifier alike), where
//! `HASTEN_LM_DIR` points at the installed models.
#![allow(clippy::expect_used)]

#[path = "../../lm/tests/support/mod.rs"]
mod support;

use hasten_eval::metrics;
use hasten_rag::{
    AnswerMode, AnswerRequest, DeviceKind, Document, LmBackend, LocalLm, SpeculativeSettings,
    WeightFormat,
};
use support::{SMALL_MODEL, real_model};

/// Four short documents, two of which state the answer; vectors put the two answering
/// documents in one cluster and the two distractors in the other.
fn documents() -> Vec<Document> {
    vec![
        Document::new(
            "Australia",
            "Canberra is the capital city of Australia. It was chosen as a compromise between Sydney and Melbourne.",
        )
        .with_vector(vec![1.0, 0.1, 0.0]),
        Document::new(
            "Sydney",
            "Sydney is the largest city in Australia and is famous for its Opera House.",
        )
        .with_vector(vec![0.1, 1.0, 0.0]),
        Document::new(
            "Melbourne",
            "Melbourne is a coastal city in the state of Victoria, known for its coffee.",
        )
        .with_vector(vec![0.0, 1.0, 0.1]),
        Document::new(
            "Parliament House",
            "Parliament House in Canberra, the Australian capital, opened in 1988.",
        )
        .with_vector(vec![1.0, 0.0, 0.1]),
    ]
}

const QUESTION: &str = "What is the capital of Australia?";

#[test]
fn smollm2_answers_from_the_documents_in_both_modes() {
    let Some(path) = real_model(SMALL_MODEL) else {
        return;
    };
    // The fast weight format keeps this test short.
    let backend =
        LocalLm::load_with(&path, &path, DeviceKind::Cpu, WeightFormat::Fast).expect("load");

    let standard = AnswerRequest {
        max_new_tokens: 24,
        ..AnswerRequest::new(QUESTION, documents())
    };
    let mut streamed = String::new();
    let answer = backend
        .answer(&standard, &mut |t: &str| streamed.push_str(t))
        .expect("standard");
    eprintln!("standard: {:?} ({:?})", answer.text, answer.timings);
    assert!(
        metrics::contains(&answer.text, "Canberra"),
        "{:?}",
        answer.text
    );
    assert_eq!(streamed.trim(), answer.text);

    let speculative = AnswerRequest {
        mode: AnswerMode::Speculative,
        speculative: SpeculativeSettings {
            drafts: 2,
            clusters: 2,
            draft_tokens: 32,
            ..SpeculativeSettings::default()
        },
        ..standard.clone()
    };
    let answer = backend
        .answer(&speculative, &mut |_: &str| {})
        .expect("speculative");
    for draft in &answer.drafts {
        eprintln!("draft {draft:?}");
    }
    eprintln!("speculative: {:?} ({:?})", answer.text, answer.timings);
    assert_eq!(answer.drafts.len(), 2);
    assert!(answer.drafts.iter().all(|d| d.score.is_finite()
        && d.draft_logprob.is_finite()
        && d.consistency_logprob.is_finite()
        && d.reflection_logprob.is_finite()));
    // Every draft read one answering document (cluster 0) and one distractor (cluster 1).
    for draft in &answer.drafts {
        assert_eq!(draft.documents.len(), 2);
        assert!(
            draft.documents.iter().any(|d| *d == 0 || *d == 3),
            "{draft:?}"
        );
    }
}
