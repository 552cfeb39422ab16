//! The answer surface as clients meet it, with real processes and the real small model
//! (`make models`; skipped, saying so, when HASTEN_LM_DIR is unset): a client that leaves
//! frees the model for the next, a full queue is a 429 with `Retry-After` before any reply
//! starts, and `finish_reason` and `usage` count the answer itself in both modes.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_loadtest::scrape::Scrape;
use hasten_tests::answering::{Answering, ONE_AT_A_TIME, small_model, start_answering, with_model};
use hasten_tests::edge::{leave_after_first_event, post_json};
use serde_json::{Value, json};

/// A streamed chat request's reply: its status, `Retry-After`, and the body's `data:` lines.
struct Streamed {
    status: u16,
    retry_after: Option<String>,
    data: Vec<String>,
}

/// A chat request, as `token`'s tenant when given: its status, `Retry-After` and body text.
async fn post_chat(
    http: &reqwest::Client,
    edge: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, Option<String>, String) {
    let mut request = http.post(format!("http://{edge}/v1/chat/completions"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry_after, response.text().await.unwrap())
}

async fn stream_chat(http: &reqwest::Client, edge: &str, body: &Value) -> Streamed {
    let (status, retry_after, text) = post_chat(http, edge, None, body).await;
    let data = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|line| line.trim().to_string())
        .collect();
    Streamed {
        status,
        retry_after,
        data,
    }
}

fn chat(question: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "hasten-rag",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
        "k": 3,
    })
}

/// A cloud index and an edge answering with `model`, configured by the TOML `config` (and
/// the flags `extra`), in the work directory `work_name`.
fn start_configured(
    work_name: &str,
    model: &std::path::Path,
    config: &str,
    extra: &[String],
) -> Answering {
    let path = hasten_tests::persistent_work_dir(work_name)
        .unwrap()
        .join("edge.toml");
    std::fs::write(&path, config).unwrap();
    let mut generation = with_model(model);
    generation.extend(["--config".into(), path.display().to_string()]);
    generation.extend_from_slice(extra);
    start_answering(work_name, &format!("{work_name}-edge"), &generation)
}

/// The edge's `hasten_answer_cancelled_total`.
async fn cancelled(edge: &str) -> u64 {
    Scrape::of(edge)
        .await
        .unwrap()
        .value("hasten_answer_cancelled_total", &[]) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_frees_the_model_for_the_next() {
    let Some(model) = small_model() else { return };
    let _alone = ONE_AT_A_TIME.lock().await;
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("answer-cancel", "cancel-edge", &with_model(&model));
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;

    // One honest answer, timed after a first one has warmed the caches.
    let honest = chat(question, 24, true);
    assert_eq!(stream_chat(&http, &addr, &honest).await.status, 200);
    let started = Instant::now();
    let one = stream_chat(&http, &addr, &honest).await;
    let one_answer = started.elapsed();
    assert_eq!(one.status, 200);

    // Streams that ask for long answers and leave after their first event (from one
    // document each: the prompt the model is reading when its client leaves is read to the
    // end of its current 512-token chunk, which cannot be cut).
    const LEAVING: usize = 4;
    for i in 0..LEAVING {
        let mut leaving = chat(&bundle.questions[i + 1].question, 400, true);
        leaving["k"] = json!(1);
        leave_after_first_event(&http, &addr, &leaving).await;
    }
    let started = Instant::now();
    let after = stream_chat(&http, &addr, &honest).await;
    let waited = started.elapsed();
    eprintln!("one answer {one_answer:?}; after {LEAVING} abandoned streams {waited:?}");
    assert_eq!(after.status, 200);
    assert_eq!(after.data.last().map(String::as_str), Some("[DONE]"));
    assert!(
        waited < one_answer * 2 + Duration::from_millis(500),
        "the honest request took {waited:?}, one answer {one_answer:?}: the abandoned \
         generations kept the model"
    );
    // Every abandoned stream is counted once its generation stops (a waiting one as it
    // leaves, the generating one at its next step).
    let deadline = Instant::now() + Duration::from_secs(30);
    while cancelled(&addr).await < LEAVING as u64 {
        assert!(
            Instant::now() < deadline,
            "cancellations counted: {}",
            cancelled(&addr).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(edge);
    cloud.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_before_the_reply_and_the_answer_is_counted_exactly() {
    let Some(model) = small_model() else { return };
    let _alone = ONE_AT_A_TIME.lock().await;
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_configured("answer-refusals", &model, "[answer]\nqueue = 1\n", &[]);
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = bundle.questions[0].question.clone();

    // A burst: one generates, one waits, the rest are refused with 429 before any stream.
    let burst = futures::future::join_all((0..8).map(|i| {
        let (http, addr) = (http.clone(), addr.clone());
        let body = chat(&bundle.questions[i].question, 48, true);
        async move { stream_chat(&http, &addr, &body).await }
    }))
    .await;
    let mut refused = 0;
    for reply in &burst {
        match reply.status {
            200 => {
                assert!(
                    reply.data.iter().all(|d| !d.contains("\"error\"")),
                    "a 200 carried an error: {:?}",
                    reply.data
                );
                assert_eq!(reply.data.last().map(String::as_str), Some("[DONE]"));
            }
            429 => {
                refused += 1;
                assert_eq!(reply.retry_after.as_deref(), Some("1"));
            }
            other => panic!("status {other}: {:?}", reply.data),
        }
    }
    assert!(
        (1..=6).contains(&refused),
        "{refused} of 8 refused with one generating and one waiting"
    );

    // A client that waits for each answer before asking again is never refused.
    for _ in 0..4 {
        let (status, reply) = post_json(
            &http,
            &addr,
            "/v1/chat/completions",
            &chat(&question, 8, false),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
    }

    // Standard mode: one token asked, one token counted, and it ended on the length.
    let (status, reply) = post_json(
        &http,
        &addr,
        "/v1/chat/completions",
        &chat(&question, 1, false),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 1, "{reply}");
    let usage = &reply["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 1
    );
    // An answer that ends on its own is a stop, with fewer tokens than allowed.
    let (_, reply) = post_json(
        &http,
        &addr,
        "/v1/answer",
        &json!({"question": question, "k": 3, "max_tokens": 200}),
    )
    .await;
    assert_eq!(reply["finish_reason"], "stop", "{reply}");
    assert!(reply["generated_tokens"].as_u64().unwrap() < 200, "{reply}");

    // Speculative mode: the drafts are reported apart; the answer alone is the completion.
    let speculative = |max_tokens: u32| {
        json!({"model": "hasten-rag-speculative", "k": 4, "max_tokens": max_tokens,
               "messages": [{"role": "user", "content": question}]})
    };
    let (status, reply) = post_json(&http, &addr, "/v1/chat/completions", &speculative(64)).await;
    assert_eq!(status, 200, "{reply}");
    let completion = reply["usage"]["completion_tokens"].as_u64().unwrap();
    let drafted = reply["hasten"]["drafting"]["generated_tokens"]
        .as_u64()
        .unwrap();
    assert!(completion <= 64, "{reply}");
    assert!(drafted > completion, "{reply}");
    let finish = reply["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(finish == "length", completion == 64, "{reply}");
    let (_, reply) = post_json(&http, &addr, "/v1/chat/completions", &speculative(1)).await;
    assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 1, "{reply}");

    // Fewer documents than clusters: fewer clusters, said in the reply, not a 400.
    let (status, reply) = post_json(
        &http,
        &addr,
        "/v1/answer",
        &json!({"question": question, "k": 1, "mode": "speculative", "max_tokens": 16}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert!(
        reply["notes"][0].as_str().unwrap().contains("clusters"),
        "{reply}"
    );
    drop(edge);
    cloud.stop();
}

const ACME: &str = "acme-token-0123456789abcdef";
const GLOBEX: &str = "globex-token-0123456789abcdef";

/// A non-streaming chat request as `token`'s tenant: status, `Retry-After` and the body.
async fn chat_as(
    http: &reqwest::Client,
    edge: &str,
    token: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let (status, retry_after, text) = post_chat(http, edge, Some(token), body).await;
    (status, retry_after, serde_json::from_str(&text).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_fill_the_queue_and_an_iterative_client_that_leaves_frees_the_model() {
    let Some(model) = small_model() else { return };
    let _alone = ONE_AT_A_TIME.lock().await;
    let tenants = hasten_tests::persistent_work_dir("answer-tenants")
        .unwrap()
        .join("tenants.toml");
    std::fs::write(
        &tenants,
        format!("[tenants]\nacme = [\"{ACME}\"]\nglobex = [\"{GLOBEX}\"]\n"),
    )
    .unwrap();
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_configured(
        "answer-tenants",
        &model,
        "[answer]\nqueue = 4\nqueue_per_tenant = 1\n",
        &[
            "--tenants-file",
            tenants.to_str().unwrap(),
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .map(String::from),
    );
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = &bundle.questions[0].question;
    let short = chat(question, 16, false);

    // One short answer, timed after a first one warmed the caches.
    assert_eq!(chat_as(&http, &addr, GLOBEX, &short).await.0, 200);
    let started = Instant::now();
    assert_eq!(chat_as(&http, &addr, GLOBEX, &short).await.0, 200);
    let one_answer = started.elapsed();

    // Acme runs a long iterative request (256 tokens, ~26 s here) and gives up on it after
    // a second.
    let leaving = {
        let (http, addr) = (http.clone(), addr.clone());
        let body = json!({"question": "Write a long story about a dragon.", "max_tokens": 256,
                          "speculate": false});
        tokio::spawn(async move {
            http.post(format!("http://{addr}/v1/ralm"))
                .bearer_auth(ACME)
                .json(&body)
                .timeout(Duration::from_secs(1))
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While it runs, acme is at its bound of one answer in progress: a 429 before any
    // reply, naming the setting.
    let (status, retry_after, reply) = chat_as(&http, &addr, ACME, &short).await;
    assert_eq!(status, 429, "{reply}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("answer_queue_per_tenant"), "{reply}");
    assert!(
        leaving.await.unwrap().unwrap_err().is_timeout(),
        "the iterative request was still running when its client left"
    );

    // Globex is served at once: the abandoned run stopped at its next step (a run that
    // went on to its 256 tokens would keep the model for many answers' time).
    let started = Instant::now();
    let (status, _, reply) = chat_as(&http, &addr, GLOBEX, &short).await;
    let waited = started.elapsed();
    eprintln!("one answer {one_answer:?}; after an abandoned iterative run {waited:?}");
    assert_eq!(status, 200, "{reply}");
    assert!(
        waited < one_answer * 2 + Duration::from_millis(500),
        "the next answer took {waited:?}, one answer {one_answer:?}: the abandoned run \
         kept the model"
    );
    // Acme's place came back with its run.
    let (status, _, reply) = chat_as(&http, &addr, ACME, &short).await;
    assert_eq!(status, 200, "{reply}");
    let cancelled = Scrape::of(&edge.addr("metrics_addr"))
        .await
        .unwrap()
        .value("hasten_answer_cancelled_total", &[]);
    assert_eq!(cancelled, 1.0);
    drop(edge);
    cloud.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_chat_query_rewrite_a_follow_up_is_retrieved_as_the_models_standalone_question() {
    let Some(model) = small_model() else { return };
    let _alone = ONE_AT_A_TIME.lock().await;
    let Answering {
        mut cloud, edge, ..
    } = start_configured(
        "answer-rewrite",
        &model,
        "[answer]\nchat_query_rewrite = true\n",
        &[],
    );
    let http = reqwest::Client::new();
    let addr = edge.addr("http_addr");
    let (first, follow_up) = ("Who won Super Bowl 50?", "Who did they beat?");
    let body = json!({
        "model": "hasten-rag",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": "The Denver Broncos."},
            {"role": "user", "content": follow_up},
        ],
    });
    let (status, reply) = post_json(&http, &addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{reply}");

    // The same rewrite, run here on the same model: retrieval ran on exactly it, not on the
    // rule's "Who won Super Bowl 50? Who did they beat?".
    // Loaded as the edge loads it (`lm_weights` fast): greedy decoding is exact per format.
    let local = hasten_rag::LocalLm::load_with(
        &model,
        &model,
        hasten_rag::DeviceKind::Cpu,
        hasten_rag::WeightFormat::Fast,
    )
    .unwrap();
    let conversation = [
        hasten_rag::ChatTurn::new(hasten_rag::Role::User, first),
        hasten_rag::ChatTurn::new(hasten_rag::Role::Assistant, "The Denver Broncos."),
    ];
    let expected =
        hasten_rag::rewrite::rewrite_locally(local.verifier(), &conversation, follow_up).unwrap();
    eprintln!("rewritten: {expected:?}");
    assert_eq!(reply["hasten"]["query"], expected.as_str(), "{reply}");
    assert_ne!(expected, format!("{first} {follow_up}"));
    let notes = reply["hasten"]["notes"].to_string();
    assert!(notes.contains("rewrite"), "{reply}");

    // A first question has nothing to rewrite: retrieval runs on it as asked.
    let (_, reply) = post_json(&http, &addr, "/v1/chat/completions", &chat(first, 8, false)).await;
    assert_eq!(reply["hasten"]["query"], first, "{reply}");
    drop(edge);
    cloud.stop();
}
