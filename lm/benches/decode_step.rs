//! One decoding step of a real model after 16 and 1,024 tokens of context, at batch 1 and 5,
//! with decode attention in one pass over the cache (lm's kernel, the default) and through
//! candle's matmuls and softmax (before it), in one run. Each iteration decodes the same
//! step against the same cache, so the time is one step at that context.
//!
//! Models: `HASTEN_BENCH_MODELS` (GGUF file names in `HASTEN_LM_DIR`, default the
//! repository's `models/lm`, space-separated), by default every one of SmolLM2-135M, Qwen2.5-Coder-0.5B and 1.5B that
//! is there; weights held as `fast` (what the edge serves with).
//!
//! Run: `RAYON_NUM_THREADS=2 cargo bench -p hasten-lm --bench decode_step` (candle sizes its
//! thread pool from RAYON_NUM_THREADS). Figures: docs/benchmarks/lm-runtime.md.

// Benchmarks take no outside input; a failed set-up should abort loudly.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use candle_core::Device;
use criterion::{Criterion, criterion_group, criterion_main};
use hasten_lm::{ForwardRequest, KvCache, LanguageModel, Logits, WeightFormat};

const DEFAULT_MODELS: &str = "SmolLM2-135M-Instruct.Q4_1.gguf \
    qwen2.5-coder-0.5b-instruct-q4_k_m.gguf qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const CONTEXTS: [usize; 2] = [16, 1_024];
const BATCHES: [usize; 2] = [1, 5];
const TEXT: &str = "The Amazon River in South America is the largest river by discharge volume \
of water in the world, and the disputed longest river system in the world in comparison to \
the Nile. ";

fn models() -> Vec<PathBuf> {
    let dir = std::env::var("HASTEN_LM_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/lm"),
        PathBuf::from,
    );
    let names = std::env::var("HASTEN_BENCH_MODELS").unwrap_or_else(|_| DEFAULT_MODELS.into());
    names
        .split_whitespace()
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .collect()
}

fn decode_step(c: &mut Criterion) {
    let models = models();
    assert!(
        !models.is_empty(),
        "no model found: set HASTEN_LM_DIR (`make models` fetches them)"
    );
    let mut group = c.benchmark_group("decode_step");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for path in models {
        let mut model =
            LanguageModel::load_with(&path, &Device::Cpu, WeightFormat::Fast).expect("load");
        let name = model.name();
        let text = model.tokenizer.encode(&TEXT.repeat(40)).expect("encode");
        for context in CONTEXTS {
            let prompt = vec![text[..context].to_vec()];
            let positions = vec![(0..context as u32).collect::<Vec<_>>()];
            let one_row = model
                .decoder
                .forward(&ForwardRequest::new(&prompt, &positions).logits(Logits::None))
                .expect("prefill")
                .kv;
            for batch in BATCHES {
                let cache: KvCache = one_row.select_rows(&vec![0; batch]).expect("rows");
                let tokens = vec![vec![text[context]]; batch];
                let next = vec![vec![context as u32]; batch];
                for fused in [true, false] {
                    model.decoder = model.decoder.with_fused_attention(fused);
                    let attention = if fused { "one-pass" } else { "candle" };
                    let id = format!("{name}/ctx {context}/batch {batch}/{attention}");
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            let request = ForwardRequest::new(&tokens, &next)
                                .past(&cache)
                                .logits(Logits::Last);
                            black_box(model.decoder.forward(&request).expect("decode"))
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
