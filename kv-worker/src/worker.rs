//! The worker's request path without the wire: each chunk resolved to its one stored KV (an
//! id through the corpus version's catalog, a text by its content, computed on first use),
//! then the fused prefill and greedy decoding.

use display_full_error::DisplayFullErrorExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hasten_rag::AnswerSink;

use crate::engine::{KvAnswer, KvEngine};
use crate::error::KvError;
use crate::fusion::{FusionSettings, PrefillOptions, SegmentKv};
use crate::preprocess::{Catalog, Progress};
use crate::prompt::chunk_tokens;
use crate::store::{
    ChunkKvStore, EntryMeta, Found, KvKey, ModelId, StoreError, Variant, chunk_content,
    content_hash,
};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("corpus version {version} is not held by this worker (held: {held})")]
    UnknownCorpus { version: String, held: String },
    #[error("chunk {id} is not in corpus version {version}")]
    UnknownChunk { id: u64, version: String },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WorkerError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkInput {
    Id(u64),
    Text { title: String, text: String },
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub question: String,
    pub chunks: Vec<ChunkInput>,
    /// Required when any chunk is an id.
    pub corpus_version: Option<String>,
    pub settings: FusionSettings,
    /// The stored KV id chunks use; text chunks always use their Full Reuse KV.
    pub variant: Variant,
    pub max_new_tokens: usize,
}

impl GenerateRequest {
    /// The ids of the chunks given by id, in order.
    pub fn ids(&self) -> Vec<u64> {
        self.chunks
            .iter()
            .filter_map(|c| match c {
                ChunkInput::Id(id) => Some(*id),
                ChunkInput::Text { .. } => None,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Generated {
    pub answer: KvAnswer,
    /// Resolving the chunks: memory, disk, or computing a text chunk's KV.
    pub load: Duration,
    pub memory_hits: usize,
    pub disk_hits: usize,
    /// Text chunks whose KV was computed for this request.
    pub computed_chunks: usize,
}

#[derive(Debug, Clone)]
pub struct TierUsage {
    pub name: &'static str,
    pub budget: u64,
    pub used: u64,
    pub hits: u64,
}

#[derive(Debug, Clone)]
pub struct WorkerInfo {
    pub model_id: ModelId,
    pub model: PathBuf,
    pub device: String,
    pub corpora: Vec<(String, Progress)>,
    pub tiers: Vec<TierUsage>,
    pub disk_hits: u64,
}

pub struct KvWorker {
    engine: KvEngine,
    store: Arc<ChunkKvStore>,
    model_id: ModelId,
    model_path: PathBuf,
    catalogs: RwLock<BTreeMap<String, Catalog>>,
    /// Which leading chunks come out exact (with `exact.stored_leading`, a prompt's first
    /// chunk reads its Full Reuse KV whatever the request's variant: that is exactly a full
    /// prefill's KV for the chunk that follows the system prompt), and what FusionRAG
    /// selects by.
    options: PrefillOptions,
}

impl KvWorker {
    /// A worker over `store` for `engine`'s model, holding every corpus version the store has
    /// a catalog of for this model. `options`: the config keys `exact_leading_chunk`,
    /// `recompute_whole_chunks` and `selection_attention`.
    pub fn new(
        engine: KvEngine,
        store: Arc<ChunkKvStore>,
        model_id: ModelId,
        model_path: PathBuf,
        options: PrefillOptions,
    ) -> Result<Self, WorkerError> {
        let worker = Self {
            engine,
            store,
            model_id,
            model_path,
            catalogs: RwLock::new(BTreeMap::new()),
            options,
        };
        worker.reload_catalogs()?;
        Ok(worker)
    }

    /// Reads the catalogs again (a corpus version preprocessed since the start).
    pub fn reload_catalogs(&self) -> Result<(), WorkerError> {
        let dir = self.store.root().join(self.model_id.as_str());
        let mut catalogs = BTreeMap::new();
        if let Ok(versions) = std::fs::read_dir(&dir) {
            for version in versions.flatten() {
                let path = version.path().join("catalog.json");
                let catalog = Catalog::load(&path).map_err(|e| {
                    WorkerError::invalid(
                        "catalog",
                        format!("{}: {}", path.display(), e.display_full()),
                    )
                })?;
                if let Some(catalog) = catalog.filter(|c| c.model == self.model_id) {
                    catalogs.insert(catalog.corpus.clone(), catalog);
                }
            }
        }
        *self.catalogs.write().unwrap_or_else(|p| p.into_inner()) = catalogs;
        Ok(())
    }

    pub fn model_id(&self) -> &ModelId {
        &self.model_id
    }

    pub fn engine(&self) -> &KvEngine {
        &self.engine
    }

    /// The checks that need no model: a request that fails them is refused before it waits
    /// for the model.
    pub fn validate(&self, request: &GenerateRequest) -> Result<(), WorkerError> {
        if request.question.trim().is_empty() {
            return Err(WorkerError::invalid("question", "is empty"));
        }
        if request.chunks.is_empty() {
            return Err(WorkerError::invalid("chunks", "needs at least one chunk"));
        }
        let ratio = request.settings.ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(WorkerError::invalid(
                "recompute_ratio",
                format!("{ratio} is outside [0, 1]"),
            ));
        }
        let ids = request.ids();
        if ids.is_empty() {
            return Ok(());
        }
        let Some(version) = &request.corpus_version else {
            return Err(WorkerError::invalid(
                "corpus_version",
                "is required for chunks given by id",
            ));
        };
        let catalogs = self.catalogs.read().unwrap_or_else(|p| p.into_inner());
        let catalog = catalogs
            .get(version)
            .ok_or_else(|| WorkerError::UnknownCorpus {
                version: version.clone(),
                held: held(&catalogs),
            })?;
        if let Some(&id) = ids.iter().find(|id| !catalog.chunks.contains_key(id)) {
            return Err(WorkerError::UnknownChunk {
                id,
                version: version.clone(),
            });
        }
        Ok(())
    }

    /// Starts loading the `variant` entries of `ids` in the background; the count started.
    pub fn prefetch(&self, version: &str, ids: &[u64], variant: Variant) -> usize {
        let keys = ids.iter().filter_map(|&id| {
            KvKey::corpus_chunk(self.model_id.clone(), version, id, variant).ok()
        });
        self.prefetch_keys(keys)
    }

    /// Starts loading the entries `request`'s id chunks read (the service does it before the
    /// request queues); the count started.
    pub fn prefetch_for(&self, request: &GenerateRequest) -> usize {
        let Some(version) = &request.corpus_version else {
            return 0;
        };
        let keys = request
            .chunks
            .iter()
            .enumerate()
            .filter_map(|(index, chunk)| match chunk {
                ChunkInput::Id(id) => Some((index, *id)),
                ChunkInput::Text { .. } => None,
            })
            .filter_map(|(index, id)| {
                let variant = self.variant_at(request, index);
                KvKey::corpus_chunk(self.model_id.clone(), version, id, variant).ok()
            });
        self.prefetch_keys(keys)
    }

    fn prefetch_keys(&self, keys: impl Iterator<Item = KvKey>) -> usize {
        let keys: Vec<KvKey> = keys.filter(|key| self.store.contains(key)).collect();
        let started = keys.len();
        self.store.prefetch(keys);
        started
    }

    /// The stored KV the chunk at `index` of `request` reads when given by id.
    fn variant_at(&self, request: &GenerateRequest, index: usize) -> Variant {
        if index == 0 && self.options.exact.stored_leading {
            Variant::FullReuse
        } else {
            request.variant
        }
    }

    /// Answers `request`, giving `sink` each piece of the answer as it is decoded; stops
    /// early once the sink's caller went away.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Generated, WorkerError> {
        self.validate(request)?;
        let started = Instant::now();
        let (mut memory_hits, mut disk_hits, mut computed_chunks) = (0, 0, 0);
        let mut chunks: Vec<Arc<SegmentKv>> = Vec::with_capacity(request.chunks.len());
        for (index, chunk) in request.chunks.iter().enumerate() {
            let (segment, found) = match chunk {
                ChunkInput::Id(id) => {
                    let version = request.corpus_version.as_deref().unwrap_or_default();
                    let variant = self.variant_at(request, index);
                    let key = KvKey::corpus_chunk(self.model_id.clone(), version, *id, variant)?;
                    self.store.get(&key)?
                }
                ChunkInput::Text { title, text } => {
                    let content = chunk_content(title, text);
                    let key = KvKey::text_chunk(self.model_id.clone(), &content);
                    match self.store.get(&key) {
                        Ok(hit) => hit,
                        Err(StoreError::NotFound(_)) => {
                            computed_chunks += 1;
                            let tokens = chunk_tokens(self.engine.model(), title, text)?;
                            let segment = self.engine.full_reuse_kv(tokens)?;
                            let meta = EntryMeta {
                                chunk_hash: content_hash(&content),
                                neighbours: Vec::new(),
                            };
                            chunks.push(self.store.put(&key, &meta, segment)?);
                            continue;
                        }
                        Err(other) => return Err(other.into()),
                    }
                }
            };
            match found {
                Found::Memory(_) => memory_hits += 1,
                Found::Disk => disk_hits += 1,
            }
            chunks.push(segment);
        }
        let load = started.elapsed();
        let refs: Vec<&SegmentKv> = chunks.iter().map(AsRef::as_ref).collect();
        let mut answer = self.engine.answer(
            &request.question,
            &refs,
            request.settings,
            request.max_new_tokens,
            self.options,
            sink,
        )?;
        // The answer's clock starts at the prefill; the request's at its arrival here.
        answer.timings.first_token += load;
        answer.timings.total += load;
        Ok(Generated {
            answer,
            load,
            memory_hits,
            disk_hits,
            computed_chunks,
        })
    }

    /// Each memory tier's budget, bytes held and hits (cheap: no file is read).
    pub fn tiers(&self) -> Vec<TierUsage> {
        let stats = self.store.stats();
        self.store
            .tier_names()
            .into_iter()
            .zip(self.store.budgets())
            .enumerate()
            .map(|(i, (name, budget))| TierUsage {
                name,
                budget,
                used: stats.memory_bytes.get(i).copied().unwrap_or(0),
                hits: stats.memory_hits.get(i).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Everything `Info` reports; preprocessing progress looks for every catalog entry's
    /// file, so this is for status calls, not for every request.
    pub fn info(&self) -> Result<WorkerInfo, WorkerError> {
        let catalogs = self.catalogs.read().unwrap_or_else(|p| p.into_inner());
        let corpora = catalogs
            .iter()
            .map(|(version, catalog)| Ok((version.clone(), catalog.progress(self.store.root())?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(WorkerInfo {
            model_id: self.model_id.clone(),
            model: self.model_path.clone(),
            device: if self.engine.system().kv().device().is_cuda() {
                "cuda".into()
            } else {
                "cpu".into()
            },
            corpora,
            tiers: self.tiers(),
            disk_hits: self.store.stats().disk_hits,
        })
    }
}

fn held(catalogs: &BTreeMap<String, Catalog>) -> String {
    if catalogs.is_empty() {
        "none: run `kv-worker preprocess`".into()
    } else {
        catalogs.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}
