//! Offline, per chunk: its Full Reuse KV (prefilled right after the system prompt) and its
//! similarity-guided KV (recomputed after the system prompt and its top-n most similar
//! chunks' Full Reuse KV, FusionRAG's preprocessing), each stored once.
//!
//! A corpus version's [`Catalog`] is written before any KV: every chunk's content hash and
//! neighbours. Progress is what of it the store holds, so an interrupted run resumes where
//! it stopped, and a new corpus version carries over exactly the entries it leaves valid
//! ([`carry_over`]).

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hasten_core::index::ExactIndex;
use hasten_lm::Decoder;
use serde::{Deserialize, Serialize};

use crate::fusion::{SegmentKv, assemble};
use crate::store::{ChunkKvStore, EntryMeta, KvKey, ModelId, StoreError, Variant};

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("computing chunk {id}'s KV")]
    Model {
        id: u64,
        source: Box<crate::KvError>,
    },
    #[error("finding neighbours")]
    Index(#[from] hasten_core::index::IndexError),
    #[error("catalog {path}: {message}")]
    Catalog { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// One chunk of a corpus version, tokenized as prompts place it.
#[derive(Debug, Clone)]
pub struct PlannedChunk {
    pub id: u64,
    pub hash: String,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogChunk {
    /// Content hash of the chunk's text.
    pub hash: String,
    pub tokens: usize,
    /// Most similar first.
    pub neighbours: Vec<u64>,
}

/// What one corpus version's preprocessing covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub model: ModelId,
    pub corpus: String,
    pub top_n: usize,
    pub chunks: BTreeMap<u64, CatalogChunk>,
}

/// Entries of a catalog held by the store, per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub full_reuse: usize,
    pub similarity: usize,
    pub chunks: usize,
}

impl Progress {
    pub fn done(&self) -> bool {
        self.full_reuse == self.chunks && self.similarity == self.chunks
    }
}

impl Catalog {
    /// The catalog of `chunks` whose embedding vectors are `vectors` (row i is chunk i, unit
    /// length): each chunk's `top_n` nearest by exact inner product, as the cloud index ranks
    /// them, itself and exact duplicates of its vector left out.
    pub fn build(
        model: ModelId,
        corpus: &str,
        chunks: &[PlannedChunk],
        vectors: &[f32],
        dimension: usize,
        top_n: usize,
    ) -> Result<Self, PreprocessError> {
        if dimension == 0 || vectors.len() != chunks.len() * dimension {
            return Err(PreprocessError::Invalid(format!(
                "{} vectors of dimension {dimension} for {} chunks",
                vectors.len() / dimension.max(1),
                chunks.len()
            )));
        }
        let row = |i: usize| &vectors[i * dimension..(i + 1) * dimension];
        let hits = if chunks.is_empty() {
            Vec::new()
        } else {
            let index = ExactIndex::build(dimension, vectors)?;
            // Room for the chunk itself and a few duplicates.
            index.search(vectors, (top_n + 4).min(chunks.len()))?
        };
        let mut catalog = BTreeMap::new();
        for (i, (chunk, hits)) in chunks.iter().zip(hits).enumerate() {
            let neighbours = hits
                .into_iter()
                .map(|hit| hit.id as usize)
                .filter(|&j| j != i && row(j) != row(i))
                .take(top_n)
                .map(|j| chunks[j].id)
                .collect();
            let entry = CatalogChunk {
                hash: chunk.hash.clone(),
                tokens: chunk.tokens.len(),
                neighbours,
            };
            if catalog.insert(chunk.id, entry).is_some() {
                return Err(PreprocessError::Invalid(format!(
                    "chunk id {} twice",
                    chunk.id
                )));
            }
        }
        Ok(Self {
            model,
            corpus: corpus.to_string(),
            top_n,
            chunks: catalog,
        })
    }

    pub fn path(store_root: &Path, model: &ModelId, corpus: &str) -> PathBuf {
        store_root
            .join(model.as_str())
            .join(corpus)
            .join("catalog.json")
    }

    pub fn load(path: &Path) -> Result<Option<Self>, PreprocessError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(PreprocessError::Catalog {
                    path: path.to_path_buf(),
                    message: e.to_string_full(),
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| PreprocessError::Catalog {
                path: path.to_path_buf(),
                message: e.to_string_full(),
            })
    }

    pub fn save(&self, store_root: &Path) -> Result<(), PreprocessError> {
        let path = Self::path(store_root, &self.model, &self.corpus);
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| PreprocessError::Catalog {
            path: path.clone(),
            message: e.to_string_full(),
        })?;
        hasten_core::lifecycle::write_atomically(&path, &bytes).map_err(|e| {
            PreprocessError::Catalog {
                path,
                message: e.to_string_full(),
            }
        })
    }

    pub fn key(&self, id: u64, variant: Variant) -> Result<KvKey, StoreError> {
        KvKey::corpus_chunk(self.model.clone(), &self.corpus, id, variant)
    }

    fn meta(&self, id: u64, variant: Variant) -> EntryMeta {
        let chunk = &self.chunks[&id];
        EntryMeta {
            chunk_hash: chunk.hash.clone(),
            neighbours: match variant {
                Variant::FullReuse => Vec::new(),
                Variant::Similarity => chunk.neighbours.clone(),
            },
        }
    }

    /// What of this catalog the store at `store_root` holds.
    pub fn progress(&self, store_root: &Path) -> Result<Progress, StoreError> {
        let held = |id: u64, variant| -> Result<usize, StoreError> {
            let path = store_root.join(self.key(id, variant)?.relative_path());
            Ok(usize::from(path.is_file()))
        };
        let mut progress = Progress {
            full_reuse: 0,
            similarity: 0,
            chunks: self.chunks.len(),
        };
        for &id in self.chunks.keys() {
            progress.full_reuse += held(id, Variant::FullReuse)?;
            progress.similarity += held(id, Variant::Similarity)?;
        }
        Ok(progress)
    }
}

/// Seconds spent per variant, over the entries this run computed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PreprocessReport {
    pub full_reuse: PhaseReport,
    pub similarity: PhaseReport,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    pub computed: usize,
    /// Already in the store (an earlier run's).
    pub skipped: usize,
    pub seconds: f64,
}

impl PhaseReport {
    pub fn seconds_per_chunk(&self) -> Option<f64> {
        (self.computed > 0).then(|| self.seconds / self.computed as f64)
    }

    fn add(&mut self, took: Duration) {
        self.computed += 1;
        self.seconds += took.as_secs_f64();
    }
}

/// Which phase an event belongs to, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    FullReuse,
    Similarity,
}

/// Computes what `catalog` lists and the store lacks: the Full Reuse KV of the `only` chunks
/// (all when `None`) and of their neighbours, then their similarity-guided KV. After each
/// stored entry `on_entry(phase, done, total)` is called; returning false stops the run
/// there (what is stored stays, and a later run resumes after it).
pub fn run(
    decoder: &Decoder,
    system: &SegmentKv,
    store: &ChunkKvStore,
    catalog: &Catalog,
    chunks: &BTreeMap<u64, PlannedChunk>,
    only: Option<&BTreeSet<u64>>,
    mut on_entry: impl FnMut(Phase, usize, usize) -> bool,
) -> Result<PreprocessReport, PreprocessError> {
    let targets: BTreeSet<u64> = match only {
        Some(only) => only.clone(),
        None => catalog.chunks.keys().copied().collect(),
    };
    let mut full_reuse = targets.clone();
    for id in &targets {
        let entry = catalog.chunks.get(id).ok_or_else(|| {
            PreprocessError::Invalid(format!(
                "chunk {id} is not in corpus version {}'s catalog",
                catalog.corpus
            ))
        })?;
        full_reuse.extend(&entry.neighbours);
    }
    let tokens = |id: u64| -> Result<&PlannedChunk, PreprocessError> {
        let chunk = chunks.get(&id).ok_or_else(|| {
            PreprocessError::Invalid(format!("no text for chunk {id} of the catalog"))
        })?;
        if chunk.hash != catalog.chunks[&id].hash {
            return Err(PreprocessError::Invalid(format!(
                "chunk {id}'s text has hash {} but the catalog of corpus version {} says {}",
                chunk.hash, catalog.corpus, catalog.chunks[&id].hash
            )));
        }
        Ok(chunk)
    };
    let model_error = |id: u64| {
        move |e: crate::KvError| PreprocessError::Model {
            id,
            source: Box::new(e),
        }
    };
    let mut report = PreprocessReport::default();
    for (done, &id) in full_reuse.iter().enumerate() {
        let key = catalog.key(id, Variant::FullReuse)?;
        if store.contains(&key) {
            report.full_reuse.skipped += 1;
        } else {
            let started = Instant::now();
            let segment =
                SegmentKv::prefill(decoder, tokens(id)?.tokens.clone(), Some(system.kv()))
                    .map_err(model_error(id))?;
            store.put(&key, &catalog.meta(id, Variant::FullReuse), segment)?;
            report.full_reuse.add(started.elapsed());
        }
        if !on_entry(Phase::FullReuse, done + 1, full_reuse.len()) {
            return Ok(report);
        }
    }
    for (done, &id) in targets.iter().enumerate() {
        let key = catalog.key(id, Variant::Similarity)?;
        if store.contains(&key) {
            report.similarity.skipped += 1;
        } else {
            let started = Instant::now();
            let neighbours = catalog.chunks[&id]
                .neighbours
                .iter()
                .map(|&n| {
                    store
                        .get(&catalog.key(n, Variant::FullReuse)?)
                        .map(|(segment, _)| segment)
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let refs: Vec<&SegmentKv> = neighbours.iter().map(AsRef::as_ref).collect();
            let segment = similarity_kv(decoder, system, &refs, tokens(id)?.tokens.clone())
                .map_err(model_error(id))?;
            store.put(&key, &catalog.meta(id, Variant::Similarity), segment)?;
            report.similarity.add(started.elapsed());
        }
        if !on_entry(Phase::Similarity, done + 1, targets.len()) {
            return Ok(report);
        }
    }
    Ok(report)
}

/// A chunk's KV recomputed after the system prompt and its neighbours (their Full Reuse KV
/// placed one after another): what it attends to resembles what a request will place
/// before it.
pub fn similarity_kv(
    decoder: &Decoder,
    system: &SegmentKv,
    neighbours: &[&SegmentKv],
    tokens: Vec<u32>,
) -> crate::Result<SegmentKv> {
    let before = assemble(decoder.rope(), system, neighbours, tokens.len())?;
    SegmentKv::prefill(decoder, tokens, Some(&before.cache))
}

/// What a new corpus version keeps of an old one's entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Invalidation {
    /// In both versions with other text: both variants recomputed.
    pub changed: Vec<u64>,
    /// Only in the old version.
    pub removed: Vec<u64>,
    /// Unchanged, but their similarity-guided KV read a changed or removed chunk, or their
    /// neighbours are others now: that variant recomputed.
    pub dependents: Vec<u64>,
    /// Entries copied to the new version.
    pub carried: usize,
}

/// Copies into `new`'s corpus version every entry of `old`'s that stays valid: a chunk's
/// Full Reuse KV when its text is unchanged, its similarity-guided KV when, besides, its
/// neighbours are the same chunks with unchanged texts (a similarity entry reads only its
/// neighbours' Full Reuse KV, so one level of dependents is all a change reaches).
pub fn carry_over(
    store: &ChunkKvStore,
    old: &Catalog,
    new: &Catalog,
) -> Result<Invalidation, PreprocessError> {
    if old.model != new.model {
        return Err(PreprocessError::Invalid(format!(
            "catalogs of two models ({} and {})",
            old.model, new.model
        )));
    }
    let same_text = |id: &u64| matches!((old.chunks.get(id), new.chunks.get(id)), (Some(a), Some(b)) if a.hash == b.hash);
    let mut invalidation = Invalidation {
        removed: old
            .chunks
            .keys()
            .filter(|id| !new.chunks.contains_key(id))
            .copied()
            .collect(),
        ..Invalidation::default()
    };
    for (id, chunk) in &new.chunks {
        let Some(before) = old.chunks.get(id) else {
            continue;
        };
        if !same_text(id) {
            invalidation.changed.push(*id);
            continue;
        }
        if store.copy_entry(
            &old.key(*id, Variant::FullReuse)?,
            &new.key(*id, Variant::FullReuse)?,
        )? {
            invalidation.carried += 1;
        }
        let neighbours_kept =
            before.neighbours == chunk.neighbours && chunk.neighbours.iter().all(same_text);
        if neighbours_kept && old.top_n == new.top_n {
            if store.copy_entry(
                &old.key(*id, Variant::Similarity)?,
                &new.key(*id, Variant::Similarity)?,
            )? {
                invalidation.carried += 1;
            }
        } else {
            invalidation.dependents.push(*id);
        }
    }
    Ok(invalidation)
}
