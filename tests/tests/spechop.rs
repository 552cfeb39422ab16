//! `/v1/spechop` end to end: `cloud-index` and `edge-node` processes on loopback, the edge's
//! agent on SmolLM2-135M-Instruct (skipped, saying so, when HASTEN_LM_DIR is unset), every
//! hop's exact retrieval from the cloud over QUIC, the edge's HaS draft as the guess. Under
//! the strict verifier SpecHop's trajectory and answer must be the sequential agent's, with a
//! cold cache (guesses from the fuzzy channel alone) and with a cache the sequential run
//! filled; bad settings are refused naming the field. The guesses are HaS's approximate
//! draft: on the synthetic corpus (120 passages, CI has no ../shared/data) the cache channel
//! probes one of its three lists and the fuzzy channel holds 64x1-bit PQ codes, so a guess may
//! miss even for a query whose exact answer is cached; the test asks for the trajectory, not
//! the hit rate.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hasten_core::bundle::CorpusBundle;
use hasten_tests::answering::{
    Answering, ONE_AT_A_TIME, OnEngine, small_model, start_answering, start_on_engine,
    wait_engine_detected, with_model,
};
use hasten_tests::edge::post_json;
use serde_json::{Value, json};

async fn spechop(http: &reqwest::Client, edge: &str, body: Value) -> Value {
    let (status, reply) = post_json(http, edge, "/v1/spechop", &body).await;
    assert_eq!(status, 200, "{body}: {reply}");
    reply
}

fn stat(reply: &Value, key: &str) -> u64 {
    reply["speculation"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no speculation.{key}: {reply}"))
}

fn assert_same_run(spec: &Value, sequential: &Value, what: &str) {
    assert_eq!(spec["hops"], sequential["hops"], "{what}");
    assert_eq!(spec["answer"], sequential["answer"], "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spechop_on_the_edge_follows_the_sequential_agent() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(model) = small_model() else { return };
    // The cloud process lives as long as its binding: kept to the end of the test.
    let Answering {
        cloud: _cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("spechop", "spechop-edge", &with_model(&model));
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let warm = &bundle.questions[0].question;
    let cold = &bundle
        .questions
        .iter()
        .find(|q| q.question != *warm)
        .expect("a second question")
        .question;

    // Cold: SpecHop first, guessing from the fuzzy channel; the sequential agent after it.
    let spec = spechop(&http, &addr, json!({"question": cold, "threads": 2})).await;
    let sequential = spechop(&http, &addr, json!({"question": cold, "speculate": false})).await;
    assert_same_run(&spec, &sequential, "cold cache, 2 threads");
    assert!(
        stat(&spec, "speculated") >= 2,
        "the fuzzy channel (on by default) guessed every hop: {spec}"
    );
    assert!(stat(&spec, "max_live") <= 2, "{spec}");

    // Warm: the sequential agent's hops enter the hot cache; SpecHop then guesses each one
    // right from it and commits it.
    let sequential = spechop(&http, &addr, json!({"question": warm, "speculate": false})).await;
    assert!(sequential.get("speculation").is_none(), "{sequential}");
    let hops = sequential["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 2, "the default two hops: {sequential}");
    assert!(
        hops.iter()
            .all(|h| h["documents"].as_array().unwrap().len() == 3),
        "three documents a hop by default: {sequential}"
    );
    for threads in [1, 3] {
        let what = format!("warm cache, {threads} threads");
        let spec = spechop(&http, &addr, json!({"question": warm, "threads": threads})).await;
        assert_same_run(&spec, &sequential, &what);
        assert!(stat(&spec, "speculated") >= 2, "{what}: {spec}");
        assert!(stat(&spec, "max_live") <= threads, "{what}: {spec}");
    }
    let jaccard = spechop(
        &http,
        &addr,
        json!({"question": warm, "verifier": "jaccard", "jaccard_threshold": 0.4}),
    )
    .await;
    assert_eq!(jaccard["hops"].as_array().unwrap().len(), 2, "{jaccard}");

    for (body, field) in [
        (json!({"question": warm, "threads": 0}), "threads"),
        (json!({"question": warm, "threads": 9}), "threads"),
        (json!({"question": warm, "verifier": "loose"}), "verifier"),
        (
            json!({"question": warm, "jaccard_threshold": 0.5}),
            "jaccard_threshold",
        ),
        (
            json!({"question": warm, "verifier": "jaccard", "jaccard_threshold": 1.5}),
            "jaccard_threshold",
        ),
        (
            json!({"question": warm, "speculate": false, "threads": 2}),
            "speculate",
        ),
        (json!({"question": warm, "hops": 0}), "hops"),
        (json!({"question": warm, "documents": 11}), "documents"),
        (json!({"question": ""}), "question"),
    ] {
        let (status, reply) = post_json(&http, &addr, "/v1/spechop", &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{body}: {reply}");
    }
}

/// The same agent on llama.cpp's server (`lm_engine_url`): each line the engine's greedy
/// continuation of the prompt's token ids, so SpecHop with the strict verifier still
/// follows the sequential agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spechop_on_an_engine_follows_the_sequential_agent() {
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
    }) = start_on_engine("spechop-engine", "spechop-engine-edge", &[])
    else {
        return;
    };
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    wait_engine_detected(&http, &addr).await;
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[1].question;
    let spec = spechop(&http, &addr, json!({"question": question, "threads": 2})).await;
    let sequential = spechop(
        &http,
        &addr,
        json!({"question": question, "speculate": false}),
    )
    .await;
    assert_same_run(&spec, &sequential, "on the engine, 2 threads");
    assert_eq!(
        sequential["hops"].as_array().unwrap().len(),
        2,
        "{sequential}"
    );
    assert!(stat(&spec, "speculated") >= 2, "{spec}");
    assert!(
        !sequential["answer"].as_str().unwrap().is_empty(),
        "{sequential}"
    );
}
