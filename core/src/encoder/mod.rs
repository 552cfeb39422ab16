//! The text encoder: all-MiniLM-L6-v2 (sentence-transformers), run in-process.
//!
//! The model is a 6-layer BERT; a sentence embedding is the mean of the last hidden states
//! over the attention mask, L2-normalised, as the model's `modules.json` prescribes
//! (Transformer -> Pooling(mean) -> Normalize). Two runtimes compute the hidden states from
//! the same weights: ONNX Runtime (`model.onnx` and `libonnxruntime.so` in the model
//! directory, written by `scripts/fetch-model.sh`), about 4x faster on CPU, and candle,
//! which needs nothing beyond the safetensors and also runs on a CUDA GPU in a build with the
//! `cuda` feature. Tokenising, batching and pooling are shared.

mod candle;
mod onnx;

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};

use tokenizers::{Tokenizer, TruncationParams};

use self::candle::CandleBert;
use self::onnx::OnnxBert;

/// Identifier written into bundle manifests, so vectors from another model are never mixed in.
pub const MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The model's `sentence_bert_config.json` sets max_seq_length 256, while the packaged
/// `tokenizer.json` truncates at 128; 256 is what the model was trained and published with.
pub const MAX_TOKENS: usize = 256;

/// Where binaries and tests find the model when not told otherwise (relative to the
/// workspace root, where `make models` unpacks it).
pub const DEFAULT_MODEL_DIR: &str = "models/all-MiniLM-L6-v2";

#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error(
        "model file {path} not found: run `make models` or point the model directory at an unpacked all-MiniLM-L6-v2"
    )]
    MissingFile { path: PathBuf },
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid model config {path}")]
    Config {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("encoder model")]
    Model(#[from] ::candle_core::Error),
    #[error("ONNX Runtime ({context})")]
    OnnxRuntime {
        context: String,
        source: ::ort::Error,
    },
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    OnnxRuntimeLibrary { path: PathBuf, message: String },
    #[error(
        "cannot open the CUDA device: the `cuda` runtime needs a build with the `cuda` feature and a GPU"
    )]
    Cuda(#[source] ::candle_core::Error),
}

/// Which runtime computes the hidden states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderRuntime {
    /// ONNX Runtime when the model directory has `model.onnx` and `libonnxruntime.so`,
    /// candle otherwise.
    Auto,
    Onnx,
    Candle,
    /// candle on the first CUDA device.
    Cuda,
}

impl EncoderRuntime {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Onnx => "onnx",
            Self::Candle => "candle",
            Self::Cuda => "cuda",
        }
    }
}

/// A BERT forward pass: token ids and mask in, last hidden states out.
trait HiddenStates: Send + Sync {
    /// `ids` and `mask` are `rows x tokens`, row-major and right-padded; the result is
    /// `rows x tokens x dimension`, row-major.
    fn forward(
        &self,
        ids: &[u32],
        mask: &[u32],
        rows: usize,
        tokens: usize,
    ) -> Result<Vec<f32>, EncoderError>;
}

/// Encodes texts into L2-normalised sentence embeddings. Thread-safe; encoding is CPU-bound,
/// so async callers should run it on a blocking thread.
pub struct TextEncoder {
    runtime: EncoderRuntime,
    model: Box<dyn HiddenStates>,
    tokenizer: Tokenizer,
    dimension: usize,
    batch_size: usize,
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEncoder")
            .field("model", &MODEL_ID)
            .field("runtime", &self.runtime)
            .field("dimension", &self.dimension)
            .finish()
    }
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, EncoderError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            EncoderError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            EncoderError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

impl TextEncoder {
    /// Loads the model from `model_dir` with the fastest runtime it has files for.
    pub fn load(model_dir: &Path) -> Result<Self, EncoderError> {
        Self::load_with(model_dir, EncoderRuntime::Auto)
    }

    /// Loads `config.json` and `tokenizer.json`, and the weights for `runtime`:
    /// `model.onnx` with `libonnxruntime.so`, or `model.safetensors` for candle.
    pub fn load_with(model_dir: &Path, runtime: EncoderRuntime) -> Result<Self, EncoderError> {
        let runtime = match runtime {
            EncoderRuntime::Auto if OnnxBert::available(model_dir) => EncoderRuntime::Onnx,
            EncoderRuntime::Auto => EncoderRuntime::Candle,
            chosen => chosen,
        };
        let config_path = model_dir.join("config.json");
        let config: ::candle_transformers::models::bert::Config =
            serde_json::from_slice(&read(&config_path)?).map_err(|source| {
                EncoderError::Config {
                    path: config_path.clone(),
                    source,
                }
            })?;
        let mut tokenizer = Tokenizer::from_bytes(read(&model_dir.join("tokenizer.json"))?)
            .map_err(|e| EncoderError::Tokenizer(e.to_string_full()))?;
        // Padding is done here, per batch of similar lengths, not by the tokenizer.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| EncoderError::Tokenizer(e.to_string_full()))?;
        // Texts per forward pass. candle amortises its per-call matmul overhead over ~32
        // texts; ONNX Runtime is fastest at a few (docs/benchmarks/encoder.md), where the
        // padding of texts sorted by length is near zero. A GPU needs large batches to fill.
        let (model, batch_size): (Box<dyn HiddenStates>, usize) = match runtime {
            EncoderRuntime::Onnx => (Box::new(OnnxBert::load(model_dir)?), 2),
            EncoderRuntime::Cuda => {
                let device = ::candle_core::Device::new_cuda(0).map_err(EncoderError::Cuda)?;
                (
                    Box::new(CandleBert::load(model_dir, &config, &device)?),
                    256,
                )
            }
            _ => (
                Box::new(CandleBert::load(
                    model_dir,
                    &config,
                    &::candle_core::Device::Cpu,
                )?),
                32,
            ),
        };
        tracing::debug!(runtime = runtime.name(), "text encoder loaded");
        Ok(Self {
            runtime,
            model,
            tokenizer,
            dimension: config.hidden_size,
            batch_size,
        })
    }

    /// The runtime in use (never `Auto`).
    pub fn runtime(&self) -> EncoderRuntime {
        self.runtime
    }

    /// Embedding dimension (384 for all-MiniLM-L6-v2).
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Encodes one text.
    pub fn encode_one(&self, text: &str) -> Result<Vec<f32>, EncoderError> {
        let mut out = self.encode(&[text])?;
        out.pop()
            .ok_or_else(|| EncoderError::Tokenizer("empty batch result".into()))
    }

    /// Encodes many texts, in batches sorted by token count so that padding stays small.
    /// The result is in the order of `texts`.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncoderError> {
        self.encode_counted(texts).map(|(vectors, _)| vectors)
    }

    /// [`TextEncoder::encode`], and the tokens the model read (each text cut at
    /// [`MAX_TOKENS`]), as embedding APIs report their usage.
    pub fn encode_counted(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, usize), EncoderError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EncoderError::Tokenizer(e.to_string_full()))?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(self.batch_size) {
            let batch: Vec<&tokenizers::Encoding> = chunk.iter().map(|&i| &encodings[i]).collect();
            for (&i, vector) in chunk.iter().zip(self.encode_batch(&batch)?) {
                out[i] = vector;
            }
        }
        let tokens = encodings.iter().map(tokenizers::Encoding::len).sum();
        Ok((out, tokens))
    }

    /// One forward pass over `batch`, padded to the longest.
    fn encode_batch(&self, batch: &[&tokenizers::Encoding]) -> Result<Vec<Vec<f32>>, EncoderError> {
        let tokens = batch.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut ids = vec![0u32; batch.len() * tokens];
        let mut mask = vec![0u32; batch.len() * tokens];
        for (row, encoding) in batch.iter().enumerate() {
            let start = row * tokens;
            ids[start..start + encoding.len()].copy_from_slice(encoding.get_ids());
            mask[start..start + encoding.len()].copy_from_slice(encoding.get_attention_mask());
        }
        let hidden = self.model.forward(&ids, &mask, batch.len(), tokens)?;
        Ok(mean_pool_normalised(
            &hidden,
            &mask,
            batch.len(),
            tokens,
            self.dimension,
        ))
    }
}

/// Mean of each row's hidden states over its real tokens, L2-normalised. The mean's divisor
/// cancels in the normalisation, so the sum is normalised directly.
fn mean_pool_normalised(
    hidden: &[f32],
    mask: &[u32],
    rows: usize,
    tokens: usize,
    dimension: usize,
) -> Vec<Vec<f32>> {
    (0..rows)
        .map(|row| {
            let mut sum = vec![0f32; dimension];
            for token in (0..tokens).filter(|&t| mask[row * tokens + t] != 0) {
                let state = &hidden[(row * tokens + token) * dimension..][..dimension];
                for (s, h) in sum.iter_mut().zip(state) {
                    *s += h;
                }
            }
            let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt();
            if norm > 0.0 {
                sum.iter_mut().for_each(|v| *v /= norm);
            }
            sum
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::mean_pool_normalised;

    #[test]
    fn pooling_ignores_padding_and_normalises() {
        // Two rows of three tokens, dimension 2; the second row has one padding token whose
        // state would change the mean if it were counted.
        let hidden = [
            1.0, 0.0, 3.0, 0.0, 2.0, 0.0, //
            0.0, 1.0, 0.0, 3.0, 100.0, 100.0,
        ];
        let mask = [1, 1, 1, 1, 1, 0];
        let pooled = mean_pool_normalised(&hidden, &mask, 2, 3, 2);
        assert_eq!(pooled[0], vec![1.0, 0.0]);
        assert_eq!(pooled[1], vec![0.0, 1.0]);
    }
}
