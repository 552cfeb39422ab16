//! `/v1/ralm` end to end: `cloud-index` and `edge-node` processes on loopback, the edge
//! generating with SmolLM2-135M-Instruct (skipped, saying so, when HASTEN_LM_DIR is unset)
//! and retrieving from the cloud over QUIC every 4 tokens. RaLMSpec's answer and the
//! documents it read must be the sequential run's, whatever its stride and techniques; the
//! reply reports the speculation; bad settings are refused naming the field; a run whose
//! cloud is gone is answered as a retrieval fallback is.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use hasten_tests::answering::{
    Answering, ONE_AT_A_TIME, OnEngine, small_model, start_answering, start_on_engine,
    wait_engine_detected, with_model,
};
use hasten_tests::edge::post_json;
use serde_json::{Value, json};

async fn ralm(http: &reqwest::Client, edge: &str, body: &Value) -> (u16, Value) {
    post_json(http, edge, "/v1/ralm", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ralmspec_on_the_edge_answers_as_the_sequential_run() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(model) = small_model() else { return };
    // The cloud process lives as long as its binding: dropped (killed) at the end.
    let Answering {
        cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("ralm", "ralm-edge", &with_model(&model));
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;

    let settings = [
        json!({}),
        json!({"stride": 1, "prefetch": 1, "asynchronous": false}),
        json!({"stride": 3, "prefetch": 20, "asynchronous": true}),
        json!({"stride": "os3", "prefetch": 1, "asynchronous": false}),
    ];
    let steps = check_lossless(&http, &addr, question, &settings).await;
    assert!(steps >= 2);

    for (body, field) in [
        (json!({"question": question, "stride": 0}), "stride"),
        (json!({"question": question, "stride": "fast"}), "stride"),
        (json!({"question": question, "prefetch": 0}), "prefetch"),
        (
            json!({"question": question, "speculate": false, "stride": 2}),
            "speculate",
        ),
        (json!({"question": " "}), "question"),
        (json!({"question": question, "max_tokens": 0}), "max_tokens"),
    ] {
        let (status, reply) = ralm(&http, &addr, &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{body}: {reply}");
    }

    // The exact retriever's own error crosses the spec-retrieval seam typed: with the cloud
    // gone a run is answered as a fallback is (503, or 504 at the cloud deadline), not as
    // an internal failure of iterative RAG (500).
    drop(cloud);
    for speculate in [false, true] {
        let body = json!({"question": question, "max_tokens": 8, "speculate": speculate});
        let (status, reply) = ralm(&http, &addr, &body).await;
        assert!(
            matches!(
                (status, reply["error"]["code"].as_str()),
                (503, Some("unavailable")) | (504, Some("deadline_exceeded"))
            ),
            "{body}: {status} {reply}"
        );
    }
}

/// RaLMSpec's answers under each of `settings` equal the sequential run's, answer and
/// documents read; returns the sequential run's steps.
async fn check_lossless(
    http: &reqwest::Client,
    addr: &str,
    question: &str,
    settings: &[Value],
) -> usize {
    let (status, sequential) = ralm(
        http,
        addr,
        &json!({"question": question, "max_tokens": 40, "speculate": false}),
    )
    .await;
    assert_eq!(status, 200, "{sequential}");
    assert!(sequential.get("speculation").is_none(), "{sequential}");
    // The token a run stops on is not the answer's (llama.cpp's server lists it among the
    // tokens it wrote, and its text is the marker's).
    assert!(
        !sequential["answer"].as_str().unwrap().contains("<|"),
        "{sequential}"
    );
    let steps = sequential["documents"].as_array().unwrap().len();
    assert!(steps >= 2, "{sequential}");

    for settings in settings {
        let mut body = settings.clone();
        body["question"] = json!(question);
        body["max_tokens"] = json!(40);
        let (status, spec) = ralm(http, addr, &body).await;
        assert_eq!(status, 200, "{settings}: {spec}");
        assert_eq!(spec["answer"], sequential["answer"], "{settings}");
        assert_eq!(spec["documents"], sequential["documents"], "{settings}");
        let stats = &spec["speculation"];
        let n = |key: &str| stats[key].as_u64().unwrap();
        assert!(n("accepted") <= n("speculated"), "{settings}: {stats}");
        assert!(
            n("exact_calls") >= 1 && n("exact_calls") as usize <= steps,
            "{stats}"
        );
        assert_eq!(
            stats["strides"].as_array().unwrap().len() as u64,
            n("exact_calls") - 1,
            "one verification per call after the first (cold) retrieval: {stats}"
        );
        assert!(
            spec["timings"]["generation_ms"].as_f64().unwrap() > 0.0,
            "{spec}"
        );
    }

    steps
}

/// The same on an edge whose steps run on llama.cpp's server (`lm_engine_url`): token ids in
/// and out, so a rolled-back step is the same pure function as in process. (With the
/// server's prompt cache on for steps, this failed: the speculative run's tokens left the
/// sequential run's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ralmspec_on_an_engine_answers_as_the_sequential_run() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(OnEngine {
        engine: _engine,
        answering:
            Answering {
                cloud: _cloud,
                edge,
                bundle_dir,
                ..
            },
    }) = start_on_engine("ralm-engine", "ralm-engine-edge", &[])
    else {
        return;
    };
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    wait_engine_detected(&http, &addr).await;
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    // Two settings, not four: each step recomputes its prompt on the engine (see
    // hasten-engine's ralm module), so a run costs more here.
    let settings = [
        json!({}),
        json!({"stride": 3, "prefetch": 1, "asynchronous": false}),
    ];
    let steps = check_lossless(&http, &addr, &bundle.questions[0].question, &settings).await;
    assert!(steps >= 2);
}
