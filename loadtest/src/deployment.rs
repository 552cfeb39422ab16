//! The `run` command (the binary's, not the library's): a saved workload against a
//! deployment's edges, retrievals or streamed answers, judged by thresholds.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use hasten_loadtest::driver::{DriverSettings, LoadModel};
use hasten_loadtest::workload;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RunTarget {
    Retrieve,
    Answers,
}

#[derive(Args)]
pub struct RunArgs {
    /// An edge's base URL, e.g. http://edge.example:7200 (repeat: requests spread over them).
    #[arg(long = "edge", required = true)]
    edges: Vec<String>,
    /// The questions, in order (JSON lines from `hasten-loadtest workload --save-workload`);
    /// started over when the duration outlasts them.
    #[arg(long)]
    workload: PathBuf,
    /// Open loop: Poisson arrivals at this many requests per second.
    #[arg(
        long,
        conflicts_with = "concurrency",
        required_unless_present = "concurrency"
    )]
    rate: Option<f64>,
    /// Closed loop: this many clients, each waiting for its answer.
    #[arg(long)]
    concurrency: Option<usize>,
    /// How long to send, e.g. 60s or 5m.
    #[arg(long, default_value = "60s", value_parser = hasten_loadtest::remote::parse_duration)]
    duration: Duration,
    /// Documents per retrieval.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// What each request is: `retrieve` (POST /v1/retrieve) or `answers` (a streamed chat
    /// completion of at most --max-tokens, timed to its first token and between tokens).
    #[arg(long, value_enum, default_value_t = RunTarget::Retrieve)]
    target: RunTarget,
    /// Longest answer with --target answers, tokens.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// File holding the bearer token of the tenant to load as.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// PEM CA certificate to trust for https edges (beside the system's roots).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Give up on a request after this long [default: 10s; 120s with --target answers].
    #[arg(long, value_parser = hasten_loadtest::remote::parse_duration)]
    timeout: Option<Duration>,
    /// Pass condition, repeatable: p50, p90, p99, p99.9, p99.99 (any pNN), max, mean with
    /// ms/s; errors with % or a share; rps; e.g. --threshold 'p99<200ms' --threshold 'errors<0.1%'.
    /// With --target answers, ttft_ and itl_ latency figures too: 'ttft_p99<2s', 'itl_p50<100ms'.
    #[arg(long = "threshold")]
    thresholds: Vec<hasten_loadtest::remote::Threshold>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value = "run/loadtest-run")]
    out: PathBuf,
}

pub async fn run(args: RunArgs) -> Result<()> {
    // An answer streams for seconds where a retrieval takes milliseconds.
    let timeout = args.timeout.unwrap_or(match args.target {
        RunTarget::Retrieve => Duration::from_secs(10),
        RunTarget::Answers => Duration::from_secs(120),
    });
    use hasten_loadtest::remote::{Deployment, RunSummary, THRESHOLDS_FAILED_EXIT, write_outputs};
    let workload = workload::read_jsonl(&args.workload)
        .with_context(|| format!("reading the workload {}", args.workload.display()))?;
    if workload.is_empty() {
        bail!("{} holds no query", args.workload.display());
    }
    for edge in &args.edges {
        if !(edge.starts_with("http://") || edge.starts_with("https://")) {
            bail!("--edge {edge:?}: give the URL, e.g. http://{edge}");
        }
    }
    let token = args
        .token_file
        .as_deref()
        .map(|path| {
            std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .with_context(|| format!("reading --token-file {}", path.display()))
        })
        .transpose()?;
    let ca_pem = args
        .ca_cert
        .as_deref()
        .map(|path| {
            std::fs::read(path).with_context(|| format!("reading --ca-cert {}", path.display()))
        })
        .transpose()?;
    let deployment = Deployment {
        edges: args
            .edges
            .iter()
            .map(|e| e.trim_end_matches('/').to_string())
            .collect(),
        token,
        ca_pem,
        request_timeout: timeout,
    };
    let load = match (args.rate, args.concurrency) {
        (Some(rate_qps), _) if rate_qps > 0.0 => LoadModel::Open {
            rate_qps,
            seed: args.seed,
        },
        (Some(rate), _) => bail!("--rate {rate}: must be positive"),
        (None, Some(clients)) if clients > 0 => LoadModel::Closed { clients },
        _ => bail!("--concurrency must be at least 1"),
    };
    let settings = DriverSettings {
        load,
        k: args.k,
        warmup: 0,
        max_duration: Some(args.duration),
        request_timeout: timeout,
        cycle: true,
        client: Some(deployment.client()?),
    };
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {pos} answered, {per_sec} ({elapsed} of the run)")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let progress = bar.clone();
    let tick = move |n: usize| progress.set_position(n as u64);
    let (summary, verdicts, written) = match args.target {
        RunTarget::Retrieve => {
            let outcome =
                hasten_loadtest::retrieve::run(&workload, &deployment.edges, &settings, tick).await;
            let summary = RunSummary::new(&outcome.records, outcome.wall);
            let verdicts = summary.judge(&args.thresholds);
            let written = write_outputs(&args.out, &summary, &verdicts, &outcome.records);
            (summary, verdicts, written)
        }
        RunTarget::Answers => {
            let exchange = hasten_loadtest::answer::exchange::ChatAnswer {
                k: args.k,
                max_tokens: args.max_tokens,
            };
            let outcome = hasten_loadtest::driver::run_exchange(
                &workload,
                &deployment.edges,
                exchange,
                &settings,
                tick,
            )
            .await;
            let replies: Vec<_> = outcome
                .records
                .iter()
                .filter_map(|r| Some((r, r.result.as_ref().ok()?)))
                .collect();
            let summary = RunSummary::new(&outcome.records, outcome.wall).with_answer_times(
                replies
                    .iter()
                    .map(|(record, reply)| reply.first_text.unwrap_or(record.latency)),
                replies
                    .iter()
                    .flat_map(|(_, reply)| reply.gaps.iter().copied()),
            );
            let verdicts = summary.judge(&args.thresholds);
            let written = write_outputs(&args.out, &summary, &verdicts, &outcome.records);
            (summary, verdicts, written)
        }
    };
    bar.finish_and_clear();
    written?;
    println!("{}", summary.text());
    for verdict in &verdicts {
        let mark = if verdict.passed { "ok  " } else { "FAIL" };
        println!(
            "{mark} {} (measured {:.6})",
            verdict.threshold, verdict.value
        );
    }
    println!("outputs in {}", args.out.display());
    if verdicts.iter().any(|v| !v.passed) {
        eprintln!("thresholds failed");
        std::process::exit(THRESHOLDS_FAILED_EXIT);
    }
    Ok(())
}
