//! A corpus update without downtime, as the chart README's runbook ("Update the corpus
//! without downtime") does it, on real processes on loopback: a `control-plane` node, the old
//! cloud (`cloud-index serve` over version 1) and a new one beside it (version 2), two edges
//! on version 1 rolled one at a time onto version 2 and the new cloud while clients keep
//! sending retrievals, and `hasten-admin corpus-update` carrying the hot cache over once the
//! first new edge has registered its version.
//!
//! The Kubernetes Service in front of the edges cannot run here: its endpoint list is kept by
//! the test as a Deployment's rolling update (`maxSurge: 1`, `maxUnavailable: 0`) keeps it.
//! An edge is added once its `/readyz` answers 200 and removed before it is stopped (SIGTERM,
//! which drains its open requests).
//!
//! The test can fail: switching in place (the new edges on the old cloud, taking traffic as
//! soon as they listen) failed it with 23 failed requests (503, the cloud unavailable to a
//! version-2 edge) when run by hand.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasten_core::bundle::{CorpusBundle, write_bundle};
use hasten_core::encoder::TextEncoder;
use hasten_eval::process::ManagedProcess;
use hasten_tests::admin::admin_json;
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::{retrieve, status, wait_for, wait_ready};
use hasten_tests::{
    build_small_bundle, dev_cert, model_dir, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::Value;

const K: usize = 5;
const CLIENTS: usize = 3;
/// How long a new edge may take to load its bundle and reach its cloud.
const EDGE_READY: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(20);

/// What the clients saw: per edge, answers by outcome; every failure, with its edge.
#[derive(Default)]
struct Traffic {
    answered: BTreeMap<(String, String), usize>,
    failures: Vec<String>,
}

/// Clients sending the questions round-robin to the edges in `endpoints` (the Service's
/// ready endpoints) until `stop`.
fn start_clients(
    endpoints: Arc<Mutex<Vec<String>>>,
    questions: Arc<Vec<String>>,
    traffic: Arc<Mutex<Traffic>>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let next = Arc::new(AtomicUsize::new(0));
    (0..CLIENTS)
        .map(|_| {
            let (endpoints, questions, traffic, stop, next) = (
                Arc::clone(&endpoints),
                Arc::clone(&questions),
                Arc::clone(&traffic),
                Arc::clone(&stop),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let edge = {
                        let endpoints = endpoints.lock().unwrap();
                        endpoints[n % endpoints.len()].clone()
                    };
                    let question = &questions[n % questions.len()];
                    let sent = http
                        .post(format!("http://{edge}/v1/retrieve"))
                        .json(&serde_json::json!({"query": question, "k": K}))
                        .send()
                        .await;
                    let outcome = match sent {
                        Ok(response) => {
                            let code = response.status().as_u16();
                            match response.json::<Value>().await {
                                Ok(body)
                                    if code == 200
                                        && body["documents"]
                                            .as_array()
                                            .is_some_and(|d| !d.is_empty()) =>
                                {
                                    Ok(body["outcome"].as_str().unwrap_or("?").to_string())
                                }
                                Ok(body) => Err(format!("{edge}: {code} {body}")),
                                Err(err) => Err(format!("{edge}: {code}, unreadable body: {err}")),
                            }
                        }
                        Err(err) => Err(format!("{edge}: {err}")),
                    };
                    {
                        let mut traffic = traffic.lock().unwrap();
                        match outcome {
                            Ok(outcome) => {
                                *traffic.answered.entry((edge, outcome)).or_default() += 1
                            }
                            Err(why) => traffic.failures.push(why),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect()
}

/// Version 2 of the corpus: version 1 with its first document revised (re-encoded with the
/// real encoder), written as a bundle at `out`. Returns the revised document's id.
fn revised_bundle(v1: &CorpusBundle, encoder: &TextEncoder, out: &Path) -> Vec<u64> {
    let mut documents = v1.documents.clone();
    let mut vectors = v1.vectors().to_vec();
    documents[0]
        .text
        .push_str(" This passage was revised in the second version of the corpus.");
    let revised = encoder.encode_one(&documents[0].text).unwrap();
    vectors[..v1.dimension()].copy_from_slice(&revised);
    let _ = std::fs::remove_dir_all(out);
    write_bundle(
        out,
        vec!["revised".into()],
        &documents,
        &vectors,
        v1.dimension(),
        &v1.questions,
    )
    .unwrap();
    vec![documents[0].id]
}

/// The documents of `old` that `new` changed or removed, as an operator computes
/// `--changed-documents`.
fn changed_documents(old: &CorpusBundle, new: &CorpusBundle) -> Vec<u64> {
    let new_texts: BTreeMap<u64, &str> = new
        .documents
        .iter()
        .map(|d| (d.id, d.text.as_str()))
        .collect();
    old.documents
        .iter()
        .filter(|d| new_texts.get(&d.id) != Some(&d.text.as_str()))
        .map(|d| d.id)
        .collect()
}

fn start_edge_on(
    work: &Path,
    name: &str,
    bundle: &Path,
    cloud: &ManagedProcess,
    cloud_name: &str,
    control_plane: &str,
) -> ManagedProcess {
    start_edge(
        work,
        name,
        bundle,
        &cloud.addr("quic_addr"),
        &dev_cert(work, cloud_name),
        &["--edge-id", name, "--control-plane", control_plane],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_roll_onto_a_new_corpus_and_cloud_without_a_failed_request() {
    let cluster = Cluster::start("corpus-update", 1, 10_000);
    let work = cluster.work.clone();
    let control_plane = cluster.addresses[&1].clone();
    let (v1_dir, _) =
        build_small_bundle(&persistent_work_dir("corpus-update").unwrap(), 3, None).unwrap();
    let v1 = CorpusBundle::load(&v1_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let v2_dir = work.join("bundle-v2");
    let revised = revised_bundle(&v1, &encoder, &v2_dir);
    let v2 = CorpusBundle::load(&v2_dir).unwrap();
    let (old_version, new_version) = (
        v1.manifest.corpus_version.clone(),
        v2.manifest.corpus_version.clone(),
    );
    assert_ne!(old_version, new_version);
    let changed = changed_documents(&v1, &v2);
    assert_eq!(changed, revised);

    // Blue: the old cloud and two edges on version 1. Green: the new cloud beside it.
    let blue = start_cloud_index(&work, "cloud-blue", &v1_dir, "127.0.0.1:0").unwrap();
    let green = start_cloud_index(&work, "cloud-green", &v2_dir, "127.0.0.1:0").unwrap();
    cluster.leader().await;
    let http = reqwest::Client::new();
    let mut old_edges = Vec::new();
    for name in ["edge-a", "edge-b"] {
        let edge = start_edge_on(&work, name, &v1_dir, &blue, "cloud-blue", &control_plane);
        wait_ready(&http, &edge.addr("http_addr"), EDGE_READY).await;
        old_edges.push(edge);
    }

    // Why the readiness gate matters: an edge of version 2 facing the old cloud is not
    // ready, and a client sent to it anyway fails on every fallback.
    {
        let mut mismatched = start_edge_on(
            &work,
            "edge-mismatched",
            &v2_dir,
            &blue,
            "cloud-blue",
            &control_plane,
        );
        let address = mismatched.addr("http_addr");
        wait_for(&http, &address, "the mismatch was never seen", WAIT, |s| {
            s["cloud"]["state"] == "version_mismatch"
        })
        .await;
        let ready = http
            .get(format!("http://{address}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 503);
        let (code, reply) = retrieve(&http, &address, &v1.questions[0].question, K).await;
        assert_ne!(
            code, 200,
            "a version-2 edge answered through a version-1 cloud: {reply}"
        );
        mismatched.stop();
    }

    let endpoints = Arc::new(Mutex::new(
        old_edges
            .iter()
            .map(|e| e.addr("http_addr"))
            .collect::<Vec<_>>(),
    ));
    let questions: Arc<Vec<String>> = Arc::new(
        v1.questions
            .iter()
            .take(80)
            .map(|q| q.question.clone())
            .collect(),
    );
    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients(
        Arc::clone(&endpoints),
        Arc::clone(&questions),
        Arc::clone(&traffic),
        Arc::clone(&stop),
    );
    // The old edges learn from their fallbacks before the update.
    tokio::time::sleep(Duration::from_secs(4)).await;

    // The roll: one new edge started and ready, then one old edge out of the Service and
    // stopped; the hot cache carried over once the first new edge has registered version 2.
    let mut new_edges = Vec::new();
    for (i, mut old) in old_edges.into_iter().enumerate() {
        let name = format!("edge-v2-{i}");
        let edge = start_edge_on(&work, &name, &v2_dir, &green, "cloud-green", &control_plane);
        let address = edge.addr("http_addr");
        wait_ready(&http, &address, EDGE_READY).await;
        if i == 0 {
            let changed_ids: Vec<String> = changed.iter().map(u64::to_string).collect();
            admin_json(
                &[&control_plane],
                &[
                    "corpus-update",
                    "--from",
                    &old_version,
                    "--to",
                    &new_version,
                    "--changed-documents",
                    &changed_ids.join(","),
                ],
            );
            // Applied on the node a moment after the tool saw it committed.
            let deadline = std::time::Instant::now() + WAIT;
            let carried: Vec<_> = loop {
                let state = cluster.state(1).await;
                let carried: Vec<_> = state
                    .entries
                    .into_iter()
                    .filter_map(|stored| stored.entry)
                    .filter(|e| e.corpus_version == new_version)
                    .collect();
                if !carried.is_empty() {
                    break carried;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "nothing was carried over"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert!(
                carried
                    .iter()
                    .all(|e| e.document_ids.iter().all(|id| !revised.contains(id))),
                "an entry holding the revised document was carried over"
            );
            let carried = carried.len();
            // The new edge starts with the hot cache, before it takes any traffic.
            wait_for(
                &http,
                &address,
                "the carried entries never arrived",
                WAIT,
                |s| s["cached_queries"].as_u64() >= Some(carried as u64),
            )
            .await;
        }
        endpoints.lock().unwrap().push(address);
        let leaving = old.addr("http_addr");
        endpoints.lock().unwrap().retain(|e| *e != leaving);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let exited = tokio::task::block_in_place(|| old.terminate(Duration::from_secs(15)));
        assert!(
            exited.is_some_and(|s| s.success()),
            "{leaving} did not drain and exit: {exited:?}"
        );
        new_edges.push(edge);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let traffic = std::mem::take(&mut *traffic.lock().unwrap());
    assert!(
        traffic.failures.is_empty(),
        "{} failed requests during the update, first: {:?}",
        traffic.failures.len(),
        &traffic.failures[..traffic.failures.len().min(5)]
    );
    let new_addresses: Vec<String> = new_edges.iter().map(|e| e.addr("http_addr")).collect();
    let by = |edges_new: bool, outcome: &str| -> usize {
        traffic
            .answered
            .iter()
            .filter(|((edge, o), _)| new_addresses.contains(edge) == edges_new && o == outcome)
            .map(|(_, n)| n)
            .sum()
    };
    eprintln!("answered: {:?}", traffic.answered);
    assert!(
        by(false, "fallback") > 0,
        "the old edges never fell back to the old cloud"
    );
    // Whether a new edge still falls back depends on how much the carried cache already
    // answers (often everything the clients ask); that they reach the new cloud is what
    // their readiness, and the status below, say.
    assert!(
        by(true, "accepted") > 0,
        "the new edges never answered from their hot cache"
    );
    for address in &new_addresses {
        let now = status(&http, address).await;
        assert_eq!(now["corpus_version"], new_version.as_str(), "{now}");
        assert_eq!(now["cloud"]["state"], "verified", "{now}");
    }
}
