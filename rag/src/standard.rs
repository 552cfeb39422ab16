//! Standard RAG: the verifier (the larger model) reads every document and writes the answer,
//! streaming it as it is generated.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use hasten_lm::{
    FinishReason, GenerationOptions, LanguageModel, TextStream, generate_interruptible,
};

use crate::answer::{Answer, AnswerTimings, DraftingTokens, Finish};
use crate::error::{RagError, Result};
use crate::prompt::{StandardPrompt, standard_prompt};
use crate::request::{AnswerRequest, Document};
use crate::sink::AnswerSink;
use crate::stop::StopStrings;

/// The prompt standard mode would read (how a request is checked before it is queued).
pub fn prompt_for(model: &LanguageModel, request: &AnswerRequest) -> Result<StandardPrompt> {
    let documents: Vec<&Document> = request.documents.iter().collect();
    standard_prompt(
        model,
        &request.question,
        &documents,
        &request.conversation,
        request.max_new_tokens,
    )
}

pub fn answer_standard(
    model: &LanguageModel,
    request: &AnswerRequest,
    sink: &mut dyn AnswerSink,
) -> Result<Answer> {
    let started = Instant::now();
    let _span = tracing::info_span!(
        "rag_standard",
        documents = request.documents.len(),
        max_new_tokens = request.max_new_tokens
    )
    .entered();
    let prompt = prompt_for(model, request)?;
    let options = GenerationOptions {
        max_new_tokens: request.max_new_tokens,
        stop_tokens: vec![model.chat.end_of_turn(), model.tokenizer.eos()],
        sampling: request.decoding.sampling(),
    };
    let mut first_text: Option<Duration> = None;
    let mut text = String::new();
    let mut stops = StopStrings::new(&request.decoding.stop);
    let mut cancelled = false;
    // Asked while the prompt is read (between its chunks) and at every token after it.
    let sink = RefCell::new(sink);
    let interrupted = || sink.borrow().cancelled();
    // The tokenizer's text for the latest token; released below through the stop strings.
    let decoded = RefCell::new(String::new());
    let mut on_delta = |delta: &str| decoded.borrow_mut().push_str(delta);
    let mut stream = TextStream::new(&model.tokenizer, &mut on_delta);
    let (generated, timings) = generate_interruptible(
        &model.decoder,
        std::slice::from_ref(&prompt.ids),
        &options,
        &interrupted,
        |_, id| {
            if interrupted() {
                cancelled = true;
                return ControlFlow::Break(());
            }
            let flow = stream.push(id);
            let released = stops.push(&std::mem::take(&mut *decoded.borrow_mut()));
            if !released.is_empty() {
                first_text.get_or_insert_with(|| started.elapsed());
                sink.borrow_mut().text(&released);
                text.push_str(&released);
            }
            if stops.stopped() {
                return ControlFlow::Break(());
            }
            flow
        },
    )?;
    stream.finish()?;
    if cancelled {
        return Err(RagError::Cancelled);
    }
    let stopped_by_string = stops.stopped();
    let rest = stops.finish();
    if !rest.is_empty() {
        first_text.get_or_insert_with(|| started.elapsed());
        sink.borrow_mut().text(&rest);
        text.push_str(&rest);
    }
    let finish = match generated.first().map(|g| g.finish) {
        Some(FinishReason::Length) if !stopped_by_string => Finish::Length,
        _ => Finish::Stop,
    };
    let total = started.elapsed();
    Ok(Answer {
        text: text.trim().to_string(),
        rationale: None,
        documents_used: (0..request.documents.len()).collect(),
        drafts: Vec::new(),
        timings: AnswerTimings {
            prefill: timings.prefill,
            first_token: first_text.unwrap_or(total),
            decode: timings.decode,
            verify: Duration::ZERO,
            total,
            kv: None,
        },
        prompt_tokens: timings.prompt_tokens,
        generated_tokens: timings.generated_tokens,
        finish,
        drafting: DraftingTokens::default(),
        dropped_turns: prompt.dropped_turns,
    })
}
