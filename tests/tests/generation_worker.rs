//! Generation on a remote worker: `lm-worker` serving the real small model over gRPC, an
//! edge answering through it (`--lm-worker`), and an edge holding the same model itself, all
//! real processes on loopback. Greedy decoding is deterministic, so the remote edge must give
//! the local edge's answers to the token; the edge's gRPC `Answer` must give its HTTP
//! answer. Skipped, saying so, when HASTEN_LM_DIR is unset.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary};
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1 as pb;
use hasten_proto::v1::edge_client::EdgeClient;
use hasten_tests::answering::{
    Answering, START_TIMEOUT, small_model, start_answering, start_edge, with_model,
};
use hasten_tests::edge::post_json;
use hasten_tests::grpc_health_becomes;
use serde_json::{Value, json};

/// The answer's content, without the timings that differ from run to run.
fn content(reply: &Value) -> Value {
    json!({
        "answer": reply["answer"],
        "documents": reply["documents"].as_array().unwrap().iter().map(|d| d["id"].clone()).collect::<Vec<_>>(),
        "used": reply["used"],
        "drafts": reply["drafts"],
        "generated_tokens": reply["generated_tokens"],
        "prompt_tokens": reply["prompt_tokens"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answers_for_the_edge_exactly_as_the_edge_would() {
    let Some(model) = small_model() else { return };
    let Answering {
        mut cloud,
        edge: local,
        bundle_dir,
        work,
    } = start_answering("generation-worker", "local-edge", &with_model(&model));
    let mut worker = ManagedProcess::start(
        "lm-worker",
        &binary("lm-worker").unwrap(),
        [
            "serve".to_string(),
            "--grpc-addr".into(),
            "127.0.0.1:0".into(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            "--lm-model".into(),
            model.display().to_string(),
        ],
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    // Its gRPC port answers health checks (grpc.health.v1), as every Hasten gRPC server does.
    assert_eq!(
        grpc_health_becomes(
            &worker.addr("grpc_addr"),
            "SERVING",
            std::time::Duration::from_secs(15)
        )
        .await,
        "SERVING"
    );
    let remote = start_edge(
        &work,
        "remote-edge",
        &bundle_dir,
        &cloud,
        &["--lm-worker".into(), worker.addr("grpc_addr")],
    );
    let http = reqwest::Client::new();
    let question = CorpusBundle::load(&bundle_dir).unwrap().questions[1]
        .question
        .clone();

    for body in [
        json!({"question": question, "k": 5, "max_tokens": 24}),
        json!({"question": question, "k": 6, "mode": "speculative", "max_tokens": 24}),
    ] {
        let (status, here) = post_json(&http, &local.addr("http_addr"), "/v1/answer", &body).await;
        assert_eq!(status, 200, "{here}");
        let (status, there) =
            post_json(&http, &remote.addr("http_addr"), "/v1/answer", &body).await;
        assert_eq!(status, 200, "{there}");
        assert!(
            !here["answer"].as_str().unwrap().trim().is_empty(),
            "{here}"
        );
        assert_eq!(content(&there), content(&here), "{body}");
    }

    // The gRPC twin: documents first, then text that adds up to the whole answer, which is
    // the HTTP API's.
    let body = json!({"question": question, "k": 5, "max_tokens": 24});
    let (_, over_http) = post_json(&http, &remote.addr("http_addr"), "/v1/answer", &body).await;
    let mut client = EdgeClient::connect(format!("http://{}", remote.addr("grpc_addr")))
        .await
        .unwrap();
    let mut events = client
        .answer(pb::AnswerRequest {
            question: question.clone(),
            k: Some(5),
            mode: pb::AnswerMode::Standard as i32,
            max_tokens: Some(24),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(event) = events.message().await.unwrap() {
        seen.push(event.event.unwrap());
    }
    let Some(pb::answer_event::Event::Documents(documents)) = seen.first() else {
        panic!("the first event is not the documents: {seen:?}");
    };
    assert_eq!(documents.documents.len(), 5);
    let Some(pb::answer_event::Event::Answer(answer)) = seen.last() else {
        panic!("the last event is not the answer: {seen:?}");
    };
    let streamed: String = seen
        .iter()
        .filter_map(|e| match e {
            pb::answer_event::Event::Delta(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, answer.answer);
    assert_eq!(answer.answer, over_http["answer"].as_str().unwrap());
    let timings = answer.timings.unwrap();
    assert!(timings.first_token_us <= timings.total_us, "{timings:?}");
    assert!(
        timings.retrieve_us > 0 && timings.prefill_us > 0,
        "{timings:?}"
    );

    // The gRPC twin refuses bad input naming the field, as the HTTP API does.
    let refused = client
        .answer(pb::AnswerRequest {
            question: question.clone(),
            k: None,
            mode: 9,
            max_tokens: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("mode"), "{refused:?}");

    // The worker counts what it generated.
    let scrape = Scrape::of(&worker.addr("metrics_addr")).await.unwrap();
    let answers = |mode: &str| scrape.value("hasten_worker_answers_total", &[("mode", mode)]);
    assert_eq!(answers("standard"), 3.0);
    assert_eq!(answers("speculative"), 1.0);

    // A worker that is gone makes answers unavailable (503), not wrong; retrieval goes on.
    worker.stop();
    let (status, reply) = post_json(&http, &remote.addr("http_addr"), "/v1/answer", &body).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["code"], "unavailable", "{reply}");
    let (status, _) = post_json(
        &http,
        &remote.addr("http_addr"),
        "/v1/retrieve",
        &json!({"query": question, "k": 5}),
    )
    .await;
    assert_eq!(status, 200);
    drop((local, remote));
    cloud.stop();
}

#[test]
fn a_worker_without_a_model_refuses_to_start_naming_the_key() {
    let output = std::process::Command::new(binary("lm-worker").unwrap())
        .args(["serve", "--grpc-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`lm_model`"), "{stderr}");
}
