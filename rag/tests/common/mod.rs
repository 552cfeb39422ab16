//! Tiny chat models for the tests: lm's tiny random-weight GGUF with a character-level
//! byte-BPE vocabulary and ChatML markers added, so that `LanguageModel::load` (and with it
//! prompts, drafting and verification) runs on it in milliseconds.
// Test support panics on setup failures, like the tests themselves.
#![allow(dead_code, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::gguf_file::{self, Value};
use hasten_lm::LanguageModel;
use hasten_rag::{Document, LocalLm};

use crate::support::{self, TinyArch, VOCAB};

/// Context of the tiny chat models: the verifier's rows (question, draft, reflection turn)
/// are a few hundred characters, and the vocabulary is one token per character.
pub const TINY_CONTEXT: u32 = 1024;

/// GPT-2's byte-to-character map for the bytes the vocabulary holds: printable ASCII as
/// itself, space as 'Ġ', newline as 'Ċ'.
fn vocabulary() -> Vec<String> {
    let mut tokens = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
    // Two printable characters make room for the markers in the 96-token vocabulary.
    tokens.extend(
        ('!'..='~')
            .filter(|c| !matches!(c, '`' | '~'))
            .map(String::from),
    );
    tokens.push("\u{0120}".into());
    tokens.push("\u{010A}".into());
    assert_eq!(tokens.len(), VOCAB);
    tokens
}

/// Writes lm's tiny model with a tokenizer and a longer context; returns its path.
pub fn tiny_chat_model(dir: &Path, arch: TinyArch, seed: u64) -> PathBuf {
    let source = support::write_tiny_model(dir, arch, seed);
    let mut file = std::fs::File::open(&source).expect("open tiny model");
    let content = gguf_file::Content::read(&mut file).expect("read tiny model");
    let tensors: Vec<(String, _)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let tensor = content
                .tensor(&mut file, name, &Device::Cpu)
                .expect("tensor");
            (name.clone(), tensor)
        })
        .collect();
    let name = match arch {
        TinyArch::Llama => "llama",
        TinyArch::Qwen2 => "qwen2",
    };
    let tokens = vocabulary();
    let types: Vec<Value> = (0..tokens.len())
        .map(|id| Value::I32(if id < 2 { 3 } else { 1 }))
        .collect();
    let mut metadata = content.metadata.clone();
    metadata.insert(format!("{name}.context_length"), Value::U32(TINY_CONTEXT));
    metadata.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    metadata.insert("tokenizer.ggml.pre".into(), Value::String("gpt2".into()));
    metadata.insert(
        "tokenizer.ggml.tokens".into(),
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    metadata.insert("tokenizer.ggml.merges".into(), Value::Array(Vec::new()));
    metadata.insert("tokenizer.ggml.token_type".into(), Value::Array(types));
    metadata.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(1));
    let path = dir.join(format!("tiny-chat-{name}-{seed}.gguf"));
    let mut out = std::fs::File::create(&path).expect("create");
    let metadata_refs: Vec<(&str, &Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &_)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &metadata_refs, &tensor_refs).expect("write");
    path
}

pub fn load_tiny(dir: &Path, arch: TinyArch, seed: u64) -> Arc<LanguageModel> {
    Arc::new(
        LanguageModel::load(&tiny_chat_model(dir, arch, seed), &Device::Cpu).expect("load tiny"),
    )
}

/// A tiny drafter (llama) and a different tiny verifier (qwen2).
pub fn tiny_backend(dir: &Path) -> LocalLm {
    LocalLm::new(
        load_tiny(dir, TinyArch::Llama, 3),
        load_tiny(dir, TinyArch::Qwen2, 4),
    )
}

/// Short documents in two obvious clusters (by vector): 0, 2, 4 about rivers, 1, 3, 5
/// about mountains.
pub fn clustered_documents() -> Vec<Document> {
    let texts = [
        ("Nile", "The Nile flows north."),
        ("Alps", "The Alps are high."),
        ("Amazon", "The Amazon is wide."),
        ("Andes", "The Andes are long."),
        ("Danube", "The Danube is blue."),
        ("Atlas", "The Atlas is dry."),
    ];
    texts
        .iter()
        .enumerate()
        .map(|(i, (title, text))| {
            let jitter = 0.05 * i as f32;
            let vector = if i % 2 == 0 {
                vec![1.0, jitter, 0.1]
            } else {
                vec![jitter, 1.0, 0.1]
            };
            Document::new(*title, *text).with_vector(vector)
        })
        .collect()
}
