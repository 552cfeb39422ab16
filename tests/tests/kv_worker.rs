//! The FusionRAG KV worker as real processes on loopback: `kv-worker preprocess` over a real
//! bundle (progress lines on a stderr that is no terminal, as a Job's pod has; resuming to
//! nothing left on a second run), `kv-worker serve` answering over gRPC
//! with the real small model, and an edge answering `/v1/answer` through it (`--kv-worker`).
//! FusionRAG recomputing 100% of the chunk tokens must answer exactly as full prefill (greedy
//! decoding), chunks sent as text must answer as the same chunks by id, the edge must answer
//! as the worker does over the ids it retrieved, and bad requests get their status with the
//! value named, never an answer. Skipped, saying so, when HASTEN_LM_DIR is unset.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, kv_worker_serve_args};
use hasten_kv_worker::progress::ProgressLine;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_client::KvGenerationClient;
use hasten_tests::answering::{START_TIMEOUT, small_model, start_edge};
use hasten_tests::edge::post_json;
use hasten_tests::{
    build_small_bundle, grpc_health_becomes, persistent_work_dir, start_cloud_index,
};
use serde_json::Value;

const CHUNKS: usize = 3;

fn preprocess(bundle: &Path, model: &Path, store: &Path) -> Value {
    let out = Command::new(binary("kv-worker").unwrap())
        .args(["preprocess", "--bundle"])
        .arg(bundle)
        .arg("--model")
        .arg(model)
        .arg("--store")
        .arg(store)
        .args(["--top-n", "2", "--dtype", "f32"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "preprocess failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let progress: Vec<ProgressLine> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let steps: Vec<&str> = progress
        .iter()
        .map(|line| line.preprocessing.step.as_str())
        .collect();
    assert_eq!(
        steps.first().copied(),
        Some("full-reuse"),
        "stderr not a terminal: progress lines, Full Reuse first: {stderr}"
    );
    let last = &progress.last().expect("a progress line").preprocessing;
    assert_eq!(
        (last.step.as_str(), last.done),
        ("similarity", last.total),
        "{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The streamed text and the final answer of one Generate.
async fn generate(
    client: &mut KvGenerationClient<tonic::transport::Channel>,
    request: pb::KvGenerateRequest,
) -> Result<(String, pb::KvGenerated), tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let (mut streamed, mut answer) = (String::new(), None);
    while let Some(event) = stream.message().await? {
        match event.event {
            Some(pb::kv_generate_event::Event::Delta(delta)) => streamed.push_str(&delta),
            Some(pb::kv_generate_event::Event::Answer(a)) => answer = Some(a),
            None => {}
        }
    }
    Ok((streamed, answer.expect("a final answer")))
}

fn ids(ids: &[u64]) -> Vec<pb::KvChunk> {
    ids.iter()
        .map(|&id| pb::KvChunk {
            chunk: Some(pb::kv_chunk::Chunk::Id(id)),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_worker_answers_over_preprocessed_chunks_as_full_prefill_would() {
    let Some(model) = small_model() else { return };
    let work = persistent_work_dir("kv-worker").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 1, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let store = work.join("store");
    let _ = std::fs::remove_dir_all(&store);

    let documents = bundle.documents.len();
    let first = preprocess(&bundle_dir, &model, &store);
    assert_eq!(first["similarity"]["computed"], documents);
    assert_eq!(first["full_reuse"]["computed"], documents);
    assert!(first["similarity"]["seconds_per_chunk"].as_f64().unwrap() > 0.0);
    let again = preprocess(&bundle_dir, &model, &store);
    assert_eq!(again["full_reuse"]["computed"], 0, "{again}");
    assert_eq!(again["similarity"]["computed"], 0, "{again}");
    assert_eq!(again["similarity"]["skipped"], documents);

    let mut worker = ManagedProcess::start(
        "kv-worker",
        &binary("kv-worker").unwrap(),
        [
            kv_worker_serve_args(&model, &store),
            vec!["--set".into(), "dtype=f32".into()],
        ]
        .concat(),
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
    let mut client = KvGenerationClient::connect(format!("http://{}", worker.addr("grpc_addr")))
        .await
        .unwrap();
    let version = bundle.manifest.corpus_version.clone();
    let info = client
        .info(pb::KvInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let held = info
        .corpora
        .iter()
        .find(|c| c.corpus_version == version)
        .expect("the preprocessed corpus version is held");
    assert_eq!(held.similarity, documents as u64);
    assert_eq!(held.chunks, documents as u64);

    let chunk_ids: Vec<u64> = bundle.documents.iter().take(CHUNKS).map(|d| d.id).collect();
    let question = bundle.questions[0].question.clone();
    let request = |mode: pb::FusionMode, ratio: Option<f32>, chunks: Vec<pb::KvChunk>| {
        pb::KvGenerateRequest {
            question: question.clone(),
            chunks,
            corpus_version: version.clone(),
            mode: mode as i32,
            recompute_ratio: ratio,
            variant: pb::KvVariant::Similarity as i32,
            max_new_tokens: 16,
        }
    };

    let (streamed, full) = generate(
        &mut client,
        request(pb::FusionMode::FullPrefill, None, ids(&chunk_ids)),
    )
    .await
    .unwrap();
    assert!(!full.text.trim().is_empty());
    assert_eq!(streamed, full.text, "the stream adds up to the answer");
    let (_, all) = generate(
        &mut client,
        request(pb::FusionMode::Fusionrag, Some(1.0), ids(&chunk_ids)),
    )
    .await
    .unwrap();
    assert_eq!(
        all.text, full.text,
        "100% recomputation answers as full prefill"
    );
    assert_eq!(all.context_tokens, full.context_tokens);
    // The first chunk reads its Full Reuse KV, a full prefill's already (the worker's
    // exact_leading_chunk): 100% recomputes every other chunk token.
    let (_, leading) = generate(
        &mut client,
        request(pb::FusionMode::FullPrefill, None, ids(&chunk_ids[..1])),
    )
    .await
    .unwrap();
    assert!(leading.recomputed_tokens > 0);
    assert_eq!(
        all.recomputed_tokens + leading.recomputed_tokens,
        full.recomputed_tokens,
        "every chunk token but the leading chunk's"
    );
    let (_, default) = generate(
        &mut client,
        request(pb::FusionMode::Unspecified, None, ids(&chunk_ids)),
    )
    .await
    .unwrap();
    // The default is FusionRAG at 15%: a strict, non-empty part of the chunk tokens.
    assert!(default.recomputed_tokens > 0 && default.recomputed_tokens < all.recomputed_tokens);
    assert_eq!(default.disk_hits, 0, "the chunks were in memory by now");

    // The same chunks as text: tokenized as preprocessing did, so the same answer.
    let texts: Vec<pb::KvChunk> = bundle
        .documents
        .iter()
        .take(CHUNKS)
        .map(|d| pb::KvChunk {
            chunk: Some(pb::kv_chunk::Chunk::Text(pb::KvTextChunk {
                title: d.title.clone(),
                text: d.text.clone(),
            })),
        })
        .collect();
    let mut as_text = request(pb::FusionMode::FullPrefill, None, texts);
    as_text.corpus_version.clear();
    let (_, by_text) = generate(&mut client, as_text.clone()).await.unwrap();
    assert_eq!(by_text.text, full.text);
    assert_eq!(by_text.computed_chunks, CHUNKS as u32);
    let (_, cached) = generate(&mut client, as_text).await.unwrap();
    assert_eq!(
        (cached.computed_chunks, cached.memory_hits),
        (0, CHUNKS as u32)
    );

    // Refusals, each naming what was wrong.
    let refused = |code: tonic::Code, needle: &str, status: tonic::Status| {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(needle), "{needle} in {status:?}");
    };
    let missing = bundle.max_document_id() + 1000;
    refused(
        tonic::Code::NotFound,
        &missing.to_string(),
        generate(
            &mut client,
            request(pb::FusionMode::Fusionrag, None, ids(&[missing])),
        )
        .await
        .unwrap_err(),
    );
    let mut other_version = request(pb::FusionMode::Fusionrag, None, ids(&chunk_ids));
    other_version.corpus_version = "0123456789abcdef".into();
    refused(
        tonic::Code::FailedPrecondition,
        "0123456789abcdef",
        generate(&mut client, other_version).await.unwrap_err(),
    );
    refused(
        tonic::Code::InvalidArgument,
        "recompute_ratio",
        generate(
            &mut client,
            request(pb::FusionMode::Fusionrag, Some(1.5), ids(&chunk_ids)),
        )
        .await
        .unwrap_err(),
    );
    // An entry missing from the store: refused, naming the chunk (second: a leading chunk
    // reads its Full Reuse KV, which is still there).
    let gone = chunk_ids[0];
    std::fs::remove_file(
        store
            .join(&info.model_id)
            .join(&version)
            .join(format!("id-{gone}.similarity.kv")),
    )
    .unwrap();
    let mut fresh_worker = ManagedProcess::start(
        "kv-worker-fresh",
        &binary("kv-worker").unwrap(),
        kv_worker_serve_args(&model, &store),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let mut fresh =
        KvGenerationClient::connect(format!("http://{}", fresh_worker.addr("grpc_addr")))
            .await
            .unwrap();
    refused(
        tonic::Code::NotFound,
        &gone.to_string(),
        generate(
            &mut fresh,
            request(pb::FusionMode::Fusionrag, None, ids(&[chunk_ids[1], gone])),
        )
        .await
        .unwrap_err(),
    );
    fresh_worker.stop();
    let mut too_long = request(pb::FusionMode::Fusionrag, None, ids(&chunk_ids));
    too_long.max_new_tokens = 100_000;
    refused(
        tonic::Code::InvalidArgument,
        "window",
        generate(&mut client, too_long).await.unwrap_err(),
    );

    let scrape = Scrape::of(&worker.addr("metrics_addr")).await.unwrap();
    let first_tokens = |mode: &str| {
        scrape.value(
            "hasten_kv_time_to_first_token_seconds_count",
            &[("mode", mode)],
        )
    };
    // All chunks, the leading chunk alone, the chunks as text.
    assert_eq!(first_tokens("full-prefill"), 4.0);
    assert_eq!(first_tokens("fusionrag"), 2.0);
    assert_eq!(
        scrape.value("hasten_kv_errors_total", &[("reason", "not_found")]),
        1.0
    );
    assert_eq!(
        scrape.value("hasten_kv_chunks_total", &[("from", "computed")]),
        CHUNKS as f64
    );

    // A caller that leaves after the first piece of text stops the decoding: the next
    // request is served in about one short answer's time, not after the abandoned long one
    // (a worker that decodes on for a gone caller fails this).
    let short = request(pb::FusionMode::Fusionrag, None, ids(&chunk_ids));
    let started = std::time::Instant::now();
    generate(&mut client, short.clone()).await.unwrap();
    let one_answer = started.elapsed();
    let mut long = short.clone();
    // A question the small model answers at length (it stops on its own otherwise).
    long.question = "Write a long story about a dragon.".into();
    long.max_new_tokens = 400;
    let mut abandoned = client.generate(long).await.unwrap().into_inner();
    assert!(
        abandoned.message().await.unwrap().is_some(),
        "a first event"
    );
    drop(abandoned);
    let started = std::time::Instant::now();
    generate(&mut client, short).await.unwrap();
    let waited = started.elapsed();
    eprintln!("one answer {one_answer:?}; after an abandoned stream {waited:?}");
    assert!(
        waited < one_answer * 2 + std::time::Duration::from_millis(500),
        "the next request took {waited:?}, one answer {one_answer:?}: the abandoned \
         generation kept the model"
    );
    let cancelled = Scrape::of(&worker.addr("metrics_addr"))
        .await
        .unwrap()
        .value("hasten_kv_errors_total", &[("reason", "cancelled")]);
    assert_eq!(cancelled, 1.0);

    // An edge over the same bundle answers through the worker: the documents it retrieved go
    // as ids, and the answer is the worker's over those ids in the edge's mode (FusionRAG 15%).
    let mut cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let mut edge = start_edge(
        &work,
        "kv-edge",
        &bundle_dir,
        &cloud,
        &["--kv-worker".into(), worker.addr("grpc_addr")],
    );
    let http = reqwest::Client::new();
    let body = serde_json::json!({"question": question, "k": 3, "max_tokens": 16});
    let (status, reply) = post_json(&http, &edge.addr("http_addr"), "/v1/answer", &body).await;
    assert_eq!(status, 200, "{reply}");
    let retrieved: Vec<u64> = reply["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    assert_eq!(retrieved.len(), 3);
    let (_, direct) = generate(
        &mut client,
        request(pb::FusionMode::Unspecified, None, ids(&retrieved)),
    )
    .await
    .unwrap();
    assert_eq!(reply["answer"].as_str().unwrap(), direct.text, "{reply}");
    let speculative = serde_json::json!({"question": question, "k": 3, "mode": "speculative"});
    let (status, refusal) =
        post_json(&http, &edge.addr("http_addr"), "/v1/answer", &speculative).await;
    assert_eq!(status, 400, "{refusal}");
    assert!(refusal.to_string().contains("mode"), "{refusal}");
    edge.stop();
    cloud.stop();
    worker.stop();
}
