//! Wire types to the worker's own and back; every field of a request is checked here or in
//! `KvWorker::validate`, and a bad one is named.

use hasten_proto::v1 as pb;

use crate::fusion::{FusionMode, FusionSettings};
use crate::store::Variant;
use crate::worker::{ChunkInput, GenerateRequest, Generated, WorkerError, WorkerInfo};
use hasten_worker_api::kv::DEFAULT_RATIO;

fn invalid(field: &'static str, message: impl Into<String>) -> WorkerError {
    WorkerError::Invalid {
        field,
        message: message.into(),
    }
}

pub fn mode_from_proto(value: i32) -> Result<FusionMode, WorkerError> {
    match pb::FusionMode::try_from(value) {
        Ok(pb::FusionMode::Unspecified | pb::FusionMode::Fusionrag) => Ok(FusionMode::FusionRag),
        Ok(pb::FusionMode::FullPrefill) => Ok(FusionMode::FullPrefill),
        Ok(pb::FusionMode::FullReuse) => Ok(FusionMode::FullReuse),
        Ok(pb::FusionMode::Cacheblend) => Ok(FusionMode::CacheBlend),
        Err(_) => Err(invalid("mode", format!("unknown fusion mode {value}"))),
    }
}

pub fn variant_from_proto(value: i32) -> Result<Variant, WorkerError> {
    match pb::KvVariant::try_from(value) {
        Ok(pb::KvVariant::Unspecified | pb::KvVariant::Similarity) => Ok(Variant::Similarity),
        Ok(pb::KvVariant::FullReuse) => Ok(Variant::FullReuse),
        Err(_) => Err(invalid("variant", format!("unknown KV variant {value}"))),
    }
}

/// `default_max_new_tokens` stands in for 0.
pub fn request_from_proto(
    request: pb::KvGenerateRequest,
    default_max_new_tokens: usize,
) -> Result<GenerateRequest, WorkerError> {
    let chunks = request
        .chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| match chunk.chunk {
            Some(pb::kv_chunk::Chunk::Id(id)) => Ok(ChunkInput::Id(id)),
            Some(pb::kv_chunk::Chunk::Text(text)) if text.text.trim().is_empty() => {
                Err(invalid("chunks", format!("chunk {i} has no text")))
            }
            Some(pb::kv_chunk::Chunk::Text(text)) => Ok(ChunkInput::Text {
                title: text.title,
                text: text.text,
            }),
            None => Err(invalid(
                "chunks",
                format!("chunk {i} is neither an id nor a text"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ratio = request.recompute_ratio.map_or(DEFAULT_RATIO, f64::from);
    Ok(GenerateRequest {
        question: request.question,
        chunks,
        corpus_version: Some(request.corpus_version).filter(|v| !v.is_empty()),
        settings: FusionSettings {
            mode: mode_from_proto(request.mode)?,
            ratio,
        },
        variant: variant_from_proto(request.variant)?,
        max_new_tokens: match request.max_new_tokens {
            0 => default_max_new_tokens,
            n => n as usize,
        },
    })
}

fn micros(d: std::time::Duration) -> u64 {
    d.as_micros() as u64
}

pub fn generated_proto(
    generated: Generated,
    queue: std::time::Duration,
    model_id: &str,
) -> pb::KvGenerated {
    let timings = generated.answer.timings;
    pb::KvGenerated {
        text: generated.answer.text,
        timings: Some(pb::KvTimings {
            queue_us: micros(queue),
            load_us: micros(generated.load),
            assemble_us: micros(timings.prefill.assemble),
            select_us: micros(timings.prefill.select),
            recompute_us: micros(timings.prefill.recompute),
            first_token_us: micros(queue + timings.first_token),
            total_us: micros(queue + timings.total),
        }),
        context_tokens: generated.answer.context_tokens as u32,
        recomputed_tokens: generated.answer.recomputed.len() as u32,
        generated_tokens: generated.answer.tokens.len() as u32,
        memory_hits: generated.memory_hits as u32,
        disk_hits: generated.disk_hits as u32,
        computed_chunks: generated.computed_chunks as u32,
        model_id: model_id.to_string(),
    }
}

pub fn info_proto(info: WorkerInfo) -> pb::KvInfo {
    pb::KvInfo {
        model_id: info.model_id.to_string(),
        model: info.model.display().to_string(),
        device: info.device,
        corpora: info
            .corpora
            .into_iter()
            .map(|(version, p)| pb::KvCorpusProgress {
                corpus_version: version,
                chunks: p.chunks as u64,
                full_reuse: p.full_reuse as u64,
                similarity: p.similarity as u64,
            })
            .collect(),
        tiers: info
            .tiers
            .into_iter()
            .map(|t| pb::KvTierUsage {
                name: t.name.to_string(),
                budget_bytes: t.budget,
                used_bytes: t.used,
                hits: t.hits,
            })
            .collect(),
        disk_hits: info.disk_hits,
    }
}
