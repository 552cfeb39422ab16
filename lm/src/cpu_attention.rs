//! A pass's attention on the CPU through [`AttentionPass`]: the queries, the cache's views
//! and the new entries handed to the kernel as they lie in memory, the cache never copied.

use candle_core::{Layout, Storage, StorageRef, Tensor};

use crate::error::Result;
use crate::kernels::{AttentionPass, KvRows};
use crate::kv::LayerKv;

/// The attention of `queries` (batch, heads, t, head_dim) over `past` and the new `keys`
/// and `values` (batch, kv_heads, t, head_dim), with `bias` (batch, t, past + t) added to
/// the scores: (batch, heads, t, head_dim). `None` where the tensors are not f32 in CPU
/// memory with rows of consecutive values; the caller then takes candle's path.
pub(crate) fn attend(
    queries: &Tensor,
    past: Option<&LayerKv>,
    keys: &Tensor,
    values: &Tensor,
    bias: Option<&[f32]>,
) -> Result<Option<Tensor>> {
    let (batch, heads, tokens, head_dim) = queries.dims4()?;
    let kv_heads = keys.dim(1)?;
    let queries = queries.contiguous()?;
    let (query_storage, query_layout) = queries.storage_and_layout();
    let start = query_layout.start_offset();
    let Some(query_values) = rows(&query_storage, query_layout, head_dim)
        .and_then(|rows| rows.data.get(start..start + queries.elem_count()))
    else {
        return Ok(None);
    };
    let new_keys = keys.storage_and_layout();
    let new_values = values.storage_and_layout();
    let past_keys = past.map(|past| past.keys().storage_and_layout());
    let past_values = past.map(|past| past.values().storage_and_layout());
    let (Some(past_keys), Some(past_values), Some(new_keys), Some(new_values)) = (
        past_rows(&past_keys, head_dim),
        past_rows(&past_values, head_dim),
        rows(&new_keys.0, new_keys.1, head_dim),
        rows(&new_values.0, new_values.1, head_dim),
    ) else {
        return Ok(None);
    };
    let mixed = AttentionPass {
        batch,
        heads,
        kv_heads,
        tokens,
        head_dim,
        queries: query_values,
        past_keys,
        past_values,
        new_keys,
        new_values,
        bias,
        scale: 1.0 / (head_dim as f32).sqrt(),
    }
    .run()?;
    Ok(Some(Tensor::from_vec(
        mixed,
        (batch, heads, tokens, head_dim),
        queries.device(),
    )?))
}

/// The past's rows, or none without a past.
fn past_rows<'a>(
    past: &'a Option<(StorageRef<'_>, &Layout)>,
    head_dim: usize,
) -> Option<KvRows<'a>> {
    match past {
        Some((storage, layout)) => rows(storage, layout, head_dim),
        None => Some(KvRows::EMPTY),
    }
}

/// A (batch, heads, rows, head_dim) f32 tensor's rows where they lie, if it is in CPU
/// memory with each row's values consecutive and a head's rows one after another.
fn rows<'a>(storage: &'a Storage, layout: &Layout, head_dim: usize) -> Option<KvRows<'a>> {
    let Storage::Cpu(cpu) = storage else {
        return None;
    };
    // Not f32: an error here, `None` to the caller.
    let data = cpu.as_slice::<f32>().ok()?;
    let (dims, stride) = (layout.dims(), layout.stride());
    let [_, _, len, width] = *dims else {
        return None;
    };
    let consecutive = width == head_dim && (width == 1 || stride[3] == 1);
    if !consecutive || (len > 1 && stride[2] != head_dim) {
        return None;
    }
    Some(KvRows {
        data,
        offset: layout.start_offset(),
        batch_stride: stride[0],
        head_stride: stride[1],
        len,
    })
}
