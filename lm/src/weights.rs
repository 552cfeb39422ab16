//! How weight matrices are held in memory.
//!
//! candle has SIMD CPU kernels for some GGUF block types (Q4_0, Q8_0, the K-quants) and a
//! scalar fallback for the others (Q4_1, Q5_0, Q5_1). The `q8_0` format re-quantises those
//! to Q8_0 at load time for candle's SIMD path (about 2x a 4-bit file's memory, values a
//! Q8_0 rounding away from the file's). `fast` instead decodes Q4_1, Q5_0, Q8_0 and Q4_K
//! matrices with Hasten's own kernels on the file's blocks ([`crate::kernels`]) and leaves
//! the rest to candle's (Q6_K's reads fewer bytes than a repacking that widens it). Prefill multiplies many rows at once, where a dense f32
//! gemm beats any per-row dot product, so `fast` also keeps an f32 copy for prompts.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{D, DType, Device, Module, Tensor};

use crate::error::{LmError, Result};
use crate::kernels::{self, BlockFormat, PackedMatrix};

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
    /// Types without a candle SIMD kernel re-quantised to Q8_0.
    Q8_0,
    /// Every matrix dequantised to f32 (dense gemm; 4 bytes a weight).
    F32,
    /// For inputs of few rows (decoding) the file's blocks, read by Hasten's kernels on the
    /// CPU (Q4_1, Q5_0, Q8_0, Q4_K) or candle's (the rest; re-quantised to Q8_0 as
    /// above where neither has a SIMD one); for inputs of many (prefill) candle's kernel on
    /// K-quant blocks and f32 for the rest. The fastest on CPU.
    Fast,
}

/// Inputs with at least this many rows (tokens x batch) take the dense path of `Fast`.
/// Below it the f32 gemm gains nothing: measured at batch-5 decoding (4 rows), 87 tokens/s
/// against 84 with Q8_0, for 4x the bytes read.
const DENSE_ROWS: usize = 32;

/// One weight matrix, in one or two representations.
pub(crate) struct Matrix {
    compact: Compact,
    dense: Option<QMatMul>,
}

/// The representation for inputs of few rows.
enum Compact {
    Candle(QMatMul),
    Kernels(PackedMatrix),
}

impl Matrix {
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [y] = Self::forward_shared([self], x)?;
        Ok(y)
    }

    /// The matrices applied to one input. Where each decodes with Hasten's kernels, the
    /// input is quantised once and one pass of the worker pool computes them all.
    pub(crate) fn forward_shared<const N: usize>(
        matrices: [&Matrix; N],
        x: &Tensor,
    ) -> Result<[Tensor; N]> {
        let rows = x.elem_count() / x.dim(D::Minus1)?;
        let packed: Option<Vec<&PackedMatrix>> = matrices
            .iter()
            .map(|matrix| matrix.kernels_for(rows))
            .collect();
        let outputs: Vec<Tensor> = match packed {
            Some(packed) => kernel_products(&packed, x, rows)?,
            None => matrices
                .iter()
                .map(|matrix| matrix.forward_alone(x, rows))
                .collect::<Result<_>>()?,
        };
        outputs.try_into().map_err(|_| missing_product())
    }

    /// Hasten's kernels' copy, when it is the one that takes an input of `rows` rows.
    fn kernels_for(&self, rows: usize) -> Option<&PackedMatrix> {
        match (&self.dense, &self.compact) {
            (Some(_), _) if rows >= DENSE_ROWS => None,
            (_, Compact::Kernels(matrix)) => Some(matrix),
            _ => None,
        }
    }

    fn forward_alone(&self, x: &Tensor, rows: usize) -> Result<Tensor> {
        match (&self.dense, &self.compact) {
            (Some(dense), _) if rows >= DENSE_ROWS => Ok(dense.forward(x)?),
            (_, Compact::Candle(matrix)) => Ok(matrix.forward(x)?),
            (_, Compact::Kernels(matrix)) => kernel_products(&[matrix], x, rows)?
                .pop()
                .ok_or_else(missing_product),
        }
    }
}

/// `x` through each of `matrices` on Hasten's kernels, in one pass.
fn kernel_products(matrices: &[&PackedMatrix], x: &Tensor, rows: usize) -> Result<Vec<Tensor>> {
    let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    kernels::matmul_shared(matrices, &values, rows)?
        .into_iter()
        .zip(matrices)
        .map(|(out, matrix)| {
            let mut shape = x.dims().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = matrix.rows();
            }
            Ok(Tensor::from_vec(out, shape, x.device())?)
        })
        .collect()
}

fn missing_product() -> LmError {
    LmError::InvalidInput("a matrix product went missing".into())
}

impl WeightFormat {
    pub(crate) fn matrix(self, stored: QTensor, device: &Device) -> Result<Matrix> {
        if self == Self::AsStored {
            return Ok(Matrix {
                compact: Compact::Candle(QMatMul::from_qtensor(stored)?),
                dense: None,
            });
        }
        if self == Self::F32 {
            return Ok(Matrix {
                compact: Compact::Candle(QMatMul::Tensor(stored.dequantize(device)?)),
                dense: None,
            });
        }
        // K-quant matrices' many-row products are faster through candle's quantised kernel
        // (its row-tiled path) than through an f32 copy: on Qwen2.5-1.5B, 105 against 56
        // prompt tokens/s, and 4 bytes a weight fewer.
        let quantised_prefill = is_k_quant(stored.dtype()) && device.is_cpu();
        let packed = self.kernel_matrix(&stored, device)?;
        let values =
            if quantised_prefill && (packed.is_some() || !needs_requantising(stored.dtype())) {
                None
            } else {
                Some(stored.dequantize(device)?)
            };
        let stored = Arc::new(stored);
        let compact = match (packed, &values) {
            (Some(packed), _) => Compact::Kernels(packed),
            (None, Some(values))
                if needs_requantising(stored.dtype()) && divisible(&stored, 32) =>
            {
                Compact::Candle(QMatMul::from_qtensor(QTensor::quantize(
                    values,
                    GgmlDType::Q8_0,
                )?)?)
            }
            (None, _) => Compact::Candle(QMatMul::from_arc(stored.clone())?),
        };
        let dense = match (self, values) {
            (Self::Fast, _) if quantised_prefill => Some(QMatMul::from_arc(stored)?),
            (Self::Fast, Some(values)) => Some(QMatMul::Tensor(values)),
            _ => None,
        };
        Ok(Matrix { compact, dense })
    }
}

impl WeightFormat {
    /// `fast`'s repacking for Hasten's CPU kernels, where they read the matrix's blocks.
    fn kernel_matrix(self, stored: &QTensor, device: &Device) -> Result<Option<PackedMatrix>> {
        let format = match stored.dtype() {
            GgmlDType::Q4_1 => BlockFormat::Q4_1,
            GgmlDType::Q5_0 => BlockFormat::Q5_0,
            GgmlDType::Q8_0 => BlockFormat::Q8_0,
            GgmlDType::Q4K => BlockFormat::Q4K,
            _ => return Ok(None),
        };
        let &[n, k] = stored.shape().dims() else {
            return Ok(None);
        };
        if self != Self::Fast || !device.is_cpu() || !PackedMatrix::supports(format, k) {
            return Ok(None);
        }
        PackedMatrix::from_ggml(format, &stored.data()?, n, k).map(Some)
    }
}

fn is_k_quant(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K
    )
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
