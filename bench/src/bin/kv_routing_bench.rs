//! hasten-kv-routing-bench: KV-aware routing against round-robin over a pool of real
//! `kv-worker serve` processes on loopback, driven through `KvPool` (the edge's backend for
//! `kv_workers`). HotpotQA questions ask over their own 10 paragraphs (ids of the bundle,
//! preprocessed into one store the workers share on disk); requests are drawn by the built-in
//! TopViews-shaped popularity model, the same stream for both policies, each policy on freshly
//! started workers with small RAM budgets. Reported per policy: the share of chunks found in a
//! worker's memory (summed over the workers' `Info`) and time to first token. `--streams`
//! repeats the comparison over several request streams (seeds): one stream's ratio moves a lot
//! with which questions its draws make hot, so the summary gives the mean, min and max.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::kv_workload::{chunk_ids, draw_stream, model_path, percentile};
use hasten_bench::questions::read_questions;
use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, kv_worker_serve_args};
use hasten_loadtest::popularity::ZipfModel;
use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_client::KvGenerationClient;
use hasten_rag::{AnswerRequest, Document, LmBackend};
use hasten_worker_api::kv::KvPool;
use hasten_worker_api::kv::KvRouting;
use hasten_worker_api::kv::Variant;
use hasten_worker_api::kv::{FusionMode, FusionSettings};
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
    /// Seed of the first request stream; stream i uses seed + i.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// How many request streams to compare the policies over.
    #[arg(long, default_value_t = 1)]
    streams: u64,
    /// FusionRAG's recompute ratio; 0 reuses every chunk's KV as stored (Full Reuse), which
    /// reads the same chunks much faster when only the hit rate is wanted.
    #[arg(long, default_value_t = 0.15)]
    recompute_ratio: f64,
    /// Where the workers' logs and ready files go.
    #[arg(long, default_value = "run/kv-routing-bench")]
    work: PathBuf,
}

/// One policy over one request stream, on freshly started workers.
struct PolicyRun {
    memory_hits: u64,
    disk_hits: u64,
    /// Ascending.
    ttfts: Vec<f64>,
}

impl PolicyRun {
    fn hit_rate(&self) -> f64 {
        self.memory_hits as f64 / (self.memory_hits + self.disk_hits).max(1) as f64
    }

    fn mean_ttft(&self) -> f64 {
        self.ttfts.iter().sum::<f64>() / self.ttfts.len().max(1) as f64
    }
}

/// What every run shares: the requests, where the workers' files are, how they compute.
struct Setup {
    args: Args,
    requests: Vec<AnswerRequest>,
    model: PathBuf,
    corpus: String,
    fusion: FusionSettings,
}

fn run_policy(
    setup: &Setup,
    runtime: &tokio::runtime::Runtime,
    routing: KvRouting,
    stream: &[usize],
) -> Result<PolicyRun> {
    let args = &setup.args;
    let workers: Vec<ManagedProcess> = (0..args.workers)
        .map(|i| {
            ManagedProcess::start(
                &format!("kv-worker-{i}"),
                &binary("kv-worker")?,
                [
                    kv_worker_serve_args(&setup.model, &args.store),
                    vec![
                        "--set".into(),
                        format!("ram_budget={}", args.ram_budget_mib << 20),
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
            setup.corpus.clone(),
            setup.fusion,
            Variant::Similarity,
            routing,
        )?)
    };
    let mut ttfts = Vec::with_capacity(stream.len());
    for &q in stream {
        let pool = Arc::clone(&pool);
        let request = setup.requests[q].clone();
        let answer = std::thread::spawn(move || pool.answer(&request, &mut |_: &str| {}))
            .join()
            .map_err(|_| anyhow::anyhow!("the request thread panicked"))??;
        ttfts.push(answer.timings.first_token.as_secs_f64());
    }
    let (memory_hits, disk_hits) = runtime.block_on(async {
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
    Ok(PolicyRun {
        memory_hits,
        disk_hits,
        ttfts,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.workers == 0 || args.requests == 0 || args.streams == 0 {
        bail!("--workers, --requests and --streams must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.recompute_ratio) {
        bail!("--recompute-ratio must be within [0, 1]");
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
    let fusion = if args.recompute_ratio == 0.0 {
        FusionSettings {
            mode: FusionMode::FullReuse,
            ratio: 0.0,
        }
    } else {
        FusionSettings {
            mode: FusionMode::FusionRag,
            ratio: args.recompute_ratio,
        }
    };
    let setup = Setup {
        model: model_path(args.model.as_deref())?,
        corpus: bundle.manifest.corpus_version.clone(),
        requests,
        fusion,
        args,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    // Memory hits and chunk reads of every stream, round-robin then KV-aware.
    let mut pooled = [(0u64, 0u64); 2];
    println!("| seed | routing | memory hits | TTFT p50 | TTFT p90 | mean TTFT |");
    println!("|---|---|---|---|---|---|");
    for seed in setup.args.seed..setup.args.seed + setup.args.streams {
        let stream = draw_stream(&popularity, setup.args.requests, seed)?;
        let mut hit_rates = Vec::new();
        for (policy, routing) in [KvRouting::RoundRobin, KvRouting::KvAware]
            .into_iter()
            .enumerate()
        {
            let run = run_policy(&setup, &runtime, routing, &stream)?;
            pooled[policy].0 += run.memory_hits;
            pooled[policy].1 += run.memory_hits + run.disk_hits;
            let (p50, p90) = (percentile(&run.ttfts, 0.5), percentile(&run.ttfts, 0.9));
            println!(
                "| {seed} | {routing:?} | {:.1}% | {p50:.3} s | {p90:.3} s | {:.3} s |",
                run.hit_rate() * 100.0,
                run.mean_ttft()
            );
            hit_rates.push(run.hit_rate());
            rows.push(json!({
                "seed": seed,
                "routing": format!("{routing:?}"),
                "workers": setup.args.workers,
                "memory_hit_rate": run.hit_rate(),
                "memory_hits": run.memory_hits,
                "disk_hits": run.disk_hits,
                "ttft_p50_s": p50,
                "ttft_p90_s": p90,
                "ttft_mean_s": run.mean_ttft(),
            }));
        }
        ratios.push(hit_rates[1] / hit_rates[0].max(f64::MIN_POSITIVE));
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    let (min, max) = ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
            (lo.min(r), hi.max(r))
        });
    let pooled_rate = |(hits, reads): (u64, u64)| hits as f64 / reads.max(1) as f64;
    let pooled_ratio = pooled_rate(pooled[1]) / pooled_rate(pooled[0]).max(f64::MIN_POSITIVE);
    println!(
        "KV-aware / round-robin memory hits over {} stream(s): pooled {pooled_ratio:.2}x \
         ({:.1}% / {:.1}%), per stream mean {mean:.2}x, min {min:.2}x, max {max:.2}x",
        ratios.len(),
        pooled_rate(pooled[1]) * 100.0,
        pooled_rate(pooled[0]) * 100.0
    );
    let report = json!({
        "questions": setup.requests.len(),
        "requests": setup.args.requests,
        "ram_budget_mib": setup.args.ram_budget_mib,
        "fusion": {"mode": setup.fusion.mode.name(), "ratio": setup.fusion.ratio},
        "runs": rows,
        "hit_rate_ratio": {
            "pooled": pooled_ratio,
            "per_stream": ratios,
            "mean": mean,
            "min": min,
            "max": max,
        },
    });
    std::fs::write(
        setup.args.work.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(())
}
