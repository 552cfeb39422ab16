//! Cross-edge learning through the Raft control plane, all real processes on loopback: three
//! `control-plane` nodes, one `cloud-index serve`, two `edge-node serve` following different
//! control-plane nodes. What edge A learns from a fallback, edge B uses.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_edge_node::has::in_edge_share;
use hasten_eval::process::ManagedProcess;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::auth::AccessToken;
use hasten_proto::control::{ControlAccess, connect};
use hasten_proto::v1::{ProposeRequest, SnapshotRequest, StatusRequest, SubscribeRequest};
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::{retrieve, status, wait_for};
use hasten_tests::{
    PAPER_VALIDATION, build_small_bundle, dev_cert, homologous_pair, model_dir,
    persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::Value;

const K: usize = 10;
/// How long an edge may take to apply what the control plane committed.
const WAIT: Duration = Duration::from_secs(15);

/// An edge named `name` that follows the control-plane nodes at `control_plane`, started
/// with `more` flags.
fn start_replicated_edge(
    work: &Path,
    name: &str,
    bundle: &Path,
    cloud: &ManagedProcess,
    cert: &Path,
    control_plane: &[&String],
    more: &[&str],
) -> ManagedProcess {
    // Which cached query an acceptance went through is what these tests check.
    let mut extra = vec![
        "--edge-id",
        name,
        "--set",
        "retrieval.expose_matched_query_text=true",
    ];
    extra.extend(PAPER_VALIDATION);
    extra.extend(more);
    for address in control_plane {
        extra.extend(["--control-plane", address.as_str()]);
    }
    start_edge(work, name, bundle, &cloud.addr("quic_addr"), cert, &extra).unwrap()
}

async fn ask(http: &reqwest::Client, edge: &str, question: &str) -> Value {
    let (code, reply) = retrieve(http, edge, question, K).await;
    assert_eq!(code, 200, "{reply}");
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_on_one_edge_is_accepted_on_another() {
    let mut cluster = Cluster::start("replicated-edges", 3, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    cluster.leader().await;
    let nodes: Vec<&String> = cluster.addresses.values().collect();
    let edge_a = start_replicated_edge(
        &work,
        "edge-a",
        &bundle_dir,
        &cloud,
        &cert,
        &nodes[..1],
        &[],
    );
    let edge_b = start_replicated_edge(
        &work,
        "edge-b",
        &bundle_dir,
        &cloud,
        &cert,
        &nodes[1..],
        &[],
    );
    let (a, b) = (edge_a.addr("http_addr"), edge_b.addr("http_addr"));
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let (first, sibling) = homologous_pair(&bundle, &encoder, K).unwrap();

    // Edge A falls back; its result is replicated to both edges, applied once on each.
    let reply = ask(&http, &a, &first.question).await;
    assert_eq!(reply["outcome"], "fallback", "{reply}");
    for edge in [&a, &b] {
        wait_for(&http, edge, "the entry never arrived", WAIT, |s| {
            s["cached_queries"] == 1 && s["control_plane"]["subscribed"] == true
        })
        .await;
    }
    // The control plane's metrics agree: one leader all nodes know in one term, three
    // proposals committed and their lag measured (each edge's corpus registration, then
    // the entry), both edges subscribed, all applied.
    let mut scrapes = Vec::new();
    for node in cluster.nodes.values() {
        let metrics = node.addr("metrics_addr");
        let ready = http
            .get(format!("http://{metrics}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 200);
        scrapes.push(Scrape::of(&metrics).await.unwrap());
    }
    let total = |name: &str, labels: &[(&str, &str)]| -> f64 {
        scrapes.iter().map(|s| s.value(name, labels)).sum()
    };
    assert_eq!(total("hasten_cp_is_leader", &[]), 1.0);
    assert_eq!(total("hasten_cp_has_leader", &[]), 3.0);
    assert_eq!(total("hasten_cp_is_voter", &[]), 3.0);
    assert_eq!(
        total("hasten_cp_proposals_total", &[("result", "committed")]),
        3.0
    );
    assert_eq!(total("hasten_cp_replication_lag_seconds_count", &[]), 3.0);
    assert_eq!(total("hasten_cp_subscribers", &[]), 2.0);
    let term = scrapes[0].value("hasten_cp_term", &[]);
    assert!(term >= 1.0);
    for scrape in &scrapes {
        assert_eq!(scrape.value("hasten_cp_term", &[]), term);
        assert_eq!(
            scrape.value("hasten_cp_applied_index", &[]),
            scrape.value("hasten_cp_commit_index", &[])
        );
    }

    // Edge B never saw the first question, yet accepts its homologous sibling.
    let reply = ask(&http, &b, &sibling.question).await;
    assert_eq!(
        reply["outcome"], "accepted",
        "sibling {:?} of {:?} on edge B: {reply}",
        sibling.question, first.question
    );
    assert_eq!(reply["matched_query"]["text"], first.question.as_str());

    // Edge B loses the node it follows; edge A keeps learning; B resumes on another node
    // and ends with the same cache as A.
    let b_follows = *cluster
        .addresses
        .iter()
        .find(|(_, address)| *address == nodes[1])
        .unwrap()
        .0;
    cluster.kill(b_follows);
    let mut asked = 1;
    for question in bundle.questions.iter().skip(1).step_by(7).take(6) {
        if ask(&http, &a, &question.question).await["outcome"] == "fallback" {
            asked += 1;
        }
    }
    wait_for(
        &http,
        &a,
        "edge A did not apply its own entries",
        WAIT,
        |s| s["cached_queries"] == asked,
    )
    .await;
    let a_status = status(&http, &a).await;
    wait_for(&http, &b, "edge B did not catch up", WAIT, |s| {
        s["cached_queries"] == asked
            && s["cached_documents"] == a_status["cached_documents"]
            && s["control_plane"]["applied_index"] == a_status["control_plane"]["applied_index"]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_serve_from_their_caches_while_the_control_plane_is_down_and_resync_after() {
    let mut cluster = Cluster::start("control-plane-down", 3, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    cluster.leader().await;
    let nodes: Vec<String> = cluster.addresses.values().cloned().collect();
    let all: Vec<&String> = nodes.iter().collect();
    let edge_a = start_replicated_edge(&work, "edge-a", &bundle_dir, &cloud, &cert, &all, &[]);
    let edge_b = start_replicated_edge(&work, "edge-b", &bundle_dir, &cloud, &cert, &all, &[]);
    let (a, b) = (edge_a.addr("http_addr"), edge_b.addr("http_addr"));
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let (first, sibling) = homologous_pair(&bundle, &encoder, K).unwrap();
    assert_eq!(ask(&http, &a, &first.question).await["outcome"], "fallback");
    for edge in [&a, &b] {
        wait_for(&http, edge, "the entry never arrived", WAIT, |s| {
            s["cached_queries"] == 1
        })
        .await;
    }

    // Every control-plane node down: both edges stay ready (bug: readiness required a live
    // subscription, so a control-plane outage took every edge out of its Service) and keep
    // answering, from their caches where the draft holds (edge B never saw the first
    // question) and from the cloud otherwise.
    let ids: Vec<u64> = cluster.addresses.keys().copied().collect();
    for id in &ids {
        cluster.kill(*id);
    }
    wait_for(
        &http,
        &b,
        "edge B still believes it is subscribed",
        WAIT,
        |s| s["control_plane"]["subscribed"] == false,
    )
    .await;
    for edge in [&a, &b] {
        let ready = http
            .get(format!("http://{edge}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            ready.status(),
            200,
            "{edge} left service without its control plane"
        );
    }
    let reply = ask(&http, &b, &sibling.question).await;
    assert_eq!(reply["outcome"], "accepted", "{reply}");
    let later = bundle
        .questions
        .iter()
        .filter(|q| q.entity != first.entity)
        .find(|q| q.question != sibling.question)
        .unwrap();
    assert_eq!(ask(&http, &a, &later.question).await["outcome"], "fallback");

    // The nodes restart from their sled directories: the edges subscribe again, edge A's
    // proposal made during the outage commits, and both end with both entries.
    for id in &ids {
        cluster.start_node(*id);
    }
    cluster.leader().await;
    for edge in [&a, &b] {
        wait_for(
            &http,
            edge,
            "the edge did not resync",
            Duration::from_secs(30),
            |s| s["control_plane"]["subscribed"] == true && s["cached_queries"] == 2,
        )
        .await;
    }
    let reply = ask(&http, &b, &later.question).await;
    assert_eq!(reply["outcome"], "accepted", "{reply}");
}

/// Edges holding a fraction of the corpus: an entry edge A learned names documents edge B
/// does not hold; B fetches them from the cloud by id, then accepts a homologous question
/// and serves the whole cached result, texts included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_holding_a_fraction_fetch_the_documents_of_replicated_entries() {
    const FRACTION: f64 = 0.3;
    let cluster = Cluster::start("replicated-fraction", 3, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    cluster.leader().await;
    let nodes: Vec<&String> = cluster.addresses.values().collect();
    let fraction = ["--set", "retrieval.corpus_fraction=0.3"];
    let edge_a = start_replicated_edge(
        &work,
        "edge-a",
        &bundle_dir,
        &cloud,
        &cert,
        &nodes,
        &fraction,
    );
    let edge_b = start_replicated_edge(
        &work,
        "edge-b",
        &bundle_dir,
        &cloud,
        &cert,
        &nodes,
        &fraction,
    );
    let (a, b) = (edge_a.addr("http_addr"), edge_b.addr("http_addr"));
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let (first, sibling) = homologous_pair(&bundle, &encoder, K).unwrap();

    let held = status(&http, &b).await["held_documents"].as_u64().unwrap() as usize;
    let share = bundle
        .documents
        .iter()
        .filter(|d| in_edge_share(d.id, FRACTION))
        .count();
    assert_eq!(held, share);
    assert!(held < bundle.len() / 2, "{held} of {}", bundle.len());

    let reply = ask(&http, &a, &first.question).await;
    assert_eq!(reply["outcome"], "fallback", "{reply}");
    let outside: Vec<u64> = reply["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .filter(|&id| !in_edge_share(id, FRACTION))
        .collect();
    assert!(!outside.is_empty(), "{reply}");
    wait_for(
        &http,
        &b,
        "edge B did not fetch the entry's documents",
        WAIT,
        |s| {
            s["cached_queries"] == 1
                && s["pending_documents"] == 0
                && s["fetched_documents"].as_u64() >= Some(outside.len() as u64)
        },
    )
    .await;
    // Its metrics say what its status says.
    let scrape = Scrape::of(&b).await.unwrap();
    let fetched = status(&http, &b).await["fetched_documents"]
        .as_f64()
        .unwrap();
    assert_eq!(scrape.value("hasten_edge_documents_held", &[]), held as f64);
    assert_eq!(
        scrape.value("hasten_edge_documents_fetched_total", &[]),
        fetched
    );
    assert_eq!(scrape.value("hasten_edge_documents_pending", &[]), 0.0);

    let reply = ask(&http, &b, &sibling.question).await;
    assert_eq!(reply["outcome"], "accepted", "{reply}");
    let served = reply["documents"].as_array().unwrap();
    assert!(
        served
            .iter()
            .any(|d| !in_edge_share(d["id"].as_u64().unwrap(), FRACTION)),
        "no document from outside B's share: {reply}"
    );
    for document in served {
        let id = document["id"].as_u64().unwrap();
        let held = bundle.documents.iter().find(|d| d.id == id).unwrap();
        assert_eq!(document["text"], held.text.as_str(), "document {id}");
    }
}

/// Bug: SIGSTOP one control-plane node of three (quorum intact) and every edge following
/// it froze: its proposals had no deadline and its stream no keepalive, so for as long as
/// the node hung nothing it proposed committed, nothing committed reached it, and it still
/// claimed to be subscribed. Now proposals have a deadline, connections HTTP/2 keepalive,
/// and the edge moves to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_control_plane_node_does_not_freeze_replication() {
    let cluster = Cluster::start("control-plane-hung-node", 3, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    let leader = cluster.leader().await;
    let hung = *cluster.addresses.keys().find(|id| **id != leader).unwrap();
    let others: Vec<&String> = cluster
        .addresses
        .iter()
        .filter(|(id, _)| **id != hung)
        .map(|(_, address)| address)
        .collect();
    // Edge A follows the node about to hang first, edge B another one.
    let mut a_nodes = vec![&cluster.addresses[&hung]];
    a_nodes.extend(others.iter().copied());
    let mut b_nodes = others.clone();
    b_nodes.push(&cluster.addresses[&hung]);
    let edge_a = start_replicated_edge(&work, "edge-a", &bundle_dir, &cloud, &cert, &a_nodes, &[]);
    let edge_b = start_replicated_edge(&work, "edge-b", &bundle_dir, &cloud, &cert, &b_nodes, &[]);
    let (a, b) = (edge_a.addr("http_addr"), edge_b.addr("http_addr"));
    let http = reqwest::Client::new();
    for edge in [&a, &b] {
        wait_for(&http, edge, "the edge never subscribed", WAIT, |s| {
            s["control_plane"]["subscribed"] == true
        })
        .await;
    }

    cluster.pause(hung);
    // Fallbacks on both edges while the node hangs; each must reach both edges.
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let mut fallbacks = 0;
    for (i, question) in bundle.questions.iter().step_by(11).take(8).enumerate() {
        let edge = if i % 2 == 0 { &a } else { &b };
        if ask(&http, edge, &question.question).await["outcome"] == "fallback" {
            fallbacks += 1;
        }
    }
    assert!(fallbacks >= 4, "only {fallbacks} fallbacks");
    for edge in [&a, &b] {
        wait_for(
            &http,
            edge,
            "replication stayed frozen behind the hung node",
            Duration::from_secs(30),
            |s| s["cached_queries"] == fallbacks && s["control_plane"]["subscribed"] == true,
        )
        .await;
    }
    let a_status = status(&http, &a).await;
    assert_eq!(a_status["control_plane"]["dropped"], 0, "{a_status}");

    // The node comes back and catches up: nothing was lost.
    cluster.resume(hung);
    let commit = cluster.status(leader).await.unwrap().commit_index;
    cluster.applied_everywhere(commit).await;
    assert_eq!(cluster.state(hung).await.entries.len(), fallbacks);
}

/// A control plane started with a token (as one without mutual TLS must be outside
/// loopback): its nodes elect a leader carrying the token to each other, a client without
/// it or with another is refused on every call (UNAUTHENTICATED), and an edge given the
/// token's file registers, proposes and follows as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_only_its_holders_reach_the_control_plane() {
    const TOKEN: &str = "cp-shared-token-5b8e1f0a9c";
    let secrets = persistent_work_dir("control-plane-token-file").unwrap();
    let token_file = secrets.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_path = token_file.display().to_string();
    let mut cluster = Cluster::start_with(
        "control-plane-token",
        3,
        10_000,
        &["--auth-token-file", &token_path],
    );
    cluster.access.token = AccessToken::new(TOKEN);
    let leader = cluster.leader().await;
    let address = &cluster.addresses[&leader];

    let without = ControlAccess::default();
    let other = ControlAccess {
        tls: None,
        token: AccessToken::new("not-the-shared-token-0000"),
    };
    for access in [&without, &other] {
        let mut client = connect(address, access).await.unwrap();
        let refusals = [
            client.status(StatusRequest {}).await.map(|_| ()),
            client
                .propose(ProposeRequest { commands: vec![] })
                .await
                .map(|_| ()),
            client.snapshot(SnapshotRequest {}).await.map(|_| ()),
            client
                .subscribe(SubscribeRequest {
                    from_index: 1,
                    subscriber: "intruder".into(),
                })
                .await
                .map(|_| ()),
        ];
        for refusal in refusals {
            let status = refusal.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");
        }
    }

    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "cloud");
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &cloud.addr("quic_addr"),
        &cert,
        &[
            "--control-plane",
            address,
            "--control-plane-token-file",
            &token_path,
        ],
    )
    .unwrap();
    let edge = edge.addr("http_addr");
    let http = reqwest::Client::new();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let reply = ask(&http, &edge, &bundle.questions[0].question).await;
    assert_eq!(reply["outcome"], "fallback", "{reply}");
    wait_for(
        &http,
        &edge,
        "the edge's entry never came back",
        WAIT,
        |s| s["cached_queries"] == 1 && s["control_plane"]["subscribed"] == true,
    )
    .await;
}
