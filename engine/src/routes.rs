//! An engine's token-level routes, whichever server it is: tokens of text and of the chat
//! template's layout, text of tokens, greedy continuations of token ids (RaLMSpec's and
//! SpecHop's steps), and the scores of a draft and of the reflection's reply (Speculative
//! RAG's verification). llama.cpp's server forces the scored tokens after the prompt
//! ([`crate::llama_cpp`]); vLLM scores them as part of the prompt ([`crate::vllm`]). Both
//! score the same token sequence: the question prompt, the draft, what the template puts
//! between a draft and the next user turn, and the reply.

use hasten_rag::prompt::REFLECTION_STATEMENT;
use hasten_rag::{ChatMessage, Role};

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::llama_cpp::{Continued, LlamaCpp};
use crate::scoring::Scoring;
use crate::vllm::{PromptScores, Vllm};

/// The token ids verification scores around each draft, the same for every draft.
pub struct Layout {
    /// The question prompt, the assistant's turn opened.
    pub context: Vec<u32>,
    /// From the end of a draft to the opened reply: the turn's end, the reflection
    /// statement as the user's next turn, the assistant's turn opened.
    pub between: Vec<u32>,
}

pub enum EngineRoutes<'a> {
    LlamaCpp(LlamaCpp<'a>),
    Vllm(Vllm<'a>, PromptScores),
}

impl<'a> EngineRoutes<'a> {
    /// The routes of the engine whose scoring was found to be `scoring`; an error when it
    /// gives no prompt scores (then it was found to be neither server).
    pub fn new(endpoint: &'a Endpoint, scoring: &Scoring) -> Result<Self, EngineError> {
        match scoring {
            Scoring::LlamaCppForcedTokens => Ok(Self::LlamaCpp(LlamaCpp::new(endpoint))),
            Scoring::PromptLogprobs => Ok(Self::Vllm(
                Vllm::new(endpoint),
                PromptScores::PromptLogprobs,
            )),
            Scoring::EchoLogprobs => Ok(Self::Vllm(Vllm::new(endpoint), PromptScores::Echo)),
            Scoring::Unavailable(reason) => Err(EngineError::Reply {
                url: endpoint.base.clone(),
                message: format!("the engine gives no prompt log-probabilities: {reason}"),
            }),
        }
    }

    /// `text`'s token ids, marker text left as text.
    pub async fn text_tokens(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        match self {
            Self::LlamaCpp(api) => api.tokenize(text, false).await,
            Self::Vllm(api, _) => api.tokenize_text(text).await,
        }
    }

    /// `messages` laid out by the model's chat template, the assistant's turn opened.
    pub async fn chat_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        match self {
            Self::LlamaCpp(api) => api.tokenize(&api.render(messages).await?, true).await,
            Self::Vllm(api, _) => api.tokenize_messages(messages).await,
        }
    }

    /// Up to `count` greedy tokens after `prompt`, the same for the same prompt.
    pub async fn continue_greedy(
        &self,
        prompt: &[u32],
        count: usize,
    ) -> Result<Continued, EngineError> {
        match self {
            Self::LlamaCpp(api) => api.continue_greedy(prompt, count).await,
            Self::Vllm(api, _) => api.continue_greedy(prompt, count).await,
        }
    }

    pub async fn detokenize(&self, tokens: &[u32]) -> Result<String, EngineError> {
        match self {
            Self::LlamaCpp(api) => api.detokenize(tokens).await,
            Self::Vllm(api, _) => api.detokenize(tokens).await,
        }
    }

    /// The layout around drafts of the question prompt `messages`, found from the template's
    /// rendering of `first_draft` followed by the reflection statement.
    pub async fn layout(
        &self,
        messages: &[ChatMessage],
        first_draft: &str,
    ) -> Result<Layout, EngineError> {
        let mut with_reply = messages.to_vec();
        with_reply.push(ChatMessage::new(Role::Assistant, first_draft));
        with_reply.push(ChatMessage::new(Role::User, REFLECTION_STATEMENT));
        match self {
            Self::LlamaCpp(api) => {
                let context_text = api.render(messages).await?;
                let rendered = api.render(&with_reply).await?;
                let between_text = rendered
                    .strip_prefix(&format!("{context_text}{first_draft}"))
                    .ok_or_else(|| api.template_error())?;
                Ok(Layout {
                    context: api.tokenize(&context_text, true).await?,
                    between: api.tokenize(between_text, true).await?,
                })
            }
            Self::Vllm(api, _) => {
                let context = self.chat_tokens(messages).await?;
                let whole = self.chat_tokens(&with_reply).await?;
                let draft = api.tokenize_text(first_draft).await?;
                let between = whole
                    .strip_prefix(context.as_slice())
                    .and_then(|rest| rest.strip_prefix(draft.as_slice()))
                    .ok_or_else(|| api.template_error())?;
                Ok(Layout {
                    between: between.to_vec(),
                    context,
                })
            }
        }
    }

    /// The summed log-probabilities of `draft` after the context, and of `reply` after the
    /// context, the draft and `between`: the draft's consistency and the reflection's.
    pub async fn score(
        &self,
        layout: &Layout,
        draft: &[u32],
        reply: &[u32],
    ) -> Result<(f32, f32), EngineError> {
        let mut before_reply = layout.context.clone();
        before_reply.extend(draft);
        before_reply.extend(&layout.between);
        match self {
            Self::LlamaCpp(api) => {
                let consistency = api.forced_logprobs(&layout.context, draft).await?;
                let reflection = api.forced_logprobs(&before_reply, reply).await?;
                Ok((consistency.iter().sum(), reflection.iter().sum()))
            }
            Self::Vllm(api, way) => {
                // One prompt holds both: `scores[i]` is token `i + 1`'s.
                let mut prompt = before_reply;
                prompt.extend(reply);
                let scores = api.prompt_logprobs(&prompt, *way).await?;
                let draft_start = layout
                    .context
                    .len()
                    .checked_sub(1)
                    .ok_or_else(|| api.template_error())?;
                let consistency = scores[draft_start..draft_start + draft.len()].iter().sum();
                let reflection = scores[scores.len() - reply.len()..].iter().sum();
                Ok((consistency, reflection))
            }
        }
    }
}
