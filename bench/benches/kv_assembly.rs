//! Assembling a request's context cache from stored segments (FusionRAG's first step): a
//! system prompt and ten chunks of SmolLM2-135M's shape (30 layers, 3 KV heads of 64), each
//! placed after the one before with its keys rotated to the new positions.
//!
//! - `per_layer`: the segments as caches of per-layer tensors, concatenated and relocated
//!   layer by layer (`KvCache::concat` + `KvCache::relocate`, how assembly worked before);
//! - `packed`: the segments packed across layers (`PackedKv::place`, how it works now), with
//!   room for 256 more entries.
//!
//! Both produce the same entries (`lm/tests/decoder.rs` checks it). CPU only: on a GPU the
//! difference is kernel launches, measured in docs/benchmarks/fusionrag.md's GPU section.
//!
//! Run: `cargo bench --profile dev --workspace --bench kv_assembly`.

// Benchmarks take no outside input; a failed set-up should abort loudly.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use candle_core::{Device, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};
use hasten_lm::{KvCache, PackedKv, RopeStyle, RotaryTables};

const LAYERS: usize = 30;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const SYSTEM_TOKENS: usize = 40;
const CHUNKS: usize = 10;
/// A HotpotQA paragraph is ~145 tokens (1,457-token contexts of ten).
const CHUNK_TOKENS: usize = 142;
const ROOM: usize = 256;

/// A segment of `tokens` entries with random keys and values (their values do not matter
/// to the time taken).
fn segment(tokens: usize, rope: &RotaryTables) -> KvCache {
    let random = || {
        Tensor::rand(-1f32, 1f32, (1, KV_HEADS, tokens, HEAD_DIM), &Device::Cpu)
            .expect("random tensor")
    };
    let layers = (0..LAYERS).map(|_| (random(), random())).collect();
    KvCache::from_stored(layers, (0..tokens as u32).collect(), rope).expect("segment")
}

fn assembly(c: &mut Criterion) {
    let rope = RotaryTables::new(HEAD_DIM, 100_000.0, 8192, RopeStyle::Halves, &Device::Cpu)
        .expect("rope tables");
    let mut segments = vec![segment(SYSTEM_TOKENS, &rope)];
    segments.extend((0..CHUNKS).map(|_| segment(CHUNK_TOKENS, &rope)));
    let packed: Vec<PackedKv> = segments
        .iter()
        .map(|s| PackedKv::pack(s).expect("pack"))
        .collect();
    let refs: Vec<&PackedKv> = packed.iter().collect();
    let entries = SYSTEM_TOKENS + CHUNKS * CHUNK_TOKENS;
    let positions = vec![(0..entries as u32).collect::<Vec<_>>()];

    let mut group = c.benchmark_group("kv_assembly");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("per_layer", |b| {
        b.iter(|| {
            let mut cache = KvCache::concat(segments.clone()).expect("concat");
            cache.relocate(&rope, positions.clone()).expect("relocate");
            black_box(cache)
        })
    });
    group.bench_function("packed", |b| {
        b.iter(|| black_box(PackedKv::place(&refs, &rope, 0, ROOM).expect("place")))
    });
    group.finish();
}

criterion_group!(benches, assembly);
criterion_main!(benches);
