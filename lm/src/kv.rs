//! The KV cache, owned by the caller.
//!
//! A [`KvCache`] is a plain value: a forward pass reads a past cache and returns the new
//! tokens' entries as another `KvCache`, which the caller appends, truncates (rollback),
//! clones (forks) or re-positions (chunk reuse) as its algorithm needs.

use candle_core::{Device, Tensor};

use crate::error::{LmError, Result};
use crate::rope::RotaryTables;

/// One layer's entries, each (batch, kv_heads, tokens, head_dim).
#[derive(Debug, Clone)]
pub struct LayerKv {
    /// Keys before RoPE: what makes an entry movable to another position.
    pub raw_keys: Tensor,
    /// Keys rotated to `positions`, what attention reads.
    pub keys: Tensor,
    pub values: Tensor,
}

#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    positions: Vec<Vec<u32>>,
    valid: Vec<Vec<bool>>,
}

impl KvCache {
    /// An empty cache (no rows yet; the first append fixes the batch size).
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn from_parts(
        layers: Vec<LayerKv>,
        positions: Vec<Vec<u32>>,
        valid: Vec<Vec<bool>>,
    ) -> Self {
        Self {
            layers,
            positions,
            valid,
        }
    }

    /// Entries per row (padding included).
    pub fn len(&self) -> usize {
        self.positions.first().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn batch(&self) -> usize {
        self.positions.len()
    }

    pub fn layers(&self) -> &[LayerKv] {
        &self.layers
    }

    /// The position of every entry, per row.
    pub fn positions(&self) -> &[Vec<u32>] {
        &self.positions
    }

    /// Whether each entry may be attended to (false for padding), per row.
    pub fn valid(&self) -> &[Vec<bool>] {
        &self.valid
    }

    /// The position after the last valid entry of each row (0 for an empty row).
    pub fn next_positions(&self) -> Vec<u32> {
        self.positions
            .iter()
            .zip(&self.valid)
            .map(|(positions, valid)| {
                positions
                    .iter()
                    .zip(valid)
                    .filter(|(_, v)| **v)
                    .map(|(p, _)| p + 1)
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Appends `other`'s entries after this cache's, row by row.
    pub fn append(&mut self, other: KvCache) -> Result<()> {
        if self.is_empty() && self.layers.is_empty() {
            *self = other;
            return Ok(());
        }
        if other.batch() != self.batch() || other.layers.len() != self.layers.len() {
            return Err(LmError::InvalidInput(format!(
                "cannot append a cache of {} rows x {} layers to one of {} rows x {} layers",
                other.batch(),
                other.layers.len(),
                self.batch(),
                self.layers.len()
            )));
        }
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            mine.raw_keys = Tensor::cat(&[&mine.raw_keys, &theirs.raw_keys], 2)?;
            mine.keys = Tensor::cat(&[&mine.keys, &theirs.keys], 2)?;
            mine.values = Tensor::cat(&[&mine.values, &theirs.values], 2)?;
        }
        for (mine, theirs) in self.positions.iter_mut().zip(other.positions) {
            mine.extend(theirs);
        }
        for (mine, theirs) in self.valid.iter_mut().zip(other.valid) {
            mine.extend(theirs);
        }
        Ok(())
    }

    /// Concatenates caches along the token axis (for example, chunks placed one after another).
    pub fn concat(parts: Vec<KvCache>) -> Result<KvCache> {
        let mut whole = KvCache::new();
        for part in parts {
            whole.append(part)?;
        }
        Ok(whole)
    }

    /// Keeps the first `len` entries of every row: the rollback of speculative decoding.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len() {
            return Ok(());
        }
        if len == 0 {
            *self = KvCache::new();
            return Ok(());
        }
        for layer in &mut self.layers {
            layer.raw_keys = layer.raw_keys.narrow(2, 0, len)?;
            layer.keys = layer.keys.narrow(2, 0, len)?;
            layer.values = layer.values.narrow(2, 0, len)?;
        }
        for row in &mut self.positions {
            row.truncate(len);
        }
        for row in &mut self.valid {
            row.truncate(len);
        }
        Ok(())
    }

    /// One batch row as a cache of its own (a fork of that sequence).
    pub fn row(&self, index: usize) -> Result<KvCache> {
        if index >= self.batch() {
            return Err(LmError::InvalidInput(format!(
                "row {index} of a cache with {} rows",
                self.batch()
            )));
        }
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    raw_keys: l.raw_keys.narrow(0, index, 1)?,
                    keys: l.keys.narrow(0, index, 1)?,
                    values: l.values.narrow(0, index, 1)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache::from_parts(
            layers,
            vec![self.positions[index].clone()],
            vec![self.valid[index].clone()],
        ))
    }

    /// Gives every entry a new position, rotating the stored raw keys there: the same keys
    /// a prefill at those positions computes, without running the model.
    pub fn relocate(&mut self, rope: &RotaryTables, positions: Vec<Vec<u32>>) -> Result<()> {
        if positions.len() != self.batch() || positions.iter().any(|r| r.len() != self.len()) {
            return Err(LmError::InvalidInput(
                "relocation needs one new position per cached entry".into(),
            ));
        }
        rope.check(&positions)?;
        let grid = position_tensor(&positions, self.device())?;
        for layer in &mut self.layers {
            layer.keys = rope.apply(&layer.raw_keys, &grid)?;
        }
        self.positions = positions;
        Ok(())
    }

    fn device(&self) -> &Device {
        self.layers
            .first()
            .map_or(&Device::Cpu, |l| l.values.device())
    }
}

/// A (batch, tokens) u32 tensor from rows of equal length.
pub(crate) fn position_tensor(rows: &[Vec<u32>], device: &Device) -> Result<Tensor> {
    let width = rows.first().map_or(0, Vec::len);
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (rows.len(), width), device)?)
}
