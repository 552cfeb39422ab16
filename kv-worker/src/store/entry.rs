//! One stored chunk KV on disk: `HKV1`, the header's length (u32, little-endian), a JSON
//! header that names the entry (model, corpus version, chunk, variant) and its shape, then
//! per layer the keys before RoPE and the values, (kv_heads, tokens, head_dim) row-major,
//! little-endian f32 or f16. The header carries the payload's SHA-256: a torn or altered file
//! is refused, never read as KV.

use candle_core::{DType, Device, Tensor};
use display_full_error::DisplayFullErrorExt;
use half::f16;
use hasten_lm::{KvCache, RotaryTables};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::StoreError;
use super::key::{ChunkRef, KvKey, ModelId, Variant};
use crate::fusion::SegmentKv;

const MAGIC: &[u8; 4] = b"HKV1";
const FORMAT: u32 = 1;

/// How stored tensors are written: f16 halves the disk and RAM, f32 keeps them exact.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    F32,
    #[default]
    F16,
}

impl KvDtype {
    fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other => Err(format!("unknown KV dtype `{other}`: expected f32 or f16")),
        }
    }
}

/// What the store knows of an entry beyond its tensors.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// The chunk text's content hash: a corpus update that changes the text invalidates it.
    pub chunk_hash: String,
    /// The chunks whose KV the similarity-guided computation attended to.
    pub neighbours: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryHeader {
    pub format: u32,
    pub model: ModelId,
    pub corpus: String,
    pub chunk: ChunkRef,
    pub variant: Variant,
    #[serde(flatten)]
    pub meta: EntryMeta,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub dtype: KvDtype,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub payload_sha256: String,
}

impl EntryHeader {
    fn payload_len(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.tokens.len() * self.head_dim * self.dtype.bytes()
    }
}

/// The file's bytes for `segment` stored under `key`.
pub fn encode(
    key: &KvKey,
    meta: &EntryMeta,
    segment: &SegmentKv,
    dtype: KvDtype,
) -> Result<Vec<u8>, StoreError> {
    let kv = segment.kv();
    let layers = kv.layers();
    let Some(first) = layers.first() else {
        return Err(StoreError::InvalidKey(format!(
            "{key}: a cache with no layers"
        )));
    };
    let (_, kv_heads, _, head_dim) = first.values().dims4()?;
    let mut payload = Vec::new();
    for layer in layers {
        for tensor in [layer.raw_keys(), layer.values()] {
            append_tensor(&mut payload, tensor, dtype)?;
        }
    }
    let header = EntryHeader {
        format: FORMAT,
        model: key.model.clone(),
        corpus: key.corpus.clone(),
        chunk: key.chunk.clone(),
        variant: key.variant,
        meta: meta.clone(),
        tokens: segment.tokens().to_vec(),
        positions: kv.positions()[0].clone(),
        dtype,
        layers: layers.len(),
        kv_heads,
        head_dim,
        payload_sha256: hex::encode(Sha256::digest(&payload)),
    };
    frame(&header, &payload)
}

/// `MAGIC`, the header's length, the header as JSON, the payload.
fn frame(header: &EntryHeader, payload: &[u8]) -> Result<Vec<u8>, StoreError> {
    let header = serde_json::to_vec(header).map_err(StoreError::Header)?;
    let mut bytes = Vec::with_capacity(8 + header.len() + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(payload);
    Ok(bytes)
}

fn append_tensor(out: &mut Vec<u8>, tensor: &Tensor, dtype: KvDtype) -> Result<(), StoreError> {
    let flat = tensor.flatten_all()?;
    match dtype {
        KvDtype::F32 => {
            for v in flat.to_dtype(DType::F32)?.to_vec1::<f32>()? {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        KvDtype::F16 => {
            for v in flat.to_dtype(DType::F16)?.to_vec1::<f16>()? {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// Reads only the header (for catalogs and checks), validating the framing.
pub fn read_header(bytes: &[u8]) -> Result<(EntryHeader, &[u8]), StoreError> {
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err(StoreError::Corrupt("not a KV entry (bad magic)".into()));
    }
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let header_bytes = bytes
        .get(8..8 + len)
        .ok_or_else(|| StoreError::Corrupt(format!("header of {len} bytes is cut short")))?;
    let header: EntryHeader = serde_json::from_slice(header_bytes).map_err(StoreError::Header)?;
    if header.format != FORMAT {
        return Err(StoreError::Corrupt(format!(
            "entry format {} (this worker reads {FORMAT})",
            header.format
        )));
    }
    Ok((header, &bytes[8 + len..]))
}

/// `bytes` (an entry of `from`) filed under `to` instead: the header renamed, the payload
/// and its checksum as they were.
pub fn rekey(bytes: &[u8], from: &KvKey, to: &KvKey) -> Result<Vec<u8>, StoreError> {
    let (mut header, payload) = read_header(bytes)?;
    let stored = (&header.model, &header.corpus, &header.chunk, header.variant);
    if stored != (&from.model, &from.corpus, &from.chunk, from.variant) {
        return Err(StoreError::Mismatch {
            key: from.to_string(),
            field: "key",
            expected: from.to_string(),
            found: format!(
                "{} ({}) of corpus {} for model {}",
                header.chunk, header.variant, header.corpus, header.model
            ),
        });
    }
    header.model = to.model.clone();
    header.corpus = to.corpus.clone();
    header.chunk = to.chunk.clone();
    header.variant = to.variant;
    frame(&header, payload)
}

/// Checks that the file holds what `key` names, intact, and rebuilds the segment on
/// `device` with its keys rotated at the positions it was computed at.
pub fn decode(
    bytes: &[u8],
    key: &KvKey,
    device: &Device,
    rope: &RotaryTables,
) -> Result<(EntryHeader, SegmentKv), StoreError> {
    let (header, payload) = read_header(bytes)?;
    let mismatch = |field: &'static str, expected: String, found: String| StoreError::Mismatch {
        key: key.to_string(),
        field,
        expected,
        found,
    };
    if header.model != key.model {
        return Err(mismatch(
            "model",
            key.model.to_string(),
            header.model.to_string(),
        ));
    }
    if header.corpus != key.corpus {
        return Err(mismatch(
            "corpus version",
            key.corpus.clone(),
            header.corpus.clone(),
        ));
    }
    if header.chunk != key.chunk {
        return Err(mismatch(
            "chunk",
            key.chunk.to_string(),
            header.chunk.to_string(),
        ));
    }
    if header.variant != key.variant {
        return Err(mismatch(
            "variant",
            key.variant.to_string(),
            header.variant.to_string(),
        ));
    }
    if payload.len() != header.payload_len() || header.positions.len() != header.tokens.len() {
        return Err(StoreError::Corrupt(format!(
            "{key}: payload of {} bytes for {} positions, the header's shape needs {}",
            payload.len(),
            header.positions.len(),
            header.payload_len()
        )));
    }
    if hex::encode(Sha256::digest(payload)) != header.payload_sha256 {
        return Err(StoreError::Corrupt(format!(
            "{key}: payload checksum mismatch"
        )));
    }
    let shape = (1, header.kv_heads, header.tokens.len(), header.head_dim);
    let per_tensor = payload.len() / (2 * header.layers.max(1));
    let mut layers = Vec::with_capacity(header.layers);
    for layer in payload.chunks_exact(2 * per_tensor) {
        let (keys, values) = layer.split_at(per_tensor);
        layers.push((
            read_tensor(keys, header.dtype, shape, device)?,
            read_tensor(values, header.dtype, shape, device)?,
        ));
    }
    let kv = KvCache::from_stored(layers, header.positions.clone(), rope)?;
    let segment = SegmentKv::new(header.tokens.clone(), kv)
        .map_err(|e| StoreError::Corrupt(format!("{key}: {}", e.display_full())))?;
    Ok((header, segment))
}

fn read_tensor(
    bytes: &[u8],
    dtype: KvDtype,
    shape: (usize, usize, usize, usize),
    device: &Device,
) -> Result<Tensor, StoreError> {
    let values: Vec<f32> = match dtype {
        KvDtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        KvDtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    };
    Ok(Tensor::from_vec(values, shape, device)?)
}
