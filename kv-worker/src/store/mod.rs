//! The chunk KV store: every chunk's KV computed once, kept on disk, with the hottest entries
//! in memory tiers (GPU memory on a CUDA worker, then RAM) under byte budgets.
//!
//! Entries are only ever read after they are written: a request gets the stored cache by
//! reference and assembly copies it into buffers the request owns (`KvCache`'s sharing
//! guard), so no request writes what another reads. Loads can start as soon as a request's
//! chunk ids are known ([`ChunkKvStore::prefetch`]); a `get` of an entry being loaded waits
//! for that load instead of reading the file twice.

mod entry;
mod key;
mod sync;
mod tiers;

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::Device;
use hasten_lm::RotaryTables;

pub use entry::{EntryHeader, EntryMeta, KvDtype, read_header};
pub use key::{
    ChunkRef, KvKey, ModelId, ModelIdentity, TEXT_CORPUS, Variant, chunk_content, content_hash,
};
pub use sync::{SyncReport, sync_version};
pub use tiers::{HeatTiers, Move};

use crate::fusion::SegmentKv;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no stored KV for {0}: preprocess the corpus version, or send the chunk as text")]
    NotFound(String),
    #[error("{key}: the stored entry is of another {field} (expected {expected}, found {found})")]
    Mismatch {
        key: String,
        field: &'static str,
        expected: String,
        found: String,
    },
    #[error("corrupt KV entry: {0}")]
    Corrupt(String),
    #[error("KV entry header")]
    Header(#[source] serde_json::Error),
    #[error("invalid KV key: {0}")]
    InvalidKey(String),
    #[error("sync: {0}")]
    Sync(String),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the model failed")]
    Lm(#[from] hasten_lm::LmError),
    /// Boxed: candle's error is large, and rare here.
    #[error(transparent)]
    Candle(Box<candle_core::Error>),
}

impl From<candle_core::Error> for StoreError {
    fn from(error: candle_core::Error) -> Self {
        Self::Candle(Box::new(error))
    }
}

/// A memory tier: where its entries' tensors live and how many bytes it may hold.
#[derive(Debug, Clone)]
pub struct MemoryTier {
    pub name: &'static str,
    pub device: Device,
    pub budget: u64,
}

#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub root: PathBuf,
    /// Fastest first; an empty list keeps everything on disk only.
    pub tiers: Vec<MemoryTier>,
    pub dtype: KvDtype,
    /// Accesses after which an access counts half in an entry's heat.
    pub half_life: f64,
}

/// Where a `get` found its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// In memory tier `n` (0 fastest).
    Memory(usize),
    Disk,
}

/// Counters since the store was opened.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreStats {
    /// Hits per memory tier, in the settings' order.
    pub memory_hits: Vec<u64>,
    pub disk_hits: u64,
    /// Bytes held per memory tier now.
    pub memory_bytes: Vec<u64>,
    /// Files read from disk (a load shared by several gets counts once).
    pub loads: u64,
    pub load_time: Duration,
}

struct Resident {
    segment: Arc<SegmentKv>,
    tier: usize,
}

/// A load in progress; its waiters take the result when it is set.
#[derive(Default)]
struct LoadSlot {
    done: Mutex<Option<Result<Arc<SegmentKv>, String>>>,
    ready: Condvar,
}

struct State {
    heat: HeatTiers<KvKey>,
    resident: HashMap<KvKey, Resident>,
    /// Bytes of each entry's tensors in memory (as computed, whatever the disk dtype).
    sizes: HashMap<KvKey, u64>,
}

pub struct ChunkKvStore {
    root: PathBuf,
    tiers: Vec<MemoryTier>,
    dtype: KvDtype,
    /// The model's device: what `get` hands out lives there.
    device: Device,
    rope: RotaryTables,
    state: Mutex<State>,
    loading: Mutex<HashMap<KvKey, Arc<LoadSlot>>>,
    memory_hits: Vec<AtomicU64>,
    disk_hits: AtomicU64,
    loads: AtomicU64,
    load_micros: AtomicU64,
}

impl ChunkKvStore {
    /// Opens (creating) the store at `settings.root` for a model on `device` whose rotary
    /// tables are `rope`.
    pub fn open(
        settings: StoreSettings,
        device: Device,
        rope: RotaryTables,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(&settings.root).map_err(|source| StoreError::Io {
            path: settings.root.clone(),
            source,
        })?;
        let budgets = settings.tiers.iter().map(|t| t.budget).collect();
        Ok(Self {
            root: settings.root,
            memory_hits: settings.tiers.iter().map(|_| AtomicU64::new(0)).collect(),
            tiers: settings.tiers,
            dtype: settings.dtype,
            device,
            rope,
            state: Mutex::new(State {
                heat: HeatTiers::new(budgets, settings.half_life),
                resident: HashMap::new(),
                sizes: HashMap::new(),
            }),
            loading: Mutex::new(HashMap::new()),
            disk_hits: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            load_micros: AtomicU64::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path_of(&self, key: &KvKey) -> PathBuf {
        self.root.join(key.relative_path())
    }

    pub fn contains(&self, key: &KvKey) -> bool {
        self.path_of(key).is_file()
    }

    /// Writes `segment` as `key`'s entry (atomically: a crash leaves the old file or none)
    /// and counts the write as an access.
    pub fn put(
        &self,
        key: &KvKey,
        meta: &EntryMeta,
        segment: SegmentKv,
    ) -> Result<Arc<SegmentKv>, StoreError> {
        let bytes = entry::encode(key, meta, &segment, self.dtype)?;
        let path = self.path_of(key);
        hasten_core::lifecycle::write_atomically(&path, &bytes)
            .map_err(|source| StoreError::Io { path, source })?;
        let segment = Arc::new(segment);
        self.admit(key, Arc::clone(&segment))?;
        Ok(segment)
    }

    /// The entry for `key` on the model's device, from memory or disk.
    pub fn get(&self, key: &KvKey) -> Result<(Arc<SegmentKv>, Found), StoreError> {
        if let Some((segment, tier)) = self.resident(key)? {
            self.memory_hits[tier].fetch_add(1, Ordering::Relaxed);
            return Ok((segment, Found::Memory(tier)));
        }
        let segment = self.load_shared(key)?;
        self.disk_hits.fetch_add(1, Ordering::Relaxed);
        Ok((self.on_model_device(&segment)?, Found::Disk))
    }

    /// Starts loading the entries of `keys` not in memory, in the background, so that the
    /// `get`s that follow find them loaded or loading.
    pub fn prefetch(self: &Arc<Self>, keys: Vec<KvKey>) {
        let missing: Vec<KvKey> = {
            let state = self.lock_state();
            keys.into_iter()
                .filter(|k| !state.resident.contains_key(k))
                .collect()
        };
        if missing.is_empty() {
            return;
        }
        let store = Arc::clone(self);
        std::thread::spawn(move || {
            for key in missing {
                if let Err(error) = store.load_shared(&key) {
                    tracing::debug!(%key, error = %error.display_full(), "prefetch failed; the request will report it");
                }
            }
        });
    }

    /// Files `from`'s entry under `to` as well (a corpus version carrying over what stays
    /// valid). False when `from` has no entry; true when `to` has one after the call.
    pub fn copy_entry(&self, from: &KvKey, to: &KvKey) -> Result<bool, StoreError> {
        let target = self.path_of(to);
        if target.is_file() {
            return Ok(true);
        }
        let source = self.path_of(from);
        let bytes = match std::fs::read(&source) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source_error) => {
                return Err(StoreError::Io {
                    path: source,
                    source: source_error,
                });
            }
        };
        let bytes = entry::rekey(&bytes, from, to)?;
        hasten_core::lifecycle::write_atomically(&target, &bytes).map_err(|source| {
            StoreError::Io {
                path: target,
                source,
            }
        })?;
        Ok(true)
    }

    /// Deletes `key`'s entry from disk and memory (a corpus update invalidated it).
    pub fn remove(&self, key: &KvKey) -> Result<(), StoreError> {
        let path = self.path_of(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::Io { path, source }),
        }
        let mut state = self.lock_state();
        state.resident.remove(key);
        state.sizes.remove(key);
        let moves = state.heat.forget(key);
        self.apply(&mut state, moves)
    }

    pub fn stats(&self) -> StoreStats {
        let state = self.lock_state();
        StoreStats {
            memory_hits: self
                .memory_hits
                .iter()
                .map(|h| h.load(Ordering::Relaxed))
                .collect(),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            memory_bytes: (0..self.tiers.len())
                .map(|t| {
                    state
                        .resident
                        .iter()
                        .filter(|(_, r)| r.tier == t)
                        .map(|(k, _)| state.sizes.get(k).copied().unwrap_or(0))
                        .sum()
                })
                .collect(),
            loads: self.loads.load(Ordering::Relaxed),
            load_time: Duration::from_micros(self.load_micros.load(Ordering::Relaxed)),
        }
    }

    /// Sets every memory tier's budget (in the settings' order) and re-places the entries.
    pub fn set_budgets(&self, budgets: Vec<u64>) -> Result<(), StoreError> {
        if budgets.len() != self.tiers.len() {
            return Err(StoreError::InvalidKey(format!(
                "{} budgets for {} memory tiers",
                budgets.len(),
                self.tiers.len()
            )));
        }
        let mut state = self.lock_state();
        let moves = state.heat.set_budgets(budgets);
        self.apply(&mut state, moves)
    }

    /// Each memory tier's budget now, in the settings' order.
    pub fn budgets(&self) -> Vec<u64> {
        self.lock_state().heat.budgets().to_vec()
    }

    pub fn tier_names(&self) -> Vec<&'static str> {
        self.tiers.iter().map(|t| t.name).collect()
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A memory hit: counted as an access, handed out on the model's device.
    fn resident(&self, key: &KvKey) -> Result<Option<(Arc<SegmentKv>, usize)>, StoreError> {
        let mut state = self.lock_state();
        let Some(resident) = state.resident.get(key) else {
            return Ok(None);
        };
        let (segment, tier) = (Arc::clone(&resident.segment), resident.tier);
        let bytes = state.sizes.get(key).copied().unwrap_or(0);
        let moves = state.heat.touch(key, bytes);
        self.apply(&mut state, moves)?;
        drop(state);
        Ok(Some((self.on_model_device(&segment)?, tier)))
    }

    /// Reads `key` from disk once however many callers ask at the same time.
    fn load_shared(&self, key: &KvKey) -> Result<Arc<SegmentKv>, StoreError> {
        let (slot, leader) = {
            let mut loading = self.loading.lock().unwrap_or_else(|p| p.into_inner());
            match loading.get(key) {
                Some(slot) => (Arc::clone(slot), false),
                None => {
                    let slot = Arc::new(LoadSlot::default());
                    loading.insert(key.clone(), Arc::clone(&slot));
                    (slot, true)
                }
            }
        };
        if !leader {
            let mut done = slot.done.lock().unwrap_or_else(|p| p.into_inner());
            while done.is_none() {
                done = slot.ready.wait(done).unwrap_or_else(|p| p.into_inner());
            }
            return match done.as_ref() {
                Some(Ok(segment)) => Ok(Arc::clone(segment)),
                // The leader's error is reported as text; read again for a typed one.
                _ => self.load(key),
            };
        }
        let result = self.load(key);
        *slot.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(match &result {
            Ok(segment) => Ok(Arc::clone(segment)),
            Err(error) => Err(error.to_string_full()),
        });
        slot.ready.notify_all();
        self.loading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        result
    }

    fn load(&self, key: &KvKey) -> Result<Arc<SegmentKv>, StoreError> {
        if let Some(resident) = self.lock_state().resident.get(key) {
            return Ok(Arc::clone(&resident.segment));
        }
        let started = Instant::now();
        let path = self.path_of(key);
        let bytes = std::fs::read(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                StoreError::NotFound(key.to_string())
            } else {
                StoreError::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let (_, segment) = entry::decode(&bytes, key, &self.device, &self.rope)?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.load_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let segment = Arc::new(segment);
        self.admit(key, Arc::clone(&segment))?;
        Ok(segment)
    }

    /// Counts an access to `key`, whose tensors are `segment`, and keeps it in the tier its
    /// heat earns (or on disk only).
    fn admit(&self, key: &KvKey, segment: Arc<SegmentKv>) -> Result<(), StoreError> {
        let bytes = segment_bytes(&segment);
        let mut state = self.lock_state();
        state.sizes.insert(key.clone(), bytes);
        let moves = state.heat.touch(key, bytes);
        self.apply(&mut state, moves)?;
        match state.heat.tier_of(key) {
            Some(tier) if !state.resident.contains_key(key) => {
                let segment = self.on_device(&segment, &self.tiers[tier].device)?;
                state
                    .resident
                    .insert(key.clone(), Resident { segment, tier });
            }
            Some(_) => {}
            None => {
                state.resident.remove(key);
            }
        }
        Ok(())
    }

    /// Carries out the tier changes of other entries: demotions to disk drop the tensors, moves
    /// between tiers copy them to the new tier's device. An entry placed in a tier but not in
    /// memory (a budget grew) is taken in at its next load.
    fn apply(&self, state: &mut State, moves: Vec<Move<KvKey>>) -> Result<(), StoreError> {
        for mv in moves {
            match mv.to {
                None => {
                    state.resident.remove(&mv.key);
                }
                Some(tier) => {
                    if let Some(resident) = state.resident.get_mut(&mv.key) {
                        resident.segment =
                            self.on_device(&resident.segment, &self.tiers[tier].device)?;
                        resident.tier = tier;
                    }
                }
            }
        }
        Ok(())
    }

    fn on_model_device(&self, segment: &Arc<SegmentKv>) -> Result<Arc<SegmentKv>, StoreError> {
        self.on_device(segment, &self.device)
    }

    fn on_device(
        &self,
        segment: &Arc<SegmentKv>,
        device: &Device,
    ) -> Result<Arc<SegmentKv>, StoreError> {
        if segment.kv().device().same_device(device) {
            return Ok(Arc::clone(segment));
        }
        let moved = Arc::new(segment.to_device(device)?);
        // A loader thread's copy runs on its own CUDA stream, and a request's thread reads
        // the segment on another: wait until the copy has landed before anyone can see it.
        device.synchronize()?;
        Ok(moved)
    }
}

/// Bytes of a segment's tensors in memory: raw keys, rotated keys and values per layer.
pub fn segment_bytes(segment: &SegmentKv) -> u64 {
    segment
        .kv()
        .layers()
        .iter()
        .map(|l| {
            [l.raw_keys(), l.keys(), l.values()]
                .iter()
                .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
                .sum::<u64>()
        })
        .sum()
}
