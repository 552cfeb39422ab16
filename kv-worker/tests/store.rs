//! The chunk KV store on tiny random models: entries read back as written and refused when
//! they are not what was asked for, one copy per chunk, requests that never write the
//! stored KV, heat-based tiers against a model of them, and loads shared by concurrent
//! readers.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use hasten_kv_worker::store::{
    ChunkKvStore, EntryMeta, Found, HeatTiers, KvDtype, KvKey, MemoryTier, ModelId, StoreError,
    StoreSettings, Variant,
};
use hasten_kv_worker::{ExactPrefix, FusionMode, FusionSettings, SegmentKv, prefill};
use hasten_lm::testing::{TinyArch, max_abs_diff, tokens, write_tiny_model};
use hasten_lm::{Decoder, ForwardRequest, Logits};
use proptest::prelude::*;
use sha2::{Digest, Sha256};

const CORPUS: &str = "c0ffee";

struct Tiny {
    _dir: tempfile::TempDir,
    decoder: Decoder,
    model: ModelId,
    system: SegmentKv,
}

fn tiny(arch: TinyArch, seed: u64) -> Tiny {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), arch, seed);
    let decoder = Decoder::load(&path, &Device::Cpu).expect("load tiny model");
    let system = SegmentKv::prefill(&decoder, tokens(seed, 9), None).expect("system KV");
    let model = ModelId::compute(&path, "as-stored", system.tokens()).expect("model id");
    Tiny {
        _dir: dir,
        decoder,
        model,
        system,
    }
}

fn open(root: &Path, tiny: &Tiny, dtype: KvDtype, ram_budget: u64) -> ChunkKvStore {
    ChunkKvStore::open(
        StoreSettings {
            root: root.to_path_buf(),
            tiers: vec![MemoryTier {
                name: "ram",
                device: Device::Cpu,
                budget: ram_budget,
            }],
            dtype,
            half_life: 64.0,
        },
        Device::Cpu,
        tiny.decoder.rope().clone(),
    )
    .expect("open store")
}

fn chunk_kv(tiny: &Tiny, seed: u64, len: usize) -> SegmentKv {
    SegmentKv::prefill(&tiny.decoder, tokens(seed, len), Some(tiny.system.kv())).expect("chunk KV")
}

fn key(tiny: &Tiny, id: u64) -> KvKey {
    KvKey::corpus_chunk(tiny.model.clone(), CORPUS, id, Variant::FullReuse).expect("key")
}

fn meta(id: u64) -> EntryMeta {
    EntryMeta {
        chunk_hash: format!("{id:016x}"),
        neighbours: vec![],
    }
}

/// SHA-256 over every tensor of a segment, in order.
fn digest(segment: &SegmentKv) -> String {
    let mut hasher = Sha256::new();
    for layer in segment.kv().layers() {
        for t in [layer.raw_keys(), layer.keys(), layer.values()] {
            for v in t.flatten_all().unwrap().to_vec1::<f32>().unwrap() {
                hasher.update(v.to_le_bytes());
            }
        }
    }
    hex::encode(hasher.finalize())
}

fn assert_same_kv(a: &SegmentKv, b: &SegmentKv, tolerance: f32) -> f32 {
    assert_eq!(a.tokens(), b.tokens());
    assert_eq!(a.kv().positions(), b.kv().positions());
    let mut worst = 0f32;
    for (x, y) in a.kv().layers().iter().zip(b.kv().layers()) {
        for (p, q) in [
            (x.raw_keys(), y.raw_keys()),
            (x.keys(), y.keys()),
            (x.values(), y.values()),
        ] {
            worst = worst.max(max_abs_diff(p, q));
        }
    }
    assert!(worst <= tolerance, "stored KV differs by {worst}");
    worst
}

#[test]
fn an_entry_reads_back_as_it_was_written() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let tiny = tiny(arch, 3);
        let root = tempfile::tempdir().unwrap();
        let original = chunk_kv(&tiny, 40, 13);
        for (dtype, tolerance) in [(KvDtype::F32, 0.0), (KvDtype::F16, 5e-3)] {
            let dir = root.path().join(format!("{dtype:?}"));
            open(&dir, &tiny, dtype, u64::MAX)
                .put(&key(&tiny, 7), &meta(7), original.clone())
                .unwrap();
            // A fresh store has nothing in memory: the entry comes from its file.
            let (read, found) = open(&dir, &tiny, dtype, u64::MAX)
                .get(&key(&tiny, 7))
                .unwrap();
            assert_eq!(found, Found::Disk);
            let worst = assert_same_kv(&original, &read, tolerance);
            // f16 is really applied (the check is not vacuous), f32 is bit-exact.
            assert_eq!(
                worst > 0.0,
                dtype == KvDtype::F16,
                "{arch:?} {dtype:?}: {worst}"
            );
        }
    }
}

#[test]
fn entries_that_are_not_what_was_asked_for_are_refused_naming_both_values() {
    let tiny = tiny(TinyArch::Llama, 5);
    let other = self::tiny(TinyArch::Llama, 6);
    assert_ne!(tiny.model, other.model, "another model file, another id");
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &tiny, KvDtype::F32, 0);
    store
        .put(&key(&tiny, 1), &meta(1), chunk_kv(&tiny, 10, 8))
        .unwrap();
    let stored = std::fs::read(store.path_of(&key(&tiny, 1))).unwrap();
    let plant = |at: &KvKey, bytes: &[u8]| {
        let path = store.path_of(at);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };

    let unknown = store.get(&key(&tiny, 2)).map(|_| ()).unwrap_err();
    assert!(matches!(unknown, StoreError::NotFound(_)), "{unknown}");
    assert!(unknown.to_string().contains("chunk 2") && unknown.to_string().contains(CORPUS));

    // Another model's entry filed under this model's key.
    let foreign = key(&other, 1);
    plant(&foreign, &stored);
    let err = store.get(&foreign).map(|_| ()).unwrap_err();
    let text = err.to_string_full();
    assert!(
        matches!(err, StoreError::Mismatch { field: "model", .. }),
        "{text}"
    );
    assert!(
        text.contains(tiny.model.as_str()) && text.contains(other.model.as_str()),
        "{text}"
    );

    // Another corpus version's.
    let newer = KvKey::corpus_chunk(tiny.model.clone(), "beef", 1, Variant::FullReuse).unwrap();
    plant(&newer, &stored);
    let err = store.get(&newer).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Mismatch {
                field: "corpus version",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string_full().contains("beef") && err.to_string_full().contains(CORPUS));

    // Another chunk's, another variant's.
    let swapped = key(&tiny, 3);
    plant(&swapped, &stored);
    assert!(matches!(
        store.get(&swapped),
        Err(StoreError::Mismatch { field: "chunk", .. })
    ));
    let similarity =
        KvKey::corpus_chunk(tiny.model.clone(), CORPUS, 1, Variant::Similarity).unwrap();
    plant(&similarity, &stored);
    assert!(matches!(
        store.get(&similarity),
        Err(StoreError::Mismatch {
            field: "variant",
            ..
        })
    ));

    // A flipped payload byte, a torn file, not an entry at all.
    let mut flipped = stored.clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    plant(&key(&tiny, 1), &flipped);
    let err = store.get(&key(&tiny, 1)).map(|_| ()).unwrap_err();
    assert!(err.to_string_full().contains("checksum"), "{err}");
    plant(&key(&tiny, 1), &stored[..stored.len() - 100]);
    assert!(matches!(
        store.get(&key(&tiny, 1)),
        Err(StoreError::Corrupt(_))
    ));
    plant(&key(&tiny, 1), b"GGUF and other things");
    assert!(matches!(
        store.get(&key(&tiny, 1)),
        Err(StoreError::Corrupt(_))
    ));

    // Corpus versions name directories: nothing that walks out of the store.
    for bad in ["", "../up", ".hidden", "a/b", "text"] {
        assert!(
            KvKey::corpus_chunk(tiny.model.clone(), bad, 1, Variant::FullReuse).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn every_prefix_that_reaches_a_chunk_finds_its_one_copy() {
    let tiny = tiny(TinyArch::Qwen2, 8);
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), &tiny, KvDtype::F32, u64::MAX);
    let text = |id: u64| format!("chunk text {id}");
    let mut computed = 0;
    // Requests [x, y] then [z, y], by id and then by text: y is computed once each way.
    for request in [[1u64, 2], [3, 2]] {
        for id in request {
            for key in [
                key(&tiny, id),
                KvKey::text_chunk(tiny.model.clone(), &text(id)),
            ] {
                if !store.contains(&key) {
                    computed += 1;
                    store.put(&key, &meta(id), chunk_kv(&tiny, id, 6)).unwrap();
                }
                store.get(&key).unwrap();
            }
        }
    }
    assert_eq!(computed, 6, "x, y, z once by id and once by text");
    let files: Vec<_> = walk(root.path());
    assert_eq!(files.len(), 6, "{files:?}");
    // The second request found y in memory.
    let stats = store.stats();
    assert_eq!(stats.disk_hits, 0);
    assert_eq!(stats.memory_hits, vec![8]);
    assert_eq!(
        stats.memory_bytes[0],
        6 * hasten_kv_worker::store::segment_bytes(&chunk_kv(&tiny, 1, 6)),
        "bytes counted once per chunk"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn requests_in_every_mode_never_write_the_stored_kv() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let tiny = tiny(arch, 11);
        let root = tempfile::tempdir().unwrap();
        let store = open(root.path(), &tiny, KvDtype::F32, u64::MAX);
        for id in 0..3 {
            store
                .put(
                    &key(&tiny, id),
                    &meta(id),
                    chunk_kv(&tiny, 20 + id, 7 + id as usize),
                )
                .unwrap();
        }
        let stored: Vec<Arc<SegmentKv>> = (0..3)
            .map(|id| store.get(&key(&tiny, id)).unwrap().0)
            .collect();
        let before: Vec<String> = stored.iter().map(|s| digest(s)).collect();
        for round in 0..5 {
            for mode in [
                FusionMode::FullPrefill,
                FusionMode::FullReuse,
                FusionMode::CacheBlend,
                FusionMode::FusionRag,
            ] {
                let chunks: Vec<Arc<SegmentKv>> = (0..3)
                    .map(|id| store.get(&key(&tiny, (id + round) % 3)).unwrap().0)
                    .collect();
                let refs: Vec<&SegmentKv> = chunks.iter().map(Arc::as_ref).collect();
                let fused = prefill(
                    &tiny.decoder,
                    &tiny.system,
                    &refs,
                    &tokens(90 + round, 5),
                    FusionSettings { mode, ratio: 0.5 },
                    4,
                    ExactPrefix::NONE.into(),
                )
                .unwrap();
                // Decoding appends to the request's cache.
                let mut cache = fused.cache;
                for step in 0..3u32 {
                    let next = [vec![1 + step]];
                    let at = [vec![fused.next_position + step]];
                    let out = tiny
                        .decoder
                        .forward(
                            &ForwardRequest::new(&next, &at)
                                .past(&cache)
                                .logits(Logits::Last),
                        )
                        .unwrap();
                    cache.append(out.kv).unwrap();
                }
            }
        }
        let after: Vec<String> = stored.iter().map(|s| digest(s)).collect();
        assert_eq!(before, after, "{arch:?}: a request wrote the stored KV");
        // The digest sees a one-element change (the comparison above can fail).
        let layer = &stored[0].kv().layers()[0];
        let nudged = layer
            .values()
            .broadcast_add(&Tensor::new(1e-3f32, &Device::Cpu).unwrap())
            .unwrap();
        assert_ne!(
            max_abs_diff(&nudged, layer.values()),
            0.0,
            "a changed tensor is told apart"
        );
    }
}

#[test]
fn concurrent_and_prefetched_loads_read_each_entry_once_and_right() {
    let a = tiny(TinyArch::Llama, 21);
    let b = tiny(TinyArch::Llama, 22);
    let root = tempfile::tempdir().unwrap();
    // The same chunk ids under two models: a load shared across them would hand out the
    // other model's KV.
    let mut originals = HashMap::new();
    {
        let store = open(root.path(), &a, KvDtype::F32, u64::MAX);
        for model in [&a, &b] {
            for id in 0..6 {
                let segment = chunk_kv(model, 30 + id, 5 + id as usize);
                store
                    .put(&key(model, id), &meta(id), segment.clone())
                    .unwrap();
                originals.insert(key(model, id), segment);
            }
        }
    }
    let store = Arc::new(open(root.path(), &a, KvDtype::F32, u64::MAX));
    let keys: Vec<KvKey> = originals.keys().cloned().collect();
    store.prefetch(keys.clone());
    std::thread::scope(|scope| {
        for reader in 0..4 {
            let (store, keys, originals) = (&store, &keys, &originals);
            scope.spawn(move || {
                for k in keys.iter().cycle().skip(reader * 3).take(keys.len()) {
                    let (segment, _) = store.get(k).unwrap();
                    assert_same_kv(&originals[k], &segment, 0.0);
                }
            });
        }
    });
    assert_eq!(
        store.stats().loads,
        keys.len() as u64,
        "each file read once"
    );
}

#[test]
fn a_small_ram_budget_keeps_the_hottest_chunks_and_serves_the_rest_from_disk() {
    let tiny = tiny(TinyArch::Llama, 31);
    let root = tempfile::tempdir().unwrap();
    let one = hasten_kv_worker::store::segment_bytes(&chunk_kv(&tiny, 1, 6));
    let store = open(root.path(), &tiny, KvDtype::F32, 2 * one);
    for id in 0..4 {
        store
            .put(&key(&tiny, id), &meta(id), chunk_kv(&tiny, id, 6))
            .unwrap();
    }
    // Chunks 0 and 1 are read often, 2 and 3 once in a while.
    for round in 0..6 {
        for id in [0, 1, 0, 1] {
            store.get(&key(&tiny, id)).unwrap();
        }
        store.get(&key(&tiny, 2 + round % 2)).unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.memory_bytes, vec![2 * one]);
    let (_, hot) = store.get(&key(&tiny, 0)).unwrap();
    let (_, cold) = store.get(&key(&tiny, 3)).unwrap();
    assert_eq!(hot, Found::Memory(0));
    assert_eq!(cold, Found::Disk);
    // Budget 0: everything from disk, nothing held.
    store.set_budgets(vec![0]).unwrap();
    assert_eq!(store.get(&key(&tiny, 0)).unwrap().1, Found::Disk);
    assert_eq!(store.stats().memory_bytes, vec![0]);
}

/// The heat model, written plainly from the definition: every access to a key adds
/// 0.5^((now - then) / half_life).
fn model_heat(log: &[(u8, u64)], key: u8, now: u64, half_life: f64) -> f64 {
    log.iter()
        .filter(|(k, _)| *k == key)
        .map(|(_, at)| 0.5f64.powf((now - at) as f64 / half_life))
        .sum()
}

#[derive(Debug, Clone)]
enum Op {
    Touch(u8, u64),
    Budgets(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..8, 1u64..5).prop_map(|(k, b)| Op::Touch(k, b * 100)),
        1 => (0u64..1200, 0u64..1200).prop_map(|(a, b)| Op::Budgets(a, b)),
    ]
}

proptest! {
    #[test]
    fn tiers_hold_what_the_heat_model_ranks_first(ops in prop::collection::vec(op(), 1..120)) {
        let half_life = 5.0;
        let mut tiers = HeatTiers::new(vec![600, 900], half_life);
        let mut budgets = [600u64, 900];
        let mut log: Vec<(u8, u64)> = Vec::new();
        let mut sizes: BTreeMap<u8, u64> = BTreeMap::new();
        let mut mirror: BTreeMap<u8, usize> = BTreeMap::new();
        let mut clock = 0u64;
        for op in ops {
            let moves = match op {
                Op::Touch(k, bytes) => {
                    clock += 1;
                    log.push((k, clock));
                    sizes.insert(k, bytes);
                    tiers.touch(&k, bytes)
                }
                Op::Budgets(a, b) => {
                    budgets = [a, b];
                    tiers.set_budgets(vec![a, b])
                }
            };
            // The moves handed out carry a holder from the old placement to the new one.
            for mv in moves {
                prop_assert_eq!(mirror.get(&mv.key).copied(), mv.from);
                match mv.to {
                    Some(t) => mirror.insert(mv.key, t),
                    None => mirror.remove(&mv.key),
                };
            }
            // Heats equal the plain definition.
            for &k in sizes.keys() {
                let expected = model_heat(&log, k, clock, half_life);
                prop_assert!((tiers.heat(&k) - expected).abs() < 1e-9 * expected.max(1.0));
            }
            // The placement is the rank-order fill of the model's heats.
            let mut ranked: Vec<u8> = sizes.keys().copied().collect();
            let last = |k: u8| log.iter().rev().find(|(x, _)| *x == k).map_or(0, |(_, at)| *at);
            ranked.sort_by(|&x, &y| {
                model_heat(&log, y, clock, half_life)
                    .total_cmp(&model_heat(&log, x, clock, half_life))
                    .then(last(y).cmp(&last(x)))
                    .then(x.cmp(&y))
            });
            let mut expected = BTreeMap::new();
            let (mut tier, mut used) = (0usize, [0u64; 2]);
            for k in ranked {
                while tier < 2 && used[tier] + sizes[&k] > budgets[tier] {
                    tier += 1;
                }
                if tier == 2 {
                    break;
                }
                used[tier] += sizes[&k];
                expected.insert(k, tier);
            }
            for &k in sizes.keys() {
                prop_assert_eq!(tiers.tier_of(&k), expected.get(&k).copied(), "key {}", k);
            }
            prop_assert_eq!(&mirror, &expected);
            for t in 0..2 {
                prop_assert!(tiers.used(t) <= budgets[t]);
                prop_assert_eq!(tiers.used(t), used[t]);
            }
        }
    }
}

/// Heat is not recency: a chunk read five times keeps its place against one read once since
/// (an LRU would have swapped them).
#[test]
fn a_popular_chunk_outlasts_a_recent_one() {
    let mut tiers = HeatTiers::new(vec![100], 10.0);
    for _ in 0..5 {
        tiers.touch(&"popular", 100);
    }
    tiers.touch(&"recent", 100);
    assert_eq!(tiers.tier_of(&"popular"), Some(0));
    assert_eq!(tiers.tier_of(&"recent"), None);
    // Long enough after, the burst has faded and steady reads of the other win.
    for _ in 0..40 {
        tiers.touch(&"recent", 100);
    }
    assert_eq!(tiers.tier_of(&"recent"), Some(0));
    assert_eq!(tiers.tier_of(&"popular"), None);
}
