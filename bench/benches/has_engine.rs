//! HaS engine micro-benchmarks at the scale: 5,000 cached queries holding 50,000
//! documents, a 100,000-vector fuzzy index, 384-d.
//!
//! - `accept_path`: two-channel draft, exact re-rank and validation for a query homologous
//!   to a cached one (encoder excluded; the cloud is never reached);
//! - `insert_on_fallback`: caching a fallback's 10 documents at capacity (FIFO eviction,
//!   cache-channel removal and addition, inverted index);
//! - `exact_flat_100k`: the baseline in the same process, an exact faiss scan of the same
//!   100,000 vectors (what answering without the edge index would cost in compute);
//! - `encode_short_query`: all-MiniLM-L6-v2 on short questions.
//!
//! p50/p99/max of every iteration are printed after criterion's own report.
//! Run: `cargo bench -p hasten-bench --bench has_engine`.

// Benchmarks take no outside input; a failed set-up should abort loudly.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hasten_bench::{Latencies, clustered_vectors};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_core::index::ExactIndex;
use hasten_edge_node::caches::{Eviction, TenantCaches};
use hasten_edge_node::fallback::{CloudDocument, CloudError, CloudSearch};
use hasten_edge_node::has::{
    CacheChannel, DocumentStore, EdgeDocument, FuzzyChannel, ValidationRules,
};
use hasten_edge_node::retrieval::{EngineSettings, RetrievalEngine, RetrievalPolicy, StageTimings};
use hasten_edge_node::tenants::Tenant;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const D: usize = 384;
const TOPICS: usize = 5_000;
const PER_TOPIC: usize = 20;
/// Cached queries (the paper's capacity); each holds the 10 nearest members of its topic.
const CACHED: usize = 5_000;
const K: usize = 10;
/// Per-dimension noise: topic members sit at cosine ~0.7 from their centre, like passages of
/// one article around a question about it.
const SPREAD: f32 = 0.05;

/// The accept path never reaches the cloud; a fallback here is a benchmark bug.
struct NoCloud;

impl CloudSearch for NoCloud {
    async fn search_batch(
        &self,
        _queries: &[Vec<f32>],
        _k: usize,
        _deadline: Option<Instant>,
    ) -> Result<Vec<Vec<CloudDocument>>, CloudError> {
        Err(CloudError::Refused("the benchmark has no cloud".into()))
    }

    async fn documents(&self, _ids: &[u64]) -> Result<Vec<CloudDocument>, CloudError> {
        Err(CloudError::Refused("the benchmark has no cloud".into()))
    }
}

struct Setup {
    engine: RetrievalEngine<NoCloud>,
    caches: Arc<TenantCaches>,
    centres: Vec<f32>,
    members: Vec<f32>,
    exact: ExactIndex,
}

fn cloud_documents(
    members: &[f32],
    topic: usize,
    range: std::ops::Range<usize>,
) -> Vec<CloudDocument> {
    range
        .map(|i| {
            let row = topic * PER_TOPIC + i;
            CloudDocument {
                id: row as u64,
                score: 0.0,
                title: format!("topic {topic}"),
                text: format!("passage {row} of topic {topic}"),
                vector: members[row * D..(row + 1) * D].to_vec(),
            }
        })
        .collect()
}

fn setup() -> Setup {
    let started = Instant::now();
    let (centres, members) = clustered_vectors(TOPICS, PER_TOPIC, D, SPREAD, 42);
    let documents: Vec<EdgeDocument> = members
        .chunks(D)
        .enumerate()
        .map(|(row, v)| EdgeDocument {
            id: row as u64,
            title: format!("topic {}", row / PER_TOPIC),
            text: format!("passage {row}"),
            vector: v.to_vec(),
        })
        .collect();
    let documents = Arc::new(DocumentStore::new(D, documents));
    let fuzzy = FuzzyChannel::build(&documents, 1.0, None, None).expect("fuzzy channel");
    let channel = CacheChannel::train(D, &members, None, None).expect("cache channel");
    println!(
        "setup: fuzzy {} nprobe {}, cache channel nlist {} nprobe {}",
        fuzzy.index().description(),
        fuzzy.index().shape().nprobe,
        channel.shape().nlist,
        channel.shape().nprobe
    );
    let caches = Arc::new(
        TenantCaches::new(
            RetrievalPolicy::Has.lookup(false),
            &[Tenant::default_tenant()],
            Eviction::Fifo(CACHED),
            &channel,
            documents,
            "bench".into(),
            K,
        )
        .expect("caches"),
    );
    let engine = RetrievalEngine::new(
        EngineSettings {
            policy: RetrievalPolicy::Has,
            tau: 0.2,
            fuzzy_candidates: 50,
            cache_candidates: 50,
            semantic_threshold: 0.9,
            fuzzy_in_validation: true,
            fuzzy_in_draft: true,
            validation: ValidationRules::default(),
            draft_with_matched: false,
            hybrid_similarity: None,
        },
        Arc::clone(&caches),
        Some(fuzzy),
        NoCloud,
    )
    .expect("engine");
    for topic in 0..CACHED {
        let query = centres[topic * D..(topic + 1) * D].to_vec();
        caches
            .insert_fallback(
                &Tenant::default_tenant(),
                None,
                query,
                &cloud_documents(&members, topic, 0..K),
            )
            .expect("the default tenant has a cache");
    }
    let cache = caches.total();
    let (queries, docs) = (cache.queries, cache.documents);
    println!(
        "setup: {queries} cached queries, {docs} cached documents, {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let exact = ExactIndex::build(D, &members).expect("exact index");
    Setup {
        engine,
        caches,
        centres,
        members,
        exact,
    }
}

/// A question homologous to cached topic `topic`: its centre moved by fresh noise.
fn homologous_query(centres: &[f32], topic: usize, rng: &mut StdRng) -> Vec<f32> {
    let v: Vec<f32> = centres[topic * D..(topic + 1) * D]
        .iter()
        .map(|c| c + 0.02 * (rng.random::<f32>() - 0.5))
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let mut rng = StdRng::seed_from_u64(7);
    let queries: Vec<Vec<f32>> = (0..1024)
        .map(|_| homologous_query(&s.centres, rng.random_range(0..CACHED), &mut rng))
        .collect();
    let accepted = queries
        .iter()
        .filter(|q| {
            s.engine
                .speculate(
                    &Tenant::default_tenant(),
                    q,
                    K,
                    false,
                    &mut StageTimings::default(),
                )
                .map(|sp| sp.verdict.accepted)
                .unwrap_or(false)
        })
        .count();
    println!(
        "accept path: {accepted}/{} benchmark queries accepted",
        queries.len()
    );
    let mut stages = [Duration::ZERO; 4];
    for q in &queries {
        let mut t = StageTimings::default();
        let _ = s
            .engine
            .speculate(&Tenant::default_tenant(), q, K, false, &mut t);
        let measured = [t.cache_channel, t.fuzzy_channel, t.merge, t.validation];
        for (sum, v) in stages.iter_mut().zip(measured) {
            *sum += v.unwrap_or_default();
        }
    }
    let n = queries.len() as u32;
    println!(
        "accept path stages, mean us: cache channel {}, fuzzy channel {}, merge {}, validation {}",
        (stages[0] / n).as_micros(),
        (stages[1] / n).as_micros(),
        (stages[2] / n).as_micros(),
        (stages[3] / n).as_micros()
    );

    let mut group = c.benchmark_group("has");
    group.measurement_time(Duration::from_secs(8));

    let mut accept = Latencies::default();
    let mut next = 0usize;
    group.bench_function("accept_path", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let q = &queries[next % queries.len()];
                next += 1;
                let started = Instant::now();
                let speculation = s.engine.speculate(
                    &Tenant::default_tenant(),
                    q,
                    K,
                    false,
                    &mut StageTimings::default(),
                );
                let elapsed = started.elapsed();
                black_box(speculation.map(|sp| sp.verdict.accepted).unwrap_or(false));
                accept.record(elapsed);
                total += elapsed;
            }
            total
        })
    });

    let mut insert = Latencies::default();
    let mut topic = 0usize;
    let mut churn = (0usize, 0usize);
    group.bench_function("insert_on_fallback", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // The FIFO evicts the oldest query, which holds the other half of this
                // topic's members: ten documents leave the cache channel, ten new ones join.
                let t = topic % TOPICS;
                let half = if (topic / TOPICS).is_multiple_of(2) {
                    K..PER_TOPIC
                } else {
                    0..K
                };
                topic += 1;
                let docs = cloud_documents(&s.members, t, half);
                let query = s.centres[t * D..(t + 1) * D].to_vec();
                let started = Instant::now();
                let change = s
                    .caches
                    .insert_fallback(&Tenant::default_tenant(), None, query, &docs)
                    .expect("the default tenant has a cache");
                let elapsed = started.elapsed();
                churn.0 += change.added.len();
                churn.1 += change.released.len();
                insert.record(elapsed);
                total += elapsed;
            }
            total
        })
    });

    println!(
        "insert: {} inserts added {} and released {} cache-channel documents; {} cached documents after",
        insert.len(),
        churn.0,
        churn.1,
        s.caches.total().documents
    );

    let mut flat = Latencies::default();
    group.bench_function("exact_flat_100k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters as usize {
                let started = Instant::now();
                black_box(s.exact.search(&queries[i % queries.len()], K).ok());
                let elapsed = started.elapsed();
                flat.record(elapsed);
                total += elapsed;
            }
            total
        })
    });
    group.finish();

    let model_dir = std::env::var_os("HASTEN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DEFAULT_MODEL_DIR)
        });
    let encoder =
        Arc::new(TextEncoder::load(&model_dir).expect("model missing: run `make models`"));
    let questions = [
        "Where was Super Bowl 50 played?",
        "Which river flows through Warsaw?",
        "When did Nikola Tesla move to New York?",
        "Who led the Normans into England?",
    ];
    let mut encode = Latencies::default();
    let mut encoder_group = c.benchmark_group("encoder");
    encoder_group.measurement_time(Duration::from_secs(8));
    encoder_group.throughput(criterion::Throughput::Elements(1));
    encoder_group.bench_function("encode_short_query", |b| {
        let mut i = 0usize;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                black_box(encoder.encode_one(questions[i % questions.len()]).ok());
                let elapsed = started.elapsed();
                i += 1;
                encode.record(elapsed);
                total += elapsed;
            }
            total
        })
    });
    encoder_group.finish();

    println!("\nlatency per call (every measured iteration):");
    println!("  accept_path         {}", accept.summary());
    println!("  insert_on_fallback  {}", insert.summary());
    println!("  exact_flat_100k     {}", flat.summary());
    println!("  encode_short_query  {}", encode.summary());
}

criterion_group!(benches, bench);
criterion_main!(benches);
