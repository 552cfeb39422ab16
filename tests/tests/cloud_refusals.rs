//! What the cloud tier refuses up front, as real processes: a search whose answer could not
//! be sent (refused before any work, by a shard and by a router), and a bundle whose
//! contents do not match its manifest (refused by `cloud-index serve` at start).

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_core::corpus::Document;
use hasten_eval::process::{ManagedProcess, ProcessError, binary, cloud_index_route_args};
use hasten_proto::v1::cloud_index_client::CloudIndexClient;
use hasten_proto::v1::{QueryVector, SearchRequest};
use hasten_tests::{build_small_bundle, persistent_work_dir, start_cloud_index};

const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Resident memory a refused search may leave behind: decoding the 1.5 MB request and
/// allocator noise, far below the gigabytes an answer of this size takes.
const REFUSAL_MEMORY_BYTES: u64 = 40 * 1024 * 1024;

/// `queries` document vectors of `bundle` (the right dimension), `k`, with vectors and texts.
fn search(bundle: &CorpusBundle, queries: usize, k: u32) -> SearchRequest {
    SearchRequest {
        queries: (0..queries)
            .map(|i| QueryVector {
                values: bundle.vector(i % bundle.len()).to_vec(),
            })
            .collect(),
        k,
        include_vectors: true,
        include_texts: true,
        timeout_ms: 60_000,
        allow_partial: false,
    }
}

/// Sends the tester's search (1,024 queries x k = 1,000 with vectors and texts) to the
/// gRPC API of `server` and checks that it is refused as an invalid argument at once,
/// without the process growing; then that an edge-sized search still gets its answer.
async fn refuses_an_oversized_answer(server: &ManagedProcess, bundle: &CorpusBundle) {
    let mut client = CloudIndexClient::connect(format!("http://{}", server.addr("grpc_addr")))
        .await
        .unwrap();
    let oversized = search(bundle, 1024, 1000);
    let before = server.resident_bytes().unwrap();
    let started = Instant::now();
    let mut request = tonic::Request::new(oversized);
    request.set_timeout(Duration::from_secs(60));
    let status = client.search(request).await.unwrap_err();
    let took = started.elapsed();
    let grown = server.resident_bytes().unwrap().saturating_sub(before);
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{} answered after {took:?}, {grown} bytes larger: {status:?}",
        server.name
    );
    for named in ["queries", "k", "include_vectors", "include_texts"] {
        assert!(
            status.message().contains(named),
            "{}: the refusal should name `{named}`: {}",
            server.name,
            status.message()
        );
    }
    assert!(
        took < Duration::from_millis(500),
        "{} refused after {took:?}",
        server.name
    );
    assert!(
        grown < REFUSAL_MEMORY_BYTES,
        "{} grew by {grown} bytes answering a refusal",
        server.name
    );

    let answer = client
        .search(search(bundle, 1, 10))
        .await
        .unwrap()
        .into_inner();
    let hits = &answer.results[0].hits;
    assert_eq!(hits.len(), 10, "{}", server.name);
    assert!(
        hits.iter()
            .all(|h| h.vector.len() == bundle.dimension() && !h.text.is_empty()),
        "{}: an edge-sized answer lost its contents",
        server.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_to_send_is_refused_before_any_work_by_a_shard_and_a_router() {
    let work = persistent_work_dir("cloud-refusals-answer").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, Some(2)).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let shards: Vec<ManagedProcess> = (0..2)
        .map(|i| {
            let shard = bundle_dir.join("shards").join(format!("shard-{i}"));
            start_cloud_index(&work, &format!("shard-{i}"), &shard, "127.0.0.1:0").unwrap()
        })
        .collect();
    refuses_an_oversized_answer(&shards[0], &bundle).await;

    let map: Vec<Vec<String>> = shards.iter().map(|s| vec![s.addr("grpc_addr")]).collect();
    let router = ManagedProcess::start(
        "router",
        &binary("cloud-index").unwrap(),
        cloud_index_route_args(&map, &work.join("router.pem")),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    refuses_an_oversized_answer(&router, &bundle).await;
}

/// Copies the files of the bundle at `from` (not its shards) to a fresh `to`.
fn copy_bundle(from: &Path, to: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
    to.to_path_buf()
}

/// Starts `cloud-index serve` over `bundle`, which must refuse to start; returns its whole
/// log (the error's tail may be only a backtrace when `RUST_BACKTRACE` is set).
fn refused_start(work: &Path, name: &str, bundle: &Path) -> String {
    match start_cloud_index(work, name, bundle, "127.0.0.1:0") {
        Ok(server) => panic!("{name} served a tampered bundle: {}", server.log_tail()),
        Err(err) => match err.downcast::<ProcessError>().unwrap() {
            ProcessError::Exited { .. } => {
                std::fs::read_to_string(work.join(format!("{name}.log"))).unwrap()
            }
            other => panic!("{name} did not exit: {other}"),
        },
    }
}

#[test]
fn serve_refuses_a_bundle_whose_contents_do_not_match_its_manifest() {
    let work = persistent_work_dir("cloud-refusals-bundle").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, Some(2)).unwrap();

    // A document's text edited after the build, in a shard (whose manifest carries the
    // whole corpus's version).
    let shard = copy_bundle(
        &bundle_dir.join("shards").join("shard-0"),
        &work.join("edited-shard"),
    );
    let documents = shard.join("documents.jsonl");
    let mut lines: Vec<Document> = std::fs::read_to_string(&documents)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    lines[3].text.push_str(" (edited)");
    let edited: Vec<String> = lines
        .iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect();
    std::fs::write(&documents, edited.join("\n") + "\n").unwrap();
    let log = refused_start(&work, "edited-shard", &shard);
    assert!(
        log.contains("documents.jsonl") && log.contains("rebuild"),
        "{log}"
    );

    // A NaN in a vector of the whole bundle.
    let whole = copy_bundle(&bundle_dir, &work.join("nan-vector"));
    let vectors = whole.join("vectors.f32");
    let mut bytes = std::fs::read(&vectors).unwrap();
    let dimension = CorpusBundle::load(&bundle_dir).unwrap().dimension();
    let row = 5;
    bytes[row * dimension * 4..row * dimension * 4 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&vectors, bytes).unwrap();
    let log = refused_start(&work, "nan-vector", &whole);
    assert!(
        log.contains("vectors.f32") && log.contains("row 5") && log.contains("rebuild"),
        "{log}"
    );
}
