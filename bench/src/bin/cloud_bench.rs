//! `hasten-cloud-bench`: the sharded cloud tier against one in-process faiss index.
//!
//! Generates seeded clustered vectors (default 1,000,000 x 384), cuts them into shard
//! bundles with the real `write_shards`, starts the shard servers and a router as real
//! processes, and measures, in one run:
//! - single-query latency through the router (QUIC, as an edge asks) against a faiss flat
//!   index over all vectors in this process, queries alternating between the two;
//! - closed-loop throughput through the router at several concurrencies, with the shards'
//!   micro-batching on and then off;
//! - in-process batched throughput under each OpenMP/OpenBLAS thread split, and the
//!   arithmetic it achieves against the CPU's peak.
//!
//! Writes `report.json` and `report.md` to the work directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::{Latencies, clustered_vectors};
use hasten_core::bundle::{FORMAT_VERSION, read_manifest, write_shards};
use hasten_core::corpus::Document;
use hasten_core::index::ExactIndex;
use hasten_core::threads::{ComputeThreads, set_blas_min_batch, set_compute_threads};
use hasten_edge_node::fallback::CloudSearch;
use hasten_edge_node::fallback::quic::{CloudEndpoint, QuicCloudClient};
use hasten_eval::process::{
    ManagedProcess, binary, cloud_index_route_args, cloud_index_serve_args,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "hasten-cloud-bench",
    about = "Sharded cloud tier (real processes) against one in-process faiss flat index"
)]
struct Cli {
    /// Vectors in the corpus.
    #[arg(long, default_value_t = 1_000_000)]
    vectors: usize,
    /// Shards to cut the corpus into.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    #[arg(long, default_value_t = 384)]
    dimension: usize,
    /// Clusters of the synthetic corpus.
    #[arg(long, default_value_t = 1000)]
    topics: usize,
    /// Per-dimension noise around a cluster centre (0.05: members at cosine ~0.7 from it).
    #[arg(long, default_value_t = 0.05)]
    spread: f32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Hits per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Queries of the single-query latency comparison (each runs on both sides).
    #[arg(long, default_value_t = 200)]
    latency_queries: usize,
    /// Concurrencies of the throughput runs.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    concurrency: Vec<usize>,
    /// Seconds of each throughput run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// OpenBLAS threads of each shard server (OpenMP stays at its default of 1); the shards
    /// share this machine's cores.
    #[arg(long, default_value_t = 1)]
    shard_blas_threads: usize,
    /// Batch size of the in-process thread-split measurement.
    #[arg(long, default_value_t = 256)]
    thread_batch: usize,
    /// Micro-batching modes to measure (shards and router alike): `on`, `off` or both.
    #[arg(long, value_delimiter = ',', default_value = "on,off")]
    batching: Vec<BatchingMode>,
    /// Measure in process only (thread splits and batch sizes), without the cluster.
    #[arg(long)]
    in_process_only: bool,
    /// Work directory: shard bundles (kept between runs), logs, report.
    #[arg(long, default_value = "run/cloud-bench")]
    work: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BatchingMode {
    On,
    Off,
}

fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.work)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(cli))
}

/// The generation parameters, recorded as the bundles' source so a rerun with the same
/// parameters reuses them.
fn source_tag(cli: &Cli) -> String {
    format!(
        "synthetic-clustered n={} d={} topics={} spread={} seed={}",
        cli.vectors, cli.dimension, cli.topics, cli.spread, cli.seed
    )
}

/// Query vectors near random cluster centres, like questions about a topic.
fn queries_near(
    centres: &[f32],
    dimension: usize,
    n: usize,
    spread: f32,
    seed: u64,
) -> Result<Vec<Vec<f32>>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let noise = Normal::new(0.0f32, spread).context("--spread must be a finite deviation")?;
    let topics = centres.len() / dimension;
    Ok((0..n)
        .map(|_| {
            let t = rng.random_range(0..topics);
            let v: Vec<f32> = centres[t * dimension..(t + 1) * dimension]
                .iter()
                .map(|c| c + noise.sample(&mut rng))
                .collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.into_iter().map(|x| x / norm).collect()
        })
        .collect())
}

fn shard_dir(cli: &Cli) -> PathBuf {
    cli.work.join(format!("shards-{}", cli.shards))
}

/// Writes the shard bundles unless bundles of the same parameters are already there.
fn ensure_shards(cli: &Cli, vectors: &[f32]) -> Result<()> {
    let dir = shard_dir(cli);
    let tag = source_tag(cli);
    let current = (0..cli.shards).all(|i| {
        read_manifest(&dir.join(format!("shard-{i}"))).is_ok_and(|m| {
            m.format_version == FORMAT_VERSION
                && m.sources == [tag.clone()]
                && m.shard.is_some_and(|s| s.count == cli.shards)
        })
    });
    if current {
        tracing::info!(dir = %dir.display(), "reusing shard bundles");
        return Ok(());
    }
    let documents: Vec<Document> = (0..cli.vectors as u64)
        .map(|id| Document {
            id,
            title: String::new(),
            text: String::new(),
        })
        .collect();
    let started = Instant::now();
    write_shards(
        &dir,
        vec![tag],
        &documents,
        vectors,
        cli.dimension,
        cli.shards,
    )?;
    tracing::info!(dir = %dir.display(), seconds = started.elapsed().as_secs_f64(), "shard bundles written");
    Ok(())
}

/// Shard servers and a router, as real processes.
struct Cluster {
    shards: Vec<ManagedProcess>,
    router: ManagedProcess,
    client: QuicCloudClient,
}

impl Cluster {
    fn start(cli: &Cli, batching: bool, corpus_version: &str) -> Result<Self> {
        let bin = binary("cloud-index")?;
        let timeout = Duration::from_secs(300);
        let mut shards = Vec::new();
        for i in 0..cli.shards {
            let name = format!("shard-{i}");
            let bundle = shard_dir(cli).join(&name);
            let mut args = cloud_index_serve_args(
                &bundle,
                "127.0.0.1:0",
                &cli.work.join(format!("{name}.pem")),
            );
            args.extend([
                "--set".into(),
                format!("batching.enabled={batching}"),
                "--set".into(),
                format!("openblas_threads={}", cli.shard_blas_threads),
            ]);
            shards.push(ManagedProcess::start(
                &name, &bin, &args, &cli.work, timeout,
            )?);
        }
        let endpoints: Vec<Vec<String>> =
            shards.iter().map(|s| vec![s.addr("grpc_addr")]).collect();
        let mut args = cloud_index_route_args(&endpoints, &cli.work.join("router.pem"));
        args.extend([
            "--set".into(),
            "request_timeout_ms=60000".into(),
            "--set".into(),
            "attempt_timeout_ms=60000".into(),
            "--set".into(),
            format!("batching.enabled={batching}"),
        ]);
        let router = ManagedProcess::start("router", &bin, &args, &cli.work, timeout)?;
        let addr: SocketAddr = router
            .addr("quic_addr")
            .parse()
            .context("router QUIC address")?;
        let client = QuicCloudClient::new(
            hasten_proto::quic::client_config(
                &hasten_proto::tls::TrustRoots::from_pem_file(&cli.work.join("router.pem"))?,
                None,
            )?,
            CloudEndpoint {
                addr: addr.to_string(),
                server_name: "localhost".into(),
                timeout: Duration::from_secs(60),
                corpus_version: corpus_version.to_string(),
            },
        )?;
        Ok(Self {
            shards,
            router,
            client,
        })
    }

    fn resident_bytes(&self) -> Value {
        json!({
            "router": self.router.resident_bytes(),
            "shards": self.shards.iter().map(ManagedProcess::resident_bytes).collect::<Vec<_>>(),
        })
    }
}

fn percentiles(latencies: &Latencies) -> Value {
    json!({
        "n": latencies.len(),
        "p50_ms": latencies.quantile_ms(0.5),
        "p99_ms": latencies.quantile_ms(0.99),
    })
}

/// Single queries, one at a time, alternating between the in-process index and the router.
async fn single_query_latency(
    cli: &Cli,
    index: &ExactIndex,
    cluster: &Cluster,
    queries: &[Vec<f32>],
) -> Result<Value> {
    let (mut local, mut routed) = (Latencies::default(), Latencies::default());
    let mut disagreements = 0;
    for query in queries.iter().take(cli.latency_queries) {
        let started = Instant::now();
        let exact = index.search(query, cli.k)?;
        local.record(started.elapsed());
        let started = Instant::now();
        let docs = cluster.client.search(query, cli.k, None).await?;
        routed.record(started.elapsed());
        let exact_ids: Vec<u64> = exact
            .first()
            .map(|h| h.iter().map(|h| h.id).collect())
            .unwrap_or_default();
        let routed_ids: Vec<u64> = docs.iter().map(|d| d.id).collect();
        if exact_ids != routed_ids {
            disagreements += 1;
        }
    }
    if disagreements > 0 {
        bail!("{disagreements} routed answers differ from the in-process exact answer");
    }
    let (lp50, rp50) = (local.quantile_ms(0.5), routed.quantile_ms(0.5));
    Ok(json!({
        "in_process": percentiles(&local),
        "router": percentiles(&routed),
        "router_over_in_process_p50": rp50 / lp50,
        "router_p50_overhead_pct": (rp50 / lp50 - 1.0) * 100.0,
    }))
}

/// Closed loop: `concurrency` callers each send their next query as soon as the last is
/// answered, for `seconds`.
async fn throughput(
    cluster: &Arc<Cluster>,
    queries: &Arc<Vec<Vec<f32>>>,
    k: usize,
    concurrency: usize,
    seconds: f64,
) -> Result<Value> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let callers: Vec<_> = (0..concurrency)
        .map(|caller| {
            let (cluster, queries, stop) =
                (Arc::clone(cluster), Arc::clone(queries), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut latencies = Latencies::default();
                let mut i = caller;
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    cluster
                        .client
                        .search(&queries[i % queries.len()], k, None)
                        .await?;
                    latencies.record(sent.elapsed());
                    i += concurrency;
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Latencies::default();
    for caller in callers {
        all.merge(&caller.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let qps = all.len() as f64 / elapsed;
    tracing::info!(concurrency, qps = format!("{qps:.1}"), "throughput");
    Ok(json!({
        "concurrency": concurrency,
        "queries": all.len(),
        "seconds": elapsed,
        "qps": qps,
        "p50_ms": all.quantile_ms(0.5),
        "p99_ms": all.quantile_ms(0.99),
    }))
}

/// Seconds of the fastest of 3 searches of the row-major batch `flat`, after one warm-up.
fn best_batch_seconds(index: &ExactIndex, flat: &[f32], k: usize) -> Result<f64> {
    index.search(flat, k)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        index.search(flat, k)?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Batched in-process throughput under each OpenMP/OpenBLAS split.
fn thread_splits(
    index: &ExactIndex,
    queries: &[Vec<f32>],
    batch: usize,
    k: usize,
) -> Result<Value> {
    let flat: Vec<f32> = queries.iter().take(batch).flatten().copied().collect();
    let n = flat.len() / index_dimension(queries);
    let mut rows = Vec::new();
    for (openmp, openblas) in [(2, 1), (1, 2), (2, 2), (1, 1)] {
        let applied: ComputeThreads = set_compute_threads(openmp, openblas);
        set_blas_min_batch(4);
        let best = best_batch_seconds(index, &flat, k)?;
        let qps = n as f64 / best;
        tracing::info!(openmp, openblas, qps = format!("{qps:.1}"), "thread split");
        rows.push(json!({
            "openmp": applied.openmp,
            "openblas": applied.openblas,
            "batch": n,
            "qps": qps,
        }));
    }
    set_compute_threads(1, 1);
    Ok(Value::Array(rows))
}

/// In-process throughput by batch size, one thread each for OpenMP and OpenBLAS: what one
/// shard process on one core gains from coalescing.
fn batch_sizes(index: &ExactIndex, queries: &[Vec<f32>], k: usize) -> Result<Value> {
    set_compute_threads(1, 1);
    set_blas_min_batch(2);
    let mut rows = Vec::new();
    for batch in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
        let flat: Vec<f32> = queries.iter().take(batch).flatten().copied().collect();
        let best = best_batch_seconds(index, &flat, k)?;
        let qps = batch as f64 / best;
        tracing::info!(
            batch,
            ms = best * 1e3,
            qps = format!("{qps:.1}"),
            "batch size"
        );
        rows.push(json!({"batch": batch, "ms": best * 1e3, "qps": qps}));
    }
    Ok(Value::Array(rows))
}

fn index_dimension(queries: &[Vec<f32>]) -> usize {
    queries.first().map_or(1, Vec::len).max(1)
}

fn markdown(report: &Value) -> String {
    let mut md = String::new();
    let s = &report["single_query"];
    md.push_str(&format!(
        "Corpus: {} vectors x {} dims in {} shards.\n\n",
        report["vectors"], report["dimension"], report["shards"]
    ));
    md.push_str("| single query | p50 ms | p99 ms |\n|---|---|---|\n");
    for (label, key) in [
        ("in-process faiss flat", "in_process"),
        ("router -> shards (QUIC)", "router"),
    ] {
        md.push_str(&format!(
            "| {label} | {:.2} | {:.2} |\n",
            s[key]["p50_ms"].as_f64().unwrap_or(f64::NAN),
            s[key]["p99_ms"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    md.push_str(&format!(
        "\nRouter p50 / in-process p50: {:.3}\n\n",
        s["router_over_in_process_p50"].as_f64().unwrap_or(f64::NAN)
    ));
    md.push_str("| batching | concurrency | q/s | p50 ms | p99 ms |\n|---|---|---|---|---|\n");
    for mode in ["batching_on", "batching_off"] {
        for row in report[mode].as_array().into_iter().flatten() {
            md.push_str(&format!(
                "| {} | {} | {:.1} | {:.1} | {:.1} |\n",
                mode.trim_start_matches("batching_"),
                row["concurrency"],
                row["qps"].as_f64().unwrap_or(f64::NAN),
                row["p50_ms"].as_f64().unwrap_or(f64::NAN),
                row["p99_ms"].as_f64().unwrap_or(f64::NAN)
            ));
        }
    }
    md.push_str(&format!(
        "\nBatched (c=max) / single (c=1) throughput: {:.2}x\n\n",
        report["batched_over_single_qps"]
            .as_f64()
            .unwrap_or(f64::NAN)
    ));
    md.push_str("| in-process batch | OpenMP | OpenBLAS | q/s |\n|---|---|---|---|\n");
    for row in report["thread_splits"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} |\n",
            row["batch"],
            row["openmp"],
            row["openblas"],
            row["qps"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    md
}

async fn run(cli: Cli) -> Result<()> {
    if cli.vectors == 0 || cli.shards == 0 || cli.concurrency.is_empty() {
        bail!("--vectors, --shards and --concurrency must be non-empty");
    }
    let started = Instant::now();
    let per_topic = cli.vectors.div_ceil(cli.topics);
    let (centres, mut vectors) =
        clustered_vectors(cli.topics, per_topic, cli.dimension, cli.spread, cli.seed);
    vectors.truncate(cli.vectors * cli.dimension);
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        "vectors generated"
    );
    ensure_shards(&cli, &vectors)?;
    let manifest = read_manifest(&shard_dir(&cli).join("shard-0"))?;
    let index = ExactIndex::build(cli.dimension, &vectors)?;
    drop(vectors);
    let queries = Arc::new(queries_near(
        &centres,
        cli.dimension,
        4096,
        cli.spread,
        cli.seed + 1,
    )?);

    let thread_rows = thread_splits(&index, &queries, cli.thread_batch, cli.k)?;
    let batch_rows = batch_sizes(&index, &queries, cli.k)?;

    let mut report = json!({
        "vectors": cli.vectors,
        "dimension": cli.dimension,
        "shards": cli.shards,
        "k": cli.k,
        "shard_blas_threads": cli.shard_blas_threads,
        "cores": hasten_core::threads::available_cores(),
        "thread_splits": thread_rows,
        "batch_sizes": batch_rows,
    });
    if cli.in_process_only {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    for mode in &cli.batching {
        let batching = *mode == BatchingMode::On;
        let cluster = Arc::new(Cluster::start(&cli, batching, &manifest.corpus_version)?);
        for query in queries.iter().take(20) {
            cluster.client.search(query, cli.k, None).await?;
        }
        if batching {
            report["single_query"] = single_query_latency(&cli, &index, &cluster, &queries).await?;
            report["resident_bytes"] = cluster.resident_bytes();
        }
        let mut rows = Vec::new();
        for &c in &cli.concurrency {
            rows.push(throughput(&cluster, &queries, cli.k, c, cli.seconds).await?);
        }
        report[if batching {
            "batching_on"
        } else {
            "batching_off"
        }] = Value::Array(rows);
    }
    let qps_at = |mode: &str, pick: fn(&[Value]) -> Option<&Value>| {
        report[mode]
            .as_array()
            .and_then(|rows| pick(rows))
            .and_then(|r| r["qps"].as_f64())
            .unwrap_or(f64::NAN)
    };
    report["batched_over_single_qps"] =
        json!(qps_at("batching_on", <[Value]>::last) / qps_at("batching_on", <[Value]>::first));
    report["seconds"] = json!(started.elapsed().as_secs_f64());
    write_report(&cli.work, &report)?;
    Ok(())
}

fn write_report(dir: &Path, report: &Value) -> Result<()> {
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    let md = markdown(report);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}
