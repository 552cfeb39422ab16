//! The model a command loads and the store it opens over it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use hasten_kv_worker::KvEngine;
use hasten_kv_worker::store::{
    ChunkKvStore, KvDtype, MemoryTier, ModelId, ModelIdentity, StoreSettings,
};
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};

#[derive(Args)]
pub(crate) struct ModelArgs {
    /// The GGUF model whose KV is stored.
    #[arg(long, env = "HASTEN_KV_MODEL")]
    pub(crate) model: PathBuf,
    /// Weight layout: as-stored, q8_0, f32 or fast (entries of one layout are not
    /// another's) [default: fast on cpu, f32 on cuda].
    #[arg(long, env = "HASTEN_KV_WEIGHTS")]
    pub(crate) weights: Option<WeightFormat>,
    /// cpu, or cuda in a build with the `cuda` feature.
    #[arg(long, env = "HASTEN_KV_DEVICE", default_value = "cpu")]
    pub(crate) device: DeviceKind,
    /// Refuse a model file whose SHA-256 is not this (64 hex digits).
    #[arg(long, env = "HASTEN_KV_MODEL_SHA256")]
    pub(crate) model_sha256: Option<String>,
}

#[derive(Args)]
pub(crate) struct StoreArgs {
    /// The store's directory.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    pub(crate) store: PathBuf,
    /// How entries are written: f16 (half the bytes) or f32 (exact).
    #[arg(long, env = "HASTEN_KV_DTYPE", default_value = "f16")]
    pub(crate) dtype: KvDtype,
    /// Bytes of chunk KV kept in RAM (the rest is read from disk when needed).
    #[arg(long, env = "HASTEN_KV_RAM_BUDGET", default_value_t = 1 << 30)]
    pub(crate) ram_budget: u64,
    /// Bytes of chunk KV kept in GPU memory on a CUDA device (the hottest entries).
    #[arg(long, env = "HASTEN_KV_GPU_BUDGET", default_value_t = 2 << 30)]
    pub(crate) gpu_budget: u64,
}

/// A loaded model with its system prompt's KV and the id its entries are stored under.
pub(crate) struct Loaded {
    pub(crate) engine: KvEngine,
    pub(crate) model_id: ModelId,
}

pub(crate) fn load_model(args: &ModelArgs) -> Result<Loaded> {
    let weights = args.weights.unwrap_or(match args.device {
        DeviceKind::Cpu => WeightFormat::Fast,
        DeviceKind::Cuda => WeightFormat::F32,
    });
    load(
        &args.model,
        args.device,
        weights,
        args.model_sha256.as_deref(),
    )
}

pub(crate) fn load(
    path: &Path,
    device: DeviceKind,
    weights: WeightFormat,
    expected_sha256: Option<&str>,
) -> Result<Loaded> {
    let started = Instant::now();
    let model = LanguageModel::load_with(path, &device.open()?, weights)
        .with_context(|| format!("loading {}", path.display()))?;
    let engine = KvEngine::new(Arc::new(model))?;
    let identity = ModelIdentity::compute(path, &weights.to_string(), engine.system().tokens())?;
    if let Some(expected) = expected_sha256
        && !identity.file_sha256.eq_ignore_ascii_case(expected)
    {
        bail!(
            "model_sha256: {} has SHA-256 {}, the configuration pins {expected}",
            path.display(),
            identity.file_sha256
        );
    }
    let model_id = identity.id;
    tracing::info!(
        model = %path.display(),
        %model_id,
        %device,
        %weights,
        took_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    Ok(Loaded { engine, model_id })
}

pub(crate) fn open_store(args: &StoreArgs, loaded: &Loaded) -> Result<ChunkKvStore> {
    let decoder = &loaded.engine.model().decoder;
    let device = loaded.engine.system().kv().device().clone();
    let mut tiers = Vec::new();
    if device.is_cuda() {
        // Entries read on a GPU stay there while they are the hottest of what fits.
        tiers.push(MemoryTier {
            name: "gpu",
            device: device.clone(),
            budget: args.gpu_budget,
        });
    }
    tiers.push(MemoryTier {
        name: "ram",
        device: candle_core::Device::Cpu,
        budget: args.ram_budget,
    });
    Ok(ChunkKvStore::open(
        StoreSettings {
            root: args.store.clone(),
            tiers,
            dtype: args.dtype,
            half_life: 1000.0,
        },
        device,
        decoder.rope().clone(),
    )?)
}
