//! Answers over chunks whose KV is reused: one loaded model, the system prompt's KV computed
//! once, a fused prefill and greedy decoding from the cache it leaves.

use std::cell::Cell;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_lm::{Decoded, GenerationOptions, LanguageModel, Sampling, TextStream, decode_from};
use hasten_rag::AnswerSink;

use crate::error::Result;
use crate::fusion::{
    FusedPrefill, FusionSettings, PrefillOptions, PrefillTimings, SegmentKv, prefill,
};
use crate::prompt::{question_tokens, stop_tokens, system_tokens};

pub struct KvEngine {
    model: Arc<LanguageModel>,
    system: SegmentKv,
}

/// Where an answer spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AnswerTimings {
    pub prefill: PrefillTimings,
    /// From the start (question tokenization included) to the first chosen token.
    pub first_token: Duration,
    pub total: Duration,
}

#[derive(Debug, Clone)]
pub struct KvAnswer {
    pub text: String,
    pub tokens: Vec<u32>,
    pub context_tokens: usize,
    /// Chunk entries computed for this request (all of them for full prefill).
    pub recomputed: Vec<usize>,
    pub timings: AnswerTimings,
}

impl KvEngine {
    /// Computes the system prompt's KV once for `model`.
    pub fn new(model: Arc<LanguageModel>) -> Result<Self> {
        let system = SegmentKv::prefill(&model.decoder, system_tokens(&model)?, None)?;
        Ok(Self { model, system })
    }

    pub fn model(&self) -> &LanguageModel {
        &self.model
    }

    pub fn system(&self) -> &SegmentKv {
        &self.system
    }

    /// A chunk's Full Reuse KV: its tokens prefilled right after the system prompt.
    pub fn full_reuse_kv(&self, tokens: Vec<u32>) -> Result<SegmentKv> {
        SegmentKv::prefill(&self.model.decoder, tokens, Some(self.system.kv()))
    }

    /// The prompt of `question` over `chunks` prefilled in `settings.mode`; its logits give
    /// the first answer token; `options` as the worker's config says.
    pub fn prefill(
        &self,
        question: &str,
        chunks: &[&SegmentKv],
        settings: FusionSettings,
        max_new_tokens: usize,
        options: PrefillOptions,
    ) -> Result<FusedPrefill> {
        let question = question_tokens(&self.model, question)?;
        prefill(
            &self.model.decoder,
            &self.system,
            chunks,
            &question,
            settings,
            max_new_tokens,
            options,
        )
    }

    /// Greedy decoding from a fused prefill, giving `sink` each piece of text; stops after
    /// the first piece the sink's caller is no longer there for.
    pub fn decode(
        &self,
        fused: FusedPrefill,
        max_new_tokens: usize,
        sink: &mut dyn AnswerSink,
    ) -> Result<Decoded> {
        let options = GenerationOptions {
            max_new_tokens,
            stop_tokens: stop_tokens(&self.model),
            sampling: Sampling::default(),
        };
        // The token callback holds the text callback, so the caller's departure is read
        // where the text is given, once per piece.
        let left = Cell::new(false);
        let mut on_text = |delta: &str| {
            sink.text(delta);
            left.set(sink.cancelled());
        };
        let mut stream = TextStream::new(&self.model.tokenizer, &mut on_text);
        let decoded = decode_from(
            &self.model.decoder,
            fused.cache,
            fused.logits,
            vec![fused.next_position],
            &options,
            |_, id| match stream.push(id) {
                ControlFlow::Continue(()) if left.get() => ControlFlow::Break(()),
                flow => flow,
            },
        )?;
        stream.finish()?;
        Ok(decoded)
    }

    /// Answers `question` over `chunks` (greedy), giving `sink` each piece of text.
    pub fn answer(
        &self,
        question: &str,
        chunks: &[&SegmentKv],
        settings: FusionSettings,
        max_new_tokens: usize,
        options: PrefillOptions,
        sink: &mut dyn AnswerSink,
    ) -> Result<KvAnswer> {
        let started = Instant::now();
        let _span = tracing::info_span!(
            "kv_answer",
            chunks = chunks.len(),
            mode = ?settings.mode,
            ratio = settings.ratio
        )
        .entered();
        let fused = self.prefill(question, chunks, settings, max_new_tokens, options)?;
        let (context_tokens, recomputed, prefill) = (
            fused.context_tokens,
            fused.recomputed.clone(),
            fused.timings,
        );
        let mut keeping = KeepingText {
            sink,
            text: String::new(),
        };
        let decoded = self.decode(fused, max_new_tokens, &mut keeping)?;
        let text = keeping.text;
        let total = started.elapsed();
        let tokens = decoded
            .results
            .into_iter()
            .next()
            .map(|g| g.tokens)
            .unwrap_or_default();
        Ok(KvAnswer {
            text,
            tokens,
            context_tokens,
            recomputed,
            timings: AnswerTimings {
                prefill,
                first_token: decoded
                    .first_token_at
                    .map_or(total, |at| at.duration_since(started)),
                total,
            },
        })
    }
}

/// Passes the answer's text on and keeps a copy of it.
struct KeepingText<'a> {
    sink: &'a mut dyn AnswerSink,
    text: String,
}

impl AnswerSink for KeepingText<'_> {
    fn text(&mut self, delta: &str) {
        self.sink.text(delta);
        self.text.push_str(delta);
    }

    fn cancelled(&self) -> bool {
        self.sink.cancelled()
    }
}
