//! Speculative RAG's verifier on vLLM's routes: drafts scored by `prompt_logprobs` or by
//! `echo` + `logprobs` on token ids from vLLM's `/tokenize`. No vLLM can run on these
//! machines (its wheels need CUDA and torch), so the routes are served by a stand-in in
//! vLLM's request and reply shapes (`tests/clients/vllm_shim.py`) whose every token id and
//! log-probability comes from a real llama.cpp server on the small model; the scores read
//! through it must equal those read from that server's own forced-token path, and an edge
//! must answer in speculative mode with it as its verifier, and run RaLMSpec and SpecHop on
//! it as losslessly as their sequential runs. Skipped, saying so, without the
//! model or the server.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_engine::Scoring;
use hasten_tests::answering::{
    Answering, ENGINE_MODEL, ONE_AT_A_TIME, engine_at, small_model, start_answering,
    start_llama_server, start_vllm_shim, wait_engine_detected, with_engine,
};
use hasten_tests::edge::post_json;
use hasten_tests::persistent_work_dir;
use serde_json::{Value, json};

/// Each engine call's deadline: the shim forces a prompt token by token.
const CALL_DEADLINE: Duration = Duration::from_secs(120);

async fn post(http: &reqwest::Client, addr: &str, path: &str, body: Value) -> Value {
    let (status, reply) = post_json(http, addr, path, &body).await;
    assert_eq!(status, 200, "{path}: {reply}");
    reply
}

fn ids(reply: &Value) -> Vec<u64> {
    reply["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_scored_on_vllm_s_routes_equal_llama_cpp_s_forced_scores() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(model) = small_model() else { return };
    let work = persistent_work_dir("engine-vllm").unwrap();
    let Some(server) = start_llama_server(&work, "llama-server", &model) else {
        return;
    };
    let llama = server.addr("http_addr");
    let shim = start_vllm_shim(&work, "vllm-shim", &llama, &[]).unwrap();
    let echo_only = start_vllm_shim(
        &work,
        "vllm-shim-echo",
        &llama,
        &["--without-prompt-logprobs"],
    )
    .unwrap();
    let (direct, vllm, echo) = (
        engine_at(&llama, CALL_DEADLINE),
        engine_at(&shim.addr("http_addr"), CALL_DEADLINE),
        engine_at(&echo_only.addr("http_addr"), CALL_DEADLINE),
    );
    assert_eq!(
        direct.detect_scoring().await.unwrap(),
        Scoring::LlamaCppForcedTokens
    );
    assert_eq!(
        vllm.detect_scoring().await.unwrap(),
        Scoring::PromptLogprobs
    );
    assert_eq!(echo.detect_scoring().await.unwrap(), Scoring::EchoLogprobs);

    let question = "Who was the first woman to win a Nobel Prize?";
    let drafts = [
        (
            "The documents say Marie Curie won the Nobel Prize in Physics in 1903.",
            "Marie Curie",
        ),
        ("Paris is the capital of France.", "Berlin"),
    ];
    let reference = direct.verify(question, &drafts).await.unwrap();
    // The same tokens scored by the same server, the question prompt prefilled from its
    // prompt cache or forced token by token, so sums may differ by rounding only (seen:
    // equal to the last digit).
    let close = |a: f32, b: f32| (a - b).abs() <= 0.2_f32.max(0.01 * b.abs());
    for (way, engine) in [("prompt_logprobs", &vllm), ("echo", &echo)] {
        let scored = engine.verify(question, &drafts).await.unwrap();
        eprintln!("{way}: {scored:?}\nllama.cpp: {reference:?}");
        assert_eq!(
            scored.tokens, reference.tokens,
            "{way}: the same tokens read"
        );
        for (s, r) in scored.verdicts.iter().zip(&reference.verdicts) {
            assert!(
                close(s.consistency, r.consistency),
                "{way}: {s:?} against {r:?}"
            );
            assert!(
                close(s.reflection, r.reflection),
                "{way}: {s:?} against {r:?}"
            );
        }
    }
    // The first draft's consistency read one position late (position i's entry taken as
    // token i - 1's, the off-by-one prompt_logprobs invites: the draft's first token left
    // out, the turn's end counted), from the shim's own reply to the prompt the scorer
    // sends: outside the tolerance. (One position early barely moves the sum: the newline
    // before the draft is nearly certain, as is the draft's last token.)
    let http = reqwest::Client::new();
    let shim_addr = shim.addr("http_addr");
    let context = ids(&post(
        &http,
        &shim_addr,
        "/tokenize",
        json!({"model": ENGINE_MODEL, "add_generation_prompt": true, "add_special_tokens": false,
               "messages": [
                   {"role": "system", "content": hasten_rag::prompt::VERIFY_INSTRUCTION},
                   {"role": "user", "content": format!("Question: {question}")}]}),
    )
    .await);
    let draft = ids(&post(
        &http,
        &shim_addr,
        "/tokenize",
        json!({"model": ENGINE_MODEL, "add_special_tokens": false,
               "prompt": hasten_rag::prompt::draft_text(drafts[0].0, drafts[0].1)}),
    )
    .await);
    let end_of_turn = ids(&post(
        &http,
        &shim_addr,
        "/tokenize",
        json!({"model": ENGINE_MODEL, "add_special_tokens": false, "prompt": "<|im_end|>"}),
    )
    .await);
    let prompt: Vec<u64> = context
        .iter()
        .chain(&draft)
        .chain(&end_of_turn)
        .copied()
        .collect();
    let reply = post(
        &http,
        &shim_addr,
        "/v1/completions",
        json!({"model": ENGINE_MODEL, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0}),
    )
    .await;
    let scores: Vec<f32> = prompt
        .iter()
        .zip(reply["choices"][0]["prompt_logprobs"].as_array().unwrap())
        .skip(1)
        .map(|(id, entry)| entry[id.to_string()]["logprob"].as_f64().unwrap() as f32)
        .collect();
    let start = context.len() - 1;
    let right: f32 = scores[start..start + draft.len()].iter().sum();
    let late: f32 = scores[start + 1..start + 1 + draft.len()].iter().sum();
    eprintln!("right positions {right}, one late {late}");
    assert!(close(right, reference.verdicts[0].consistency));
    assert!(!close(late, reference.verdicts[0].consistency));

    // An edge whose verifier is the vLLM-shaped engine (drafts written on llama.cpp's own
    // chat completions) says so and answers in speculative mode.
    // Two minutes an engine call, as the llama.cpp edge test gives: five drafts queue for
    // the server's two slots.
    let config = work.join("edge.toml");
    std::fs::write(&config, "[engine]\ntimeout_ms = 120000\n").unwrap();
    let mut generation = with_engine(&shim_addr, ENGINE_MODEL);
    generation.extend([
        "--lm-engine-drafter-url".to_string(),
        format!("http://{llama}/v1"),
        "--config".to_string(),
        config.display().to_string(),
    ]);
    let Answering {
        cloud: _cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("engine-vllm", "engine-vllm-edge", &generation);
    let addr = edge.addr("http_addr");
    wait_engine_detected(&http, &addr).await;
    let status = hasten_tests::edge::status(&http, &addr).await;
    assert!(
        status["generation"]["device"]
            .as_str()
            .unwrap()
            .contains("vLLM prompt_logprobs"),
        "the status says how drafts are scored: {status}"
    );
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = bundle.questions[0].question.clone();
    let speculative = post(
        &http,
        &addr,
        "/v1/answer",
        json!({"question": question, "k": 4, "mode": "speculative", "max_tokens": 32}),
    )
    .await;
    let drafts = speculative["drafts"].as_array().unwrap();
    assert_eq!(drafts.len(), 5, "m = 5 drafts: {speculative}");
    assert!(
        drafts.iter().all(|d| d["score"].as_f64().unwrap() < 0.0),
        "every draft was scored: {speculative}"
    );
    assert!(
        drafts.iter().any(|d| d["answer"] == speculative["answer"]),
        "the answer is a draft's: {speculative}"
    );

    // RaLMSpec's and SpecHop's steps on vLLM's token routes (greedy continuations of token
    // ids): speculation stays lossless, and no stop token reaches an answer.
    let ralm = |body: Value| {
        let (http, addr) = (&http, &addr);
        async move { post(http, addr, "/v1/ralm", body).await }
    };
    let sequential =
        ralm(json!({"question": question, "max_tokens": 40, "speculate": false})).await;
    let speculative = ralm(json!({"question": question, "max_tokens": 40, "stride": 3})).await;
    eprintln!("ralm: {}", sequential["answer"]);
    assert_eq!(speculative["answer"], sequential["answer"], "{speculative}");
    assert_eq!(speculative["documents"], sequential["documents"]);
    assert!(speculative["speculation"]["exact_calls"].as_u64().unwrap() >= 1);
    assert!(
        !sequential["answer"].as_str().unwrap().contains("<|"),
        "{sequential}"
    );
    let hop_question = bundle.questions[1].question.clone();
    let hops = |body: Value| {
        let (http, addr) = (&http, &addr);
        async move { post(http, addr, "/v1/spechop", body).await }
    };
    let sequential = hops(json!({"question": hop_question, "speculate": false})).await;
    let speculative = hops(json!({"question": hop_question, "threads": 2})).await;
    eprintln!("spechop: {}", sequential["answer"]);
    assert_eq!(speculative["hops"], sequential["hops"]);
    assert_eq!(speculative["answer"], sequential["answer"]);
    assert!(!sequential["answer"].as_str().unwrap().is_empty());
}
