//! One iterative-RAG generation step: the prompt for a document and the text so far, and
//! the next few greedy tokens. Sequential and speculative runs share it, so equal documents
//! give equal tokens.
//!
//! A step is a pure function of (document, generated tokens): the document's prompt is
//! prefilled once per request and kept (its KV and last logits), and each step prefills the
//! generated tokens on top of it and decodes. Reading the same document again, as
//! consecutive retrievals mostly do, costs a prefill of the answer so far instead of the
//! whole prompt, and a rollback cannot leave a cache that a sequential run would not have.

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::Tensor;
use hasten_lm::{
    ChatMessage, FinishReason, ForwardRequest, GenerationOptions, KvCache, LanguageModel, LmError,
    Logits, Role, Sampling, decode_from,
};

use super::RalmSettings;
use crate::error::{StepError, StepResult};
use crate::retriever::RetrievedDocument;

/// The system turn: a few sentences, so that generation spans several retrievals.
pub const RALM_INSTRUCTION: &str =
    "Answer the question using the document. Explain the answer in a few sentences.";

/// A step's prompt as chat messages: the instruction, then the document (`text`, already cut
/// to [`RalmSettings::document_tokens`]) and the question.
pub fn ralm_messages(title: &str, text: &str, question: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(Role::System, RALM_INSTRUCTION),
        ChatMessage::new(
            Role::User,
            format!("Document: {title}\n{text}\n\nQuestion: {question}"),
        ),
    ]
}

/// Refuses what no step can run: an empty question, a zero interval or token budget.
pub fn check_request(question: &str, settings: &RalmSettings) -> StepResult<()> {
    if question.trim().is_empty() {
        return Err(StepError::InvalidRequest("the question is empty".into()));
    }
    if settings.interval == 0 || settings.max_new_tokens == 0 {
        return Err(StepError::InvalidRequest(format!(
            "interval ({}) and max_new_tokens ({}) must be at least 1",
            settings.interval, settings.max_new_tokens
        )));
    }
    Ok(())
}

/// The retrieval query after a step: the question, then `generated_tail` (the last
/// [`RalmSettings::query_tokens`] generated tokens, as text). Before the first step the
/// query is the question alone.
pub fn query_after(question: &str, generated_tail: &str) -> String {
    format!("{question}\n{}", generated_tail.trim())
}

/// Tokens a step produced and whether the answer ended with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTokens {
    pub tokens: Vec<u32>,
    pub finished: bool,
}

/// What a run needs of the model: the retrieval query after the tokens so far, the next
/// step's greedy tokens reading a document, and the answer's text. [`RalmGenerator`] runs it
/// in this process; an engine that continues token ids (hasten-engine) runs it remotely.
/// Implementations must be pure functions of (document, generated tokens), or speculation
/// would not be lossless.
pub trait RalmStepper: Sync {
    fn settings(&self) -> &RalmSettings;
    /// The retrieval query after `generated`: the question and the last
    /// [`RalmSettings::query_tokens`] generated tokens.
    fn query_text(&self, generated: &[u32]) -> StepResult<String>;
    /// The next step's tokens after `generated`, reading `document`.
    fn step(&self, document: &RetrievedDocument, generated: &[u32]) -> StepResult<StepTokens>;
    /// The answer's text.
    fn text(&self, generated: &[u32]) -> StepResult<String>;
}

/// Documents whose prefilled prompt a request keeps: a run reads a handful, and one
/// prompt's KV is ~20 MB on SmolLM2.
const PROMPTS_KEPT: usize = 4;

/// A document's prompt, prefilled.
struct PromptKv {
    kv: KvCache,
    /// (1, vocab) at the prompt's last token.
    logits: Tensor,
    len: usize,
}

/// The prompts prefilled so far, oldest first out.
#[derive(Default)]
struct PromptCache {
    prompts: HashMap<u64, Arc<PromptKv>>,
    order: VecDeque<u64>,
}

/// Generates one request's answer step by step.
pub struct RalmGenerator<'a> {
    model: &'a LanguageModel,
    question: String,
    settings: RalmSettings,
    prompts: Mutex<PromptCache>,
}

impl<'a> RalmGenerator<'a> {
    pub fn new(
        model: &'a LanguageModel,
        question: &str,
        settings: RalmSettings,
    ) -> StepResult<Self> {
        check_request(question, &settings)?;
        Ok(Self {
            model,
            question: question.trim().to_owned(),
            settings,
            prompts: Mutex::new(PromptCache::default()),
        })
    }

    pub fn model(&self) -> &LanguageModel {
        self.model
    }
}

impl RalmStepper for RalmGenerator<'_> {
    fn settings(&self) -> &RalmSettings {
        &self.settings
    }

    fn query_text(&self, generated: &[u32]) -> StepResult<String> {
        let tail = &generated[generated.len().saturating_sub(self.settings.query_tokens)..];
        if tail.is_empty() {
            return Ok(self.question.clone());
        }
        let text = self.model.tokenizer.decode(tail)?;
        Ok(query_after(&self.question, &text))
    }

    fn step(&self, document: &RetrievedDocument, generated: &[u32]) -> StepResult<StepTokens> {
        let budget = self.settings.max_new_tokens.saturating_sub(generated.len());
        let count = self.settings.interval.min(budget);
        if count == 0 {
            return Ok(StepTokens {
                tokens: Vec::new(),
                finished: true,
            });
        }
        let prompt = self.prompt_kv(document)?;
        let context = self.model.decoder.rope().max_positions();
        if prompt.len + generated.len() + count > context {
            return Err(StepError::InvalidRequest(format!(
                "a prompt of {} tokens, {} generated and {count} more exceed the model's \
                 context of {context}",
                prompt.len,
                generated.len()
            )));
        }
        let (cache, logits) = if generated.is_empty() {
            (prompt.kv.clone(), prompt.logits.clone())
        } else {
            let positions: Vec<u32> = (prompt.len..prompt.len + generated.len())
                .map(|p| p as u32)
                .collect();
            let out = self.model.decoder.forward(
                &ForwardRequest::new(&[generated.to_vec()], &[positions])
                    .past(&prompt.kv)
                    .logits(Logits::Last),
            )?;
            let mut cache = prompt.kv.clone();
            cache.append(out.kv)?;
            let logits = out
                .logits
                .ok_or_else(|| LmError::InvalidInput("the prefill returned no logits".into()))?;
            (cache, logits)
        };
        let options = GenerationOptions {
            max_new_tokens: count,
            stop_tokens: vec![self.model.chat.end_of_turn(), self.model.tokenizer.eos()],
            sampling: Sampling::default(),
        };
        let next = (prompt.len + generated.len()) as u32;
        let mut decoded = decode_from(
            &self.model.decoder,
            cache,
            logits,
            vec![next],
            &options,
            |_, _| ControlFlow::Continue(()),
        )?;
        let result = decoded
            .results
            .pop()
            .ok_or_else(|| LmError::InvalidInput("decoding returned no sequence".into()))?;
        let finished = result.finish == FinishReason::Stop
            || generated.len() + result.tokens.len() >= self.settings.max_new_tokens;
        Ok(StepTokens {
            tokens: result.tokens,
            finished,
        })
    }

    fn text(&self, generated: &[u32]) -> StepResult<String> {
        Ok(self.model.tokenizer.decode(generated)?.trim().to_owned())
    }
}

impl RalmGenerator<'_> {
    /// `document`'s prompt prefilled, from this request's cache or computed now.
    fn prompt_kv(&self, document: &RetrievedDocument) -> StepResult<Arc<PromptKv>> {
        if let Some(kept) = self.lock_prompts().prompts.get(&document.id) {
            return Ok(Arc::clone(kept));
        }
        let tokens = self.prompt(document)?;
        let positions: Vec<u32> = (0..tokens.len() as u32).collect();
        let len = tokens.len();
        let out = self
            .model
            .decoder
            .forward(&ForwardRequest::new(&[tokens], &[positions]).logits(Logits::Last))?;
        let logits = out
            .logits
            .ok_or_else(|| LmError::InvalidInput("the prefill returned no logits".into()))?;
        let prompt = Arc::new(PromptKv {
            kv: out.kv,
            logits,
            len,
        });
        let mut cache = self.lock_prompts();
        if cache.order.len() == PROMPTS_KEPT
            && let Some(oldest) = cache.order.pop_front()
        {
            cache.prompts.remove(&oldest);
        }
        cache.order.push_back(document.id);
        cache.prompts.insert(document.id, Arc::clone(&prompt));
        Ok(prompt)
    }

    fn lock_prompts(&self) -> std::sync::MutexGuard<'_, PromptCache> {
        // The cache holds only finished prefills: a panic elsewhere cannot leave it torn.
        self.prompts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The chat prompt with `document` (its first [`RalmSettings::document_tokens`] tokens),
    /// ending in the open assistant turn the generated tokens continue.
    fn prompt(&self, document: &RetrievedDocument) -> StepResult<Vec<u32>> {
        let tokens = self.model.tokenizer.encode(&document.text)?;
        let text = if tokens.len() > self.settings.document_tokens {
            self.model
                .tokenizer
                .decode(&tokens[..self.settings.document_tokens])?
        } else {
            document.text.to_string()
        };
        Ok(self.model.chat.prompt(
            &self.model.tokenizer,
            &ralm_messages(&document.title, &text, &self.question),
        )?)
    }
}
