//! What edges cache when the control plane decides: real `control-plane`, `cloud-index` and
//! `edge-node` processes on loopback, entries proposed straight to the control plane's gRPC
//! API (as an operator's tool or another edge would), and each edge's cache compared with
//! the replicated state machine's.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use hasten_core::bundle::{CorpusBundle, write_bundle};
use hasten_eval::process::ManagedProcess;
use hasten_loadtest::scrape::Scrape;
use hasten_proto::control::ControlClient;
use hasten_proto::v1::{
    CacheEntry, ControlCommand, ControlState, CorpusUpdate, ProposeRequest, RuntimeConfig,
    control_command,
};
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::{status, wait_for};
use hasten_tests::{build_small_bundle, dev_cert, start_cloud_index, start_edge};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// An entry of `tenant` default for `corpus_version`, its query vector the bundle's row
/// `row` and its documents `documents`.
fn entry(
    bundle: &CorpusBundle,
    seq: u64,
    row: usize,
    documents: Vec<u64>,
    corpus_version: &str,
) -> ControlCommand {
    ControlCommand {
        kind: Some(control_command::Kind::Insert(CacheEntry {
            origin: "operator-test".into(),
            origin_seq: seq,
            text: Some(format!("question {seq}")),
            vector: bundle.vector(row).to_vec(),
            document_ids: documents,
            tenant: "default".into(),
            corpus_version: corpus_version.into(),
        })),
    }
}

async fn propose(client: &mut ControlClient, commands: Vec<ControlCommand>) -> u64 {
    client
        .propose(ProposeRequest { commands })
        .await
        .unwrap()
        .into_inner()
        .index
}

fn capacity(capacity: u64) -> ControlCommand {
    ControlCommand {
        kind: Some(control_command::Kind::Config(RuntimeConfig {
            tau: None,
            cache_capacity: Some(capacity),
        })),
    }
}

/// Registers `bundle`'s corpus, as its edges do when they start (done here so that the
/// test's own proposals need not wait for them).
async fn register(cluster: &Cluster, bundle: &CorpusBundle) {
    let max_document_id = bundle.documents.iter().map(|d| d.id).max().unwrap();
    cluster
        .register_corpus(
            &bundle.manifest.corpus_version,
            bundle.dimension() as u32,
            max_document_id,
        )
        .await;
}

/// An edge on `bundle` following the control plane at `control_plane`, with `extra` flags.
fn replicated_edge(
    work: &Path,
    name: &str,
    bundle: &Path,
    cloud: &ManagedProcess,
    control_plane: &str,
    extra: &[&str],
) -> ManagedProcess {
    let mut args = vec!["--edge-id", name, "--control-plane", control_plane];
    args.extend_from_slice(extra);
    start_edge(
        work,
        name,
        bundle,
        &cloud.addr("quic_addr"),
        &dev_cert(work, "cloud"),
        &args,
    )
    .unwrap()
}

/// (entries, distinct documents) the state holds, of `corpus_version` only when given.
fn expected(state: &ControlState, corpus_version: Option<&str>) -> (usize, usize) {
    let entries: Vec<&CacheEntry> = state
        .entries
        .iter()
        .filter_map(|e| e.entry.as_ref())
        .filter(|e| corpus_version.is_none_or(|v| e.corpus_version == v))
        .collect();
    let documents: BTreeSet<u64> = entries
        .iter()
        .flat_map(|e| e.document_ids.iter().copied())
        .collect();
    (entries.len(), documents.len())
}

/// Waits until the edge has applied `index` and holds `queries` queries over `documents`
/// documents.
async fn edge_holds(http: &reqwest::Client, edge: &str, index: u64, holds: (usize, usize)) {
    let what = format!("the edge never held {holds:?} at index {index}");
    wait_for(http, edge, &what, WAIT, |s: &Value| {
        s["control_plane"]["applied_index"].as_u64() >= Some(index)
            && s["cached_queries"] == holds.0
            && s["cached_documents"] == holds.1
    })
    .await;
}

/// Bug: each edge's hot cache evicted FIFO by its own `cache_capacity` beside the control
/// plane's state machine, and never applied the replicated capacity, so raising it left
/// every edge holding fewer entries than the log. With a control plane, evictions now come
/// only from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_hold_what_the_state_machine_holds_whatever_their_own_capacity() {
    let cluster = Cluster::start("replicated-capacity", 1, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let version = bundle.manifest.corpus_version.clone();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    register(&cluster, &bundle).await;
    let control_plane = cluster.addresses[&1].clone();
    // Both edges would keep 3 entries by themselves.
    let edges: Vec<ManagedProcess> = ["edge-a", "edge-b"]
        .iter()
        .map(|name| {
            replicated_edge(
                &work,
                name,
                &bundle_dir,
                &cloud,
                &control_plane,
                &["--set", "retrieval.cache_capacity=3"],
            )
        })
        .collect();
    let http = reqwest::Client::new();
    let mut client = cluster.client(1).await;
    propose(&mut client, vec![capacity(6)]).await;
    // Nine entries over overlapping document ranges: past both capacities.
    let mut last = 0;
    for seq in 1..=9u64 {
        let first = seq * 3;
        let documents = (first..first + 10).collect();
        last = propose(
            &mut client,
            vec![entry(&bundle, seq, seq as usize, documents, &version)],
        )
        .await;
    }
    let holds = expected(&cluster.state(1).await, None);
    assert_eq!(
        holds.0, 6,
        "the state machine keeps its replicated capacity"
    );
    for edge in &edges {
        edge_holds(&http, &edge.addr("http_addr"), last, holds).await;
        let now = status(&http, &edge.addr("http_addr")).await;
        assert_eq!(now["cache_capacity"], Value::Null, "{now}");
    }

    // Shrinking the capacity evicts on every edge what the state machine evicts.
    let last = propose(&mut client, vec![capacity(2)]).await;
    let holds = expected(&cluster.state(1).await, None);
    assert_eq!(holds.0, 2);
    for edge in &edges {
        edge_holds(&http, &edge.addr("http_addr"), last, holds).await;
    }
}

/// Bug: cache entries did not carry the corpus version, so after a corpus update an edge
/// could serve a replicated entry whose document ids changed meaning. Entries now carry it,
/// an edge caches only its own version's, and a corpus update drops the entries that hold
/// a changed document and carries the others over to the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corpus_update_drops_changed_entries_and_carries_the_rest_to_the_new_version() {
    let cluster = Cluster::start("replicated-corpus-update", 1, 10_000);
    let work = cluster.work.clone();
    let (v1_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let v1 = CorpusBundle::load(&v1_dir).unwrap();
    // Version 2: the same corpus with document 0's text edited.
    let changed = v1.documents[0].id;
    let mut documents = v1.documents.clone();
    documents[0].text.push_str(" (revised)");
    let v2_dir = work.join("bundle-v2");
    let _ = std::fs::remove_dir_all(&v2_dir);
    write_bundle(
        &v2_dir,
        vec!["test".into()],
        &documents,
        v1.vectors(),
        v1.dimension(),
        &v1.questions,
    )
    .unwrap();
    let v2 = CorpusBundle::load(&v2_dir).unwrap();
    let (old, new) = (
        v1.manifest.corpus_version.clone(),
        v2.manifest.corpus_version.clone(),
    );
    assert_ne!(old, new);

    let cloud = start_cloud_index(&work, "cloud", &v1_dir, "127.0.0.1:0").unwrap();
    register(&cluster, &v1).await;
    register(&cluster, &v2).await;
    let control_plane = cluster.addresses[&1].clone();
    let edge_v1 = replicated_edge(&work, "edge-v1", &v1_dir, &cloud, &control_plane, &[]);
    let edge_v2 = replicated_edge(&work, "edge-v2", &v2_dir, &cloud, &control_plane, &[]);
    let (a, b) = (edge_v1.addr("http_addr"), edge_v2.addr("http_addr"));
    let http = reqwest::Client::new();
    let mut client = cluster.client(1).await;
    // Version 1: one entry holds the changed document, another does not; version 2: one.
    let holding_changed = (0..10).map(|d| changed + d).collect::<Vec<u64>>();
    let untouched = (20..30).collect::<Vec<u64>>();
    let last = propose(
        &mut client,
        vec![
            entry(&v1, 1, 1, holding_changed, &old),
            entry(&v1, 2, 2, untouched.clone(), &old),
            entry(&v2, 3, 3, (40..50).collect(), &new),
        ],
    )
    .await;
    edge_holds(&http, &a, last, (2, 20)).await;
    edge_holds(&http, &b, last, (1, 10)).await;
    let skipped = status(&http, &b).await["skipped_entries"]["corpus_version"].clone();
    assert_eq!(
        skipped, 2,
        "the version-2 edge skips version-1 entries, and counts them"
    );

    let update = ControlCommand {
        kind: Some(control_command::Kind::CorpusUpdate(CorpusUpdate {
            from_version: old.clone(),
            to_version: new.clone(),
            changed_document_ids: vec![changed],
        })),
    };
    let last = propose(&mut client, vec![update]).await;
    let state = cluster.state(1).await;
    assert_eq!(expected(&state, Some(&old)), (0, 0));
    assert_eq!(expected(&state, Some(&new)), (2, 20));
    // The version-1 edge loses both its entries (one invalid, one now version 2's); the
    // version-2 edge gains the carried one.
    edge_holds(&http, &a, last, (0, 0)).await;
    edge_holds(&http, &b, last, (2, 20)).await;
    let b_now = status(&http, &b).await;
    assert_eq!(b_now["corpus_version"], new.as_str());
    // Facing a cloud of another corpus version, the version-2 edge is not ready, and says
    // why.
    let ready = http.get(format!("http://{b}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let reason = ready.text().await.unwrap();
    assert!(reason.contains("corpus version"), "{reason}");
    // ... and so do its metric and its log.
    let link = Scrape::of(&b)
        .await
        .unwrap()
        .value("hasten_edge_cloud_link", &[("state", "version_mismatch")]);
    assert_eq!(link, 1.0);
    let log = std::fs::read_to_string(&edge_v2.log).unwrap();
    assert!(
        log.contains("the cloud index serves another corpus version"),
        "{}",
        edge_v2.log_tail()
    );
}

/// Bug: the control plane committed entries no edge could apply (a 3-dimensional vector,
/// document id 99999999), which the edges then skipped silently. An edge now registers its
/// corpus when it starts, and the control plane refuses, before the log, entries of an
/// unregistered corpus or that do not fit theirs; what an edge still skips it counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_that_fit_no_edge_are_refused_before_the_log() {
    let cluster = Cluster::start("replicated-refusals", 1, 10_000);
    let work = cluster.work.clone();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let version = bundle.manifest.corpus_version.clone();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    cluster.leader().await;
    let control_plane = cluster.addresses[&1].clone();
    let edge = replicated_edge(&work, "edge", &bundle_dir, &cloud, &control_plane, &[]);
    let http = reqwest::Client::new();
    // The edge registers its own corpus.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let state = cluster.state(1).await;
        if let Some(facts) = state.corpora.iter().find(|c| c.corpus_version == version) {
            assert_eq!(facts.dimension as usize, bundle.dimension());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never registered its corpus"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = cluster.client(1).await;
    let refused = |commands: Vec<ControlCommand>| {
        let mut client = client.clone();
        async move {
            client
                .propose(ProposeRequest { commands })
                .await
                .unwrap_err()
        }
    };
    let mut flat = entry(&bundle, 1, 1, vec![1, 2], &version);
    if let Some(control_command::Kind::Insert(e)) = &mut flat.kind {
        e.vector = vec![1.0, 0.0, 0.0];
    }
    let refusal = refused(vec![flat]).await;
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal:?}");
    assert!(
        refusal.message().contains("3 dimensions"),
        "{}",
        refusal.message()
    );
    let refusal = refused(vec![entry(&bundle, 2, 1, vec![1, 99_999_999], &version)]).await;
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal:?}");
    assert!(
        refusal.message().contains("99999999"),
        "{}",
        refusal.message()
    );
    let refusal = refused(vec![entry(&bundle, 3, 1, vec![1], "no-such-corpus")]).await;
    assert_eq!(
        refusal.code(),
        tonic::Code::FailedPrecondition,
        "{refusal:?}"
    );
    // What fits is committed, and every edge applies it: nothing was skipped.
    let last = propose(
        &mut client,
        vec![entry(&bundle, 4, 1, (0..10).collect(), &version)],
    )
    .await;
    edge_holds(&http, &edge.addr("http_addr"), last, (1, 10)).await;
    let now = status(&http, &edge.addr("http_addr")).await;
    assert_eq!(now["skipped_entries"]["malformed"], 0, "{now}");
    assert_eq!(cluster.state(1).await.entries.len(), 1);
}
