//! The request's context cache: the system prompt's and the chunks' stored entries, one
//! after another, with every key rotated to its place in this prompt.

use std::ops::Range;

use hasten_lm::{KvCache, PackedKv, RotaryTables};

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

/// Places `system` at positions `0..` and each chunk right after the one before it, with
/// room for `room` more entries (what the request will append: recomputed tokens, the
/// question, the answer) before the cache's buffers must grow.
///
/// The stored caches are only read: placement copies them into buffers of the request's
/// own, so nothing a request does reaches the stored entries.
pub fn assemble(
    rope: &RotaryTables,
    system: &SegmentKv,
    chunks: &[&SegmentKv],
    room: usize,
) -> Result<Assembled> {
    let mut tokens = system.tokens().to_vec();
    let mut parts = vec![system.packed()];
    let mut chunk_spans = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let start = tokens.len();
        tokens.extend_from_slice(chunk.tokens());
        chunk_spans.push(start..tokens.len());
        parts.push(chunk.packed());
    }
    let cache: KvCache = PackedKv::place(&parts, rope, 0, room)?;
    Ok(Assembled {
        cache,
        tokens,
        system_len: system.len(),
        chunk_spans,
    })
}
