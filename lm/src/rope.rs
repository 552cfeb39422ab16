//! Rotary position embeddings at arbitrary positions.
//!
//! The runtime keeps keys before RoPE, so placing a key at a new position is one rotation
//! of the stored key; the tables here serve any (batch, token) grid of positions.

use candle_core::{DType, Device, Tensor};

use crate::error::{LmError, Result};
use crate::gguf::RopeStyle;

#[derive(Debug, Clone)]
pub struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
    max_positions: usize,
}

impl RotaryTables {
    pub fn new(
        head_dim: usize,
        base: f32,
        max_positions: usize,
        style: RopeStyle,
        device: &Device,
    ) -> Result<Self> {
        let inverse_frequencies: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1.0 / base.powf(i as f32 / head_dim as f32))
            .collect();
        let half = inverse_frequencies.len();
        let inverse_frequencies = Tensor::from_vec(inverse_frequencies, (1, half), device)?;
        let positions = Tensor::arange(0u32, max_positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_positions, 1))?;
        let angles = positions.matmul(&inverse_frequencies)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
            style,
            max_positions,
        })
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The rotation at a (batch, tokens) grid of positions, to apply to every layer.
    pub fn at(&self, positions: &Tensor) -> Result<Rotation> {
        let (batch, tokens) = positions.dims2()?;
        let flat = positions.flatten_all()?;
        let half = self.cos.dim(1)?;
        Ok(Rotation {
            cos: self
                .cos
                .index_select(&flat, 0)?
                .reshape((batch, tokens, half))?,
            sin: self
                .sin
                .index_select(&flat, 0)?
                .reshape((batch, tokens, half))?,
            style: self.style,
        })
    }

    /// Rotates `x` of shape (batch, heads, tokens, head_dim); `positions` is (batch, tokens).
    pub fn apply(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        self.at(positions)?.apply(x)
    }

    /// Checks that every position fits the tables before any tensor work starts.
    pub fn check(&self, positions: &[Vec<u32>]) -> Result<()> {
        match positions.iter().flatten().max() {
            Some(&p) if p as usize >= self.max_positions => Err(LmError::InvalidInput(format!(
                "position {p} is beyond the model's context of {} tokens",
                self.max_positions
            ))),
            _ => Ok(()),
        }
    }
}

/// Cosines and sines gathered for one grid of positions.
#[derive(Debug, Clone)]
pub struct Rotation {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
}

impl Rotation {
    /// Rotates `x` of shape (batch, heads, tokens, head_dim).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)?,
        })
    }
}
