//! A segment of the prompt (the system prompt, one chunk) with the KV cache computed for it
//! once and only ever read afterwards.

use hasten_lm::{Decoder, ForwardRequest, KvCache, Logits, PackedKv};

use crate::error::{KvError, Result};

#[derive(Debug, Clone)]
pub struct SegmentKv {
    tokens: Vec<u32>,
    /// One row, one entry per token, at whatever positions it was computed, every layer in
    /// one tensor per kind: assembly moves it to the request's positions.
    packed: PackedKv,
    /// The same entries as a cache (views of `packed`, nothing copied).
    kv: KvCache,
}

impl SegmentKv {
    pub fn new(tokens: Vec<u32>, kv: KvCache) -> Result<Self> {
        if kv.batch() != 1 || kv.len() != tokens.len() || tokens.is_empty() {
            return Err(KvError::InvalidInput(format!(
                "a segment needs one cache row with one entry per token ({} tokens, {} rows of \
                 {} entries)",
                tokens.len(),
                kv.batch(),
                kv.len()
            )));
        }
        let packed = PackedKv::pack(&kv)?;
        let kv = packed.cache()?;
        Ok(Self { tokens, packed, kv })
    }

    /// Prefills `tokens` after `past` (at the positions that follow it), or alone from
    /// position 0: a chunk's Full Reuse KV is its prefill after the system prompt.
    pub fn prefill(decoder: &Decoder, tokens: Vec<u32>, past: Option<&KvCache>) -> Result<Self> {
        let start = past.map_or(0, |p| p.next_positions().first().copied().unwrap_or(0));
        let positions = vec![(start..start + tokens.len() as u32).collect::<Vec<_>>()];
        let rows = [tokens];
        let mut request = ForwardRequest::new(&rows, &positions).logits(Logits::None);
        if let Some(past) = past {
            request = request.past(past);
        }
        let kv = decoder.forward(&request)?.kv;
        let [tokens] = rows;
        Self::new(tokens, kv)
    }

    /// A copy on `device`.
    pub fn to_device(&self, device: &candle_core::Device) -> hasten_lm::Result<Self> {
        let packed = self.packed.to_device(device)?;
        Ok(Self {
            tokens: self.tokens.clone(),
            kv: packed.cache()?,
            packed,
        })
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn packed(&self) -> &PackedKv {
        &self.packed
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}
