//! What an edge and a KV worker agree on: how a prompt's chunk KV is fused and which stored
//! variant it reads, their wire forms, which worker owns a chunk ([`routing`]), and the pool
//! client the edge answers through ([`KvPool`]).

mod pool;
pub mod routing;

use std::fmt;

use hasten_proto::v1 as pb;
use serde::{Deserialize, Serialize};

pub use pool::KvPool;
pub use routing::KvRouting;

/// How a prompt's chunks get their KV (the FusionRAG paper's modes; what each does is in
/// `hasten_kv_worker::fusion`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum FusionMode {
    #[serde(rename = "full-prefill")]
    FullPrefill,
    #[serde(rename = "full-reuse")]
    FullReuse,
    #[serde(rename = "cacheblend")]
    CacheBlend,
    #[default]
    #[serde(rename = "fusionrag")]
    FusionRag,
}

impl FusionMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::FullPrefill => "full-prefill",
            Self::FullReuse => "full-reuse",
            Self::CacheBlend => "cacheblend",
            Self::FusionRag => "fusionrag",
        }
    }
}

/// The recompute ratio when none is named (the paper's r = 15%).
pub const DEFAULT_RATIO: f64 = 0.15;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusionSettings {
    pub mode: FusionMode,
    /// Share of the chunk tokens recomputed (CacheBlend, FusionRAG).
    pub ratio: f64,
}

impl Default for FusionSettings {
    /// FusionRAG at the paper's 15%.
    fn default() -> Self {
        Self {
            mode: FusionMode::FusionRag,
            ratio: DEFAULT_RATIO,
        }
    }
}

/// How a chunk's KV was computed.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Prefilled right after the system prompt.
    FullReuse,
    /// Recomputed while attending to its most similar chunks (FusionRAG's preprocessing).
    Similarity,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Self::FullReuse => "full-reuse",
            Self::Similarity => "similarity",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub fn mode_proto(mode: FusionMode) -> pb::FusionMode {
    match mode {
        FusionMode::FullPrefill => pb::FusionMode::FullPrefill,
        FusionMode::FullReuse => pb::FusionMode::FullReuse,
        FusionMode::CacheBlend => pb::FusionMode::Cacheblend,
        FusionMode::FusionRag => pb::FusionMode::Fusionrag,
    }
}

pub fn variant_proto(variant: Variant) -> pb::KvVariant {
    match variant {
        Variant::FullReuse => pb::KvVariant::FullReuse,
        Variant::Similarity => pb::KvVariant::Similarity,
    }
}
