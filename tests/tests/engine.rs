//! Generation on an engine the team already runs: an edge answering through a real
//! llama.cpp server (its own HTTP server, from the xllamacpp wheel `make test` installs)
//! serving the small model (`make models`). Skipped, saying so, without either. No mock
//! engine: the one fault case that needs an engine that accepts and then says nothing is a
//! bare TCP listener, and says so.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_engine::Scoring;
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};
use hasten_loadtest::scrape::Scrape;
use hasten_rag::prompt::{VERIFY_INSTRUCTION, draft_text, standard_messages};
use hasten_rag::rewrite::{REWRITE_TOKENS, rewrite_messages, standalone_question};
use hasten_rag::verify::verify;
use hasten_rag::{ChatTurn, Document, Role};
use hasten_tests::answering::{
    Answering, ENGINE_MODEL, ONE_AT_A_TIME, OnEngine, engine_at, small_model, start_answering,
    start_llama_server, start_on_engine, wait_engine_detected, with_engine,
};
use hasten_tests::edge::{leave_after_first_event, post_json};
use hasten_tests::persistent_work_dir;
use serde_json::{Value, json};

/// A system message that makes the small model write until `max_tokens`: what a client
/// that leaves early would otherwise leave running.
const RAMBLE: &str = "Write a very long, detailed essay of at least 800 words, with many sections.";
const ESSAY: &str = "Write a long essay about every document.";

fn chat(question: &str, system: Option<&str>, max_tokens: u32) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": question}));
    json!({
        "model": "hasten-rag",
        "messages": messages,
        "max_tokens": max_tokens,
        "k": 3,
    })
}

fn content(reply: &Value) -> &str {
    reply["choices"][0]["message"]["content"].as_str().unwrap()
}

/// The engine's `llamacpp:<name>` counter or gauge.
async fn engine_metric(engine: &str, name: &str) -> f64 {
    Scrape::of(engine)
        .await
        .unwrap()
        .value(&format!("llamacpp:{name}"), &[])
}

/// `--config` of a file turning `chat_query_rewrite` on, in the work directory `work_name`,
/// with a per-call engine deadline of two minutes: Speculative RAG's five drafts queue for
/// the server's two slots, and on two cores shared with another job a queued draft waited
/// more than the default 30 s for its first token (a 503, seen twice). The deadline itself
/// is tested below with 1.5 s against a server that never answers.
fn edge_config(work_name: &str) -> Vec<String> {
    let path = persistent_work_dir(work_name).unwrap().join("edge.toml");
    std::fs::write(
        &path,
        "[answer]\nchat_query_rewrite = true\n\n[engine]\ntimeout_ms = 120000\n",
    )
    .unwrap();
    vec!["--config".into(), path.display().to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_answers_through_a_llama_cpp_server() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(OnEngine {
        engine,
        answering:
            Answering {
                cloud: _cloud,
                edge,
                bundle_dir,
                ..
            },
    }) = start_on_engine("engine", "engine-edge", &edge_config("engine"))
    else {
        return;
    };
    let engine_addr = engine.addr("http_addr");
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = bundle.questions[0].question.clone();

    // The edge's answer is the engine's own greedy answer to Hasten's prompt over the
    // documents the edge retrieved: same text, same prompt tokens.
    let (status, reply) = post_json(
        &http,
        &addr,
        "/v1/answer",
        &json!({"question": question, "k": 3, "max_tokens": 32}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let documents: Vec<Document> = reply["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| Document {
            id: d["id"].as_u64(),
            title: d["title"].as_str().unwrap().to_string(),
            text: d["text"].as_str().unwrap().to_string(),
            vector: None,
        })
        .collect();
    assert_eq!(documents.len(), 3);
    let messages: Vec<Value> =
        standard_messages(&question, &documents.iter().collect::<Vec<_>>(), &[])
            .iter()
            .map(|m| json!({"role": m.role.name(), "content": m.content}))
            .collect();
    let (status, direct) = post_json(
        &http,
        &engine_addr,
        "/v1/chat/completions",
        &json!({"model": ENGINE_MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{direct}");
    eprintln!(
        "edge: {:?}; engine: {:?}",
        reply["answer"],
        content(&direct)
    );
    assert_eq!(reply["answer"].as_str().unwrap(), content(&direct).trim());
    assert_eq!(reply["prompt_tokens"], direct["usage"]["prompt_tokens"]);
    assert_eq!(
        reply["generated_tokens"],
        direct["usage"]["completion_tokens"]
    );
    let (_, bare) = post_json(
        &http,
        &engine_addr,
        "/v1/chat/completions",
        &json!({"model": ENGINE_MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 1}),
    )
    .await;
    assert!(
        reply["prompt_tokens"].as_u64().unwrap()
            > bare["usage"]["prompt_tokens"].as_u64().unwrap() + 3 * 16,
        "the documents are in the engine's prompt"
    );

    // Streamed through the OpenAI surface, with the usage chunk.
    let mut streamed = chat(&question, None, 32);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let deltas = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert!(deltas >= 2, "the answer arrives in pieces: {text}");
    let usage = chunks.iter().find(|c| c["usage"].is_object()).unwrap();
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // `stop` ends the answer where the stop string starts.
    let (status, long) = post_json(
        &http,
        &addr,
        "/v1/chat/completions",
        &chat(ESSAY, Some(RAMBLE), 64),
    )
    .await;
    assert_eq!(status, 200, "{long}");
    let long_text = content(&long).to_string();
    let words: Vec<&str> = long_text.split_whitespace().collect();
    assert!(words.len() > 8, "a long answer to cut: {long_text:?}");
    // A later word that follows a space (another may follow a line break).
    let stop = words[6..]
        .iter()
        .map(|word| format!(" {word}"))
        .find(|stop| long_text.find(stop.as_str()).is_some_and(|at| at > 0))
        .unwrap_or_else(|| panic!("no word after a space to stop at: {long_text:?}"));
    let at = long_text.find(&stop).unwrap();
    let mut stopped = chat(ESSAY, Some(RAMBLE), 64);
    stopped["stop"] = json!([stop]);
    let (status, cut) = post_json(&http, &addr, "/v1/chat/completions", &stopped).await;
    assert_eq!(status, 200, "{cut}");
    assert_eq!(content(&cut), long_text[..at].trim());
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    assert_eq!(long["choices"][0]["finish_reason"], "length");

    // With `chat_query_rewrite`, a follow-up is retrieved as the engine's own greedy
    // rewrite of it (Hasten's rewrite prompt, sent here directly afterwards, without the
    // server's prompt cache: a prefill continued from it is not bit-identical to a fresh
    // one, and the edge's request was the first of this prompt).
    let (status, reply) = post_json(
        &http,
        &addr,
        "/v1/chat/completions",
        &json!({"model": "hasten-rag", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Who won Super Bowl 50?"},
            {"role": "assistant", "content": "The Denver Broncos."},
            {"role": "user", "content": "Who did they beat?"},
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let conversation = [
        ChatTurn::new(Role::User, "Who won Super Bowl 50?"),
        ChatTurn::new(Role::Assistant, "The Denver Broncos."),
    ];
    let rewrite: Vec<Value> = rewrite_messages(&conversation, "Who did they beat?")
        .iter()
        .map(|m| json!({"role": m.role.name(), "content": m.content}))
        .collect();
    let (_, direct) = post_json(
        &http,
        &engine_addr,
        "/v1/chat/completions",
        &json!({"model": ENGINE_MODEL, "messages": rewrite, "max_tokens": REWRITE_TOKENS,
                "temperature": 0, "cache_prompt": false}),
    )
    .await;
    let expected = standalone_question(content(&direct)).unwrap();
    eprintln!("rewritten by the engine: {expected:?}");
    assert_eq!(reply["hasten"]["query"], expected.as_str(), "{reply}");

    // A seeded sampled answer is reproducible.
    let mut sampled = chat(ESSAY, Some(RAMBLE), 24);
    sampled["temperature"] = json!(1.0);
    sampled["seed"] = json!(7);
    let (_, first) = post_json(&http, &addr, "/v1/chat/completions", &sampled).await;
    let (_, second) = post_json(&http, &addr, "/v1/chat/completions", &sampled).await;
    assert_eq!(content(&first), content(&second));

    // Speculative RAG on the engine: drafts written there, judged by its log-probabilities.
    wait_engine_detected(&http, &addr).await;
    let status = hasten_tests::edge::status(&http, &addr).await;
    let generation = &status["generation"];
    assert_eq!(
        generation["modes"],
        json!(["standard", "speculative"]),
        "{status}"
    );
    assert!(
        generation["device"]
            .as_str()
            .unwrap()
            .contains("llama.cpp forced-token log-probabilities"),
        "the status says how drafts are scored: {generation}"
    );
    let (status, speculative) = post_json(
        &http,
        &addr,
        "/v1/answer",
        &json!({"question": question, "k": 4, "mode": "speculative", "max_tokens": 32}),
    )
    .await;
    assert_eq!(status, 200, "{speculative}");
    let drafts = speculative["drafts"].as_array().unwrap();
    assert_eq!(drafts.len(), 5, "m = 5 drafts: {speculative}");
    let answers: Vec<&str> = drafts
        .iter()
        .map(|d| d["answer"].as_str().unwrap())
        .collect();
    eprintln!("speculative: {:?} from {answers:?}", speculative["answer"]);
    assert!(answers.contains(&speculative["answer"].as_str().unwrap()));
    assert!(
        drafts.iter().all(|d| d["score"].as_f64().unwrap() < 0.0),
        "every draft was scored: {speculative}"
    );
    // rho_draft comes from the drafter engine's streamed log-probabilities: an engine asked
    // for none (llama.cpp sends none at `top_logprobs: 0`) would leave it 0 and the drafted
    // tokens uncounted.
    assert!(
        drafts
            .iter()
            .all(|d| d["draft_logprob"].as_f64().unwrap() < 0.0),
        "every draft carries the drafter's log-probability: {speculative}"
    );
    assert!(
        speculative["drafting"]["generated_tokens"]
            .as_u64()
            .unwrap()
            >= 5,
        "the drafted tokens are counted: {speculative}"
    );
    assert!(
        speculative["prompt_tokens"].as_u64().unwrap() > 0,
        "the verifier read the drafts"
    );

    // A client that leaves closes the engine's request: the engine decodes a few tokens
    // more, not the 400 asked for. The same request run to the end is the control.
    let mut leaving = chat(ESSAY, Some(RAMBLE), 400);
    leaving["stream"] = json!(true);
    let decoded = engine_metric(&engine_addr, "n_decode_total").await;
    leave_after_first_event(&http, &addr, &leaving).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    while engine_metric(&engine_addr, "requests_processing").await > 0.0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the engine never stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = engine_metric(&engine_addr, "n_decode_total").await - decoded;
    let decoded = engine_metric(&engine_addr, "n_decode_total").await;
    leaving["stream"] = json!(false);
    let (status, whole) = post_json(&http, &addr, "/v1/chat/completions", &leaving).await;
    assert_eq!(status, 200, "{whole}");
    let ran = engine_metric(&engine_addr, "n_decode_total").await - decoded;
    eprintln!("engine decode steps: {left} for the stream that left, {ran} for the whole answer");
    assert!(
        ran >= 300.0,
        "the control must run long to show anything: {ran}"
    );
    assert!(
        left < ran / 2.0,
        "the engine kept decoding for a client that left: {left} of {ran}"
    );
    let cancelled = Scrape::of(&addr)
        .await
        .unwrap()
        .value("hasten_answer_cancelled_total", &[]);
    assert!(cancelled >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_is_down_or_silent_is_a_503_within_the_deadline() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(_) = small_model() else { return };
    // Down: nothing listens on the port.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    // Silent: a bare TCP listener (not an engine, and not a mock of one) that accepts and
    // never answers, as a hung engine would.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut generation = with_engine(&down, ENGINE_MODEL);
    generation.extend(["--set".into(), "engine.timeout_ms=1500".into()]);
    let Answering {
        cloud,
        edge,
        bundle_dir,
        work,
    } = start_answering("engine-faults", "down-edge", &generation);
    let mut hung = with_engine(&silent_addr, ENGINE_MODEL);
    hung.extend(["--set".into(), "engine.timeout_ms=1500".into()]);
    let silent_edge =
        hasten_tests::answering::start_edge(&work, "silent-edge", &bundle_dir, &cloud, &hung);
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;
    for (edge, name) in [(&edge, "down"), (&silent_edge, "silent")] {
        let started = Instant::now();
        let (status, reply) = post_json(
            &http,
            &edge.addr("http_addr"),
            "/v1/chat/completions",
            &chat(question, None, 16),
        )
        .await;
        let took = started.elapsed();
        eprintln!("{name} engine: {status} after {took:?}: {reply}");
        assert_eq!(status, 503, "{name}: {reply}");
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
        // Streamed too: a status before the stream starts (an SDK retries a 503), not a 200
        // whose stream carries the error.
        let mut streamed = chat(question, None, 16);
        streamed["stream"] = json!(true);
        let response = http
            .post(format!(
                "http://{}/v1/chat/completions",
                edge.addr("http_addr")
            ))
            .json(&streamed)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_eq!(status, 503, "{name}, streamed: {body}");
    }
    let log = std::fs::read_to_string(&silent_edge.log).unwrap();
    assert!(
        log.contains(&silent_addr),
        "the engine's address is in the log"
    );
}

/// Speculative RAG's verification scores read from the engine equal the in-process
/// runtime's one-pass scores of the same GGUF within a stated tolerance: llama.cpp's kernels
/// quantise activations (Q8_1 against Q4_1 weights) where the runtime, with the weights as
/// stored, does the same through candle's, so the sums of 20-40 token log-probabilities
/// differ by rounding only. Scoring the draft one position off (its context without the
/// opened turn's newline) must fall outside the tolerance, or the comparison shows nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_verification_scores_equal_the_runtime_one_pass_scores() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(model) = small_model() else { return };
    let work = persistent_work_dir("engine-scores").unwrap();
    let Some(server) = start_llama_server(&work, "llama-server", &model) else {
        return;
    };
    let engine_addr = server.addr("http_addr");
    let engine = engine_at(&engine_addr, Duration::from_secs(60));
    assert_eq!(
        engine.detect_scoring().await.unwrap(),
        Scoring::LlamaCppForcedTokens
    );

    let question = "Who was the first woman to win a Nobel Prize?";
    let drafts = [
        (
            "The documents say Marie Curie won the Nobel Prize in Physics in 1903.",
            "Marie Curie",
        ),
        (
            "The documents mention the Nobel Prize in Literature of 1909.",
            "Selma Lagerlöf",
        ),
        ("Paris is the capital of France.", "Berlin"),
    ];
    let remote = engine.verify(question, &drafts).await.unwrap();
    let local = tokio::task::spawn_blocking(move || {
        let device = DeviceKind::Cpu.open().unwrap();
        let lm = LanguageModel::load_with(&model, &device, WeightFormat::AsStored).unwrap();
        verify(&lm, question, &drafts).unwrap()
    })
    .await
    .unwrap();
    eprintln!("engine {remote:?}\nruntime {local:?}");
    assert_eq!(remote.tokens, local.tokens, "the same tokens read");
    // A draft's sum (~30 tokens): 0.05 nats a token, or 3% of the sum; the reply's one
    // token: 0.25 nats. (Seen: 0.28-0.82 and 0.02-0.16.)
    let close = |a: f32, b: f32| (a - b).abs() <= 1.5_f32.max(0.03 * b.abs());
    for (r, l) in remote.verdicts.iter().zip(&local.verdicts) {
        assert!(close(r.consistency, l.consistency), "{r:?} against {l:?}");
        assert!(
            (r.reflection - l.reflection).abs() <= 0.25,
            "{r:?} against {l:?}"
        );
    }

    // The same draft scored one position off: outside the tolerance.
    let http = reqwest::Client::new();
    let post = |path: &'static str, body: Value| {
        let (http, engine_addr) = (&http, &engine_addr);
        async move { post_json(http, engine_addr, path, &body).await.1 }
    };
    let rendered = post(
        "/apply-template",
        json!({"messages": [
            {"role": "system", "content": VERIFY_INSTRUCTION},
            {"role": "user", "content": format!("Question: {question}")},
        ]}),
    )
    .await;
    let ids = |reply: Value| -> Vec<u64> {
        reply["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let mut context = ids(post(
        "/tokenize",
        json!({"content": rendered["prompt"], "add_special": false, "parse_special": true}),
    )
    .await);
    context.pop();
    let draft = ids(post(
        "/tokenize",
        json!({"content": draft_text(drafts[0].0, drafts[0].1), "add_special": false}),
    )
    .await);
    let grammar: Vec<String> = draft.iter().map(|id| format!("<[{id}]>")).collect();
    let shifted = post(
        "/completion",
        json!({"prompt": context, "n_predict": draft.len(), "n_probs": 1, "temperature": 0,
               "grammar": format!("root ::= {}", grammar.join(" "))}),
    )
    .await;
    let off: f32 = shifted["completion_probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["logprob"].as_f64().unwrap() as f32)
        .sum();
    eprintln!(
        "one position off: {off} against {}",
        local.verdicts[0].consistency
    );
    assert!(!close(off, local.verdicts[0].consistency));
}
