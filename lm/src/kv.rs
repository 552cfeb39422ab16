//! The KV cache, owned by the caller.
//!
//! A [`KvCache`] is a plain value: a forward pass reads a past cache and returns the new
//! tokens' entries as another `KvCache`, which the caller appends, truncates (rollback),
//! clones (forks) or re-positions (chunk reuse) as its algorithm needs.
//!
//! Appending does not copy the cache: each layer's tensors have room to grow along the token
//! axis, and new entries are written into it. Only where no other holder can see the written
//! region: a cache whose buffers another cache shares (a clone, a row) or that was truncated
//! since grows by copying into new buffers instead, so a value never changes under anyone.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::{LmError, Result};
use crate::rope::RotaryTables;

/// Growth of a buffer that must be copied anyway: half again what it holds, so that a
/// decode loop copies O(log n) times, and at least this many entries.
const MIN_GROWTH: usize = 64;

/// One layer's entries, each (batch, kv_heads, tokens, head_dim).
#[derive(Debug, Clone)]
pub struct LayerKv {
    /// Keys before RoPE: what makes an entry movable to another position.
    raw_keys: Tensor,
    /// Keys rotated to `positions`, what attention reads.
    keys: Tensor,
    values: Tensor,
    /// The tensors above are views of the first `len` entries of these buffers, which may
    /// hold more room along the token axis.
    buffers: [Tensor; 3],
    /// Entries ever written into the buffers: past `len` after a truncation, where views
    /// handed out before it may still reach.
    written: usize,
}

impl LayerKv {
    pub(crate) fn new(raw_keys: Tensor, keys: Tensor, values: Tensor) -> Result<Self> {
        let written = values.dim(2)?;
        Ok(Self {
            buffers: [raw_keys.clone(), keys.clone(), values.clone()],
            raw_keys,
            keys,
            values,
            written,
        })
    }

    /// Views of the first `len` entries of `buffers` (raw keys, keys, values), whose room
    /// past `len` the next append may write into.
    pub(crate) fn in_buffers(buffers: [Tensor; 3], len: usize) -> Result<Self> {
        let [raw_keys, keys, values] = buffers.clone();
        let mut layer = Self {
            raw_keys,
            keys,
            values,
            buffers,
            written: len,
        };
        layer.view(len)?;
        Ok(layer)
    }

    pub fn raw_keys(&self) -> &Tensor {
        &self.raw_keys
    }

    pub fn keys(&self) -> &Tensor {
        &self.keys
    }

    pub fn values(&self) -> &Tensor {
        &self.values
    }

    fn len(&self) -> Result<usize> {
        Ok(self.values.dim(2)?)
    }

    /// Views of the first `len` entries of the buffers.
    fn view(&mut self, len: usize) -> Result<()> {
        let [raw_keys, keys, values] = &self.buffers;
        self.raw_keys = raw_keys.narrow(2, 0, len)?;
        self.keys = keys.narrow(2, 0, len)?;
        self.values = values.narrow(2, 0, len)?;
        Ok(())
    }

    /// Appends `other`'s entries: in place when `exclusive` (no other cache shares the
    /// buffers), nothing was truncated and there is room; into new, larger buffers otherwise.
    fn append(&mut self, other: &LayerKv, exclusive: bool) -> Result<()> {
        let len = self.len()?;
        let added = other.len()?;
        let in_place = exclusive && self.written == len;
        let sources = [&other.raw_keys, &other.keys, &other.values];
        for (buffer, source) in self.buffers.iter_mut().zip(sources) {
            let room = buffer.dim(2)? >= len + added && buffer.is_contiguous();
            if in_place && room {
                buffer.slice_set(&source.contiguous()?, 2, len)?;
            } else {
                let kept = buffer.narrow(2, 0, len)?;
                let mut spare_shape = source.dims().to_vec();
                spare_shape[2] = (len / 2).max(MIN_GROWTH);
                let spare = Tensor::zeros(spare_shape, source.dtype(), source.device())?;
                *buffer = Tensor::cat(&[&kept, source, &spare], 2)?;
            }
        }
        self.written = len + added;
        self.view(len + added)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.view(len)
    }

    /// One batch row; it shares the buffers, so the caller marks both caches shared.
    fn row(&self, index: usize) -> Result<LayerKv> {
        let narrow = |t: &Tensor| t.narrow(0, index, 1);
        Ok(LayerKv {
            raw_keys: narrow(&self.raw_keys)?,
            keys: narrow(&self.keys)?,
            values: narrow(&self.values)?,
            buffers: [
                narrow(&self.buffers[0])?,
                narrow(&self.buffers[1])?,
                narrow(&self.buffers[2])?,
            ],
            written: self.written,
        })
    }

    /// Copies of the rows `indices`, in that order, in buffers of their own (with room to
    /// grow, so the next append writes in place).
    fn select(&self, indices: &[usize]) -> Result<LayerKv> {
        let pick = |t: &Tensor| -> Result<Tensor> {
            let rows = indices
                .iter()
                .map(|&i| t.narrow(0, i, 1))
                .collect::<candle_core::Result<Vec<_>>>()?;
            let len = t.dim(2)?;
            let mut spare_shape = t.dims().to_vec();
            spare_shape[0] = indices.len();
            spare_shape[2] = (len / 2).max(MIN_GROWTH);
            let spare = Tensor::zeros(spare_shape, t.dtype(), t.device())?;
            Ok(Tensor::cat(&[&Tensor::cat(&rows, 0)?, &spare], 2)?)
        };
        let len = self.len()?;
        let mut layer = LayerKv {
            buffers: [
                pick(&self.raw_keys)?,
                pick(&self.keys)?,
                pick(&self.values)?,
            ],
            raw_keys: self.raw_keys.clone(),
            keys: self.keys.clone(),
            values: self.values.clone(),
            written: len,
        };
        layer.view(len)?;
        Ok(layer)
    }

    /// Replaces the rotated keys (a relocation); their buffer is the new tensor itself.
    fn set_keys(&mut self, keys: Tensor) {
        self.buffers[1] = keys.clone();
        self.keys = keys;
    }
}

#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    positions: Vec<Vec<u32>>,
    valid: Vec<Vec<bool>>,
    /// Held by every cache that shares these buffers (clones, rows): appending writes into
    /// them only while this cache holds it alone.
    sharers: Arc<()>,
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
            sharers: Arc::new(()),
        }
    }

    /// One row rebuilt from stored parts: per layer the keys before RoPE and the values, each
    /// (1, kv_heads, tokens, head_dim), with the keys rotated to `positions` (one per token).
    /// What a KV store writes is `layers()`' `raw_keys` and `values`; this is the way back.
    pub fn from_stored(
        layers: Vec<(Tensor, Tensor)>,
        positions: Vec<u32>,
        rope: &RotaryTables,
    ) -> Result<Self> {
        let positions = vec![positions];
        rope.check(&positions)?;
        let shape = layers.first().map(|(k, _)| k.dims().to_vec());
        let mut rebuilt = Vec::with_capacity(layers.len());
        for (index, (raw_keys, values)) in layers.into_iter().enumerate() {
            let (batch, _, tokens, _) = raw_keys.dims4()?;
            if Some(raw_keys.dims().to_vec()) != shape
                || values.dims() != raw_keys.dims()
                || batch != 1
                || tokens != positions[0].len()
            {
                return Err(LmError::InvalidInput(format!(
                    "stored layer {index}: keys {:?} and values {:?} do not make one row of {} \
                     entries shaped like layer 0's {:?}",
                    raw_keys.dims(),
                    values.dims(),
                    positions[0].len(),
                    shape.clone().unwrap_or_default()
                )));
            }
            let grid = position_tensor(&positions, raw_keys.device())?;
            let keys = rope.apply(&raw_keys, &grid)?;
            rebuilt.push(LayerKv::new(raw_keys, keys, values)?);
        }
        let valid = vec![vec![true; positions[0].len()]];
        Ok(Self::from_parts(rebuilt, positions, valid))
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
        let exclusive = Arc::strong_count(&self.sharers) == 1;
        for (mine, theirs) in self.layers.iter_mut().zip(&other.layers) {
            mine.append(theirs, exclusive)?;
        }
        if !exclusive {
            // Every layer now has buffers of its own.
            self.sharers = Arc::new(());
        }
        for (mine, theirs) in self.positions.iter_mut().zip(other.positions) {
            mine.extend(theirs);
        }
        for (mine, theirs) in self.valid.iter_mut().zip(other.valid) {
            mine.extend(theirs);
        }
        Ok(())
    }

    /// One-row caches of different lengths as the rows of one batch, each padded on the left
    /// with entries marked invalid: the cache a left-padded batched prefill of the same rows
    /// gives, without computing the padding.
    pub fn stack_left_padded(rows: Vec<KvCache>) -> Result<KvCache> {
        if let Some(wide) = rows.iter().find(|row| row.batch() != 1) {
            return Err(LmError::InvalidInput(format!(
                "stacking takes one-row caches, got one of {} rows",
                wide.batch()
            )));
        }
        let width = rows.iter().map(KvCache::len).max().unwrap_or(0);
        let layer_count = rows.first().map_or(0, |row| row.layers.len());
        if rows.iter().any(|row| row.layers.len() != layer_count) {
            return Err(LmError::InvalidInput(
                "stacking caches of different layer counts".into(),
            ));
        }
        let padded = |tensor: &Tensor, entries: usize| -> Result<Tensor> {
            let padding = width - entries;
            if padding == 0 {
                return Ok(tensor.clone());
            }
            let mut shape = tensor.dims().to_vec();
            shape[2] = padding;
            let zeros = Tensor::zeros(shape, tensor.dtype(), tensor.device())?;
            Ok(Tensor::cat(&[&zeros, tensor], 2)?)
        };
        let mut layers = Vec::with_capacity(layer_count);
        for layer in 0..layer_count {
            let mut parts: [Vec<Tensor>; 3] = Default::default();
            for row in &rows {
                let entries = row.len();
                let kv = &row.layers[layer];
                for (part, tensor) in parts.iter_mut().zip([&kv.raw_keys, &kv.keys, &kv.values]) {
                    part.push(padded(tensor, entries)?);
                }
            }
            let [raw_keys, keys, values] = parts.map(|part| Tensor::cat(&part, 0));
            layers.push(LayerKv::new(raw_keys?, keys?, values?)?);
        }
        let mut positions = Vec::with_capacity(rows.len());
        let mut valid = Vec::with_capacity(rows.len());
        for row in rows {
            let padding = width - row.len();
            positions.push(
                std::iter::repeat_n(0, padding)
                    .chain(row.positions.into_iter().flatten())
                    .collect(),
            );
            valid.push(
                std::iter::repeat_n(false, padding)
                    .chain(row.valid.into_iter().flatten())
                    .collect(),
            );
        }
        Ok(KvCache::from_parts(layers, positions, valid))
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
            layer.truncate(len)?;
        }
        for row in &mut self.positions {
            row.truncate(len);
        }
        for row in &mut self.valid {
            row.truncate(len);
        }
        Ok(())
    }

    /// Marks entries of one row as never to be attended to again (by a causal pass), as
    /// padding is: what chunk reuse does with an entry once it has been recomputed. Only the
    /// flags change, so the tensors (perhaps shared) are untouched.
    pub fn hide(&mut self, row: usize, entries: &[usize]) -> Result<()> {
        self.check_row(row)?;
        let flags = &mut self.valid[row];
        if let Some(&bad) = entries.iter().find(|&&e| e >= flags.len()) {
            return Err(LmError::InvalidInput(format!(
                "entry {bad} of a cache row with {} entries",
                flags.len()
            )));
        }
        for &entry in entries {
            flags[entry] = false;
        }
        Ok(())
    }

    /// One batch row as a cache of its own (a fork of that sequence).
    pub fn row(&self, index: usize) -> Result<KvCache> {
        self.check_row(index)?;
        let layers = self
            .layers
            .iter()
            .map(|l| l.row(index))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            positions: vec![self.positions[index].clone()],
            valid: vec![self.valid[index].clone()],
            sharers: Arc::clone(&self.sharers),
        })
    }

    fn check_row(&self, index: usize) -> Result<()> {
        if index >= self.batch() {
            return Err(LmError::InvalidInput(format!(
                "row {index} of a cache with {} rows",
                self.batch()
            )));
        }
        Ok(())
    }

    /// The rows `indices`, in that order, as a cache of their own: what a batch keeps when
    /// some of its sequences are finished. Copies the rows, so nothing is shared.
    pub fn select_rows(&self, indices: &[usize]) -> Result<KvCache> {
        for &index in indices {
            self.check_row(index)?;
        }
        if indices.is_empty() {
            return Ok(KvCache::new());
        }
        let layers = self
            .layers
            .iter()
            .map(|l| l.select(indices))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            positions: indices.iter().map(|&i| self.positions[i].clone()).collect(),
            valid: indices.iter().map(|&i| self.valid[i].clone()).collect(),
            sharers: Arc::new(()),
        })
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
            let keys = rope.apply(&layer.raw_keys, &grid)?;
            layer.set_keys(keys);
        }
        self.positions = positions;
        Ok(())
    }

    /// A copy of this cache on `device` (a KV store moving an entry between GPU and RAM).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                LayerKv::new(
                    l.raw_keys.to_device(device)?,
                    l.keys.to_device(device)?,
                    l.values.to_device(device)?,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_parts(
            layers,
            self.positions.clone(),
            self.valid.clone(),
        ))
    }

    /// Where the entries live (the CPU for an empty cache).
    pub fn device(&self) -> &Device {
        self.layers
            .first()
            .map_or(&Device::Cpu, |l| l.values().device())
    }
}

/// A (batch, tokens) u32 tensor from rows of equal length.
pub(crate) fn position_tensor(rows: &[Vec<u32>], device: &Device) -> Result<Tensor> {
    let width = rows.first().map_or(0, Vec::len);
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (rows.len(), width), device)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A one-layer, one-row cache of `n` entries whose values are `first..first + n`
    /// (keys the same), at positions from `at`.
    fn entries(first: f32, n: usize, at: u32) -> KvCache {
        let data: Vec<f32> = (0..n).map(|i| first + i as f32).collect();
        let t = Tensor::from_vec(data, (1, 1, n, 1), &Device::Cpu).unwrap();
        KvCache::from_parts(
            vec![LayerKv::new(t.clone(), t.clone(), t).unwrap()],
            vec![(at..at + n as u32).collect()],
            vec![vec![true; n]],
        )
    }

    fn values(cache: &KvCache) -> Vec<f32> {
        cache.layers()[0]
            .values()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn appends_grow_in_place_and_read_back_in_order() {
        let mut cache = entries(0.0, 3, 0);
        for step in 0..100 {
            cache
                .append(entries(3.0 + step as f32, 1, 3 + step))
                .unwrap();
        }
        let expected: Vec<f32> = (0..103).map(|i| i as f32).collect();
        assert_eq!(values(&cache), expected);
        assert_eq!(cache.layers()[0].raw_keys().dims(), &[1, 1, 103, 1]);
        assert_eq!(cache.len(), 103);
    }

    #[test]
    fn a_fork_never_sees_its_siblings_appends() {
        let mut original = entries(0.0, 4, 0);
        // Room to grow, so that an unguarded append would write in place.
        original.append(entries(4.0, 1, 4)).unwrap();
        let mut fork = original.clone();
        let mut row = original.row(0).unwrap();
        original.append(entries(100.0, 2, 5)).unwrap();
        fork.append(entries(200.0, 2, 5)).unwrap();
        row.append(entries(300.0, 1, 5)).unwrap();
        assert_eq!(values(&original), [0.0, 1.0, 2.0, 3.0, 4.0, 100.0, 101.0]);
        assert_eq!(values(&fork), [0.0, 1.0, 2.0, 3.0, 4.0, 200.0, 201.0]);
        assert_eq!(values(&row), [0.0, 1.0, 2.0, 3.0, 4.0, 300.0]);
    }

    /// Rows 0..batch of one layer, row r's values `100 r + i`.
    fn rows(batch: usize, n: usize) -> KvCache {
        let data: Vec<f32> = (0..batch)
            .flat_map(|r| (0..n).map(move |i| (100 * r + i) as f32))
            .collect();
        let t = Tensor::from_vec(data, (batch, 1, n, 1), &Device::Cpu).unwrap();
        KvCache::from_parts(
            vec![LayerKv::new(t.clone(), t.clone(), t).unwrap()],
            (0..batch).map(|r| vec![r as u32; n]).collect(),
            vec![vec![true; n]; batch],
        )
    }

    fn row_values(cache: &KvCache, row: usize) -> Vec<f32> {
        cache.layers()[0]
            .values()
            .narrow(0, row, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn selected_rows_keep_their_entries_and_grow_apart_from_the_original() {
        let mut original = rows(3, 2);
        original.append(rows(3, 1)).unwrap();
        let mut kept = original.select_rows(&[2, 0]).unwrap();
        assert_eq!(kept.batch(), 2);
        assert_eq!(row_values(&kept, 0), [200.0, 201.0, 200.0]);
        assert_eq!(row_values(&kept, 1), [0.0, 1.0, 0.0]);
        assert_eq!(kept.positions(), &[vec![2, 2, 2], vec![0, 0, 0]]);
        kept.append(rows(2, 1)).unwrap();
        original.append(rows(3, 1)).unwrap();
        assert_eq!(row_values(&kept, 0), [200.0, 201.0, 200.0, 0.0]);
        assert_eq!(row_values(&original, 2), [200.0, 201.0, 200.0, 200.0]);
        assert!(original.select_rows(&[3]).is_err());
    }

    #[test]
    fn a_view_taken_before_a_rollback_keeps_its_values() {
        let mut cache = entries(0.0, 4, 0);
        cache.append(entries(4.0, 2, 4)).unwrap();
        let before = cache.layers()[0].values().clone();
        cache.truncate(3).unwrap();
        cache.append(entries(50.0, 3, 3)).unwrap();
        let seen: Vec<f32> = before.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(seen, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(values(&cache), [0.0, 1.0, 2.0, 50.0, 51.0, 52.0]);
    }

    #[test]
    fn hiding_entries_flags_them_in_that_cache_only() {
        let original = entries(0.0, 4, 10);
        let mut copy = original.clone();
        copy.hide(0, &[1, 3]).unwrap();
        assert_eq!(copy.valid(), &[vec![true, false, true, false]]);
        assert_eq!(original.valid(), &[vec![true; 4]]);
        assert_eq!(copy.next_positions(), [13]);
        assert_eq!(values(&copy), values(&original));
        assert!(copy.hide(0, &[4]).is_err());
        assert!(copy.hide(1, &[0]).is_err());
    }
}
