//! Requests that cannot be answered are refused before any model runs, naming the field.
#![allow(clippy::expect_used)]

#[path = "../../lm/tests/support/mod.rs"]
mod support;

mod common;

use display_full_error::DisplayFullErrorExt;
use hasten_rag::{AnswerMode, AnswerRequest, Document, LmBackend, RagError};

fn speculative() -> AnswerRequest {
    AnswerRequest {
        mode: AnswerMode::Speculative,
        ..AnswerRequest::new("Which river is longest?", common::clustered_documents())
    }
}

fn refused_field(request: &AnswerRequest) -> (&'static str, String) {
    match request.validate() {
        Err(error @ RagError::InvalidRequest { field, .. }) => (field, error.to_string_full()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn each_invalid_field_is_named() {
    let cases: Vec<(&str, AnswerRequest)> = vec![
        (
            "question",
            AnswerRequest {
                question: "  ".into(),
                ..speculative()
            },
        ),
        (
            "documents",
            AnswerRequest {
                documents: Vec::new(),
                ..speculative()
            },
        ),
        (
            "max_new_tokens",
            AnswerRequest {
                max_new_tokens: 0,
                ..speculative()
            },
        ),
        (
            "max_new_tokens",
            AnswerRequest {
                max_new_tokens: 1025,
                ..speculative()
            },
        ),
    ];
    let mut cases = cases;
    for (drafts, clusters, field) in [
        (0, 2, "speculative.drafts"),
        (17, 2, "speculative.drafts"),
        (5, 0, "speculative.clusters"),
        (5, 7, "speculative.clusters"),
    ] {
        let mut request = speculative();
        request.speculative.drafts = drafts;
        request.speculative.clusters = clusters;
        cases.push((field, request));
    }
    let mut missing_vector = speculative();
    missing_vector.documents[3].vector = None;
    cases.push(("documents", missing_vector));
    let mut zero_tokens = speculative();
    zero_tokens.speculative.draft_tokens = 0;
    cases.push(("speculative.draft_tokens", zero_tokens));

    for (expected, request) in &cases {
        let (field, message) = refused_field(request);
        assert_eq!(field, *expected, "{message}");
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn a_missing_vector_is_fine_without_clustering_and_in_standard_mode() {
    let mut request = speculative();
    request.documents[3].vector = None;
    request.speculative.clustering = false;
    request.validate().expect("ablation needs no vectors");
    let standard = AnswerRequest {
        speculative: hasten_rag::SpeculativeSettings {
            clusters: 99,
            ..Default::default()
        },
        ..AnswerRequest::new("q?", vec![Document::new("t", "x")])
    };
    standard
        .validate()
        .expect("standard mode ignores speculative settings");
}

#[test]
fn the_backend_refuses_before_running_a_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = common::tiny_backend(dir.path());
    let mut request = speculative();
    request.documents[0].vector = None;
    let mut streamed = String::new();
    let error = backend
        .answer(&request, &mut |t: &str| streamed.push_str(t))
        .expect_err("must refuse");
    assert_eq!(error.field(), Some("documents"), "{error}");
    assert!(
        error.to_string_full().contains("document 0 has no vector"),
        "{error}"
    );
    assert!(streamed.is_empty());
}

#[test]
fn answer_mode_is_lowercase_in_json() {
    assert_eq!(
        serde_json::to_string(&AnswerMode::Speculative).expect("json"),
        "\"speculative\""
    );
    let mode: AnswerMode = serde_json::from_str("\"standard\"").expect("parse");
    assert_eq!(mode, AnswerMode::Standard);
}
