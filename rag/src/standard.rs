//! Standard RAG: the verifier (the larger model) reads every document and writes the answer,
//! streaming it as it is generated.

use std::time::{Duration, Instant};

use hasten_lm::{GenerationOptions, LanguageModel, Sampling, TextStream, generate};

use crate::answer::{Answer, AnswerTimings};
use crate::error::Result;
use crate::prompt::standard_prompt;
use crate::request::{AnswerRequest, Document};

pub fn answer_standard(
    model: &LanguageModel,
    request: &AnswerRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<Answer> {
    let started = Instant::now();
    let _span = tracing::info_span!(
        "rag_standard",
        documents = request.documents.len(),
        max_new_tokens = request.max_new_tokens
    )
    .entered();
    let documents: Vec<&Document> = request.documents.iter().collect();
    let prompt = standard_prompt(model, &request.question, &documents, request.max_new_tokens)?;
    let options = GenerationOptions {
        max_new_tokens: request.max_new_tokens,
        stop_tokens: vec![model.chat.end_of_turn(), model.tokenizer.eos()],
        sampling: Sampling::default(),
    };
    let mut first_text: Option<Duration> = None;
    let mut on_delta = |delta: &str| {
        first_text.get_or_insert_with(|| started.elapsed());
        on_text(delta);
    };
    let mut stream = TextStream::new(&model.tokenizer, &mut on_delta);
    let (generated, timings) = generate(
        &model.decoder,
        std::slice::from_ref(&prompt),
        &options,
        |_, id| stream.push(id),
    )?;
    stream.finish()?;
    let tokens = generated.first().map_or(&[][..], |g| g.tokens.as_slice());
    let text = model.tokenizer.decode(tokens)?.trim().to_string();
    let total = started.elapsed();
    Ok(Answer {
        text,
        rationale: None,
        documents_used: (0..request.documents.len()).collect(),
        drafts: Vec::new(),
        timings: AnswerTimings {
            prefill: timings.prefill,
            first_token: first_text.unwrap_or(total),
            decode: timings.decode,
            verify: Duration::ZERO,
            total,
        },
        prompt_tokens: timings.prompt_tokens,
        generated_tokens: timings.generated_tokens,
    })
}
