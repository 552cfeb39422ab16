//! Tenants and client deadlines with real processes: a cloud index, a control-plane node and
//! two edges sharing a tenants file. Two tenants ask homologous questions; neither is ever
//! answered through the other's cache, on the edge that fell back or on the one the
//! control plane replicated the result to.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1::edge_client::EdgeClient;
use hasten_proto::v1::{RetrieveRequest, retrieve_request};
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::wait_for;
use hasten_tests::{
    PAPER_VALIDATION, build_small_bundle, dev_cert, homologous_pair, model_dir, start_cloud_index,
    start_edge,
};
use serde_json::{Value, json};

const K: usize = 10;
const WAIT: Duration = Duration::from_secs(15);
const ACME_TOKEN: &str = "acme-token-0123456789abcdef";
const GLOBEX_TOKEN: &str = "globex-token-fedcba9876543210";
/// A tenant that has cached nothing: its every question goes to the cloud.
const INITECH_TOKEN: &str = "initech-token-00112233445566";

/// `POST /v1/retrieve` of `question` with `token` (none: no Authorization header) and
/// `headers`: the status, the body and the response headers.
async fn ask(
    http: &reqwest::Client,
    edge: &str,
    token: Option<&str>,
    question: &str,
    headers: &[(&str, &str)],
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut request = http
        .post(format!("http://{edge}/v1/retrieve"))
        .json(&json!({"query": question, "k": K}));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    (code, response.json().await.unwrap(), headers)
}

fn write_tenants(work: &Path) -> std::path::PathBuf {
    let path = work.join("tenants.toml");
    std::fs::write(
        &path,
        format!(
            "[tenants]\nacme = [\"{ACME_TOKEN}\"]\nglobex = [\"{GLOBEX_TOKEN}\"]\ninitech = [\"{INITECH_TOKEN}\"]\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homologous_questions_of_two_tenants_never_share_a_cache() {
    let cluster = Cluster::start("tenants", 1, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    cluster.leader().await;
    let tenants = write_tenants(&work);
    let control_plane = cluster.addresses[&1].clone();
    let start = |name: &str| {
        start_edge(
            &work,
            name,
            &bundle_dir,
            &cloud.addr("quic_addr"),
            &dev_cert(&work, "cloud"),
            &[
                &[
                    "--edge-id",
                    name,
                    "--control-plane",
                    &control_plane,
                    "--tenants-file",
                    tenants.to_str().unwrap(),
                    // Required with tenants: status and metrics name every tenant.
                    "--metrics-addr",
                    "127.0.0.1:0",
                    // Which cached query an acceptance went through is what this test checks.
                    "--set",
                    "retrieval.expose_matched_query_text=true",
                ][..],
                &PAPER_VALIDATION,
            ]
            .concat(),
        )
        .unwrap()
    };
    let (edge_a, edge_b) = (start("edge-a"), start("edge-b"));
    let (a, b) = (edge_a.addr("http_addr"), edge_b.addr("http_addr"));
    // The admin routes (status, metrics) are on an address of their own, not the API's.
    let (a_admin, b_admin) = (edge_a.addr("metrics_addr"), edge_b.addr("metrics_addr"));
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let (first, sibling) = homologous_pair(&bundle, &encoder, K).unwrap();

    // Without a valid token nothing is answered, and the token is not echoed.
    for token in [None, Some("acme-token-0123456789abcdeX")] {
        let (code, reply, headers) = ask(&http, &a, token, &first.question, &[]).await;
        assert_eq!(code, 401, "{reply}");
        assert_eq!(reply["error"]["code"], "unauthenticated");
        assert_eq!(headers["www-authenticate"], "Bearer");
        assert!(!reply.to_string().contains("0123456789"));
    }

    // acme falls back on edge A; the control plane replicates the result to both edges.
    let (code, reply, _) = ask(&http, &a, Some(ACME_TOKEN), &first.question, &[]).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );
    for path in ["metrics", "v1/status", "readyz"] {
        let on_api = http.get(format!("http://{a}/{path}")).send().await.unwrap();
        assert_eq!(on_api.status(), 404, "/{path} on the clients' address");
        let on_admin = http
            .get(format!("http://{a_admin}/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(on_admin.status(), 200, "/{path} on the admin address");
    }
    for edge in [&a_admin, &b_admin] {
        wait_for(&http, edge, "acme's entry never arrived", WAIT, |s| {
            s["cached_queries"] == 1
        })
        .await;
    }

    // globex asks the homologous sibling on edge B, which holds acme's entry: the cloud
    // answers, since globex has cached nothing.
    let (code, reply, _) = ask(&http, &b, Some(GLOBEX_TOKEN), &sibling.question, &[]).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );
    assert_eq!(reply["matched_query"], Value::Null);

    // The same sibling from acme on edge B is accepted, through acme's own replicated
    // entry: the pair is homologous enough, so globex's fallback was the tenant boundary.
    let (code, reply, _) = ask(&http, &b, Some(ACME_TOKEN), &sibling.question, &[]).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("accepted")),
        "{reply}"
    );
    assert_eq!(reply["matched_query"]["text"], json!(first.question));

    // Once globex's entry is on edge A too, globex repeats acme's exact question there: it
    // may be accepted through globex's own sibling, never through acme's entry.
    wait_for(&http, &a_admin, "globex's entry never arrived", WAIT, |s| {
        s["cached_queries"] == 2
    })
    .await;
    let (code, reply, _) = ask(&http, &a, Some(GLOBEX_TOKEN), &first.question, &[]).await;
    assert_eq!(code, 200, "{reply}");
    if reply["outcome"] == "accepted" {
        assert_eq!(
            reply["matched_query"]["text"],
            json!(sibling.question),
            "{reply}"
        );
    }
    let globex_entries = if reply["outcome"] == "fallback" {
        2.0
    } else {
        1.0
    };

    // Each tenant's cache holds its own fallbacks, replicated to both edges.
    for edge in [&a_admin, &b_admin] {
        wait_for(&http, edge, "globex's entries never arrived", WAIT, |s| {
            s["cached_queries"] == 1 + globex_entries as u64
        })
        .await;
    }
    for (edge, process) in [(&a_admin, &edge_a), (&b_admin, &edge_b)] {
        let scrape = Scrape::of(edge).await.unwrap();
        let entries =
            |tenant: &str| scrape.value("hasten_edge_cache_entries", &[("tenant", tenant)]);
        assert_eq!((entries("acme"), entries("globex")), (1.0, globex_entries));
        let log = std::fs::read_to_string(&process.log).unwrap();
        assert!(!log.contains(ACME_TOKEN) && !log.contains(GLOBEX_TOKEN));
    }
    let scrape = Scrape::of(&b_admin).await.unwrap();
    let requests = |tenant: &str, outcome: &str| {
        scrape.value(
            "hasten_edge_requests_total",
            &[("tenant", tenant), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("acme", "accepted"), 1.0);
    assert_eq!(requests("globex", "fallback"), 1.0);
    assert_eq!(requests("globex", "accepted"), 0.0);

    // The gRPC API takes the same tokens, and the client's grpc-timeout.
    let mut grpc = EdgeClient::connect(format!("http://{}", edge_a.addr("grpc_addr")))
        .await
        .unwrap();
    let request = |token: Option<&str>, timeout: Option<Duration>| {
        let mut request = tonic::Request::new(RetrieveRequest {
            input: Some(retrieve_request::Input::Query(first.question.clone())),
            k: Some(K as u32),
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        request
    };
    let refused = grpc.retrieve(request(None, None)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let reply = grpc
        .retrieve(request(Some(ACME_TOKEN), Some(Duration::from_secs(20))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.documents.len(), K);

    // A client deadline too short for a fallback ends it with 504 at the edge; a generous
    // one is met; a malformed one is refused.
    let fresh = &bundle.questions[bundle.questions.len() - 1].question;
    let short = [("x-request-timeout-ms", "1")];
    let (code, reply, _) = ask(&http, &a, Some(INITECH_TOKEN), fresh, &short).await;
    assert_eq!(code, 504, "{reply}");
    assert_eq!(reply["error"]["code"], "deadline_exceeded");
    let long = [("x-request-timeout-ms", "20000")];
    let (code, reply, _) = ask(&http, &a, Some(INITECH_TOKEN), fresh, &long).await;
    assert_eq!(
        (code, &reply["outcome"]),
        (200, &json!("fallback")),
        "{reply}"
    );
    let junk = [("x-request-timeout-ms", "soon")];
    let (code, reply, _) = ask(&http, &a, Some(ACME_TOKEN), fresh, &junk).await;
    assert_eq!(
        (code, &reply["error"]["field"]),
        (400, &json!("x-request-timeout-ms"))
    );
    let scrape = Scrape::of(&a_admin).await.unwrap();
    assert_eq!(
        scrape.value(
            "hasten_edge_request_errors_total",
            &[("kind", "deadline_exceeded")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value(
            "hasten_edge_request_errors_total",
            &[("kind", "unauthenticated")]
        ),
        3.0,
        "two refused over HTTP, one over gRPC"
    );
}
