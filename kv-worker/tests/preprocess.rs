//! Preprocessing on a tiny random model: neighbours as exact search ranks them, a run that
//! resumes after an interruption to the same store as one uninterrupted run, and a corpus
//! update that invalidates a changed chunk and exactly the entries that read it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use candle_core::Device;
use hasten_kv_worker::SegmentKv;
use hasten_kv_worker::preprocess::{Catalog, PlannedChunk, carry_over, run};
use hasten_kv_worker::store::{
    ChunkKvStore, KvDtype, MemoryTier, ModelId, StoreSettings, Variant, read_header,
};
use hasten_lm::Decoder;
use hasten_lm::testing::{TinyArch, tokens, write_tiny_model};
use rand::{Rng, SeedableRng};

const DIMENSION: usize = 8;
const TOP_N: usize = 3;

struct Setup {
    _dir: tempfile::TempDir,
    decoder: Decoder,
    system: SegmentKv,
    model: ModelId,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_model(dir.path(), TinyArch::Llama, 41);
    let decoder = Decoder::load(&path, &Device::Cpu).unwrap();
    let system = SegmentKv::prefill(&decoder, tokens(41, 7), None).unwrap();
    let model = ModelId::compute(&path, "as-stored", system.tokens()).unwrap();
    Setup {
        _dir: dir,
        decoder,
        system,
        model,
    }
}

fn store(root: &Path, setup: &Setup) -> ChunkKvStore {
    ChunkKvStore::open(
        StoreSettings {
            root: root.to_path_buf(),
            tiers: vec![MemoryTier {
                name: "ram",
                device: Device::Cpu,
                budget: u64::MAX,
            }],
            dtype: KvDtype::F32,
            half_life: 64.0,
        },
        Device::Cpu,
        setup.decoder.rope().clone(),
    )
    .unwrap()
}

/// Chunks with ids 100.. and random unit vectors.
fn corpus(n: usize) -> (Vec<PlannedChunk>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let chunks = (0..n)
        .map(|i| PlannedChunk {
            id: 100 + i as u64,
            hash: format!("hash-{i}"),
            tokens: tokens(60 + i as u64, 4 + i % 3),
        })
        .collect();
    let mut vectors = Vec::new();
    for _ in 0..n {
        let v: Vec<f32> = (0..DIMENSION)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        vectors.extend(v.iter().map(|x| x / norm));
    }
    (chunks, vectors)
}

fn by_id(chunks: &[PlannedChunk]) -> BTreeMap<u64, PlannedChunk> {
    chunks.iter().map(|c| (c.id, c.clone())).collect()
}

/// Every entry file under `root`, by path relative to it.
fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "kv") {
                let name = path.strip_prefix(root).unwrap().display().to_string();
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn payload(bytes: &[u8]) -> Vec<u8> {
    read_header(bytes).unwrap().1.to_vec()
}

#[test]
fn neighbours_are_the_exact_nearest_other_chunks() {
    let setup = setup();
    let (chunks, vectors) = corpus(9);
    let catalog = Catalog::build(
        setup.model.clone(),
        "v1",
        &chunks,
        &vectors,
        DIMENSION,
        TOP_N,
    )
    .unwrap();
    let row = |i: usize| &vectors[i * DIMENSION..(i + 1) * DIMENSION];
    for (i, chunk) in chunks.iter().enumerate() {
        let mut others: Vec<(f32, u64)> = (0..chunks.len())
            .filter(|&j| j != i)
            .map(|j| {
                (
                    row(i).iter().zip(row(j)).map(|(a, b)| a * b).sum(),
                    chunks[j].id,
                )
            })
            .collect();
        others.sort_by(|a, b| b.0.total_cmp(&a.0));
        let expected: Vec<u64> = others.iter().take(TOP_N).map(|(_, id)| *id).collect();
        assert_eq!(
            catalog.chunks[&chunk.id].neighbours, expected,
            "chunk {}",
            chunk.id
        );
    }
}

#[test]
fn an_interrupted_run_resumes_to_the_same_store_as_one_run() {
    let setup = setup();
    let (chunks, vectors) = corpus(8);
    let catalog = Catalog::build(
        setup.model.clone(),
        "v1",
        &chunks,
        &vectors,
        DIMENSION,
        TOP_N,
    )
    .unwrap();
    let texts = by_id(&chunks);
    let whole = tempfile::tempdir().unwrap();
    let report = run(
        &setup.decoder,
        &setup.system,
        &store(whole.path(), &setup),
        &catalog,
        &texts,
        None,
        |_, _, _| true,
    )
    .unwrap();
    assert_eq!(
        (report.full_reuse.computed, report.similarity.computed),
        (8, 8)
    );

    let resumed = tempfile::tempdir().unwrap();
    let mut entries = 0;
    // Stopped after 11 entries: all of Full Reuse and 3 similarity ones.
    let first = run(
        &setup.decoder,
        &setup.system,
        &store(resumed.path(), &setup),
        &catalog,
        &texts,
        None,
        |_, _, _| {
            entries += 1;
            entries < 11
        },
    )
    .unwrap();
    assert_eq!(
        (first.full_reuse.computed, first.similarity.computed),
        (8, 3)
    );
    let progress = catalog.progress(resumed.path()).unwrap();
    assert_eq!(
        (progress.full_reuse, progress.similarity, progress.done()),
        (8, 3, false)
    );
    let rest = run(
        &setup.decoder,
        &setup.system,
        &store(resumed.path(), &setup),
        &catalog,
        &texts,
        None,
        |_, _, _| true,
    )
    .unwrap();
    assert_eq!((rest.full_reuse.skipped, rest.similarity.skipped), (8, 3));
    assert_eq!(rest.similarity.computed, 5);
    assert!(catalog.progress(resumed.path()).unwrap().done());
    assert_eq!(files(whole.path()), files(resumed.path()));
}

#[test]
fn a_corpus_update_invalidates_a_changed_chunk_and_the_entries_that_read_it() {
    let setup = setup();
    let (chunks, vectors) = corpus(10);
    let v1 = Catalog::build(
        setup.model.clone(),
        "v1",
        &chunks,
        &vectors,
        DIMENSION,
        TOP_N,
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let kv = store(root.path(), &setup);
    run(
        &setup.decoder,
        &setup.system,
        &kv,
        &v1,
        &by_id(&chunks),
        None,
        |_, _, _| true,
    )
    .unwrap();

    // Chunk 103's text changes (same vector, so every neighbour list stays).
    let changed = 103;
    let mut edited = chunks.clone();
    edited[3] = PlannedChunk {
        id: changed,
        hash: "hash-3-edited".into(),
        tokens: tokens(999, 6),
    };
    let v2 = Catalog::build(
        setup.model.clone(),
        "v2",
        &edited,
        &vectors,
        DIMENSION,
        TOP_N,
    )
    .unwrap();
    let dependents: BTreeSet<u64> = v1
        .chunks
        .iter()
        .filter(|(_, c)| c.neighbours.contains(&changed))
        .map(|(id, _)| *id)
        .collect();
    assert!(
        !dependents.is_empty(),
        "the case must have chunks that read the changed one"
    );

    let invalidation = carry_over(&kv, &v1, &v2).unwrap();
    assert_eq!(invalidation.changed, vec![changed]);
    assert!(invalidation.removed.is_empty());
    assert_eq!(
        invalidation
            .dependents
            .iter()
            .copied()
            .collect::<BTreeSet<_>>(),
        dependents
    );
    assert_eq!(invalidation.carried, 2 * 10 - 2 - dependents.len());
    for &id in v2.chunks.keys() {
        let fr = kv.contains(&v2.key(id, Variant::FullReuse).unwrap());
        let sim = kv.contains(&v2.key(id, Variant::Similarity).unwrap());
        assert_eq!(fr, id != changed, "Full Reuse of {id}");
        assert_eq!(
            sim,
            id != changed && !dependents.contains(&id),
            "similarity of {id}"
        );
    }

    // Preprocessing v2 completes it; what was carried is v1's KV unchanged, what was
    // recomputed differs from v1's (keeping it would have served stale KV).
    run(
        &setup.decoder,
        &setup.system,
        &kv,
        &v2,
        &by_id(&edited),
        None,
        |_, _, _| true,
    )
    .unwrap();
    assert!(v2.progress(root.path()).unwrap().done());
    let all = files(root.path());
    let entry = |version: &str, id: u64, variant: Variant| {
        let key = match version {
            "v1" => v1.key(id, variant).unwrap(),
            _ => v2.key(id, variant).unwrap(),
        };
        payload(&all[&key.relative_path().display().to_string()])
    };
    for &id in v2.chunks.keys() {
        for variant in [Variant::FullReuse, Variant::Similarity] {
            let stale =
                id == changed || (variant == Variant::Similarity && dependents.contains(&id));
            assert_eq!(
                entry("v1", id, variant) != entry("v2", id, variant),
                stale,
                "{id} {variant}"
            );
        }
    }
    // A carried entry is refused under its old version's key name: headers were renamed.
    let header = read_header(
        &all[&v2
            .key(100, Variant::FullReuse)
            .unwrap()
            .relative_path()
            .display()
            .to_string()],
    )
    .unwrap()
    .0;
    assert_eq!(header.corpus, "v2");
}
