//! Test support for this crate and the ones built on it: tiny random-weight GGUF models, so
//! that equivalences are checked on both architectures in seconds without downloads, and the
//! real models where `HASTEN_LM_DIR` points at them.
// Test support panics on setup failures, like the tests that call it.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use std::sync::Arc;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TinyArch {
    Llama,
    Qwen2,
}

pub const VOCAB: usize = 96;
pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FFN: usize = 128;
pub const LAYERS: usize = 2;
pub const CONTEXT: usize = 256;

fn random(rng: &mut StdRng, shape: &[usize], scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).expect("tensor")
}

fn around_one(rng: &mut StdRng, n: usize) -> Tensor {
    let data: Vec<f32> = (0..n)
        .map(|_| 1.0 + rng.random_range(-0.2f32..0.2))
        .collect();
    Tensor::from_vec(data, n, &Device::Cpu).expect("tensor")
}

/// Writes a 2-layer model with random weights (Q8_0 matrices, f32 norms and biases) and
/// returns its path inside `dir`.
pub fn write_tiny_model(dir: &Path, arch: TinyArch, seed: u64) -> PathBuf {
    let mut rng = StdRng::seed_from_u64(seed);
    let name = match arch {
        TinyArch::Llama => "llama",
        TinyArch::Qwen2 => "qwen2",
    };
    let head_dim = HIDDEN / HEADS;
    let q8 = |t: Tensor| QTensor::quantize(&t, GgmlDType::Q8_0).expect("quantize");
    let f32q = |t: Tensor| QTensor::quantize(&t, GgmlDType::F32).expect("f32");
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            q8(random(&mut rng, &[VOCAB, HIDDEN], 1.0)),
        ),
        (
            "output_norm.weight".into(),
            f32q(around_one(&mut rng, HIDDEN)),
        ),
        (
            "output.weight".into(),
            q8(random(&mut rng, &[VOCAB, HIDDEN], 0.6)),
        ),
    ];
    let linear_scale = 1.7 / (HIDDEN as f32).sqrt();
    for layer in 0..LAYERS {
        let p = |n: &str| format!("blk.{layer}.{n}");
        tensors.push((p("attn_norm.weight"), f32q(around_one(&mut rng, HIDDEN))));
        tensors.push((p("ffn_norm.weight"), f32q(around_one(&mut rng, HIDDEN))));
        tensors.push((
            p("attn_q.weight"),
            q8(random(&mut rng, &[HEADS * head_dim, HIDDEN], linear_scale)),
        ));
        tensors.push((
            p("attn_k.weight"),
            q8(random(
                &mut rng,
                &[KV_HEADS * head_dim, HIDDEN],
                linear_scale,
            )),
        ));
        tensors.push((
            p("attn_v.weight"),
            q8(random(
                &mut rng,
                &[KV_HEADS * head_dim, HIDDEN],
                linear_scale,
            )),
        ));
        tensors.push((
            p("attn_output.weight"),
            q8(random(&mut rng, &[HIDDEN, HIDDEN], linear_scale)),
        ));
        tensors.push((
            p("ffn_gate.weight"),
            q8(random(&mut rng, &[FFN, HIDDEN], linear_scale)),
        ));
        tensors.push((
            p("ffn_up.weight"),
            q8(random(&mut rng, &[FFN, HIDDEN], linear_scale)),
        ));
        tensors.push((
            p("ffn_down.weight"),
            q8(random(&mut rng, &[HIDDEN, FFN], 1.7 / (FFN as f32).sqrt())),
        ));
        if arch == TinyArch::Qwen2 {
            tensors.push((
                p("attn_q.bias"),
                f32q(random(&mut rng, &[HEADS * head_dim], 0.3)),
            ));
            tensors.push((
                p("attn_k.bias"),
                f32q(random(&mut rng, &[KV_HEADS * head_dim], 0.3)),
            ));
            tensors.push((
                p("attn_v.bias"),
                f32q(random(&mut rng, &[KV_HEADS * head_dim], 0.3)),
            ));
        }
    }
    use gguf_file::Value;
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(name.into())),
        (format!("{name}.block_count"), Value::U32(LAYERS as u32)),
        (
            format!("{name}.embedding_length"),
            Value::U32(HIDDEN as u32),
        ),
        (
            format!("{name}.feed_forward_length"),
            Value::U32(FFN as u32),
        ),
        (
            format!("{name}.attention.head_count"),
            Value::U32(HEADS as u32),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            Value::U32(KV_HEADS as u32),
        ),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (
            format!("{name}.rope.dimension_count"),
            Value::U32(head_dim as u32),
        ),
        (format!("{name}.rope.freq_base"), Value::F32(10_000.0)),
        (format!("{name}.context_length"), Value::U32(CONTEXT as u32)),
    ];
    let path = dir.join(format!("tiny-{name}-{seed}.gguf"));
    let mut file = std::fs::File::create(&path).expect("create gguf");
    let metadata_refs: Vec<(&str, &Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &metadata_refs, &tensor_refs).expect("write gguf");
    path
}

/// Context of the tiny chat models ([`tiny_chat_model`]): the verifier's rows (question, draft, reflection turn)
/// are a few hundred characters, and the vocabulary is one token per character.
pub const TINY_CHAT_CONTEXT: u32 = 1024;

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
/// (A character-level byte-BPE vocabulary and ChatML markers, so that `LanguageModel::load`,
/// prompts and chat templates run on the tiny model in milliseconds.)
pub fn tiny_chat_model(dir: &Path, arch: TinyArch, seed: u64) -> PathBuf {
    let source = write_tiny_model(dir, arch, seed);
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
    metadata.insert(
        format!("{name}.context_length"),
        Value::U32(TINY_CHAT_CONTEXT),
    );
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

/// [`tiny_chat_model`], loaded.
pub fn load_tiny(dir: &Path, arch: TinyArch, seed: u64) -> Arc<crate::LanguageModel> {
    Arc::new(
        crate::LanguageModel::load(&tiny_chat_model(dir, arch, seed), &Device::Cpu)
            .expect("load tiny"),
    )
}

/// Random token ids in the tiny vocabulary.
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..VOCAB as u32)).collect()
}

/// Largest absolute difference between two tensors of one shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .expect("same shape")
        .abs()
        .expect("abs")
        .flatten_all()
        .expect("flatten")
        .max(0)
        .expect("max")
        .to_scalar::<f32>()
        .expect("scalar")
}

/// The real model `file` under `HASTEN_LM_DIR`: `None` when the variable is unset (the test
/// says it is skipped); a panic when it is set but the file is missing, so that a CI run
/// that installed the models cannot silently skip.
pub fn real_model(file: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("HASTEN_LM_DIR") else {
        eprintln!("HASTEN_LM_DIR is unset: skipping the test on {file}");
        return None;
    };
    let path = Path::new(&dir).join(file);
    assert!(
        path.is_file(),
        "HASTEN_LM_DIR is set but {} is missing (run `make models`)",
        path.display()
    );
    Some(path)
}

pub const SMALL_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const LARGE_MODEL: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// An optional real model (not installed by `make models`): `None` when absent.
pub fn optional_real_model(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("HASTEN_LM_DIR")?;
    let path = Path::new(&dir).join(file);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "{} is not installed (`make models-large`): skipping",
            path.display()
        );
        None
    }
}
