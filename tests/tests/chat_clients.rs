//! The clients RAG applications use, from PyPI, against a real edge answering with the real
//! small model: the OpenAI SDK, LangChain's ChatOpenAI and LlamaIndex's OpenAILike
//! (`make test` installs them), each whole and streamed. A system message and earlier turns
//! reach the prompt, an 8,000-character message is answered, `stop` ends the answer before
//! its string, and a seeded sampled answer can be reproduced. Skipped, saying so, without the
//! model or the clients.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hasten_core::bundle::CorpusBundle;
use hasten_tests::answering::{Answering, client_python, small_model, start_answering, with_model};
use serde_json::Value;

/// What one client saw on one transport.
fn check_client(name: &str, seen: &Value) {
    let content = |probe: &str| seen[probe]["content"].as_str().unwrap().trim().to_string();
    let prompt_tokens = |probe: &str| seen[probe]["prompt_tokens"].as_u64();
    for probe in ["plain", "system", "history", "long"] {
        assert!(!content(probe).is_empty(), "{name}: {probe}: {seen}");
    }
    // The system message and the earlier turns are read: the prompt grows with them. (A
    // client that reports no usage on a stream, LlamaIndex's, is checked whole only.)
    if let (Some(plain), Some(system), Some(history)) = (
        prompt_tokens("plain"),
        prompt_tokens("system"),
        prompt_tokens("history"),
    ) {
        assert!(system > plain, "{name}: system {system}, plain {plain}");
        assert!(history > plain, "{name}: history {history}, plain {plain}");
    } else {
        assert_eq!(name, "llamaindex stream", "{seen}");
    }
    // The answer ends just before the stop string taken from the greedy answer.
    if let Some(stop) = seen["stop_string"].as_str() {
        let plain = content("plain");
        let expected = plain[..plain.find(stop).unwrap()].trim();
        assert_eq!(
            content("stopped"),
            expected,
            "{name}: stop {stop:?}: {seen}"
        );
        if let Some(finish) = seen["stopped"]["finish_reason"].as_str() {
            assert_eq!(finish, "stop", "{name}: {seen}");
        }
    }
    // Sampling with a seed reproduces its answer.
    let seeded = seen["seeded"].as_array().unwrap();
    assert_eq!(seeded[0], seeded[1], "{name}: {seen}");
}

/// `/v1/embeddings` through both clients: the same unit vectors of the encoder's dimension,
/// a question nearer its rewording than a recipe.
fn check_embeddings(seen: &Value) {
    assert_eq!(
        seen["models"],
        serde_json::json!(["all-MiniLM-L6-v2", "hasten-rag", "hasten-rag-speculative"]),
        "{seen}"
    );
    let vectors =
        |key: &str| -> Vec<Vec<f64>> { serde_json::from_value(seen[key].clone()).unwrap() };
    let (sdk, langchain) = (vectors("sdk"), vectors("langchain"));
    assert_eq!(sdk.len(), 3);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for (a, b) in sdk.iter().zip(&langchain) {
        assert_eq!(a.len(), 384);
        assert!((dot(a, a) - 1.0).abs() < 1e-4, "not unit length");
        assert!(
            a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6),
            "clients disagree"
        );
    }
    let query: Vec<f64> = serde_json::from_value(seen["langchain_query"].clone()).unwrap();
    assert!(query.iter().zip(&sdk[0]).all(|(x, y)| (x - y).abs() < 1e-6));
    assert!(dot(&sdk[0], &sdk[1]) > dot(&sdk[0], &sdk[2]), "{seen}");
    assert!(seen["usage"].as_u64().unwrap() > 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_llamaindex_and_the_openai_sdk_read_the_conversation_and_sample_as_asked() {
    let Some(model) = small_model() else { return };
    let Some(python) = client_python("HASTEN_RAG_CLIENTS_PYTHON", "the chat clients test") else {
        return;
    };
    let Answering {
        mut cloud,
        edge,
        bundle_dir,
        ..
    } = start_answering("chat-clients", "chat-clients-edge", &with_model(&model));
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let question = bundle.questions[0].question.clone();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/chat_clients.py");
    let addr = edge.addr("http_addr");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .arg(addr)
            .arg(question)
            .arg("And who founded it?")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the clients script failed: {stderr}"
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    for client in ["openai", "langchain", "llamaindex"] {
        for transport in ["invoke", "stream"] {
            check_client(
                &format!("{client} {transport}"),
                &seen["clients"][client][transport],
            );
        }
        // Greedy answers are the same whole and streamed.
        assert_eq!(
            seen["clients"][client]["invoke"]["plain"]["content"]
                .as_str()
                .unwrap()
                .trim(),
            seen["clients"][client]["stream"]["plain"]["content"]
                .as_str()
                .unwrap()
                .trim(),
            "{client}"
        );
    }
    check_embeddings(&seen["embeddings"]);
    let openai = &seen["clients"]["openai"]["invoke"];
    // usage and Hasten's own report agree; the follow-up was retrieved with the turn before.
    assert_eq!(
        openai["plain"]["prompt_tokens"], openai["plain"]["hasten_prompt_tokens"],
        "{openai}"
    );
    let query = openai["history"]["query"].as_str().unwrap();
    assert!(
        query.starts_with(bundle.questions[0].question.trim()) && query.ends_with("founded it?"),
        "{query}"
    );
    // The 8,000-character message was retrieved by its end, within the query limit.
    let long_query = openai["long"]["query"].as_str().unwrap();
    assert!(long_query.chars().count() <= 2000, "{long_query}");
    assert!(long_query.ends_with(bundle.questions[0].question.trim()));
    drop(edge);
    cloud.stop();
}
