//! Drafting, verification and both answer modes on tiny random-weight models: the batched
//! and one-pass paths against their one-at-a-time references.
#![allow(clippy::expect_used)]

#[path = "../../lm/tests/support/mod.rs"]
mod support;

mod common;

use std::sync::Arc;

use hasten_lm::score_incrementally;
use hasten_rag::draft::write_drafts;
use hasten_rag::verify::{verification_rows, verify};
use hasten_rag::{
    AnswerMode, AnswerRequest, DraftSelection, Finish, LmBackend, LocalLm, SpeculativeSettings,
};
use support::TinyArch;

const QUESTION: &str = "Which river is longest?";

fn speculative(drafts: usize) -> AnswerRequest {
    AnswerRequest {
        mode: AnswerMode::Speculative,
        // Room for a whole draft's answer line (drafts are written answer first).
        max_new_tokens: 32,
        speculative: SpeculativeSettings {
            drafts,
            draft_tokens: 12,
            seed: 5,
            ..SpeculativeSettings::default()
        },
        ..AnswerRequest::new(QUESTION, common::clustered_documents())
    }
}

#[test]
fn batched_drafting_equals_drafting_each_subset_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let drafter = support::load_tiny(dir.path(), TinyArch::Llama, 3);
    let documents = common::clustered_documents();
    // Subsets of different lengths (one to three documents), so the batch is left-padded.
    let subsets = vec![vec![0, 1], vec![2], vec![3, 4, 5], vec![1, 4]];
    let batched =
        write_drafts(&drafter, QUESTION, &documents, &subsets, 12, &|| false).expect("batch");
    assert_eq!(batched.drafts.len(), subsets.len());
    for (row, subset) in subsets.iter().enumerate() {
        let alone = write_drafts(
            &drafter,
            QUESTION,
            &documents,
            std::slice::from_ref(subset),
            12,
            &|| false,
        )
        .expect("alone");
        let (a, b) = (&batched.drafts[row], &alone.drafts[0]);
        assert_eq!(a.tokens, b.tokens, "row {row}");
        assert_eq!(
            (&a.rationale, &a.answer, &a.documents),
            (&b.rationale, &b.answer, &b.documents),
            "row {row}"
        );
        assert!(
            (a.logprob - b.logprob).abs() < 2e-3,
            "row {row}: {} batched, {} alone",
            a.logprob,
            b.logprob
        );
        assert!(a.logprob.is_finite() && a.logprob <= 0.0);
    }
}

#[test]
fn one_pass_verifier_scores_equal_token_by_token_scores() {
    let dir = tempfile::tempdir().expect("tempdir");
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let verifier = support::load_tiny(dir.path(), arch, 8);
        // Short drafts: the token-by-token reference costs one forward pass per token.
        let drafts = [("The Nile is long.", "The Nile"), ("", "Amazon")];
        let verification = verify(&verifier, QUESTION, &drafts).expect("verify");
        let laid_out = verification_rows(&verifier, QUESTION, &drafts).expect("rows");
        assert_eq!(verification.verdicts.len(), drafts.len());
        for (row, verdict) in laid_out.rows.iter().zip(&verification.verdicts) {
            let reference =
                score_incrementally(&verifier.decoder, &laid_out.context, &row.continuation)
                    .expect("incremental");
            let expected = row.verdict(&reference);
            assert!(
                (verdict.consistency - expected.consistency).abs() < 2e-3,
                "{arch:?}: consistency {} one-pass, {} token by token",
                verdict.consistency,
                expected.consistency
            );
            assert!(
                (verdict.reflection - expected.reflection).abs() < 2e-3,
                "{arch:?}: reflection {} one-pass, {} token by token",
                verdict.reflection,
                expected.reflection
            );
            assert!(!row.draft.is_empty() && !row.yes.is_empty());
            assert_eq!(row.yes.end, row.continuation.len());
        }
    }
}

#[test]
fn a_single_draft_is_the_drafters_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = common::tiny_backend(dir.path());
    let request = speculative(1);
    let mut streamed = String::new();
    let answer = backend
        .answer(&request, &mut |t: &str| streamed.push_str(t))
        .expect("answer");
    assert_eq!(answer.drafts.len(), 1);
    let draft = &answer.drafts[0];
    let direct = write_drafts(
        backend.drafter(),
        QUESTION,
        &request.documents,
        std::slice::from_ref(&draft.documents),
        request.speculative.draft_tokens,
        &|| false,
    )
    .expect("draft");
    assert_eq!(answer.text, direct.drafts[0].answer);
    assert_eq!(answer.text, draft.answer);
    assert_eq!(answer.rationale.as_deref(), Some(draft.rationale.as_str()));
    assert_eq!(answer.documents_used, draft.documents);
    assert_eq!(streamed, answer.text);
    assert_eq!(answer.finish, Finish::Stop);
    // Nothing to choose between: the verifier does not run.
    assert_eq!(answer.timings.verify, std::time::Duration::ZERO);

    // A reply limit shorter than the draft's answer cuts it, and says so.
    let short = AnswerRequest {
        max_new_tokens: 3,
        ..request.clone()
    };
    let cut = backend
        .answer(&short, &mut |_: &str| {})
        .expect("short answer");
    assert_eq!(cut.finish, Finish::Length);
    assert!(
        cut.text.len() < draft.answer.len() && draft.answer.starts_with(&cut.text),
        "{:?} is not a cut of {:?}",
        cut.text,
        draft.answer
    );
}

#[test]
fn speculative_mode_returns_every_draft_and_answers_with_the_best() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = common::tiny_backend(dir.path());
    let request = speculative(4);
    let answer = backend.answer(&request, &mut |_: &str| {}).expect("answer");
    assert_eq!(answer.drafts.len(), 4);
    for draft in &answer.drafts {
        assert!(draft.score.is_finite(), "{draft:?}");
        assert_eq!(draft.documents.len(), 2);
        assert!(draft.draft_logprob <= 0.0 && draft.consistency_logprob < 0.0);
        assert!(draft.reflection_logprob < 0.0);
        let sum = draft.draft_logprob + draft.consistency_logprob + draft.reflection_logprob;
        assert!((draft.score - sum).abs() < 1e-4);
    }
    let best = answer
        .drafts
        .iter()
        .map(|d| d.score)
        .fold(f32::NEG_INFINITY, f32::max);
    let chosen = answer
        .drafts
        .iter()
        .find(|d| d.documents == answer.documents_used)
        .expect("chosen draft");
    assert_eq!(chosen.score, best);
    assert_eq!(answer.text, chosen.answer);
    assert!(answer.timings.verify > std::time::Duration::ZERO);
    assert!(answer.prompt_tokens > 0 && answer.generated_tokens > 0);

    // The same request gives the same answer; random selection is the seeded ablation.
    let again = backend.answer(&request, &mut |_: &str| {}).expect("again");
    assert_eq!(again.drafts, answer.drafts);
    let mut random = request.clone();
    random.speculative.selection = DraftSelection::Random { seed: 1 };
    let a = backend.answer(&random, &mut |_: &str| {}).expect("random");
    let b = backend
        .answer(&random, &mut |_: &str| {})
        .expect("random again");
    assert_eq!(a.documents_used, b.documents_used);
    assert!(a.drafts.iter().all(|d| d.consistency_logprob == 0.0));
}

#[test]
fn standard_mode_streams_the_verifiers_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = common::tiny_backend(dir.path());
    let request = AnswerRequest {
        max_new_tokens: 10,
        ..AnswerRequest::new(QUESTION, common::clustered_documents())
    };
    let mut streamed = String::new();
    let answer = backend
        .answer(&request, &mut |t: &str| streamed.push_str(t))
        .expect("answer");
    assert_eq!(streamed.trim(), answer.text);
    assert!(answer.drafts.is_empty() && answer.rationale.is_none());
    assert_eq!(answer.documents_used, (0..6).collect::<Vec<_>>());
    assert!(answer.generated_tokens <= 10);
    assert!(answer.timings.total >= answer.timings.first_token);
}

#[test]
fn long_documents_are_cut_to_fit_the_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = common::tiny_backend(dir.path());
    let long = "The river runs on and on. ".repeat(200);
    let documents = (0..4)
        .map(|i| hasten_rag::Document::new(format!("D{i}"), long.clone()))
        .collect();
    let request = AnswerRequest {
        max_new_tokens: 4,
        ..AnswerRequest::new(QUESTION, documents)
    };
    let answer = backend.answer(&request, &mut |_: &str| {}).expect("fits");
    assert!(answer.prompt_tokens <= support::TINY_CHAT_CONTEXT as usize);
}

#[test]
fn one_path_loads_one_model_for_both_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = support::tiny_chat_model(dir.path(), TinyArch::Llama, 3);
    let shared = LocalLm::load(&path, &path, hasten_lm::DeviceKind::Cpu).expect("load");
    assert!(Arc::ptr_eq(shared.drafter(), shared.verifier()));
    let info = shared.info();
    assert_eq!(info.drafter, info.verifier);
    assert_eq!(info.device, "cpu");
    let other = support::tiny_chat_model(dir.path(), TinyArch::Qwen2, 4);
    let pair = LocalLm::load_with(
        &path,
        &other,
        hasten_lm::DeviceKind::Cpu,
        hasten_lm::WeightFormat::Fast,
    )
    .expect("load");
    assert!(!Arc::ptr_eq(pair.drafter(), pair.verifier()));
    let request = AnswerRequest {
        max_new_tokens: 4,
        ..AnswerRequest::new(QUESTION, common::clustered_documents())
    };
    pair.answer(&request, &mut |_: &str| {}).expect("answer");
}
