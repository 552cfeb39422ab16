//! The chunks of an evaluation: every question's paragraphs (deduplicated), their tokens,
//! their nearest neighbours by MiniLM cosine, and their KV computed ahead of the questions.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use hasten_bench::progress_bar;
use hasten_bench::questions::{Question, encode_documents};
use hasten_core::encoder::TextEncoder;
use hasten_core::index::ExactIndex;
use hasten_kv_worker::preprocess::similarity_kv;
use hasten_kv_worker::prompt::chunk_tokens;
use hasten_kv_worker::store::Variant;
use hasten_kv_worker::{KvEngine, SegmentKv};

/// The short name a report gives a stored KV variant.
pub fn variant_name(variant: Variant) -> &'static str {
    match variant {
        Variant::FullReuse => "fr-kv",
        Variant::Similarity => "sim-kv",
    }
}

pub struct Corpus {
    tokens: Vec<Vec<u32>>,
    /// Each question's chunks, in the file's order (then padding).
    per_question: Vec<Vec<usize>>,
    neighbours: Vec<Vec<usize>>,
}

/// Every chunk's KV, per variant (`None` where no question needs it).
pub struct Stores {
    full_reuse: Vec<Option<SegmentKv>>,
    similarity: Vec<Option<SegmentKv>>,
    seconds: [Vec<f64>; 2],
}

impl Corpus {
    pub fn build(
        engine: &KvEngine,
        questions: &[Question],
        encoder: &TextEncoder,
        top_n: usize,
        min_context: usize,
    ) -> Result<Self> {
        let mut ids: HashMap<(String, String), usize> = HashMap::new();
        let mut documents = Vec::new();
        let mut per_question = Vec::with_capacity(questions.len());
        for question in questions {
            let mut own = Vec::new();
            for document in &question.documents {
                let key = (document.title.clone(), document.text.clone());
                let id = *ids.entry(key).or_insert_with(|| {
                    documents.push(document.clone());
                    documents.len() - 1
                });
                own.push(id);
            }
            per_question.push(own);
        }
        let tokens = documents
            .iter()
            .map(|d| chunk_tokens(engine.model(), &d.title, &d.text))
            .collect::<hasten_kv_worker::Result<Vec<_>>>()?;
        let system = engine.system().len();
        if min_context > 0 {
            let originals = per_question.clone();
            for (q, own) in per_question.iter_mut().enumerate() {
                let mut context = system + own.iter().map(|&c| tokens[c].len()).sum::<usize>();
                let later = originals
                    .iter()
                    .cycle()
                    .skip(q + 1)
                    .take(originals.len() - 1);
                for &chunk in later.flatten() {
                    if context >= min_context {
                        break;
                    }
                    if !own.contains(&chunk) {
                        own.push(chunk);
                        context += tokens[chunk].len();
                    }
                }
            }
        }
        eprintln!("encoding {} chunks for their neighbours", documents.len());
        encode_documents(encoder, &mut documents)?;
        let vectors: Vec<f32> = documents
            .iter()
            .flat_map(|d| d.vector.iter().flatten().copied())
            .collect();
        let neighbours = nearest(&vectors, encoder.dimension(), top_n)?;
        Ok(Self {
            tokens,
            per_question,
            neighbours,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Full Reuse KV of every chunk a question or a neighbour list needs, then the
    /// similarity-guided KV of every chunk a question reads; seconds per chunk recorded.
    pub fn preprocess(&self, engine: &KvEngine) -> Result<Stores> {
        let mut used = vec![false; self.len()];
        for &chunk in self.per_question.iter().flatten() {
            used[chunk] = true;
        }
        let mut needed = used.clone();
        for (chunk, _) in used.iter().enumerate().filter(|(_, u)| **u) {
            for &n in &self.neighbours[chunk] {
                needed[n] = true;
            }
        }
        let mut stores = Stores {
            full_reuse: vec![None; self.len()],
            similarity: vec![None; self.len()],
            seconds: [Vec::new(), Vec::new()],
        };
        eprintln!("preprocessing: Full Reuse KV");
        let bar = progress_bar("Full Reuse KV", needed.iter().filter(|n| **n).count());
        for (chunk, _) in needed.iter().enumerate().filter(|(_, n)| **n) {
            let started = Instant::now();
            stores.full_reuse[chunk] = Some(engine.full_reuse_kv(self.tokens[chunk].clone())?);
            stores.seconds[0].push(started.elapsed().as_secs_f64());
            bar.inc(1);
        }
        bar.finish_and_clear();
        eprintln!("preprocessing: similarity-guided KV");
        let bar = progress_bar("similarity KV", used.iter().filter(|u| **u).count());
        let decoder = &engine.model().decoder;
        for (chunk, _) in used.iter().enumerate().filter(|(_, u)| **u) {
            let started = Instant::now();
            let neighbours: Vec<&SegmentKv> = self.neighbours[chunk]
                .iter()
                .filter_map(|&n| stores.full_reuse[n].as_ref())
                .collect();
            let kv = similarity_kv(
                decoder,
                engine.system(),
                &neighbours,
                self.tokens[chunk].clone(),
            )?;
            stores.similarity[chunk] = Some(kv);
            stores.seconds[1].push(started.elapsed().as_secs_f64());
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(stores)
    }

    /// Question `q`'s chunks in `variant`.
    pub fn chunks_of<'a>(
        &self,
        q: usize,
        variant: Variant,
        exact_lead: bool,
        stores: &'a Stores,
    ) -> Vec<&'a SegmentKv> {
        let store = |variant| match variant {
            Variant::FullReuse => &stores.full_reuse,
            Variant::Similarity => &stores.similarity,
        };
        self.per_question[q]
            .iter()
            .enumerate()
            .filter_map(|(i, &c)| {
                let variant = if i == 0 && exact_lead {
                    Variant::FullReuse
                } else {
                    variant
                };
                store(variant)[c].as_ref()
            })
            .collect()
    }
}

impl Stores {
    pub fn report(&self) -> serde_json::Value {
        let summary = |seconds: &[f64]| {
            serde_json::json!({
                "chunks": seconds.len(),
                "seconds_per_chunk": seconds.iter().sum::<f64>() / seconds.len().max(1) as f64,
            })
        };
        serde_json::json!({
            "full_reuse": summary(&self.seconds[0]),
            "similarity": summary(&self.seconds[1]),
        })
    }
}

/// Each chunk's `n` most similar chunks (exact inner product of unit vectors, faiss), most
/// similar first; the chunk itself and exact duplicates of its vector left out.
fn nearest(vectors: &[f32], dimension: usize, n: usize) -> Result<Vec<Vec<usize>>> {
    let index = ExactIndex::build(dimension, vectors).context("indexing the chunks")?;
    // Room for the chunk itself and a few duplicates.
    let hits = index
        .search(vectors, n + 4)
        .context("searching the chunks")?;
    let row = |i: usize| &vectors[i * dimension..(i + 1) * dimension];
    Ok(hits
        .into_iter()
        .enumerate()
        .map(|(i, hits)| {
            hits.into_iter()
                .map(|hit| hit.id as usize)
                .filter(|&j| j != i && row(j) != row(i))
                .take(n)
                .collect()
        })
        .collect())
}
