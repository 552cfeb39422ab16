//! One stateless decoder for GGUF llama and qwen2 models.
//!
//! `forward` takes tokens at explicit positions, a past KV cache that the caller owns and a
//! mask, and returns what was asked for: last- or all-position logits, the new tokens' KV
//! (keys before and after RoPE, values) and, on request, the last layer's queries and
//! attention weights. It keeps no state between calls.

use std::path::Path;

use candle_core::{D, DType, Device, IndexOp, Tensor};

use crate::cpu_attention;
use crate::error::{LmError, Result};
use crate::gguf::{Architecture, GgufFile, ModelConfig};
use crate::kernels;
use crate::kv::{KvCache, LayerKv, position_tensor};
use crate::mask::AttentionMask;
use crate::rope::{RotaryTables, Rotation};
use crate::weights::{Matrix, WeightFormat};

/// How a pass computes its layers' attention.
#[derive(Clone, Copy)]
enum AttentionPath<'a> {
    /// candle's operations (matmuls, softmax).
    Candle,
    /// `cpu_attention`, with the pass's mask as values to add to the scores.
    Fused(Option<&'a [f32]>),
}

/// A linear map with an optional bias (qwen2's q/k/v projections have one).
struct Projection {
    weight: Matrix,
    bias: Option<Tensor>,
}

impl Projection {
    /// The projections of one input (a layer's query, key and value), their matrices
    /// applied together.
    fn forward_shared<const N: usize>(
        projections: [&Projection; N],
        x: &Tensor,
    ) -> Result<[Tensor; N]> {
        let mut outputs = Matrix::forward_shared(projections.map(|p| &p.weight), x)?;
        for (y, projection) in outputs.iter_mut().zip(projections) {
            if let Some(bias) = &projection.bias {
                *y = y.broadcast_add(bias)?;
            }
        }
        Ok(outputs)
    }
}

struct Layer {
    attention_norm: Tensor,
    query: Projection,
    key: Projection,
    value: Projection,
    output: Matrix,
    ffn_norm: Tensor,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

/// Which logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Logits {
    None,
    /// (batch, vocab) at the last new token of every row.
    #[default]
    Last,
    /// (batch, n, vocab) at the last n new tokens of every row: what scoring a
    /// continuation reads, without the output projection of every context position (a
    /// vocabulary-wide row each, gigabytes for a batch of long rows).
    Trailing(usize),
    /// (batch, tokens, vocab) at every new token.
    All,
}

/// A forward pass over `tokens` (rows of equal length; pad on the left and mark padding
/// in `valid`).
#[derive(Debug, Clone)]
pub struct ForwardRequest<'a> {
    pub tokens: &'a [Vec<u32>],
    pub positions: &'a [Vec<u32>],
    pub valid: Option<&'a [Vec<bool>]>,
    pub past: Option<&'a KvCache>,
    pub mask: AttentionMask,
    pub logits: Logits,
    pub attention: AttentionReadout,
    /// Runs only the first this many layers (`None`: all); their KV is what comes back, and
    /// the last of them is the one whose attention is returned. No logits then.
    pub layers: Option<usize>,
    /// Asked between the chunks of a long prompt: `true` ends the pass with
    /// [`LmError::Interrupted`] (its caller went away).
    pub interrupt: Option<Interrupt<'a>>,
}

/// Whether a long pass should stop between its chunks.
#[derive(Clone, Copy)]
pub struct Interrupt<'a>(pub &'a dyn Fn() -> bool);

impl std::fmt::Debug for Interrupt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupt")
    }
}

impl<'a> ForwardRequest<'a> {
    pub fn new(tokens: &'a [Vec<u32>], positions: &'a [Vec<u32>]) -> Self {
        Self {
            tokens,
            positions,
            valid: None,
            past: None,
            mask: AttentionMask::Causal,
            logits: Logits::Last,
            attention: AttentionReadout::None,
            layers: None,
            interrupt: None,
        }
    }

    /// Stops a long prompt between its chunks once `interrupted` says so.
    pub fn interruptible(mut self, interrupted: &'a dyn Fn() -> bool) -> Self {
        self.interrupt = Some(Interrupt(interrupted));
        self
    }

    pub fn past(mut self, past: &'a KvCache) -> Self {
        self.past = Some(past);
        self
    }

    pub fn valid(mut self, valid: &'a [Vec<bool>]) -> Self {
        self.valid = Some(valid);
        self
    }

    pub fn mask(mut self, mask: AttentionMask) -> Self {
        self.mask = mask;
        self
    }

    pub fn logits(mut self, logits: Logits) -> Self {
        self.logits = logits;
        self
    }

    /// Returns the last layer's attention ([`AttentionReadout::LastLayer`]).
    pub fn with_attention(mut self) -> Self {
        self.attention = AttentionReadout::LastLayer;
        self
    }

    /// Returns the attention weights summed over the layers run
    /// ([`AttentionReadout::SummedOverLayers`]).
    pub fn with_attention_summed_over_layers(mut self) -> Self {
        self.attention = AttentionReadout::SummedOverLayers;
        self
    }

    /// Runs the first `layers` layers only (CacheBlend's deviation needs two).
    pub fn first_layers(mut self, layers: usize) -> Self {
        self.layers = Some(layers);
        self
    }
}

/// Which attention a pass returns, for query-guided selection (FusionRAG).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttentionReadout {
    #[default]
    None,
    /// The last layer run's queries and weights.
    LastLayer,
    /// The last layer run's queries, and the weights of every layer run summed: each layer's
    /// rows sum to 1, so every layer weighs the same.
    SummedOverLayers,
}

/// The new tokens' view of the context, as [`AttentionReadout`] asked.
#[derive(Debug, Clone)]
pub struct PassAttention {
    /// (batch, heads, tokens, head_dim), after RoPE.
    pub queries: Tensor,
    /// (batch, heads, tokens, past + tokens), after softmax (summed over the layers with
    /// [`AttentionReadout::SummedOverLayers`]).
    pub weights: Tensor,
}

#[derive(Debug, Clone)]
pub struct ForwardOutput {
    pub logits: Option<Tensor>,
    /// The new tokens' entries; append them to the past to continue.
    pub kv: KvCache,
    pub attention: Option<PassAttention>,
}

pub struct Decoder {
    config: ModelConfig,
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: Matrix,
    rope: RotaryTables,
    device: Device,
    prefill_chunk: usize,
    /// On the CPU, decoding and long prompts attend through `cpu_attention` (else candle's
    /// operations).
    fused_attention: bool,
}

/// Long causal prompts are read in chunks of this many tokens, each attending to the cache
/// of the ones before: the same numbers, with attention scores of (chunk x seen) instead of
/// (prompt x prompt) held and scanned at once.
pub const PREFILL_CHUNK: usize = 512;

/// Scores (query heads x new tokens x entries) from which a pass without a past attends in
/// `cpu_attention` on the CPU. Below, candle's operations are as fast, and a short prompt
/// keeps the numbers candle's own models compute.
const FUSED_PROMPT_SCORES: usize = 1 << 16;

impl Decoder {
    /// Loads with the weights as stored in the file.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        Self::from_gguf(&mut file, device, WeightFormat::AsStored)
    }

    pub fn from_gguf(file: &mut GgufFile, device: &Device, format: WeightFormat) -> Result<Self> {
        let config = file.config()?;
        let embeddings = file
            .tensor("token_embd.weight", device)?
            .dequantize(device)?;
        let output_name = if file.has_tensor("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = format.matrix(file.tensor(output_name, device)?, device)?;
        let norm = file
            .tensor("output_norm.weight", device)?
            .dequantize(device)?;
        let with_bias = config.architecture == Architecture::Qwen2;
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let mut matrix = |name: &str| -> Result<Matrix> {
                format.matrix(
                    file.tensor(&format!("blk.{i}.{name}.weight"), device)?,
                    device,
                )
            };
            let (q, k, v) = (matrix("attn_q")?, matrix("attn_k")?, matrix("attn_v")?);
            let output = matrix("attn_output")?;
            let (gate, up, down) = (matrix("ffn_gate")?, matrix("ffn_up")?, matrix("ffn_down")?);
            let mut vector = |name: &str| -> Result<Tensor> {
                Ok(file
                    .tensor(&format!("blk.{i}.{name}"), device)?
                    .dequantize(device)?)
            };
            let mut bias = |name: &str| -> Result<Option<Tensor>> {
                if with_bias {
                    vector(&format!("{name}.bias")).map(Some)
                } else {
                    Ok(None)
                }
            };
            let (bq, bk, bv) = (bias("attn_q")?, bias("attn_k")?, bias("attn_v")?);
            layers.push(Layer {
                attention_norm: vector("attn_norm.weight")?,
                query: Projection {
                    weight: q,
                    bias: bq,
                },
                key: Projection {
                    weight: k,
                    bias: bk,
                },
                value: Projection {
                    weight: v,
                    bias: bv,
                },
                output,
                ffn_norm: vector("ffn_norm.weight")?,
                gate,
                up,
                down,
            });
        }
        let rope = RotaryTables::new(
            config.head_dim,
            config.rope_base,
            config.context_length,
            config.rope_style,
            device,
        )?;
        Ok(Self {
            config,
            embeddings,
            layers,
            norm,
            output,
            rope,
            device: device.clone(),
            prefill_chunk: PREFILL_CHUNK,
            fused_attention: true,
        })
    }

    /// Sets the chunk length of long causal prefills (`usize::MAX`: never chunk).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// Whether decoding and long prompts on the CPU attend through lm's kernels (the
    /// default) or through candle's matmuls and softmax (the reference, for benchmarks and
    /// tests).
    pub fn with_fused_attention(mut self, fused: bool) -> Self {
        self.fused_attention = fused;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn rope(&self) -> &RotaryTables {
        &self.rope
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn forward(&self, request: &ForwardRequest<'_>) -> Result<ForwardOutput> {
        let (batch, t) = self.validate(request)?;
        // Chunks compute logits in the last chunk alone.
        let last_chunk = (t.max(1) - 1) % self.prefill_chunk + 1;
        let chunkable = matches!(request.mask, AttentionMask::Causal)
            && request.attention == AttentionReadout::None
            && request.layers.is_none()
            && match request.logits {
                Logits::None | Logits::Last => true,
                Logits::Trailing(n) => n <= last_chunk,
                Logits::All => false,
            };
        if chunkable && t > self.prefill_chunk {
            return self.forward_in_chunks(request, t);
        }
        self.forward_once(request, batch, t)
    }

    /// A long causal pass as consecutive chunks over a growing cache; only the last chunk's
    /// logits are computed.
    fn forward_in_chunks(&self, request: &ForwardRequest<'_>, t: usize) -> Result<ForwardOutput> {
        let mut seen = request.past.cloned().unwrap_or_default();
        let mut new = KvCache::new();
        let mut logits = None;
        let columns = |rows: &[Vec<u32>], range: std::ops::Range<usize>| -> Vec<Vec<u32>> {
            rows.iter().map(|row| row[range.clone()].to_vec()).collect()
        };
        let mut start = 0;
        while start < t {
            if start > 0
                && request
                    .interrupt
                    .is_some_and(|Interrupt(interrupted)| interrupted())
            {
                return Err(LmError::Interrupted);
            }
            let end = (start + self.prefill_chunk).min(t);
            let tokens = columns(request.tokens, start..end);
            let positions = columns(request.positions, start..end);
            let valid: Option<Vec<Vec<bool>>> = request
                .valid
                .map(|rows| rows.iter().map(|row| row[start..end].to_vec()).collect());
            let chunk = ForwardRequest {
                tokens: &tokens,
                positions: &positions,
                valid: valid.as_deref(),
                past: Some(&seen),
                mask: AttentionMask::Causal,
                logits: if end == t {
                    request.logits
                } else {
                    Logits::None
                },
                attention: AttentionReadout::None,
                layers: None,
                interrupt: None,
            };
            let out = self.forward_once(&chunk, tokens.len(), end - start)?;
            seen.append(out.kv.clone())?;
            new.append(out.kv)?;
            logits = out.logits;
            start = end;
        }
        Ok(ForwardOutput {
            logits,
            kv: new,
            attention: None,
        })
    }

    fn forward_once(
        &self,
        request: &ForwardRequest<'_>,
        batch: usize,
        t: usize,
    ) -> Result<ForwardOutput> {
        let _span = tracing::trace_span!("lm_forward", batch, tokens = t).entered();
        let empty = KvCache::new();
        let past = request.past.unwrap_or(&empty);
        let all_valid;
        let valid = match request.valid {
            Some(valid) => valid,
            None => {
                all_valid = vec![vec![true; t]; batch];
                &all_valid
            }
        };
        let past_valid: Vec<Vec<bool>> = if past.is_empty() {
            vec![Vec::new(); batch]
        } else {
            past.valid().to_vec()
        };
        // Built once per pass as an additive (batch, 1, t, past + t) bias: 0 where a token
        // may attend, -inf where it may not.
        let mask = request
            .mask
            .build(&past_valid, valid, &self.device)?
            .map(|allowed| -> Result<Tensor> {
                let open = Tensor::zeros(allowed.shape(), DType::F32, &self.device)?;
                let closed = Tensor::full(f32::NEG_INFINITY, allowed.shape(), &self.device)?;
                Ok(allowed.where_cond(&open, &closed)?.unsqueeze(1)?)
            })
            .transpose()?;
        // On the CPU, decoding and long prompts attend in `cpu_attention`, which takes the
        // mask as plain values, read out once per pass.
        let fused_bias = if self.fused_attention_applies(t, past.len()) {
            Some(match &mask {
                Some(mask) => Some(mask.flatten_all()?.to_vec1::<f32>()?),
                None => None,
            })
        } else {
            None
        };
        let path = match &fused_bias {
            Some(bias) => AttentionPath::Fused(bias.as_deref()),
            None => AttentionPath::Candle,
        };

        let token_ids = position_tensor(request.tokens, &self.device)?;
        let rotation = self
            .rope
            .at(&position_tensor(request.positions, &self.device)?)?;
        let mut x = self
            .embeddings
            .index_select(&token_ids.flatten_all()?, 0)?
            .reshape((batch, t, self.config.hidden))?;

        let depth = request.layers.unwrap_or(self.layers.len());
        let last = depth.saturating_sub(1);
        let mut new_layers = Vec::with_capacity(depth);
        let mut attention: Option<PassAttention> = None;
        for (index, layer) in self.layers.iter().take(depth).enumerate() {
            let past_layer = past.layers().get(index);
            let residual = &x;
            let normed =
                candle_nn::ops::rms_norm(&x, &layer.attention_norm, self.config.rms_eps as f32)?;
            let want_attention = match request.attention {
                AttentionReadout::None => false,
                AttentionReadout::LastLayer => index == last,
                AttentionReadout::SummedOverLayers => true,
            };
            let (attended, kv, seen) = self.attend(
                layer,
                &normed,
                &rotation,
                past_layer,
                mask.as_ref(),
                path,
                want_attention,
            )?;
            attention = match (attention, seen) {
                (Some(before), Some(seen)) => Some(PassAttention {
                    weights: (before.weights + seen.weights)?,
                    queries: seen.queries,
                }),
                (before, seen) => seen.or(before),
            };
            new_layers.push(kv);
            let x_mid = (attended + residual)?;
            let normed =
                candle_nn::ops::rms_norm(&x_mid, &layer.ffn_norm, self.config.rms_eps as f32)?;
            let [gate, up] = Matrix::forward_shared([&layer.gate, &layer.up], &normed)?;
            let hidden = (candle_nn::ops::silu(&gate)? * up)?;
            x = (layer.down.forward(&hidden)? + x_mid)?;
        }

        let logits = match request.logits {
            Logits::None => None,
            Logits::Last => {
                let x = candle_nn::ops::rms_norm(
                    &x.i((.., t - 1, ..))?.contiguous()?,
                    &self.norm,
                    self.config.rms_eps as f32,
                )?;
                Some(self.output.forward(&x)?)
            }
            Logits::Trailing(n) => {
                let x = x.i((.., t - n.., ..))?.contiguous()?;
                let x = candle_nn::ops::rms_norm(&x, &self.norm, self.config.rms_eps as f32)?;
                Some(self.output.forward(&x)?)
            }
            Logits::All => {
                let x = candle_nn::ops::rms_norm(&x, &self.norm, self.config.rms_eps as f32)?;
                Some(self.output.forward(&x)?)
            }
        };
        let kv = KvCache::from_parts(new_layers, request.positions.to_vec(), valid.to_vec());
        Ok(ForwardOutput {
            logits,
            kv,
            attention,
        })
    }

    /// Whether a pass of `t` new tokens after `past` entries attends through
    /// `cpu_attention`: on the CPU, when it decodes after a past (its scores are smaller
    /// than the KV they come from, as for `split_past` below) or its scores are many.
    fn fused_attention_applies(&self, t: usize, past: usize) -> bool {
        let repeat = self.config.heads / self.config.kv_heads;
        let decoding = past > 0 && kernels::decodes(repeat, t, self.config.head_dim);
        let long = repeat * t * (past + t) >= FUSED_PROMPT_SCORES;
        self.fused_attention && self.device.is_cpu() && (decoding || long)
    }

    /// Self-attention of one layer; returns its output, the new entries and, when asked, the
    /// queries and weights.
    #[allow(clippy::too_many_arguments)] // one layer's inputs, each used
    fn attend(
        &self,
        layer: &Layer,
        x: &Tensor,
        rotation: &Rotation,
        past: Option<&LayerKv>,
        mask: Option<&Tensor>,
        path: AttentionPath<'_>,
        want_attention: bool,
    ) -> Result<(Tensor, LayerKv, Option<PassAttention>)> {
        let c = &self.config;
        let (batch, t, _) = x.dims3()?;
        let split = |y: Tensor, heads: usize| -> Result<Tensor> {
            Ok(y.reshape((batch, t, heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let [q, raw_keys, values] =
            Projection::forward_shared([&layer.query, &layer.key, &layer.value], x)?;
        let q = split(q, c.heads)?;
        let raw_keys = split(raw_keys, c.kv_heads)?;
        let values = split(values, c.kv_heads)?;
        let q = rotation.apply(&q)?;
        let keys = rotation.apply(&raw_keys)?;
        let to_output = |mixed: Tensor| -> Result<Tensor> {
            let mixed = mixed
                .reshape((batch, c.heads, t, c.head_dim))?
                .transpose(1, 2)?
                .reshape((batch, t, c.hidden))?;
            layer.output.forward(&mixed)
        };
        if let (AttentionPath::Fused(bias), false) = (path, want_attention)
            && let Some(mixed) = cpu_attention::attend(&q, past, &keys, &values, bias)?
        {
            return Ok((
                to_output(mixed)?,
                LayerKv::new(raw_keys, keys, values)?,
                None,
            ));
        }
        let repeat = c.heads / c.kv_heads;
        // Grouped-query attention without copying K/V per head: the query heads that share
        // a KV head are stacked along the token axis of one matmul.
        let grouped = q.reshape((batch, c.kv_heads, repeat * t, c.head_dim))?;
        // Attention over the past without copying it: scores against the past and the new
        // keys separately, one softmax over both, and two weighted sums. That costs a copy of
        // the scores instead of the K/V, so it applies while the scores are the smaller:
        // always when decoding on a CPU; a long chunk of a prompt concatenates K/V instead.
        // On a GPU the copy is cheap and the split's three more kernel launches are not.
        let split_past =
            past.filter(|_| kernels::decodes(repeat, t, c.head_dim) && !self.device.is_cuda());
        let (all_keys, all_values) = match past {
            Some(past) if split_past.is_none() => (
                Tensor::cat(&[past.keys(), &keys], 2)?,
                Tensor::cat(&[past.values(), &values], 2)?,
            ),
            _ => (keys.clone(), values.clone()),
        };
        let scores = grouped.matmul(&all_keys.t()?)?;
        let scores = match split_past {
            Some(past) => Tensor::cat(&[&grouped.matmul(&past.keys().t()?)?, &scores], 3)?,
            None => scores,
        };
        let width = scores.dim(3)?;
        let scores = (scores / (c.head_dim as f64).sqrt())?.reshape((batch, c.heads, t, width))?;
        let scores = match mask {
            Some(bias) => scores.broadcast_add(bias)?,
            None => scores,
        };
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let grouped_weights = weights.reshape((batch, c.kv_heads, repeat * t, width))?;
        let mixed = match split_past {
            Some(past) => {
                let seen = past.values().dim(2)?;
                let on_past = grouped_weights.narrow(3, 0, seen)?.contiguous()?;
                let on_new = grouped_weights.narrow(3, seen, t)?.contiguous()?;
                (on_past.matmul(past.values())? + on_new.matmul(&all_values.contiguous()?)?)?
            }
            None => grouped_weights.matmul(&all_values.contiguous()?)?,
        };
        let out = to_output(mixed)?;
        let seen = want_attention.then(|| PassAttention {
            queries: q.clone(),
            weights: weights.clone(),
        });
        Ok((out, LayerKv::new(raw_keys, keys, values)?, seen))
    }

    fn validate(&self, request: &ForwardRequest<'_>) -> Result<(usize, usize)> {
        let batch = request.tokens.len();
        let t = request.tokens.first().map_or(0, Vec::len);
        if batch == 0 || t == 0 {
            return Err(LmError::InvalidInput(
                "a forward pass needs at least one token".into(),
            ));
        }
        let same_shape =
            |rows: &[Vec<u32>]| rows.len() == batch && rows.iter().all(|r| r.len() == t);
        if !same_shape(request.tokens) || !same_shape(request.positions) {
            return Err(LmError::InvalidInput(
                "tokens and positions must be rows of one length (pad on the left)".into(),
            ));
        }
        if let Some(valid) = request.valid
            && (valid.len() != batch || valid.iter().any(|r| r.len() != t))
        {
            return Err(LmError::InvalidInput(
                "`valid` must match the tokens' shape".into(),
            ));
        }
        if let Some(&bad) = request
            .tokens
            .iter()
            .flatten()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            return Err(LmError::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        self.rope.check(request.positions)?;
        if let Logits::Trailing(n) = request.logits
            && (n == 0 || n > t)
        {
            return Err(LmError::InvalidInput(format!(
                "trailing logits of {n} tokens need 1 to {t} (the pass's new tokens)"
            )));
        }
        if let Some(layers) = request.layers
            && (layers == 0 || layers > self.layers.len() || request.logits != Logits::None)
        {
            return Err(LmError::InvalidInput(format!(
                "a pass over the first {layers} layers needs 1 to {} layers and no logits",
                self.layers.len()
            )));
        }
        if let Some(past) = request.past
            && !past.is_empty()
            && (past.batch() != batch || past.layers().len() != self.layers.len())
        {
            return Err(LmError::InvalidInput(format!(
                "past cache has {} rows, the request {batch}",
                past.batch()
            )));
        }
        Ok((batch, t))
    }
}

/// Log-softmax over the vocabulary (last axis), in f32.
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&log_sum)?)
}
