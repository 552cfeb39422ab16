//! The request's context cache: the system prompt's and the chunks' stored entries, one
//! after another, with every key rotated to its place in this prompt.

use std::ops::Range;

use hasten_lm::{KvCache, RotaryTables};

use crate::error::Result;
use crate::fusion::segment::SegmentKv;

/// A context cache that belongs to one request.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// One row; entry i sits at position i.
    pub cache: KvCache,
    /// The context's tokens, in order.
    pub tokens: Vec<u32>,
    /// The system prompt's entries are `0..system_len`.
    pub system_len: usize,
    /// Each chunk's entries.
    pub chunk_spans: Vec<Range<usize>>,
}

impl Assembled {
    /// Entries that belong to chunks (what selection chooses among).
    pub fn chunk_tokens(&self) -> usize {
        self.tokens.len() - self.system_len
    }
}

/// Places `system` at positions `0..` and each chunk right after the one before it.
///
/// The stored caches are only read: the first append shares the system prompt's buffers,
/// and the next one (or the relocation, which writes new key tensors) gives the request
/// buffers of its own, so nothing a request does reaches the stored entries.
pub fn assemble(
    rope: &RotaryTables,
    system: &SegmentKv,
    chunks: &[&SegmentKv],
) -> Result<Assembled> {
    let mut tokens = system.tokens().to_vec();
    let mut parts = vec![system.kv().clone()];
    let mut chunk_spans = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let start = tokens.len();
        tokens.extend_from_slice(chunk.tokens());
        chunk_spans.push(start..tokens.len());
        parts.push(chunk.kv().clone());
    }
    let mut cache = KvCache::concat(parts)?;
    cache.relocate(rope, vec![(0..tokens.len() as u32).collect()])?;
    Ok(Assembled {
        cache,
        tokens,
        system_len: system.len(),
        chunk_spans,
    })
}
