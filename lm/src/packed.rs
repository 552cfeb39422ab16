//! A one-row KV cache with every layer in one tensor per kind, (layers, kv_heads, tokens,
//! head_dim): the form a segment's stored KV takes so that placing segments one after another
//! costs one copy per segment and kind, and moving every layer's keys one rotation.
//!
//! A cache of per-layer tensors needs those per layer. On a GPU each is a kernel launch, and
//! for a small model launches, not arithmetic, bound assembly: placing a system prompt and
//! ten chunks of a 30-layer model per layer took 10-17 ms on an H200, a quarter of a full
//! prefill of the same 1.5k tokens.

use candle_core::{Device, Tensor};

use crate::error::{LmError, Result};
use crate::kv::{KvCache, LayerKv, position_tensor};
use crate::rope::RotaryTables;

#[derive(Debug, Clone)]
pub struct PackedKv {
    raw_keys: Tensor,
    keys: Tensor,
    values: Tensor,
    positions: Vec<u32>,
}

impl PackedKv {
    /// Packs a one-row cache whose every entry is valid (a segment's prefill).
    pub fn pack(cache: &KvCache) -> Result<Self> {
        let all_valid = cache
            .valid()
            .first()
            .is_some_and(|row| row.iter().all(|&v| v));
        if cache.batch() != 1 || cache.is_empty() || cache.layers().is_empty() || !all_valid {
            return Err(LmError::InvalidInput(format!(
                "only one row of valid entries packs ({} rows of {} entries, {} layers)",
                cache.batch(),
                cache.len(),
                cache.layers().len()
            )));
        }
        let stack = |kind: fn(&LayerKv) -> &Tensor| -> Result<Tensor> {
            let layers: Vec<&Tensor> = cache.layers().iter().map(kind).collect();
            Ok(Tensor::cat(&layers, 0)?)
        };
        Ok(Self {
            raw_keys: stack(LayerKv::raw_keys)?,
            keys: stack(LayerKv::keys)?,
            values: stack(LayerKv::values)?,
            positions: cache.positions()[0].clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    pub fn device(&self) -> &Device {
        self.values.device()
    }

    /// The entries as a cache whose layers are views of these tensors (no copy). The views
    /// have no room to grow, so appending to that cache copies and never writes here.
    pub fn cache(&self) -> Result<KvCache> {
        let layers = (0..self.values.dim(0)?)
            .map(|l| {
                let layer = |t: &Tensor| t.narrow(0, l, 1);
                LayerKv::in_buffers(
                    [
                        layer(&self.raw_keys)?,
                        layer(&self.keys)?,
                        layer(&self.values)?,
                    ],
                    self.len(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache::from_parts(
            layers,
            vec![self.positions.clone()],
            vec![vec![true; self.len()]],
        ))
    }

    /// A copy on `device` (three transfers, whatever the number of layers).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            raw_keys: self.raw_keys.to_device(device)?,
            keys: self.keys.to_device(device)?,
            values: self.values.to_device(device)?,
            positions: self.positions.clone(),
        })
    }

    /// `parts` one after another at positions `start..`, every key rotated there, in buffers
    /// of the new cache's own with `room` entries to spare, so that the next appends (the
    /// request's recomputed tokens, its question, its answer) write in place. The parts are
    /// only read.
    pub fn place(
        parts: &[&PackedKv],
        rope: &RotaryTables,
        start: u32,
        room: usize,
    ) -> Result<KvCache> {
        let Some(first) = parts.first() else {
            return Err(LmError::InvalidInput("nothing to place".into()));
        };
        let (layers, heads, _, head_dim) = first.values.dims4()?;
        if let Some(odd) = parts.iter().find(|p| {
            p.values.dims4().ok() != Some((layers, heads, p.len(), head_dim))
                || !p.device().same_device(first.device())
        }) {
            return Err(LmError::InvalidInput(format!(
                "segments of one cache must share their layers, heads and device: {:?} and {:?}",
                first.values.dims(),
                odd.values.dims()
            )));
        }
        let entries: usize = parts.iter().map(|p| p.len()).sum();
        let positions = vec![(start..start + entries as u32).collect::<Vec<_>>()];
        rope.check(&positions)?;
        let device = first.device();
        let spare = (room > 0)
            .then(|| {
                Tensor::zeros(
                    (layers, heads, room, head_dim),
                    first.values.dtype(),
                    device,
                )
            })
            .transpose()?;
        let joined = |kind: fn(&PackedKv) -> &Tensor| -> Result<Tensor> {
            let mut pieces: Vec<&Tensor> = parts.iter().map(|p| kind(p)).collect();
            pieces.extend(&spare);
            Ok(Tensor::cat(&pieces, 2)?)
        };
        let raw_keys = joined(|p| &p.raw_keys)?;
        // One rotation for every layer (their heads side by side make one row), over the room
        // too: rotating its zeros at any position leaves zeros, and it saves copying the keys
        // into a buffer with room afterwards.
        let mut grid = positions.clone();
        grid[0].resize(entries + room, start);
        let keys = rope
            .apply(
                &raw_keys.reshape((1, layers * heads, entries + room, head_dim))?,
                &position_tensor(&grid, device)?,
            )?
            .reshape((layers, heads, entries + room, head_dim))?;
        let buffers = [raw_keys, keys, joined(|p| &p.values)?];
        let layers = (0..layers)
            .map(|l| {
                let [raw, rotated, values] = &buffers;
                LayerKv::in_buffers(
                    [
                        raw.narrow(0, l, 1)?,
                        rotated.narrow(0, l, 1)?,
                        values.narrow(0, l, 1)?,
                    ],
                    entries,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache::from_parts(
            layers,
            positions,
            vec![vec![true; entries]],
        ))
    }
}
