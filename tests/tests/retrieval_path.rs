//! The first complete retrieval path with real processes on loopback: `cloud-index build`
//! encodes a small real corpus (the first SQuAD articles from ../shared/data; the synthetic
//! knowledge base when that is absent), `cloud-index serve` and `edge-node serve` run as
//! processes, and the test talks to them over HTTP, gRPC and (through the edge) QUIC.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hasten_core::Question;
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_eval::process::{ManagedProcess, binary, edge_serve_args};
use hasten_proto::codec::ProtoCodec;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::edge_client::EdgeClient;
use hasten_proto::v1::{
    ProposeReply, QueryVector, RetrieveRequest, RetrieveResponse, SearchRequest, retrieve_request,
};
use hasten_tests::{
    PAPER_VALIDATION, brute_force_top_k, build_small_bundle, dev_cert, exact_ids, homologous_pair,
    model_dir, persistent_work_dir, start_cloud_index,
};
use serde_json::{Value, json};

const K: usize = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the test bundle twice with the real `cloud-index build`; the second build must
/// reuse every vector. Returns the bundle path.
fn build_bundle(work: &Path) -> PathBuf {
    let (_, first) = build_small_bundle(work, 3, None).unwrap();
    let (bundle, second) = build_small_bundle(work, 3, None).unwrap();
    assert_eq!(second["encoded"], 0, "second build re-encoded: {second}");
    assert_eq!(second["reused"], first["documents"]);
    assert_eq!(second["corpus_version"], first["corpus_version"]);
    bundle
}

struct Fixture {
    bundle: CorpusBundle,
    encoder: TextEncoder,
    http: reqwest::Client,
}

impl Fixture {
    fn exact(&self, text: &str) -> Vec<(u64, f32)> {
        let v = self.encoder.encode_one(text).unwrap();
        brute_force_top_k(&self.bundle.documents, self.bundle.vectors(), &v, K)
    }

    fn exact_ids(&self, text: &str) -> HashSet<u64> {
        exact_ids(&self.bundle, &self.encoder, text, K).unwrap()
    }

    /// Asserts `reply`'s documents are a valid exact top-k for `text`: k distinct documents,
    /// ordered by score, each scoring at least the k-th best brute-force score.
    fn assert_exact(&self, text: &str, reply: &Value) {
        let exact = self.exact(text);
        let kth = exact[K - 1].1;
        let v = self.encoder.encode_one(text).unwrap();
        let by_id: HashMap<u64, usize> = self
            .bundle
            .documents
            .iter()
            .enumerate()
            .map(|(row, d)| (d.id, row))
            .collect();
        let docs = reply["documents"].as_array().unwrap();
        assert_eq!(docs.len(), K);
        let ids: HashSet<u64> = docs.iter().map(|d| d["id"].as_u64().unwrap()).collect();
        assert_eq!(ids.len(), K, "duplicate documents");
        let mut previous = f32::INFINITY;
        for doc in docs {
            let row = by_id[&doc["id"].as_u64().unwrap()];
            let score: f32 = self
                .bundle
                .vector(row)
                .iter()
                .zip(&v)
                .map(|(a, b)| a * b)
                .sum();
            assert!(
                score >= kth - 1e-4,
                "document {} scores {score} below the exact k-th {kth}",
                doc["id"]
            );
            assert!(score <= previous + 1e-4, "results out of order");
            previous = score;
            assert_eq!(doc["text"], self.bundle.documents[row].text.as_str());
        }
        let expected: HashSet<u64> = exact
            .iter()
            .filter(|(_, s)| *s > kth + 1e-4)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            expected.is_subset(&ids),
            "a clearly-top document is missing"
        );
    }

    async fn retrieve(&self, edge: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("http://{edge}/v1/retrieve"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn ask(&self, edge: &str, question: &str) -> (u16, Value) {
        self.retrieve(edge, json!({"query": question, "k": K}))
            .await
    }
}

/// Questions of the first entity, its most homologous sibling, and a question of another
/// entity sharing almost nothing with the first question's exact result.
fn pick_questions(f: &Fixture) -> (Question, Question, Question, Question) {
    let (first, sibling) = homologous_pair(&f.bundle, &f.encoder, K).unwrap();
    let first_docs = f.exact_ids(&first.question);
    let by_entity: Vec<&Question> = f.bundle.questions.iter().collect();
    let mut strangers = by_entity
        .iter()
        .filter(|q| q.entity != first.entity)
        .filter(|q| f.exact_ids(&q.question).intersection(&first_docs).count() == 0);
    let stranger = strangers.next().map(|q| (*q).clone()).unwrap();
    let stranger_docs = f.exact_ids(&stranger.question);
    let another = strangers
        .find(|q| {
            f.exact_ids(&q.question)
                .intersection(&stranger_docs)
                .count()
                == 0
        })
        .map(|q| (*q).clone())
        .unwrap();
    (first, sibling, stranger, another)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_edge_in_front_of_an_exact_cloud() {
    let work = persistent_work_dir("retrieval-path").unwrap();
    let bundle_dir = build_bundle(&work);
    let mut cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    let edge = ManagedProcess::start(
        "edge",
        &binary("edge-node").unwrap(),
        edge_serve_args(&bundle_dir, &model_dir(), &cloud.addr("quic_addr"), &cert)
            .into_iter()
            .chain(["--set".into(), "cloud.timeout_ms=1000".into()])
            .chain(PAPER_VALIDATION.map(String::from)),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let f = Fixture {
        bundle: CorpusBundle::load(&bundle_dir).unwrap(),
        encoder: TextEncoder::load(&model_dir()).unwrap(),
        http: reqwest::Client::new(),
    };
    let http = edge.addr("http_addr");
    let (first, sibling, stranger, another) = pick_questions(&f);

    // A cold cache: the first question falls back, and the cloud's answer is exact.
    let (status, reply) = f.ask(&http, &first.question).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["outcome"], "fallback");
    f.assert_exact(&first.question, &reply);
    assert!(reply["timings_us"]["cloud_us"].as_u64().unwrap() > 0);

    // A homologous question (same article, another attribute) is accepted through it.
    let (status, reply) = f.ask(&http, &sibling.question).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["outcome"], "accepted",
        "sibling {:?} of {:?}: {reply}",
        sibling.question, first.question
    );
    // The cached query it went through is named by id; its text is another user's
    // question, shown only when the operator enables it (this edge does not).
    assert!(reply["matched_query"]["id"].is_u64(), "{reply}");
    assert!(
        reply["matched_query"].get("text").is_none(),
        "another user's question leaked: {reply}"
    );
    assert!(!reply.to_string().contains(first.question.as_str()));
    assert!(reply["homology_score"].as_f64().unwrap() >= 0.2);
    assert!(reply["timings_us"].get("cloud_us").is_none(), "{reply}");
    assert_eq!(reply["documents"].as_array().unwrap().len(), K);

    // A question about something else is not accepted on that basis; its fallback is exact.
    let (status, reply) = f.ask(&http, &stranger.question).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["outcome"], "fallback",
        "{:?} accepted: {reply}",
        stranger.question
    );
    f.assert_exact(&stranger.question, &reply);

    // The cloud's own gRPC API: one batched call, each list equal to brute force.
    let mut cloud_grpc = CloudIndexClient::connect(format!("http://{}", cloud.addr("grpc_addr")))
        .await
        .unwrap();
    let texts = [first.question.as_str(), another.question.as_str()];
    let vectors = f.encoder.encode(&texts).unwrap();
    let batch = cloud_grpc
        .search(SearchRequest {
            queries: vectors
                .iter()
                .map(|v| QueryVector { values: v.clone() })
                .collect(),
            k: K as u32,
            include_vectors: false,
            include_texts: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.results.len(), 2);
    for (text, result) in texts.iter().zip(&batch.results) {
        let reply = json!({"documents": result.hits.iter().map(|h| json!({"id": h.id, "text": h.text})).collect::<Vec<_>>()});
        f.assert_exact(text, &reply);
    }

    // Bad input: HTTP 400 naming the field.
    let bad: Vec<(Value, &str)> = vec![
        (json!({"query": "   "}), "query"),
        (json!({"query": "x".repeat(2001)}), "query"),
        (json!({"query": "a", "k": 0}), "k"),
        (json!({"query": "a", "k": 101}), "k"),
        (json!({}), "query"),
        (json!({"vector": [0.5, 0.5]}), "vector"),
        (
            json!({"vector": std::iter::once(1e39).chain(std::iter::repeat_n(0.0, 383)).collect::<Vec<f64>>()}),
            "vector",
        ),
        (json!({"query": "a", "k": "ten"}), "k"),
        (json!({"query": "a", "mode": "fast"}), "mode"),
    ];
    for (body, field) in bad {
        let (status, reply) = f.retrieve(&http, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} -> {reply}");
    }
    // Bodies refused before parsing or as a whole: not JSON, not an object, over the
    // 64 KiB limit (413), or not declared as JSON (415).
    let oversized = format!("{{\"query\": \"{}\"}}", "y".repeat(70_000));
    let raw = [
        ("{not json", "application/json", 400, "invalid_argument"),
        (
            r#"[{"query": "a"}]"#,
            "application/json",
            400,
            "invalid_argument",
        ),
        (
            oversized.as_str(),
            "application/json",
            413,
            "payload_too_large",
        ),
        (
            r#"{"query": "a"}"#,
            "text/plain",
            415,
            "unsupported_media_type",
        ),
    ];
    for (body, content_type, status, code) in raw {
        let response = f
            .http
            .post(format!("http://{http}/v1/retrieve"))
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let got = response.status().as_u16();
        let reply: Value = response.json().await.unwrap();
        let shown = &body[..body.len().min(40)];
        assert_eq!(got, status, "{shown} as {content_type}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{shown}: {reply}");
        if status == 400 {
            assert_eq!(reply["error"]["field"], "body", "{shown}: {reply}");
        }
    }

    // Bad input over gRPC: INVALID_ARGUMENT.
    let mut edge_grpc = EdgeClient::connect(format!("http://{}", edge.addr("grpc_addr")))
        .await
        .unwrap();
    let grpc_bad = [
        RetrieveRequest {
            input: Some(retrieve_request::Input::Query(String::new())),
            k: None,
        },
        RetrieveRequest {
            input: Some(retrieve_request::Input::Query("a".into())),
            k: Some(0),
        },
        RetrieveRequest {
            input: None,
            k: None,
        },
        RetrieveRequest {
            input: Some(retrieve_request::Input::Vector(QueryVector {
                values: vec![f32::NAN; 384],
            })),
            k: None,
        },
    ];
    for request in grpc_bad {
        let status = edge_grpc.retrieve(request.clone()).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{request:?}: {status}"
        );
    }
    // A body that is not a RetrieveRequest at all (a varint where the query string
    // belongs) is the client's mistake too, not an internal error.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", edge.addr("grpc_addr")))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    let garbled = raw
        .unary(
            tonic::Request::new(ProposeReply {
                index: 7,
                ..Default::default()
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static("/hasten.v1.Edge/Retrieve"),
            ProtoCodec::<ProposeReply, RetrieveResponse>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(garbled.code(), tonic::Code::InvalidArgument, "{garbled}");
    // A message beyond the body bound (64 KiB) is refused before it is decoded.
    let status = edge_grpc
        .retrieve(RetrieveRequest {
            input: Some(retrieve_request::Input::Query("x".repeat(100_000))),
            k: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status}"
    );
    assert!(status.message().contains("too large"), "{status}");
    let ok = edge_grpc
        .retrieve(RetrieveRequest {
            input: Some(retrieve_request::Input::Query(sibling.question.clone())),
            k: Some(K as u32),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.outcome, hasten_proto::v1::Outcome::Accepted as i32);

    // The cloud goes away: queries that need it get 503, accepted drafts keep being served.
    cloud.stop();
    let (status, reply) = f.ask(&http, &another.question).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["code"], "unavailable");
    let status = edge_grpc
        .retrieve(RetrieveRequest {
            input: Some(retrieve_request::Input::Query(another.question.clone())),
            k: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let (status, reply) = f.ask(&http, &sibling.question).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["outcome"], "accepted");
}
