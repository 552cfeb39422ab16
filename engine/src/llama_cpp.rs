//! Prompt log-probabilities from llama.cpp's server. It returns no log-probabilities of a
//! prompt (`echo` is ignored), but a grammar of token ids forces any continuation, and the
//! server reports each forced token's log-probability as the model gave it, before the
//! grammar and the sampler act: text the model did not write, scored token by token in one
//! request, exactly as a forward pass over it would.

use hasten_rag::ChatMessage;

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::wire::{
    self, ApplyTemplate, Completion, Detokenize, Detokenized, ForcedCompletion, GreedyCompletion,
    GreedyContinuation, Rendered, Tokenize, Tokens,
};

/// Tokens a greedy continuation wrote, and whether the model ended its turn with them (the
/// end-of-turn token itself is not among them).
pub struct Continued {
    pub tokens: Vec<u32>,
    pub ended: bool,
}

pub struct LlamaCpp<'a> {
    endpoint: &'a Endpoint,
}

impl<'a> LlamaCpp<'a> {
    pub fn new(endpoint: &'a Endpoint) -> Self {
        Self { endpoint }
    }

    /// Whether the engine is a llama.cpp server (it answers `GET /props`).
    pub async fn detect(endpoint: &Endpoint) -> Result<bool, EngineError> {
        let url = format!("{}/props", endpoint.root);
        match endpoint.get_json::<serde_json::Value>(&url).await {
            Ok(props) => Ok(props.get("default_generation_settings").is_some()),
            Err(EngineError::Status { status, .. }) if status == 404 || status == 405 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `messages` as the model's chat template lays them out, the assistant's turn opened.
    pub async fn render(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        let body = ApplyTemplate {
            messages: wire::messages(messages),
        };
        let url = format!("{}/apply-template", self.endpoint.root);
        let rendered: Rendered = self.endpoint.post_json(&url, &body).await?;
        Ok(rendered.prompt)
    }

    /// The template laid out a conversation otherwise than its turns, one by one.
    pub fn template_error(&self) -> EngineError {
        EngineError::Template {
            url: format!("{}/apply-template", self.endpoint.root),
        }
    }

    /// `text`'s token ids; `markers`: whether marker text becomes the markers' tokens (for
    /// template text, never for a client's or a model's text).
    pub async fn tokenize(&self, text: &str, markers: bool) -> Result<Vec<u32>, EngineError> {
        let url = format!("{}/tokenize", self.endpoint.root);
        let body = Tokenize {
            content: text,
            add_special: false,
            parse_special: markers,
        };
        let tokens: Tokens = self.endpoint.post_json(&url, &body).await?;
        Ok(tokens.tokens)
    }

    pub async fn detokenize(&self, tokens: &[u32]) -> Result<String, EngineError> {
        let url = format!("{}/detokenize", self.endpoint.root);
        let text: Detokenized = self
            .endpoint
            .post_json(&url, &Detokenize { tokens })
            .await?;
        Ok(text.content)
    }

    /// Up to `count` greedy tokens after `prompt`, computed from scratch: the same prompt
    /// always gives the same tokens.
    pub async fn continue_greedy(
        &self,
        prompt: &[u32],
        count: usize,
    ) -> Result<Continued, EngineError> {
        let url = format!("{}/completion", self.endpoint.root);
        let body = GreedyCompletion {
            prompt,
            n_predict: count,
            temperature: 0.0,
            // A prefill continued from the server's cache is not bit-identical to one from
            // scratch (other batch shapes), and greedy decoding amplifies the difference: a
            // step must be a pure function of its tokens, so each is computed whole.
            cache_prompt: false,
            return_tokens: true,
        };
        let reply: GreedyContinuation = self.endpoint.post_json(&url, &body).await?;
        let mut tokens = reply.tokens;
        // The server lists the end-of-turn token it stopped on (b11549; its text is left
        // out), which would reach the answer as `<|im_end|>`.
        let ended = reply.stop_type == "eos";
        if ended {
            tokens.pop();
        }
        Ok(Continued { tokens, ended })
    }

    /// The log-probability of each of `forced` following `prompt` and the forced tokens
    /// before it.
    pub async fn forced_logprobs(
        &self,
        prompt: &[u32],
        forced: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        if forced.is_empty() {
            return Ok(Vec::new());
        }
        let grammar = forced
            .iter()
            .map(|id| format!("<[{id}]>"))
            .collect::<Vec<_>>()
            .join(" ");
        let body = ForcedCompletion {
            prompt,
            n_predict: forced.len(),
            n_probs: 1,
            temperature: 0.0,
            grammar: format!("root ::= {grammar}"),
            cache_prompt: true,
        };
        let url = format!("{}/completion", self.endpoint.root);
        let completion: Completion = self.endpoint.post_json(&url, &body).await?;
        let written: Vec<u32> = completion
            .completion_probabilities
            .iter()
            .map(|p| p.id)
            .collect();
        if written != forced {
            return Err(EngineError::Reply {
                url,
                message: format!(
                    "asked to continue with {} forced tokens, it wrote {:?}",
                    forced.len(),
                    written
                ),
            });
        }
        Ok(completion
            .completion_probabilities
            .iter()
            .map(|p| p.logprob)
            .collect())
    }
}
