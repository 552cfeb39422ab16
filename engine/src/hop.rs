//! SpecHop's agent on an engine's token routes ([`EngineHopAgent`], llama.cpp's server or
//! vLLM's): the same prompts as the
//! in-process agent (`hasten_spec_retrieval::hop`), each line the engine's greedy
//! continuation of the prompt's token ids, computed from scratch (see [`crate::ralm`]), so
//! equal inputs give equal moves and speculation stays lossless.

use hasten_spec_retrieval::hop::{
    Action, DOCUMENT_TOKENS, Hop, HopAgent, LINE_TOKENS, action, first_line, plan_prompt,
    read_prompt,
};
use hasten_spec_retrieval::{RetrievedDocument, StepError};

use crate::EngineLm;
use crate::error::EngineError;

/// A multi-hop agent with a fixed number of hops, on the engine.
pub struct EngineHopAgent<'a> {
    engine: &'a EngineLm,
    hops: usize,
}

impl<'a> EngineHopAgent<'a> {
    pub fn new(engine: &'a EngineLm, hops: usize) -> Self {
        Self { engine, hops }
    }

    fn call<T>(&self, work: impl Future<Output = Result<T, EngineError>>) -> Result<T, StepError> {
        self.engine
            .runtime()
            .block_on(work)
            .map_err(|error| StepError::Generation {
                endpoint: self.engine.url().to_string(),
                retryable: error.is_retryable(),
                source: Box::new(error),
            })
    }

    /// One greedy line after `messages` and a forced start of the reply (`prefix`).
    fn line(
        &self,
        messages: &[hasten_rag::ChatMessage],
        prefix: &str,
    ) -> Result<String, StepError> {
        self.call(async {
            let api = self.engine.routes()?;
            let mut prompt = api.chat_tokens(messages).await?;
            prompt.extend(api.text_tokens(prefix).await?);
            let continued = api.continue_greedy(&prompt, LINE_TOKENS).await?;
            Ok(first_line(&api.detokenize(&continued.tokens).await?))
        })
    }

    /// `text` cut to [`DOCUMENT_TOKENS`] of the engine's tokens.
    fn clip(&self, text: &str) -> Result<String, StepError> {
        self.call(async {
            let api = self.engine.routes()?;
            let tokens = api.text_tokens(text).await?;
            if tokens.len() <= DOCUMENT_TOKENS {
                return Ok(text.to_owned());
            }
            api.detokenize(&tokens[..DOCUMENT_TOKENS]).await
        })
    }
}

impl HopAgent for EngineHopAgent<'_> {
    fn act(&self, question: &str, hops: &[Hop], must_answer: bool) -> Result<Action, StepError> {
        let answer = must_answer || hops.len() >= self.hops;
        let (messages, prefix) = plan_prompt(question, hops, answer);
        Ok(action(question, answer, self.line(&messages, prefix)?))
    }

    fn read(
        &self,
        question: &str,
        _hops: &[Hop],
        query: &str,
        documents: &[RetrievedDocument],
    ) -> Result<String, StepError> {
        let messages = read_prompt(question, query, documents, |text| self.clip(text))?;
        self.line(&messages, "")
    }
}
