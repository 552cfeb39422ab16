//! Reading a GGUF file: its metadata as a typed [`ModelConfig`], and its tensors by name.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::{QTensor, gguf_file};

use crate::error::{LmError, Result};

/// The decoder families this runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama-family (SmolLM2, TinyLlama, Llama): no attention biases, interleaved RoPE pairs.
    Llama,
    /// Qwen2 (Qwen2, Qwen2.5): q/k/v biases, RoPE over the two halves of a head (NeoX style).
    Qwen2,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): GGUF llama weights are permuted for this.
    Interleaved,
    /// Pairs (i, i + d/2).
    Halves,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f64,
    pub context_length: usize,
    pub vocab_size: usize,
}

/// An open GGUF file: parsed header plus a reader for its tensor data.
pub struct GgufFile {
    pub path: PathBuf,
    pub content: gguf_file::Content,
    reader: BufReader<File>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| LmError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = gguf_file::Content::read(&mut reader).map_err(|source| LmError::Gguf {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    pub fn metadata(&self, key: &str) -> Result<&gguf_file::Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| self.bad_key(key, "missing"))
    }

    pub fn bad_key(&self, key: &str, problem: impl Into<String>) -> LmError {
        LmError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    pub fn string(&self, key: &str) -> Result<String> {
        self.metadata(key)?
            .to_string()
            .cloned()
            .map_err(|e| self.bad_key(key, format!("not a string ({e})")))
    }

    pub fn unsigned(&self, key: &str) -> Result<usize> {
        let value = self.metadata(key)?;
        value
            .to_u32()
            .map(|v| v as usize)
            .or_else(|_| value.to_u64().map(|v| v as usize))
            .or_else(|_| value.to_i32().map(|v| v.max(0) as usize))
            .map_err(|e| self.bad_key(key, format!("not an unsigned integer ({e})")))
    }

    pub fn float(&self, key: &str) -> Result<f32> {
        self.metadata(key)?
            .to_f32()
            .map_err(|e| self.bad_key(key, format!("not a float ({e})")))
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|source| LmError::Tensor {
                path: self.path.clone(),
                name: name.to_string(),
                source: Box::new(source),
            })
    }

    pub fn config(&self) -> Result<ModelConfig> {
        let arch_name = self.string("general.architecture")?;
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            _ => {
                return Err(LmError::UnsupportedArchitecture {
                    path: self.path.clone(),
                    architecture: arch_name,
                });
            }
        };
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let hidden = self.unsigned(&key("embedding_length"))?;
        let heads = self.unsigned(&key("attention.head_count"))?;
        let kv_heads = self
            .unsigned(&key("attention.head_count_kv"))
            .or_else(|e| {
                if self
                    .content
                    .metadata
                    .contains_key(&key("attention.head_count_kv"))
                {
                    Err(e)
                } else {
                    Ok(heads)
                }
            })?;
        if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(self.bad_key(
                &key("attention.head_count"),
                format!("inconsistent: {heads} heads, {kv_heads} KV heads, width {hidden}"),
            ));
        }
        let head_dim = hidden / heads;
        if let Ok(rope_dim) = self.unsigned(&key("rope.dimension_count"))
            && rope_dim != head_dim
        {
            return Err(self.bad_key(
                &key("rope.dimension_count"),
                format!("{rope_dim}, but partial rotary embeddings (head width {head_dim}) are not supported"),
            ));
        }
        let rope_base = self.float(&key("rope.freq_base")).unwrap_or(10_000.0);
        let rms_eps = self.float(&key("attention.layer_norm_rms_epsilon"))? as f64;
        let context_length = self.unsigned(&key("context_length")).unwrap_or(4096);
        let vocab_size = match self.content.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims()[0],
            None => return Err(self.bad_key("token_embd.weight", "missing (tensor)")),
        };
        Ok(ModelConfig {
            architecture,
            layers: self.unsigned(&key("block_count"))?,
            hidden,
            heads,
            kv_heads,
            head_dim,
            rope_base,
            rope_style: match architecture {
                Architecture::Llama => RopeStyle::Interleaved,
                Architecture::Qwen2 => RopeStyle::Halves,
            },
            rms_eps,
            context_length,
            vocab_size,
        })
    }
}
