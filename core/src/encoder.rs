//! The text encoder: all-MiniLM-L6-v2 (sentence-transformers) run in-process with candle.
//!
//! The model is a 6-layer BERT; a sentence embedding is the mean of the last hidden states
//! over the attention mask, L2-normalised, as the model's `modules.json` prescribes
//! (Transformer -> Pooling(mean) -> Normalize).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// Identifier written into bundle manifests, so vectors from another model are never mixed in.
pub const MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The model's `sentence_bert_config.json` sets max_seq_length 256, while the packaged
/// `tokenizer.json` truncates at 128; 256 is what the model was trained and published with.
pub const MAX_TOKENS: usize = 256;

/// Where binaries and tests find the model when not told otherwise (relative to the
/// workspace root, where `make models` unpacks it).
pub const DEFAULT_MODEL_DIR: &str = "models/all-MiniLM-L6-v2";

/// Texts per forward pass. Larger batches amortise the per-call overhead of candle's matmuls
/// on the CPU; beyond ~32 the padded length of the longest text dominates instead.
const BATCH_SIZE: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error(
        "model file {path} not found: run `make models` or point the model directory at an unpacked all-MiniLM-L6-v2"
    )]
    MissingFile { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid model config {path}: {source}")]
    Config {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model: {0}")]
    Model(#[from] candle_core::Error),
}

/// Encodes texts into L2-normalised sentence embeddings. Thread-safe; encoding is CPU-bound,
/// so async callers should run it on a blocking thread.
pub struct TextEncoder {
    model: BertModel,
    tokenizer: Tokenizer,
    dimension: usize,
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEncoder")
            .field("model", &MODEL_ID)
            .field("dimension", &self.dimension)
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, EncoderError> {
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
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `model_dir`.
    pub fn load(model_dir: &Path) -> Result<Self, EncoderError> {
        let config_path = model_dir.join("config.json");
        let config: BertConfig =
            serde_json::from_slice(&read(&config_path)?).map_err(|source| {
                EncoderError::Config {
                    path: config_path.clone(),
                    source,
                }
            })?;
        let tokenizer_path = model_dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_bytes(read(&tokenizer_path)?)
            .map_err(|e| EncoderError::Tokenizer(e.to_string()))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| EncoderError::Tokenizer(e.to_string()))?;
        let weights = read(&model_dir.join("model.safetensors"))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)?;
        let model = BertModel::load(vb, &config)?;
        Ok(Self {
            model,
            tokenizer,
            dimension: config.hidden_size,
        })
    }

    /// Embedding dimension (384 for all-MiniLM-L6-v2).
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Encodes one text.
    pub fn encode_one(&self, text: &str) -> Result<Vec<f32>, EncoderError> {
        let mut out = self.encode_batch(&[text])?;
        out.pop()
            .ok_or_else(|| EncoderError::Tokenizer("empty batch result".into()))
    }

    /// Encodes many texts, in batches sorted by length so that padding stays small.
    /// The result is in the order of `texts`.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncoderError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH_SIZE) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, vector) in chunk.iter().zip(self.encode_batch(&batch)?) {
                out[i] = vector;
            }
        }
        Ok(out)
    }

    /// One forward pass over `texts`, padded to the longest.
    fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncoderError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EncoderError::Tokenizer(e.to_string()))?;
        let device = &self.model.device;
        let stack = |field: fn(&tokenizers::Encoding) -> &[u32]| -> candle_core::Result<Tensor> {
            let rows = encodings
                .iter()
                .map(|e| Tensor::new(field(e), device))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::stack(&rows, 0)
        };
        let input_ids = stack(tokenizers::Encoding::get_ids)?;
        let type_ids = stack(tokenizers::Encoding::get_type_ids)?;
        let mask = stack(tokenizers::Encoding::get_attention_mask)?;
        let hidden = self.model.forward(&input_ids, &type_ids, Some(&mask))?;
        // Mean over real tokens: sum(hidden * mask) / sum(mask), then L2-normalise.
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        let norms = mean.sqr()?.sum_keepdim(1)?.sqrt()?;
        let normalised = mean.broadcast_div(&norms)?;
        Ok(normalised.to_vec2::<f32>()?)
    }
}
