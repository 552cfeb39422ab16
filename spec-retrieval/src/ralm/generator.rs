//! One iterative-RAG generation step: the prompt for a document and the text so far, and
//! the next few greedy tokens. Sequential and speculative runs share it, so equal documents
//! give equal tokens.

use hasten_lm::{
    ChatMessage, FinishReason, GenerationOptions, LanguageModel, Role, Sampling, generate,
};

use super::RalmSettings;
use crate::error::{Result, SpecError};
use crate::retriever::RetrievedDocument;

/// The system turn: a few sentences, so that generation spans several retrievals.
pub const RALM_INSTRUCTION: &str =
    "Answer the question using the document. Explain the answer in a few sentences.";

/// Tokens a step produced and whether the answer ended with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StepTokens {
    pub tokens: Vec<u32>,
    pub finished: bool,
}

/// Generates one request's answer step by step.
pub struct RalmGenerator<'a> {
    model: &'a LanguageModel,
    question: String,
    settings: RalmSettings,
}

impl<'a> RalmGenerator<'a> {
    pub fn new(model: &'a LanguageModel, question: &str, settings: RalmSettings) -> Result<Self> {
        if question.trim().is_empty() {
            return Err(SpecError::InvalidRequest("the question is empty".into()));
        }
        if settings.interval == 0 || settings.max_new_tokens == 0 {
            return Err(SpecError::InvalidRequest(format!(
                "interval ({}) and max_new_tokens ({}) must be at least 1",
                settings.interval, settings.max_new_tokens
            )));
        }
        Ok(Self {
            model,
            question: question.trim().to_owned(),
            settings,
        })
    }

    pub fn settings(&self) -> &RalmSettings {
        &self.settings
    }

    pub fn model(&self) -> &LanguageModel {
        self.model
    }

    /// The retrieval query after `generated`: the question and the last generated tokens.
    pub fn query_text(&self, generated: &[u32]) -> Result<String> {
        let tail = &generated[generated.len().saturating_sub(self.settings.query_tokens)..];
        if tail.is_empty() {
            return Ok(self.question.clone());
        }
        let text = self.model.tokenizer.decode(tail)?;
        Ok(format!("{}\n{}", self.question, text.trim()))
    }

    /// The next step's tokens after `generated`, reading `document`.
    pub(crate) fn step(
        &self,
        document: &RetrievedDocument,
        generated: &[u32],
    ) -> Result<StepTokens> {
        let budget = self.settings.max_new_tokens.saturating_sub(generated.len());
        let count = self.settings.interval.min(budget);
        if count == 0 {
            return Ok(StepTokens {
                tokens: Vec::new(),
                finished: true,
            });
        }
        let mut prompt = self.prompt(document)?;
        prompt.extend_from_slice(generated);
        let options = GenerationOptions {
            max_new_tokens: count,
            stop_tokens: vec![self.model.chat.end_of_turn(), self.model.tokenizer.eos()],
            sampling: Sampling::default(),
        };
        let (mut results, _) = generate(
            &self.model.decoder,
            std::slice::from_ref(&prompt),
            &options,
            |_, _| std::ops::ControlFlow::Continue(()),
        )?;
        let result = results.pop().ok_or_else(|| {
            hasten_lm::LmError::InvalidInput("generation returned no sequence".into())
        })?;
        let finished = result.finish == FinishReason::Stop
            || generated.len() + result.tokens.len() >= self.settings.max_new_tokens;
        Ok(StepTokens {
            tokens: result.tokens,
            finished,
        })
    }

    /// The answer's text.
    pub fn text(&self, generated: &[u32]) -> Result<String> {
        Ok(self.model.tokenizer.decode(generated)?.trim().to_owned())
    }

    /// The chat prompt with `document` (its first [`RalmSettings::document_tokens`] tokens),
    /// ending in the open assistant turn the generated tokens continue.
    fn prompt(&self, document: &RetrievedDocument) -> Result<Vec<u32>> {
        let tokens = self.model.tokenizer.encode(&document.text)?;
        let text = if tokens.len() > self.settings.document_tokens {
            self.model
                .tokenizer
                .decode(&tokens[..self.settings.document_tokens])?
        } else {
            document.text.to_string()
        };
        let user = format!(
            "Document: {}\n{}\n\nQuestion: {}",
            document.title, text, self.question
        );
        Ok(self.model.chat.prompt(
            &self.model.tokenizer,
            &[
                ChatMessage::new(Role::System, RALM_INSTRUCTION),
                ChatMessage::new(Role::User, user),
            ],
        )?)
    }
}
