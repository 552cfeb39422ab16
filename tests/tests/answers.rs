//! `/v1/answer` end to end with real processes and the real small model: `cloud-index`
//! and `edge-node` on loopback, the edge loading SmolLM2-135M-Instruct (installed by
//! `make models`; the test is skipped, saying so, when HASTEN_LM_DIR is unset).

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, edge_serve_args};
use hasten_tests::answering::{
    Answering, START_TIMEOUT, client_python, small_model, start_answering, with_model,
};
use hasten_tests::edge::post_json;
use hasten_tests::{
    build_small_bundle, dev_cert, model_dir, persistent_work_dir, start_cloud_index,
};
use serde_json::{Value, json};

async fn post(http: &reqwest::Client, edge: &str, body: &Value) -> (u16, Value) {
    post_json(http, edge, "/v1/answer", body).await
}

/// The events of a server-sent-events body, as (event name, JSON data).
fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_string());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push_str(value.trim_start());
                }
            }
            Some((name?, serde_json::from_str(&data).ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_answers_from_what_it_retrieved_in_both_modes() {
    let Some(model) = small_model() else { return };
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("answers", "answering-edge", &with_model(&model));
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;

    // Standard: the answer comes with the documents it was written from and its timings.
    let (status, reply) = post(
        &http,
        &addr,
        &json!({"question": question, "k": 5, "max_tokens": 24}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert!(
        !reply["answer"].as_str().unwrap().trim().is_empty(),
        "{reply}"
    );
    assert_eq!(reply["mode"], "standard");
    assert_eq!(reply["documents"].as_array().unwrap().len(), 5);
    let generated = reply["generated_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&generated), "{reply}");
    let t = &reply["timings"];
    let ms = |key: &str| t[key].as_f64().unwrap();
    assert!(
        ms("retrieve_ms") > 0.0 && ms("prefill_ms") > 0.0 && ms("decode_ms") >= 0.0,
        "{t}"
    );
    assert!(ms("first_token_ms") <= ms("total_ms") + 1e-6, "{t}");
    assert!(
        ms("total_ms") >= ms("retrieve_ms") + ms("prefill_ms"),
        "{t}"
    );

    // Speculative: m = 5 drafts, each from one document per cluster (k = 2), and the answer
    // is the best-scored draft's.
    let (status, reply) = post(
        &http,
        &addr,
        &json!({"question": question, "k": 10, "mode": "speculative", "max_tokens": 32}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["mode"], "speculative");
    let drafts = reply["drafts"].as_array().unwrap();
    assert_eq!(drafts.len(), 5, "{reply}");
    for draft in drafts {
        let docs = draft["documents"].as_array().unwrap();
        assert_eq!(docs.len(), 2, "{draft}");
        assert!(docs.iter().all(|d| d.as_u64().unwrap() < 10));
        assert!(draft["score"].as_f64().unwrap().is_finite(), "{draft}");
    }
    let best = drafts
        .iter()
        .max_by(|a, b| {
            a["score"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["score"].as_f64().unwrap())
        })
        .unwrap();
    // The best draft's answer, cut to max_tokens when it is longer.
    let (answer, best_answer) = (
        reply["answer"].as_str().unwrap(),
        best["answer"].as_str().unwrap(),
    );
    match reply["finish_reason"].as_str().unwrap() {
        "stop" => assert_eq!(answer, best_answer, "{reply}"),
        _ => assert!(best_answer.starts_with(answer), "{reply}"),
    }
    assert_eq!(reply["used"], best["documents"]);

    // Streamed: documents first, then the text in pieces that add up to the final answer.
    let body = http
        .post(format!("http://{addr}/v1/answer"))
        .json(&json!({"question": question, "k": 5, "max_tokens": 24, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(body.status().as_u16(), 200);
    assert!(
        body.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = sse_events(&body.text().await.unwrap());
    assert_eq!(
        events.first().map(|e| e.0.as_str()),
        Some("documents"),
        "{events:?}"
    );
    let (last_name, last) = events.last().unwrap();
    assert_eq!(last_name, "answer", "{events:?}");
    let streamed: String = events
        .iter()
        .filter(|(name, _)| name == "delta")
        .map(|(_, data)| data["text"].as_str().unwrap().to_string())
        .collect();
    assert!(
        events.iter().filter(|(n, _)| n == "delta").count() >= 2,
        "{events:?}"
    );
    assert_eq!(streamed, last["answer"].as_str().unwrap());

    // Bad input names its field.
    for (body, field) in [
        (json!({"question": "  "}), "question"),
        (json!({"k": 3}), "question"),
        (json!({"question": "q", "max_tokens": 0}), "max_tokens"),
        (json!({"question": "q", "max_tokens": 100000}), "max_tokens"),
        (json!({"question": "q", "mode": "fastest"}), "mode"),
        (json!({"question": "q", "k": 100000}), "k"),
        (json!({"question": "q", "temperature": 3}), "temperature"),
    ] {
        let (status, reply) = post(&http, &addr, &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{body}: {reply}");
    }

    // Metrics count the answers by mode.
    let metrics = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("hasten_edge_answers_total{mode=\"standard\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("hasten_edge_answers_total{mode=\"speculative\"} 1"));
    assert!(metrics.contains("hasten_edge_answer_first_token_seconds_count{mode=\"standard\"} 2"));
    assert!(metrics.contains("hasten_edge_answer_errors_total{kind=\"invalid_argument\"} 7"));
    drop(edge);
    cloud.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_without_a_model_says_so_and_a_bad_model_file_stops_the_start() {
    let Some(_) = small_model() else { return };
    let work = persistent_work_dir("answers-no-model").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let mut cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    let args = edge_serve_args(&bundle_dir, &model_dir(), &cloud.addr("quic_addr"), &cert);
    let edge = ManagedProcess::start(
        "modelless-edge",
        &binary("edge-node").unwrap(),
        args.clone(),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let http = reqwest::Client::new();
    let (status, reply) = post(&http, &edge.addr("http_addr"), &json!({"question": "Who?"})).await;
    assert_eq!(status, 503, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lm_model"),
        "{reply}"
    );
    drop(edge);

    let broken = work.join("not-a-model.gguf");
    std::fs::write(&broken, b"GGUF but not really").unwrap();
    let output = std::process::Command::new(binary("edge-node").unwrap())
        .args(args)
        .args(["--lm-model", &broken.display().to_string()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not-a-model.gguf"), "{stderr}");
    cloud.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_talks_to_the_edge_unchanged() {
    let Some(model) = small_model() else { return };
    let Some(python) = client_python("HASTEN_OPENAI_PYTHON", "the OpenAI SDK test") else {
        return;
    };
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("answers-openai", "answering-edge", &with_model(&model));
    let question = CorpusBundle::load(&bundle_dir).unwrap().questions[0]
        .question
        .clone();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/openai_chat.py");
    let addr = edge.addr("http_addr");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .arg(addr)
            .arg(question)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK script failed: {stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        seen["models"],
        json!(["all-MiniLM-L6-v2", "hasten-rag", "hasten-rag-speculative"]),
        "{seen}"
    );
    let content = seen["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{seen}");
    assert!(
        ["stop", "length"].contains(&seen["finish_reason"].as_str().unwrap()),
        "{seen}"
    );
    let usage = &seen["usage"];
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(seen["documents"], 10, "{seen}");
    // Greedy decoding over the same (now cached) documents: the stream spells the same answer.
    assert!(seen["stream_chunks"].as_u64().unwrap() >= 2, "{seen}");
    assert_eq!(seen["streamed"].as_str().unwrap(), content, "{seen}");
    assert!(
        !seen["speculative"].as_str().unwrap().trim().is_empty(),
        "{seen}"
    );
    assert_eq!(seen["unknown_model"]["status"], 404, "{seen}");
    assert_eq!(seen["unknown_model"]["code"], "model_not_found", "{seen}");
    assert_eq!(seen["no_user_message"]["status"], 400, "{seen}");
    assert_eq!(seen["no_user_message"]["param"], "messages", "{seen}");
    drop(edge);
    cloud.stop();
}
