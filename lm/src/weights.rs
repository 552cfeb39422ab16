//! How weight matrices are held in memory.
//!
//! candle has SIMD CPU kernels for some GGUF block types (Q4_0, Q8_0, the K-quants) and a
//! scalar fallback for the others (Q4_1, Q5_0, Q5_1). Re-quantising those to Q8_0 at load
//! time trades memory (about 2x a 4-bit file) for the SIMD path; the values then differ
//! from the file's by Q8_0 rounding (about 0.4% of each block's largest weight). Prefill
//! multiplies many rows at once, where a dense f32 gemm beats any per-row dot product, so
//! the `fast` format keeps both: Q8_0 for decoding, f32 for prompts.

use std::fmt;
use std::str::FromStr;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{LmError, Result};

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// Exactly as the file stores them: what candle's own models and llama.cpp compute with.
    #[default]
    AsStored,
    /// Types without a SIMD kernel re-quantised to Q8_0.
    Q8_0,
    /// Every matrix dequantised to f32 (dense gemm; 4 bytes a weight).
    F32,
    /// Q8_0 as above for inputs of few rows (decoding), f32 for inputs of many (prefill):
    /// the fastest on CPU, at 5 bytes a weight.
    Fast,
}

/// Inputs with at least this many rows (tokens x batch) take the dense path of `Fast`.
/// Below it the f32 gemm gains nothing: measured at batch-5 decoding (4 rows), 87 tokens/s
/// against 84 with Q8_0, for 4x the bytes read.
const DENSE_ROWS: usize = 32;

/// One weight matrix, in one or two representations.
pub(crate) struct Matrix {
    compact: QMatMul,
    dense: Option<QMatMul>,
}

impl Matrix {
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        match &self.dense {
            Some(dense) if rows >= DENSE_ROWS => dense.forward(x),
            _ => self.compact.forward(x),
        }
    }
}

impl WeightFormat {
    pub(crate) fn matrix(self, stored: QTensor, device: &Device) -> Result<Matrix> {
        if self == Self::AsStored {
            return Ok(Matrix {
                compact: QMatMul::from_qtensor(stored)?,
                dense: None,
            });
        }
        // Dequantised once, whichever representations are built from it.
        let values = stored.dequantize(device)?;
        if self == Self::F32 {
            return Ok(Matrix {
                compact: QMatMul::Tensor(values),
                dense: None,
            });
        }
        let compact = if needs_requantising(stored.dtype()) && divisible(&stored, 32) {
            QMatMul::from_qtensor(QTensor::quantize(&values, GgmlDType::Q8_0)?)?
        } else {
            QMatMul::from_qtensor(stored)?
        };
        let dense = (self == Self::Fast).then(|| QMatMul::Tensor(values));
        Ok(Matrix { compact, dense })
    }
}

fn needs_requantising(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1)
}

fn divisible(tensor: &QTensor, block: usize) -> bool {
    tensor
        .shape()
        .dims()
        .last()
        .is_some_and(|inner| inner % block == 0)
}

impl FromStr for WeightFormat {
    type Err = LmError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "as_stored" => Ok(Self::AsStored),
            "q8_0" => Ok(Self::Q8_0),
            "f32" => Ok(Self::F32),
            "fast" => Ok(Self::Fast),
            other => Err(LmError::InvalidInput(format!(
                "weight format `{other}`: expected as_stored, q8_0, f32 or fast"
            ))),
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AsStored => "as_stored",
            Self::Q8_0 => "q8_0",
            Self::F32 => "f32",
            Self::Fast => "fast",
        })
    }
}
