//! The tokenizer of a GGUF model, built from its metadata (`tokenizer.ggml.*`).
//!
//! Byte-level BPE ("gpt2" model) with the pre-tokenizer that `tokenizer.ggml.pre` names.
//! Control tokens (chat markers, end of text) are never produced from text: they are
//! looked up by name, so a question that contains `<|im_end|>` cannot forge a turn.

use display_full_error::DisplayFullErrorExt;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::{LmError, Result};
use crate::gguf::GgufFile;

const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: u32 = 3;

pub struct GgufTokenizer {
    inner: Tokenizer,
    control: HashMap<String, u32>,
    control_ids: HashSet<u32>,
    bos: Option<u32>,
    add_bos: bool,
    eos: u32,
}

impl GgufTokenizer {
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let fail = |reason: String| LmError::TokenizerMetadata {
            path: file.path.clone(),
            reason,
        };
        let model = file.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(fail(format!(
                "tokenizer model `{model}` (only byte-level BPE, `gpt2`, is supported)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            let values = file
                .metadata(key)?
                .to_vec()
                .map_err(|e| file.bad_key(key, format!("not an array ({e})")))?;
            values
                .iter()
                .map(|v| {
                    v.to_string()
                        .cloned()
                        .map_err(|e| file.bad_key(key, format!("holds a non-string ({e})")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| fail(format!("merge `{m}` is not two tokens")))
            })
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<u32> = match file.content.metadata.get("tokenizer.ggml.token_type") {
            Some(value) => value
                .to_vec()
                .map_err(|e| file.bad_key("tokenizer.ggml.token_type", e.to_string_full()))?
                .iter()
                .map(|v| v.to_i32().map(|t| t as u32).or_else(|_| v.to_u32()))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| file.bad_key("tokenizer.ggml.token_type", e.to_string_full()))?,
            None => Vec::new(),
        };
        let mut control = HashMap::new();
        for (id, (token, kind)) in tokens.iter().zip(&types).enumerate() {
            if *kind == TOKEN_TYPE_CONTROL {
                control.insert(token.clone(), id as u32);
            }
        }
        let vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, token)| (token.clone(), id as u32))
            .collect::<Vocab>();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| fail(format!("BPE: {e}")))?;
        let mut inner = Tokenizer::new(bpe);
        let pre = file
            .string("tokenizer.ggml.pre")
            .unwrap_or_else(|_| "gpt2".into());
        let regex_then_bytes = |pattern: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(pattern.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| fail(format!("pre-tokenizer regex: {e}")))?;
            Ok(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into())
        };
        let pre_tokenizer: PreTokenizerWrapper = match pre.as_str() {
            "gpt2" | "default" => ByteLevel::new(false, true, true).into(),
            // SmolLM: digits one by one, then GPT-2's split.
            "smollm" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            // No NFC normalisation, as llama.cpp on the same file: "e" + U+0301 stays two
            // characters (Hugging Face's Qwen2 tokenizer would compose them first).
            "qwen2" => regex_then_bytes(QWEN2_PATTERN)?,
            "llama-bpe" | "llama3" | "smaug-bpe" => regex_then_bytes(LLAMA3_PATTERN)?,
            other => {
                return Err(fail(format!(
                    "pre-tokenizer `{other}` is not supported (gpt2, smollm, qwen2, llama-bpe are)"
                )));
            }
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let id = |key: &str| file.unsigned(key).ok().map(|v| v as u32);
        let eos = id("tokenizer.ggml.eos_token_id")
            .ok_or_else(|| fail("no `tokenizer.ggml.eos_token_id`".into()))?;
        let control_ids = control.values().copied().collect();
        Ok(Self {
            inner,
            control,
            control_ids,
            bos: id("tokenizer.ggml.bos_token_id"),
            add_bos: file
                .metadata("tokenizer.ggml.add_bos_token")
                .and_then(|v| {
                    v.to_bool()
                        .map_err(|e| file.bad_key("add_bos_token", e.to_string_full()))
                })
                .unwrap_or(false),
            eos,
        })
    }

    /// Token ids of plain text (no BOS, control-token names are text like any other).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| LmError::Tokenize(e.to_string_full()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, control tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !self.control_ids.contains(id))
            .collect();
        self.inner
            .decode(&kept, false)
            .map_err(|e| LmError::Tokenize(e.to_string_full()))
    }

    /// The id of a control token such as `<|im_start|>`.
    pub fn control_token(&self, name: &str) -> Option<u32> {
        self.control.get(name).copied()
    }

    /// The BOS id when the model wants one in front of every prompt.
    pub fn bos_prefix(&self) -> Option<u32> {
        if self.add_bos { self.bos } else { None }
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Turns a growing list of generated ids into text deltas, holding back bytes that do not
/// yet form whole UTF-8 characters.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl StreamDecoder {
    pub fn push(&mut self, tokenizer: &GgufTokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() <= self.emitted {
            return Ok(None);
        }
        let delta = text.get(self.emitted..).map(str::to_string);
        self.emitted = text.len();
        Ok(delta)
    }
}

/// Generated ids as text for a callback, in whole-character pieces: what a generation's
/// `on_token` streams through. A token callback cannot return an error, so the first
/// tokenizer error stops the row and waits for [`TextStream::finish`].
pub struct TextStream<'a> {
    tokenizer: &'a GgufTokenizer,
    decoder: StreamDecoder,
    on_text: &'a mut dyn FnMut(&str),
    failure: Option<LmError>,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a GgufTokenizer, on_text: &'a mut dyn FnMut(&str)) -> Self {
        Self {
            tokenizer,
            decoder: StreamDecoder::default(),
            on_text,
            failure: None,
        }
    }

    /// Takes the next id; breaks on a tokenizer error.
    pub fn push(&mut self, id: u32) -> ControlFlow<()> {
        match self.decoder.push(self.tokenizer, id) {
            Ok(Some(delta)) => {
                (self.on_text)(&delta);
                ControlFlow::Continue(())
            }
            Ok(None) => ControlFlow::Continue(()),
            Err(error) => {
                self.failure = Some(error);
                ControlFlow::Break(())
            }
        }
    }

    /// The error that stopped the stream, if any.
    pub fn finish(self) -> Result<()> {
        self.failure.map_or(Ok(()), Err)
    }
}
