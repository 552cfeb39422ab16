//! hasten-kv-routing-bench: KV-aware routing against round-robin over a pool of real
//! `kv-worker serve` processes on loopback, driven through `KvPool` (the edge's backend for
//! `kv_workers`). HotpotQA questions ask over their own 10 paragraphs (ids of the bundle,
//! preprocessed into one store the workers share on disk); requests are drawn by the built-in
//! TopViews-shaped popularity model, the same stream for both policies, each policy on freshly
//! started workers with small RAM budgets. Reported per policy: the share of chunks found in a
//! worker's memory (summed over the workers' `Info`) and time to first token.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::kv_workload::{chunk_ids, draw_stream, model_path, percentile};
use hasten_bench::questions::read_questions;
use hasten_core::bundle::CorpusBundle;
use hasten_kv_worker::FusionSettings;
use hasten_kv_worker::client::KvPool;
use hasten_kv_worker::routing::KvRouting;
use hasten_kv_worker::store::Variant;
use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_client::KvGenerationClient;
use hasten_rag::{AnswerRequest, Document, LmBackend};
use loadtest::popularity::ZipfModel;
use loadtest::process::{ManagedProcess, binary, kv_worker_serve_args};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "KV-aware routing against round-robin over kv-worker processes")]
struct Args {
    /// HotpotQA distractor JSONL: each question's paragraphs are its chunks.
    #[arg(default_value = "../shared/data/hotpotqa-distractor-100.jsonl")]
    questions: PathBuf,
    #[arg(long)]
    bundle: PathBuf,
    /// The store `kv-worker preprocess` filled for that bundle (shared by the workers).
    #[arg(long)]
    store: PathBuf,
    /// The GGUF model (default: SmolLM2-135M-Instruct under $HASTEN_LM_DIR).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Each worker's RAM budget for chunk KV, MiB.
    #[arg(long, default_value_t = 256)]
    ram_budget_mib: u64,
    #[arg(long, default_value_t = 20)]
    limit: usize,
    #[arg(long, default_value_t = 200)]
    requests: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where the workers' logs and ready files go.
    #[arg(long, default_value = "run/kv-routing-bench")]
    work: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.workers == 0 || args.requests == 0 {
        bail!("--workers and --requests must be at least 1");
    }
    std::fs::create_dir_all(&args.work)?;
    let questions = read_questions(&args.questions, Some(args.limit), true)?;
    let bundle = CorpusBundle::load(&args.bundle)
        .with_context(|| format!("loading {}", args.bundle.display()))?;
    let chunks = chunk_ids(&questions, &bundle)?;
    let requests: Vec<AnswerRequest> = questions
        .iter()
        .zip(&chunks)
        .map(|(q, ids)| {
            let documents = q
                .documents
                .iter()
                .zip(ids)
                .map(|(d, &id)| Document::new(d.title.clone(), d.text.clone()).with_id(id))
                .collect();
            let mut request = AnswerRequest::new(q.question.clone(), documents);
            request.max_new_tokens = 1;
            request
        })
        .collect();
    let popularity = ZipfModel::default().daily(requests.len())?;
    let stream = draw_stream(&popularity, args.requests, args.seed)?;
    let model = model_path(args.model.as_deref())?;
    let runtime = tokio::runtime::Runtime::new()?;
    let corpus = bundle.manifest.corpus_version.clone();
    let mut rows = Vec::new();
    println!("| routing | workers | memory hits | TTFT p50 | TTFT p90 | mean TTFT |");
    println!("|---|---|---|---|---|---|");
    for routing in [KvRouting::RoundRobin, KvRouting::KvAware] {
        let workers: Vec<ManagedProcess> = (0..args.workers)
            .map(|i| {
                ManagedProcess::start(
                    &format!("kv-worker-{i}"),
                    &binary("kv-worker")?,
                    [
                        kv_worker_serve_args(&model, &args.store),
                        vec![
                            "--ram-budget".into(),
                            (args.ram_budget_mib << 20).to_string(),
                        ],
                    ]
                    .concat(),
                    &args.work,
                    std::time::Duration::from_secs(300),
                )
                .map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?;
        let addrs: Vec<String> = workers.iter().map(|w| w.addr("grpc_addr")).collect();
        let pool = {
            let _guard = runtime.enter();
            Arc::new(KvPool::connect_lazy(
                &addrs,
                None,
                corpus.clone(),
                FusionSettings::default(),
                Variant::Similarity,
                routing,
            )?)
        };
        let mut ttfts = Vec::with_capacity(stream.len());
        for &q in &stream {
            let pool = Arc::clone(&pool);
            let request = requests[q].clone();
            let answer = std::thread::spawn(move || pool.answer(&request, &mut |_| {}))
                .join()
                .map_err(|_| anyhow::anyhow!("the request thread panicked"))??;
            ttfts.push(answer.timings.first_token.as_secs_f64());
        }
        let (memory, disk) = runtime.block_on(async {
            let (mut memory, mut disk) = (0u64, 0u64);
            for addr in &addrs {
                let mut client = KvGenerationClient::connect(format!("http://{addr}")).await?;
                let info = client.info(pb::KvInfoRequest {}).await?.into_inner();
                memory += info.tiers.iter().map(|t| t.hits).sum::<u64>();
                disk += info.disk_hits;
            }
            anyhow::Ok((memory, disk))
        })?;
        drop(workers);
        ttfts.sort_by(f64::total_cmp);
        let mean = ttfts.iter().sum::<f64>() / ttfts.len() as f64;
        let hit_rate = memory as f64 / (memory + disk).max(1) as f64;
        println!(
            "| {routing:?} | {} | {:.1}% | {:.3} s | {:.3} s | {mean:.3} s |",
            args.workers,
            hit_rate * 100.0,
            percentile(&ttfts, 0.5),
            percentile(&ttfts, 0.9)
        );
        rows.push(json!({
            "routing": format!("{routing:?}"),
            "workers": args.workers,
            "memory_hit_rate": hit_rate,
            "memory_hits": memory,
            "disk_hits": disk,
            "ttft_p50_s": percentile(&ttfts, 0.5),
            "ttft_p90_s": percentile(&ttfts, 0.9),
            "ttft_mean_s": mean,
        }));
    }
    let report = json!({
        "questions": requests.len(),
        "requests": stream.len(),
        "ram_budget_mib": args.ram_budget_mib,
        "policies": rows,
    });
    std::fs::write(
        args.work.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(())
}
