//! Hasten's LM runtime: GGUF llama-family and qwen2 decoders on candle whose KV cache the
//! caller owns.
//!
//! [`Decoder::forward`] is stateless: tokens at any positions, a past [`KvCache`], a mask,
//! and a choice of outputs. Generation ([`generate`]), one-pass scoring ([`score`]), chat
//! prompts ([`ChatTemplate`]) and the tokenizer ([`GgufTokenizer`]) are built on it.

pub mod chat;
mod cpu_attention;
pub mod decoder;
pub mod device;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod mask;
pub mod model;
pub mod packed;
pub mod rope;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use chat::{ChatMessage, ChatTemplate, Role};
pub use decoder::{
    AttentionReadout, Decoder, ForwardOutput, ForwardRequest, Interrupt, Logits, PassAttention,
    log_softmax,
};
pub use device::DeviceKind;
pub use error::{LmError, Result};
pub use generate::{
    Decoded, FinishReason, Generated, GenerationOptions, GenerationTimings, PaddedBatch, Sampling,
    decode_from, generate, generate_interruptible, left_pad, score, score_incrementally,
    score_shared,
};
pub use gguf::{Architecture, GgufFile, ModelConfig, RopeStyle};
pub use kv::{KvCache, LayerKv};
pub use mask::AttentionMask;
pub use model::LanguageModel;
pub use packed::PackedKv;
pub use rope::{RotaryTables, Rotation};
pub use tokenizer::{GgufTokenizer, StreamDecoder, TextStream};
pub use weights::WeightFormat;
