//! Loading a corpus bundle, which every shard server and edge does at start: reading the
//! manifest, documents and vectors and checking them against the manifest. Each bundle is
//! measured twice: the whole load, and the content check alone on what the load read.
//!
//! - `demo`: the bundle `make demo` builds (`run/demo/bundle-real`, 3,533 passages), when
//!   it is there;
//! - `synthetic_100k`: 100,000 passages of the demo corpus's average size (~700 bytes a
//!   JSON line) with seeded unit vectors, 384-d, written once to a temporary directory.
//!
//! Run: `cargo bench -p hasten-bench --bench bundle_load`.

// Benchmarks take no outside input; a failed set-up should abort loudly.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hasten_bench::clustered_vectors;
use hasten_core::bundle::{CorpusBundle, write_bundle};
use hasten_core::corpus::Document;

const D: usize = 384;
const SYNTHETIC_PASSAGES: usize = 100_000;
/// A demo passage's text is ~650 bytes.
const TEXT_BYTES: usize = 650;

fn demo_bundle() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../run/demo/bundle-real");
    dir.join("manifest.json").exists().then_some(dir)
}

fn synthetic_bundle(dir: &Path) -> PathBuf {
    let (_, vectors) = clustered_vectors(SYNTHETIC_PASSAGES / 100, 100, D, 0.05, 11);
    let documents: Vec<Document> = (0..SYNTHETIC_PASSAGES as u64)
        .map(|id| {
            let mut text = String::with_capacity(TEXT_BYTES + 16);
            while text.len() < TEXT_BYTES {
                text.push_str(&format!("passage {id} word {} ", text.len()));
            }
            Document {
                id,
                title: format!("Article {}", id / 40),
                text,
            }
        })
        .collect();
    let out = dir.join("synthetic");
    write_bundle(&out, vec!["synthetic".into()], &documents, &vectors, D, &[])
        .expect("synthetic bundle");
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("bundle_load");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let dir = tempfile::tempdir().expect("temporary directory");
    let bundles = demo_bundle()
        .map(|demo| ("demo", demo))
        .into_iter()
        .chain([("synthetic_100k", synthetic_bundle(dir.path()))]);
    for (name, path) in bundles {
        group.bench_function(format!("{name}/load"), |b| {
            b.iter(|| black_box(CorpusBundle::load(&path).expect("bundle")))
        });
        // The check alone, on what load read: its share of the load time.
        let loaded = CorpusBundle::load(&path).expect("bundle");
        group.bench_function(format!("{name}/check_contents"), |b| {
            b.iter(|| loaded.check_contents(&path).expect("checked"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
