//! Iterative RAG's generation steps on an engine's token routes ([`EngineRalm`], on
//! llama.cpp's server or vLLM's, [`crate::routes`]): each step sends
//! the document's prompt and the answer's tokens so far as token ids and gets the next greedy
//! tokens back, so a step is the same pure function of (document, tokens) as in process and
//! RaLMSpec's rollbacks stay lossless. llama.cpp's prompt cache is not used for steps: a
//! prefill continued from it is not bit-identical to one from scratch, which was enough for
//! a speculative run's greedy tokens to leave the sequential run's (measured on llama.cpp
//! b11549). Each step pays its whole prompt instead. vLLM's prefix cache is the server's
//! to keep; whether its greedy tokens are batch-invariant is the server's too (no vLLM ran
//! here).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use hasten_spec_retrieval::RetrievedDocument;
use hasten_spec_retrieval::StepError;
use hasten_spec_retrieval::ralm::{
    RalmSettings, RalmStepper, StepTokens, check_request, query_after, ralm_messages,
};

use crate::EngineLm;
use crate::error::EngineError;

/// One request's generation steps on the engine.
pub struct EngineRalm<'a> {
    engine: &'a EngineLm,
    question: String,
    settings: RalmSettings,
    /// Each document's prompt as token ids, tokenised once per request.
    prompts: Mutex<HashMap<u64, Vec<u32>>>,
}

impl<'a> EngineRalm<'a> {
    pub fn new(
        engine: &'a EngineLm,
        question: &str,
        settings: RalmSettings,
    ) -> Result<Self, StepError> {
        check_request(question, &settings)?;
        Ok(Self {
            engine,
            question: question.trim().to_owned(),
            settings,
            prompts: Mutex::new(HashMap::new()),
        })
    }

    fn failed(&self, error: EngineError) -> StepError {
        StepError::Generation {
            endpoint: self.engine.url().to_string(),
            retryable: error.is_retryable(),
            source: Box::new(error),
        }
    }

    /// Runs an engine call from the blocking thread a run is on.
    fn call<T>(&self, work: impl Future<Output = Result<T, EngineError>>) -> Result<T, StepError> {
        self.engine
            .runtime()
            .block_on(work)
            .map_err(|error| self.failed(error))
    }

    /// `document`'s prompt (its first [`RalmSettings::document_tokens`] tokens), ending in
    /// the open assistant turn the generated tokens continue.
    async fn prompt(&self, document: &RetrievedDocument) -> Result<Vec<u32>, EngineError> {
        let api = self.engine.routes()?;
        let tokens = api.text_tokens(&document.text).await?;
        let text = if tokens.len() > self.settings.document_tokens {
            api.detokenize(&tokens[..self.settings.document_tokens])
                .await?
        } else {
            document.text.to_string()
        };
        api.chat_tokens(&ralm_messages(&document.title, &text, &self.question))
            .await
    }
}

impl RalmStepper for EngineRalm<'_> {
    fn settings(&self) -> &RalmSettings {
        &self.settings
    }

    fn query_text(&self, generated: &[u32]) -> Result<String, StepError> {
        let tail = &generated[generated.len().saturating_sub(self.settings.query_tokens)..];
        if tail.is_empty() {
            return Ok(self.question.clone());
        }
        let text = self.call(async { self.engine.routes()?.detokenize(tail).await })?;
        Ok(query_after(&self.question, &text))
    }

    fn step(
        &self,
        document: &RetrievedDocument,
        generated: &[u32],
    ) -> Result<StepTokens, StepError> {
        let budget = self.settings.max_new_tokens.saturating_sub(generated.len());
        let count = self.settings.interval.min(budget);
        if count == 0 {
            return Ok(StepTokens {
                tokens: Vec::new(),
                finished: true,
            });
        }
        let kept = self
            .prompts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&document.id)
            .cloned();
        let mut prompt = match kept {
            Some(prompt) => prompt,
            None => {
                let prompt = self.call(self.prompt(document))?;
                self.prompts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(document.id, prompt.clone());
                prompt
            }
        };
        prompt.extend_from_slice(generated);
        let continued =
            self.call(async { self.engine.routes()?.continue_greedy(&prompt, count).await })?;
        let finished = continued.ended
            || generated.len() + continued.tokens.len() >= self.settings.max_new_tokens;
        Ok(StepTokens {
            tokens: continued.tokens,
            finished,
        })
    }

    fn text(&self, generated: &[u32]) -> Result<String, StepError> {
        let text = self.call(async { self.engine.routes()?.detokenize(generated).await })?;
        Ok(text.trim().to_owned())
    }
}
