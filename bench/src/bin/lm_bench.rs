//! hasten-lm-bench: prefill and decode throughput of the hasten-lm runtime on a GGUF file,
//! measured the way `bench/lm-peer.py` measures llama.cpp, so that `bench/lm-runtime.sh`
//! can put the two side by side (same file, same machine, same thread count).
//!
//! Prefill: one forward pass over exactly N tokens of real text (fresh cache), median of
//! `--repeat` runs. Decode: B sequences with their own prompts of `--decode-context` tokens
//! (16 by default), prefilled, then
//! `--decode-tokens` greedy steps of one token per sequence; aggregate tokens/s = B x steps
//! / time of the steps. Scoring: the verifier's pass over `--score-rows` rows of
//! `--score-context` + `--score-tokens` tokens, log-probabilities at the continuation's
//! positions alone (what `score` does) against at every position (what it did before); and
//! rows sharing one context, read once (`score_shared`) against once per row (`score`).
//! Every measurement has one untimed warm-up run first. `--greedy-against FORMAT` also
//! decodes five prompts greedily with the weights held as FORMAT and candle's attention
//! (the reference kernels) and reports where the two outputs first differ, with the reference's logit gap there.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{D, IndexOp};
use clap::Parser;
use hasten_lm::kernels::Isa;
use hasten_lm::{
    DeviceKind, ForwardRequest, KvCache, LanguageModel, Logits, WeightFormat, left_pad,
    log_softmax, score, score_shared,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Prefill and decode throughput of hasten-lm on a GGUF model"
)]
struct Args {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Compute threads; must equal RAYON_NUM_THREADS, which candle's kernels read.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prompt lengths for prefill, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
    prefill: Vec<usize>,
    /// Greedy decode steps per sequence.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Prompt tokens of each decoded sequence: what its decode steps attend to beyond their
    /// own tokens (a RAG answer decodes after a prompt of thousands).
    #[arg(long, default_value_t = 16)]
    decode_context: usize,
    /// Batch sizes for decoding, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    batches: Vec<usize>,
    /// Runs per measurement; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Rows of a scoring pass (0: no scoring measurement).
    #[arg(long, default_value_t = 5)]
    score_rows: usize,
    /// Context tokens of each scored row (a verifier's question and rationale).
    #[arg(long, default_value_t = 160)]
    score_context: usize,
    /// Scored tokens at the end of each row.
    #[arg(long, default_value_t = 48)]
    score_tokens: usize,
    #[arg(long, default_value = "cpu")]
    device: DeviceKind,
    /// How weights are held: as_stored, q8_0 (types without SIMD kernels re-quantised) or f32.
    #[arg(long, default_value = "as_stored")]
    weights: WeightFormat,
    /// Also decode the decode prompts greedily with the weights held this way and candle's
    /// attention (the reference kernels), and report where the outputs first differ.
    #[arg(long)]
    greedy_against: Option<WeightFormat>,
    /// Decode attention through candle's matmuls and softmax, as before lm's fused decode
    /// attention kernel (the before column of that change).
    #[arg(long)]
    candle_attention: bool,
    /// Where to write the JSON report.
    #[arg(long)]
    out: Option<PathBuf>,
}

const TEXT: &str = "The Amazon River in South America is the largest river by discharge volume of \
water in the world, and the disputed longest river system in the world in comparison to the \
Nile. The headwaters of the Apurimac River on Nevado Mismi had been considered for nearly a \
century as the Amazon basin's most distant source, until a 2014 study found it to be the \
headwaters of the Mantaro River on the Cordillera Rumi Cruz in Peru. ";

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.repeat == 0 || args.decode_tokens == 0 {
        bail!("--repeat and --decode-tokens must be at least 1");
    }
    // candle sizes its CPU kernels' parallelism from RAYON_NUM_THREADS, read at first use.
    let from_env = std::env::var("RAYON_NUM_THREADS").ok();
    if from_env.as_deref() != Some(args.threads.to_string().as_str()) {
        bail!(
            "run with RAYON_NUM_THREADS={} so that candle's kernels use --threads (bench/lm-runtime.sh does)",
            args.threads
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build_global()
        .context("setting the thread count")?;
    let device = args.device.open()?;
    let mut model = LanguageModel::load_with(&args.model, &device, args.weights)?;
    model.decoder = model.decoder.with_fused_attention(!args.candle_attention);
    let text_ids = model.tokenizer.encode(&TEXT.repeat(64))?;

    let mut prefill = Vec::new();
    for &n in &args.prefill {
        if n > text_ids.len() || n > model.decoder.rope().max_positions() {
            bail!("--prefill {n} is longer than the benchmark text or the model's context");
        }
        let tokens = vec![text_ids[..n].to_vec()];
        let positions = vec![(0..n as u32).collect::<Vec<_>>()];
        let mut rates = Vec::new();
        // One untimed warm-up run, as the peer script does.
        for run in 0..=args.repeat {
            let start = Instant::now();
            model
                .decoder
                .forward(&ForwardRequest::new(&tokens, &positions).logits(Logits::Last))?;
            if run > 0 {
                rates.push(n as f64 / start.elapsed().as_secs_f64());
            }
        }
        let rate = median(rates);
        eprintln!("prefill {n:>5} tokens: {rate:>8.1} tokens/s");
        prefill.push(serde_json::json!({"tokens": n, "tokens_per_s": rate}));
    }

    let mut decode = Vec::new();
    for &batch in &args.batches {
        let context = args.decode_context;
        if batch * 7 + context > text_ids.len() {
            bail!("--decode-context {context} at batch {batch} is longer than the bench's text");
        }
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|b| text_ids[b * 7..b * 7 + context].to_vec())
            .collect();
        let mut rates = Vec::new();
        for run in 0..=args.repeat {
            let batch_input = left_pad(&prompts, 0);
            let out = model.decoder.forward(
                &ForwardRequest::new(&batch_input.tokens, &batch_input.positions)
                    .valid(&batch_input.valid),
            )?;
            let mut cache: KvCache = out.kv;
            let mut logits = out.logits.context("prefill logits")?;
            let start = Instant::now();
            for step in 0..args.decode_tokens {
                let next: Vec<Vec<u32>> = logits
                    .argmax(candle_core::D::Minus1)?
                    .to_vec1::<u32>()?
                    .into_iter()
                    .map(|id| vec![id])
                    .collect();
                let at: Vec<Vec<u32>> = vec![vec![(context + step) as u32]; batch];
                let out = model
                    .decoder
                    .forward(&ForwardRequest::new(&next, &at).past(&cache))?;
                cache.append(out.kv)?;
                logits = out.logits.context("decode logits")?;
            }
            if run > 0 {
                rates.push((batch * args.decode_tokens) as f64 / start.elapsed().as_secs_f64());
            }
        }
        let rate = median(rates);
        eprintln!(
            "decode batch {batch}: {rate:>8.1} tokens/s aggregate, {:>7.1} per sequence",
            rate / batch as f64
        );
        decode.push(serde_json::json!({
            "batch": batch,
            "context": context,
            "aggregate_tokens_per_s": rate,
            "per_sequence_tokens_per_s": rate / batch as f64,
        }));
    }

    let greedy = match args.greedy_against {
        Some(reference) => {
            let mut reference = LanguageModel::load_with(&args.model, &device, reference)?;
            // The reference attends through candle's operations too.
            reference.decoder = reference.decoder.with_fused_attention(false);
            compare_greedy(&model, &reference, &text_ids, &args)?
        }
        None => serde_json::Value::Null,
    };

    let scoring = if args.score_rows == 0 {
        serde_json::Value::Null
    } else {
        measure_scoring(&model, &text_ids, &args)?
    };

    let report = serde_json::json!({
        "runtime": "hasten-lm",
        "model": args.model,
        "device": args.device.to_string(),
        "weights": args.weights.to_string(),
        "kernels": Isa::selected().to_string(),
        "decode_attention": if args.candle_attention { "candle" } else { "fused" },
        "threads": args.threads,
        "prefill": prefill,
        "decode": decode,
        "scoring": scoring,
        "greedy": greedy,
    });
    let text = serde_json::to_string_pretty(&report)?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}

/// Seconds of one scoring pass (median) with log-probabilities at the scored positions
/// alone and at every position, and the logits each held.
fn measure_scoring(
    model: &LanguageModel,
    text_ids: &[u32],
    args: &Args,
) -> Result<serde_json::Value> {
    let width = args.score_context + args.score_tokens;
    if args.score_tokens == 0 || args.score_rows * 5 + width > text_ids.len() {
        bail!("--score-tokens must be at least 1 and the rows fit the bench's text");
    }
    let rows: Vec<Vec<u32>> = (0..args.score_rows)
        .map(|r| text_ids[r * 5..r * 5 + width].to_vec())
        .collect();
    let batch = left_pad(&rows, 0);
    let time = |logits: Logits| -> Result<(f64, usize)> {
        let mut seconds = Vec::new();
        let mut held = 0;
        for run in 0..=args.repeat {
            let start = Instant::now();
            let out = model.decoder.forward(
                &ForwardRequest::new(&batch.tokens, &batch.positions)
                    .valid(&batch.valid)
                    .logits(logits),
            )?;
            let logits = out.logits.context("scoring logits")?;
            held = logits.elem_count() * 4;
            log_softmax(&logits)?;
            if run > 0 {
                seconds.push(start.elapsed().as_secs_f64());
            }
        }
        Ok((median(seconds), held))
    };
    let (trailing_s, trailing_bytes) = time(Logits::Trailing(args.score_tokens + 1))?;
    let (all_s, all_bytes) = time(Logits::All)?;
    // The verifier's rows share their question prompt: `score` reads it once per row,
    // `score_shared` once. Rows of the same lengths as above, the context common to all.
    let context = &text_ids[..args.score_context];
    let continuations: Vec<Vec<u32>> = (0..args.score_rows)
        .map(|r| {
            let start = args.score_context + r * 5;
            text_ids[start..start + args.score_tokens].to_vec()
        })
        .collect();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = continuations
        .iter()
        .map(|c| (context.to_vec(), c.clone()))
        .collect();
    let timed = |pass: &dyn Fn() -> hasten_lm::Result<Vec<Vec<f32>>>| -> Result<f64> {
        let mut seconds = Vec::new();
        for run in 0..=args.repeat {
            let start = Instant::now();
            pass()?;
            if run > 0 {
                seconds.push(start.elapsed().as_secs_f64());
            }
        }
        Ok(median(seconds))
    };
    let per_row_s = timed(&|| score(&model.decoder, &pairs))?;
    let shared_s = timed(&|| score_shared(&model.decoder, context, &continuations))?;
    eprintln!(
        "scoring {} rows of {width} tokens: {trailing_s:.3} s at the scored positions, \
         {all_s:.3} s at every position ({:.2}x); logits {:.1} MB against {:.1} MB",
        args.score_rows,
        all_s / trailing_s,
        trailing_bytes as f64 / 1e6,
        all_bytes as f64 / 1e6,
    );
    eprintln!(
        "scoring {} rows after one shared context: {shared_s:.3} s reading it once, \
         {per_row_s:.3} s once per row ({:.2}x)",
        args.score_rows,
        per_row_s / shared_s,
    );
    Ok(serde_json::json!({
        "rows": args.score_rows,
        "context": args.score_context,
        "scored_tokens": args.score_tokens,
        "scored_positions_s": trailing_s,
        "every_position_s": all_s,
        "speedup": all_s / trailing_s,
        "scored_positions_logit_bytes": trailing_bytes,
        "every_position_logit_bytes": all_bytes,
        "shared_context_once_s": shared_s,
        "shared_context_per_row_s": per_row_s,
        "shared_context_speedup": per_row_s / shared_s,
    }))
}

/// Greedy decoding of one prompt, token by token: each step's token and logits.
fn greedy(model: &LanguageModel, prompt: &[u32], steps: usize) -> Result<Vec<(u32, Vec<f32>)>> {
    let positions = vec![(0..prompt.len() as u32).collect::<Vec<_>>()];
    let out = model
        .decoder
        .forward(&ForwardRequest::new(&[prompt.to_vec()], &positions))?;
    let mut cache: KvCache = out.kv;
    let mut logits = out.logits.context("prefill logits")?;
    let mut decoded = Vec::with_capacity(steps);
    for step in 0..steps {
        let row = logits.i(0)?;
        let token = row.argmax(D::Minus1)?.to_scalar::<u32>()?;
        decoded.push((token, row.to_vec1::<f32>()?));
        let at = vec![vec![(prompt.len() + step) as u32]];
        let out = model
            .decoder
            .forward(&ForwardRequest::new(&[vec![token]], &at).past(&cache))?;
        cache.append(out.kv)?;
        logits = out.logits.context("decode logits")?;
    }
    Ok(decoded)
}

/// The decode prompts decoded greedily by `model` and `reference`: per prompt, whether the
/// tokens are identical, else the first step where they differ and the reference's logit
/// margin there between its token and `model`'s (how near a tie rounding tipped).
fn compare_greedy(
    model: &LanguageModel,
    reference: &LanguageModel,
    text_ids: &[u32],
    args: &Args,
) -> Result<serde_json::Value> {
    let mut prompts = Vec::new();
    for p in 0..5 {
        let prompt = &text_ids[p * 7..p * 7 + args.decode_context];
        let ours = greedy(model, prompt, args.decode_tokens)?;
        let theirs = greedy(reference, prompt, args.decode_tokens)?;
        let first = ours.iter().zip(&theirs).position(|((a, _), (b, _))| a != b);
        let report = match first {
            None => serde_json::json!({"prompt": p, "identical": true}),
            Some(step) => {
                let (our_token, _) = ours[step];
                let (their_token, ref_logits) = &theirs[step];
                let gap = ref_logits[*their_token as usize] - ref_logits[our_token as usize];
                serde_json::json!({
                    "prompt": p,
                    "identical": false,
                    "first_difference": step,
                    "token": our_token,
                    "reference_token": their_token,
                    "reference_logit_gap": gap,
                })
            }
        };
        eprintln!("greedy, prompt {p}: {report}");
        prompts.push(report);
    }
    Ok(serde_json::json!({
        "reference_weights": args.greedy_against.map(|w| w.to_string()),
        "steps": args.decode_tokens,
        "prompts": prompts,
    }))
}
