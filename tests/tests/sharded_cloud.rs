//! The sharded cloud tier as real processes on loopback: a corpus cut into 2 shards by the
//! real `cloud-index build --shards`, 2 replicas of each (`cloud-index serve`), a router
//! (`cloud-index route`) and an edge (`edge-node serve`) that talks to the router exactly as
//! it talks to one index. Replicas are killed while queries flow.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, ProcessError, binary, cloud_index_route_args};
use hasten_loadtest::scrape::Scrape;
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{DocumentsRequest, InfoRequest, QueryVector, SearchRequest};
use hasten_tests::{
    brute_force_top_k, build_small_bundle, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::{Value, json};

const K: usize = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);

fn shard_bundle(bundle: &Path, shard: u32) -> PathBuf {
    bundle.join("shards").join(format!("shard-{shard}"))
}

/// A shard server on `grpc_addr` (port 0: any).
fn start_shard(work: &Path, name: &str, bundle: &Path, grpc_addr: &str) -> ManagedProcess {
    start_cloud_index(work, name, bundle, grpc_addr).unwrap()
}

fn start_router(work: &Path, shards: &[Vec<String>]) -> Result<ManagedProcess, ProcessError> {
    let mut args = cloud_index_route_args(shards, &work.join("router.pem"));
    args.extend(
        [
            "--set",
            "health_interval_ms=200",
            "--set",
            "startup_timeout_s=20",
        ]
        .map(String::from),
    );
    ManagedProcess::start(
        "router",
        &binary("cloud-index").unwrap(),
        &args,
        work,
        START_TIMEOUT,
    )
}

fn search_request(queries: Vec<Vec<f32>>, allow_partial: bool) -> SearchRequest {
    SearchRequest {
        queries: queries
            .into_iter()
            .map(|values| QueryVector { values })
            .collect(),
        k: K as u32,
        include_texts: true,
        allow_partial,
        ..Default::default()
    }
}

async fn retrieve(http: &reqwest::Client, edge: &str, body: Value) -> (u16, Value) {
    let response = http
        .post(format!("http://{edge}/v1/retrieve"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_fails_over_between_replicas_and_names_a_lost_shard() {
    let work = persistent_work_dir("sharded-cloud").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, Some(2)).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();

    let mut replicas: Vec<ManagedProcess> = [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
        .iter()
        .map(|(shard, r)| {
            start_shard(
                &work,
                &format!("shard-{shard}{r}"),
                &shard_bundle(&bundle_dir, *shard),
                "127.0.0.1:0",
            )
        })
        .collect();
    let endpoints: Vec<String> = replicas.iter().map(|p| p.addr("grpc_addr")).collect();
    let shard_map = vec![endpoints[..2].to_vec(), endpoints[2..].to_vec()];
    let router = start_router(&work, &shard_map).unwrap();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &router.addr("quic_addr"),
        &work.join("router.pem"),
        &[
            "--set",
            "cloud.timeout_ms=3000",
            "--set",
            "retrieval.tau=0.9",
        ],
    )
    .unwrap();

    let mut cloud = CloudIndexClient::connect(format!("http://{}", router.addr("grpc_addr")))
        .await
        .unwrap();
    // The router describes the whole corpus: the full bundle's version and size.
    let info = cloud.info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.corpus_version, bundle.manifest.corpus_version);
    assert_eq!(info.documents as usize, bundle.len());

    // Merged answers equal an exact search over the whole corpus (one batched call; the
    // queries are document vectors, so both shards hold close neighbours).
    let rows: Vec<usize> = (0..bundle.len()).step_by(bundle.len() / 12 + 1).collect();
    let queries: Vec<Vec<f32>> = rows.iter().map(|&r| bundle.vector(r).to_vec()).collect();
    let reply = cloud
        .search(search_request(queries.clone(), false))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.partial);
    for (query, hits) in queries.iter().zip(&reply.results) {
        let exact: Vec<u64> = brute_force_top_k(&bundle.documents, bundle.vectors(), query, K)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let got: Vec<u64> = hits.hits.iter().map(|h| h.id).collect();
        assert_eq!(got, exact);
        assert!(hits.hits.iter().any(|h| h.id % 2 == 0) && hits.hits.iter().any(|h| h.id % 2 == 1));
    }

    // Documents by id: each id asked of its shard, answered in request order with texts and
    // vectors as the bundle holds them; an id no shard holds is named missing.
    let unknown = bundle.documents.iter().map(|d| d.id).max().unwrap() + 7;
    let picked: Vec<usize> = vec![5, 2, bundle.len() - 1, 4, 5];
    let mut ids: Vec<u64> = picked.iter().map(|&r| bundle.documents[r].id).collect();
    ids.insert(2, unknown);
    let documents = cloud
        .documents(DocumentsRequest {
            ids: ids.clone(),
            include_vectors: true,
            include_texts: true,
            timeout_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(documents.missing_ids, vec![unknown]);
    let rows: Vec<usize> = vec![5, 2, bundle.len() - 1, 4];
    assert_eq!(
        documents.documents.len(),
        rows.len(),
        "duplicates answered once"
    );
    for (doc, row) in documents.documents.iter().zip(rows) {
        let held = &bundle.documents[row];
        assert_eq!(
            (doc.id, &doc.title, &doc.text),
            (held.id, &held.title, &held.text)
        );
        assert_eq!(doc.vector, bundle.vector(row));
    }
    assert!(documents.documents.iter().any(|d| d.id % 2 == 0));
    assert!(documents.documents.iter().any(|d| d.id % 2 == 1));
    let too_many = cloud
        .documents(DocumentsRequest {
            ids: (0..2000).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument, "{too_many}");

    // Concurrent searches of different k and contents, coalesced by the router into shared
    // requests, each get their own exact answer; a malformed one among them fails alone.
    let concurrent = futures::future::join_all((0..24usize).map(|i| {
        let mut cloud = cloud.clone();
        let query = queries[i % queries.len()].clone();
        async move {
            let mut request = search_request(vec![query.clone()], false);
            request.k = 1 + (i * 7 % 20) as u32;
            request.include_texts = i % 2 == 0;
            request.include_vectors = i % 3 == 0;
            if i == 5 {
                request.queries[0].values.pop();
            }
            (request.clone(), cloud.search(request).await)
        }
    }))
    .await;
    for (request, outcome) in concurrent {
        let query = &request.queries[0].values;
        if query.len() != bundle.dimension() {
            let status = outcome.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
            continue;
        }
        let reply = outcome.unwrap().into_inner();
        let k = request.k as usize;
        let exact: Vec<u64> = brute_force_top_k(&bundle.documents, bundle.vectors(), query, k)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let hits = &reply.results[0].hits;
        assert_eq!(
            hits.iter().map(|h| h.id).collect::<Vec<_>>(),
            exact,
            "k={k}"
        );
        assert!(
            hits.iter()
                .all(|h| h.text.is_empty() != request.include_texts)
        );
        assert!(
            hits.iter()
                .all(|h| h.vector.is_empty() != request.include_vectors)
        );
    }

    // Queries flow through the edge (questions, mostly fallbacks at tau 0.9) and straight
    // to the router while one replica of shard 0 is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let after_kill = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::new();
    let edge_addr = edge.addr("http_addr");
    let questions: Vec<String> = bundle
        .questions
        .iter()
        .map(|q| q.question.clone())
        .collect();
    let edge_flow = {
        let (stop, killed, after_kill) = (stop.clone(), killed.clone(), after_kill.clone());
        let (http, edge_addr) = (http.clone(), edge_addr.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            for question in questions.iter().cycle() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (status, reply) =
                    retrieve(&http, &edge_addr, json!({"query": question, "k": K})).await;
                if status != 200 {
                    failures.push(format!("{status}: {reply}"));
                } else if killed.load(Ordering::SeqCst) {
                    after_kill.fetch_add(1, Ordering::SeqCst);
                }
            }
            failures
        })
    };
    let router_flow = {
        let (stop, killed, after_kill) = (stop.clone(), killed.clone(), after_kill.clone());
        let mut cloud = cloud.clone();
        let queries = queries.clone();
        tokio::spawn(async move {
            let mut failures = Vec::new();
            for query in queries.iter().cycle() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match cloud
                    .search(search_request(vec![query.clone()], false))
                    .await
                {
                    Ok(reply) if reply.get_ref().results[0].hits.len() == K => {
                        if killed.load(Ordering::SeqCst) {
                            after_kill.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Ok(reply) => failures.push(format!("short answer: {:?}", reply.get_ref())),
                    Err(status) => failures.push(status.to_string()),
                }
            }
            failures
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    replicas[0].stop();
    killed.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let edge_failures = edge_flow.await.unwrap();
    let router_failures = router_flow.await.unwrap();
    assert!(
        edge_failures.is_empty(),
        "edge queries failed: {edge_failures:?}"
    );
    assert!(
        router_failures.is_empty(),
        "router queries failed: {router_failures:?}"
    );
    assert!(
        after_kill.load(Ordering::SeqCst) > 20,
        "too few queries after the kill to show failover: {}",
        after_kill.load(Ordering::SeqCst)
    );

    // Both replicas of shard 0 gone: a clear UNAVAILABLE naming the shard...
    replicas[1].stop();
    let status = cloud
        .search(search_request(vec![queries[0].clone()], false))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(status.message().contains("shard 0"), "{status}");
    // ...or, when the request allows it, shard 1's exact share flagged partial.
    let partial = cloud
        .search(search_request(vec![queries[0].clone()], true))
        .await
        .unwrap()
        .into_inner();
    assert!(partial.partial);
    assert_eq!(partial.missing_shards, vec![0]);
    let hits = &partial.results[0].hits;
    assert_eq!(hits.len(), K);
    assert!(
        hits.iter().all(|h| h.id % 2 == 1),
        "shard 0's documents in a partial answer"
    );
    // The router's metrics and readiness say the same: failovers on shard 0, no live
    // replica of it, not ready.
    let router_metrics = router.addr("metrics_addr");
    let scrape = Scrape::of(&router_metrics).await.unwrap();
    assert!(scrape.value("hasten_cloud_failovers_total", &[("shard", "0")]) >= 1.0);
    assert_eq!(
        scrape.value("hasten_cloud_shard_live_replicas", &[("shard", "0")]),
        0.0
    );
    assert_eq!(
        scrape.value("hasten_cloud_shard_live_replicas", &[("shard", "1")]),
        2.0
    );
    let ready = reqwest::get(format!("http://{router_metrics}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready.text().await.unwrap().contains("[0]"));
    // The edge's fallback fails fast; it never caches a partial answer. The client learns
    // that the cloud is unavailable, the edge's log which shard and why (a client is not
    // told the cloud's internals). The query points away from every cached document.
    let away: Vec<f32> = bundle.vector(bundle.len() / 2).iter().map(|x| -x).collect();
    let started = Instant::now();
    let (status, reply) = retrieve(&http, &edge_addr, json!({"vector": away, "k": K})).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["code"], "unavailable", "{reply}");
    assert!(!reply.to_string().contains("shard 0"), "{reply}");
    let log = std::fs::read_to_string(&edge.log).unwrap();
    assert!(
        log.lines()
            .any(|line| line.contains("request failed") && line.contains("shard 0")),
        "the edge did not log the cause"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // A replica restarted on its address is found by the health checks and serves again.
    replicas[0] = start_shard(
        &work,
        "shard-0a",
        &shard_bundle(&bundle_dir, 0),
        &endpoints[0],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match cloud
            .search(search_request(vec![queries[0].clone()], false))
            .await
        {
            Ok(reply) => {
                assert!(!reply.get_ref().partial);
                break;
            }
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("shard 0 never came back: {status}"),
        }
    }
}

#[test]
fn shards_of_different_corpora_are_refused_at_start() {
    let work = persistent_work_dir("sharded-cloud-mixed").unwrap();
    for corpus in ["first", "second"] {
        std::fs::create_dir_all(work.join(corpus)).unwrap();
    }
    let (first, _) = build_small_bundle(&work.join("first"), 3, Some(2)).unwrap();
    let (second, _) = build_small_bundle(&work.join("second"), 6, Some(2)).unwrap();
    let a = start_shard(&work, "first-0", &shard_bundle(&first, 0), "127.0.0.1:0");
    let b = start_shard(&work, "second-1", &shard_bundle(&second, 1), "127.0.0.1:0");
    let err = start_router(
        &work,
        &[vec![a.addr("grpc_addr")], vec![b.addr("grpc_addr")]],
    )
    .unwrap_err();
    assert!(
        matches!(err, ProcessError::Exited { .. }),
        "the router should have exited: {err}"
    );
    // The whole log: a backtrace after the message can push it out of the error's tail.
    let log = std::fs::read_to_string(work.join("router.log")).unwrap();
    assert!(
        log.contains("different corpora") && log.contains("shard 1"),
        "{log}"
    );
    // Shards listed under the wrong numbers are refused as well.
    let c = start_shard(&work, "first-1", &shard_bundle(&first, 1), "127.0.0.1:0");
    let err = start_router(
        &work,
        &[vec![c.addr("grpc_addr")], vec![a.addr("grpc_addr")]],
    )
    .unwrap_err();
    let log = std::fs::read_to_string(work.join("router.log")).unwrap();
    assert!(log.contains("holds shard 1 of 2"), "{err}\n{log}");
}
