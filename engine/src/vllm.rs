//! Prompt log-probabilities from vLLM's server. Its `/v1/completions` scores the prompt's own
//! tokens, in one of two ways (both served by vLLM, detected once): its `prompt_logprobs`
//! parameter (a map per position, keyed by token id), or OpenAI's legacy `echo` +
//! `logprobs` (the prompt's tokens read back with their log-probabilities, first `null`).
//! The prompt goes as token ids, which the server's `/tokenize` gives: of the chat messages
//! laid out by the model's template, or of plain text.

use std::collections::HashMap;

use hasten_rag::ChatMessage;
use serde::{Deserialize, Serialize};

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::llama_cpp::Continued;
use crate::wire::{self, Message};

/// Which of vLLM's two ways of scoring a prompt the engine answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptScores {
    /// vLLM's `prompt_logprobs: 0`.
    PromptLogprobs,
    /// `echo: true` with `logprobs: 0`.
    Echo,
}

/// Text the detection scores: any few tokens do.
const PROBE_TEXT: &str = "The capital of France is Paris.";

pub struct Vllm<'a> {
    endpoint: &'a Endpoint,
}

impl<'a> Vllm<'a> {
    pub fn new(endpoint: &'a Endpoint) -> Self {
        Self { endpoint }
    }

    /// How the engine scores a prompt, when it has vLLM's `/tokenize` and either way
    /// gives a log-probability for each prompt token; `None` when it does not. Errors are
    /// an engine that could not be reached (ask again later).
    pub async fn detect(endpoint: &'a Endpoint) -> Result<Option<PromptScores>, EngineError> {
        let api = Self::new(endpoint);
        let ids = match api.tokenize_text(PROBE_TEXT).await {
            Ok(ids) => ids,
            Err(error) if refused(&error) => return Ok(None),
            Err(error) => return Err(error),
        };
        for way in [PromptScores::PromptLogprobs, PromptScores::Echo] {
            match api.prompt_logprobs(&ids, way).await {
                Ok(_) => return Ok(Some(way)),
                Err(error) if refused(&error) => {
                    tracing::info!(engine = %endpoint.base, ?way, error = %error, "prompt scores not served this way");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// The token ids of `messages` as the model's chat template lays them out, the
    /// assistant's turn opened.
    pub async fn tokenize_messages(
        &self,
        messages: &[ChatMessage],
    ) -> Result<Vec<u32>, EngineError> {
        let body = TokenizeMessages {
            model: &self.endpoint.model,
            messages: wire::messages(messages),
            add_generation_prompt: true,
            // The template writes whatever special tokens the model wants.
            add_special_tokens: false,
        };
        self.tokenize(&body).await
    }

    /// The token ids of `text` alone (no BOS: the pieces of a prompt are joined).
    pub async fn tokenize_text(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let body = TokenizeText {
            model: &self.endpoint.model,
            prompt: text,
            add_special_tokens: false,
        };
        self.tokenize(&body).await
    }

    /// The template laid out a conversation otherwise than its turns, one by one.
    pub fn template_error(&self) -> EngineError {
        EngineError::Template {
            url: format!("{}/tokenize", self.endpoint.root),
        }
    }

    async fn tokenize<B: Serialize>(&self, body: &B) -> Result<Vec<u32>, EngineError> {
        let url = format!("{}/tokenize", self.endpoint.root);
        let tokens: Tokens = self.endpoint.post_json(&url, body).await?;
        Ok(tokens.tokens)
    }

    pub async fn detokenize(&self, tokens: &[u32]) -> Result<String, EngineError> {
        let url = format!("{}/detokenize", self.endpoint.root);
        let body = Detokenize {
            model: &self.endpoint.model,
            tokens,
        };
        let text: Detokenized = self.endpoint.post_json(&url, &body).await?;
        Ok(text.prompt)
    }

    /// `POST /v1/completions` of `body`: its address and the reply's first choice.
    async fn complete<B: Serialize>(
        &self,
        body: &B,
    ) -> Result<(String, ScoredChoice), EngineError> {
        let url = format!("{}/completions", self.endpoint.base);
        let reply: Scored = self.endpoint.post_json(&url, body).await?;
        match reply.choices.into_iter().next() {
            Some(choice) => Ok((url, choice)),
            None => Err(EngineError::Reply {
                url,
                message: "no choice in the completion".into(),
            }),
        }
    }

    /// Up to `count` greedy tokens after `prompt`. The tokens come back as the written
    /// tokens' log-probability entries, named by id (`return_tokens_as_token_ids`); vLLM
    /// lists the token it stopped on among them (vllm-project/vllm#28185), which is not
    /// kept: `finish_reason: "stop"` with no `stop_reason` (end of sequence), or with the
    /// stop token's id.
    pub async fn continue_greedy(
        &self,
        prompt: &[u32],
        count: usize,
    ) -> Result<Continued, EngineError> {
        let body = GreedyCompletion {
            model: &self.endpoint.model,
            prompt,
            max_tokens: count,
            temperature: 0.0,
            logprobs: 0,
            return_tokens_as_token_ids: true,
        };
        let (url, choice) = self.complete(&body).await?;
        read_continuation(choice).map_err(|message| EngineError::Reply { url, message })
    }

    /// The log-probability of each of `ids` after the first, given the ones before it.
    pub async fn prompt_logprobs(
        &self,
        ids: &[u32],
        way: PromptScores,
    ) -> Result<Vec<f32>, EngineError> {
        let body = ScorePrompt {
            model: &self.endpoint.model,
            prompt: ids,
            // One token is written, unread: not every version takes 0.
            max_tokens: 1,
            temperature: 0.0,
            prompt_logprobs: (way == PromptScores::PromptLogprobs).then_some(0),
            echo: way == PromptScores::Echo,
            logprobs: (way == PromptScores::Echo).then_some(0),
        };
        let (url, choice) = self.complete(&body).await?;
        let read = match way {
            PromptScores::PromptLogprobs => read_prompt_logprobs(ids, choice.prompt_logprobs),
            PromptScores::Echo => read_echoed(ids, choice.logprobs),
        };
        read.map_err(|message| EngineError::Reply { url, message })
    }
}

/// Whether `error` says the engine does not serve what was asked (a missing route, an
/// unknown parameter, a reply without the scores), as opposed to not answering at all.
fn refused(error: &EngineError) -> bool {
    match error {
        EngineError::Status { status, .. } => (400..500).contains(status) && *status != 429,
        EngineError::Reply { .. } => true,
        _ => false,
    }
}

/// `prompt_logprobs`: `null` for the first position, then per position a map from token id
/// to its score, which holds the prompt's token (and the top alternatives, when asked).
fn read_prompt_logprobs(
    ids: &[u32],
    positions: Option<Vec<Option<HashMap<String, PromptLogprob>>>>,
) -> Result<Vec<f32>, String> {
    let positions = positions.ok_or("no prompt_logprobs in the completion")?;
    if positions.len() != ids.len() {
        return Err(format!(
            "prompt_logprobs for {} positions of a {}-token prompt",
            positions.len(),
            ids.len()
        ));
    }
    ids.iter()
        .zip(positions)
        .skip(1)
        .map(|(id, scores)| {
            scores
                .and_then(|scores| scores.get(&id.to_string()).map(|s| s.logprob))
                .ok_or_else(|| format!("no prompt log-probability of token {id}"))
        })
        .collect()
}

/// `echo` + `logprobs`: the prompt's tokens then the written one, `null` for the first.
fn read_echoed(ids: &[u32], logprobs: Option<EchoedLogprobs>) -> Result<Vec<f32>, String> {
    let logprobs = logprobs.ok_or("no logprobs in the echoed completion")?;
    if logprobs.token_logprobs.len() < ids.len() {
        return Err(format!(
            "{} echoed log-probabilities for a {}-token prompt (echo ignored?)",
            logprobs.token_logprobs.len(),
            ids.len()
        ));
    }
    logprobs.token_logprobs[1..ids.len()]
        .iter()
        .enumerate()
        .map(|(i, score)| score.ok_or_else(|| format!("no echoed log-probability at {}", i + 1)))
        .collect()
}

/// The tokens of a greedy completion, without the one it stopped on.
fn read_continuation(choice: ScoredChoice) -> Result<Continued, String> {
    let written = choice
        .logprobs
        .ok_or("no logprobs in the completion")?
        .tokens;
    let mut tokens = written
        .iter()
        .map(|name| {
            name.strip_prefix("token_id:")
                .and_then(|id| id.parse().ok())
                .ok_or_else(|| {
                    format!("{name:?} is not a token id (return_tokens_as_token_ids ignored?)")
                })
        })
        .collect::<Result<Vec<u32>, String>>()?;
    let ended = choice.finish_reason.as_deref() == Some("stop");
    let stopped_on_last = match choice.stop_reason {
        None => true,
        Some(serde_json::Value::Number(id)) => id.as_u64() == tokens.last().map(|&t| u64::from(t)),
        Some(_) => false,
    };
    if ended && stopped_on_last {
        tokens.pop();
    }
    Ok(Continued { tokens, ended })
}

/// `POST /tokenize` of chat messages.
#[derive(Debug, Serialize)]
struct TokenizeMessages<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    add_generation_prompt: bool,
    add_special_tokens: bool,
}

/// `POST /tokenize` of text.
#[derive(Debug, Serialize)]
struct TokenizeText<'a> {
    model: &'a str,
    prompt: &'a str,
    add_special_tokens: bool,
}

#[derive(Debug, Deserialize)]
struct Tokens {
    tokens: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct Detokenize<'a> {
    model: &'a str,
    tokens: &'a [u32],
}

#[derive(Debug, Deserialize)]
struct Detokenized {
    prompt: String,
}

/// `POST /v1/completions` scoring its prompt.
#[derive(Debug, Serialize)]
struct ScorePrompt<'a> {
    model: &'a str,
    prompt: &'a [u32],
    max_tokens: usize,
    temperature: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    echo: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<u32>,
}

/// `POST /v1/completions` continuing `prompt` greedily, the tokens named by id.
#[derive(Debug, Serialize)]
struct GreedyCompletion<'a> {
    model: &'a str,
    prompt: &'a [u32],
    max_tokens: usize,
    temperature: f32,
    logprobs: u32,
    return_tokens_as_token_ids: bool,
}

#[derive(Debug, Deserialize)]
struct Scored {
    #[serde(default)]
    choices: Vec<ScoredChoice>,
}

#[derive(Debug, Deserialize)]
struct ScoredChoice {
    #[serde(default)]
    prompt_logprobs: Option<Vec<Option<HashMap<String, PromptLogprob>>>>,
    #[serde(default)]
    logprobs: Option<EchoedLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    /// The stop string or token id that ended the completion; `null` at the end of sequence.
    #[serde(default)]
    stop_reason: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct PromptLogprob {
    logprob: f32,
}

#[derive(Debug, Deserialize)]
struct EchoedLogprobs {
    #[serde(default)]
    token_logprobs: Vec<Option<f32>>,
    #[serde(default)]
    tokens: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply laid out as vLLM's `CompletionResponse` documents it (vllm/entrypoints/
    /// openai/protocol.py): written here from that description, not recorded from a
    /// server, as none can run on this machine.
    fn choice(json: serde_json::Value) -> ScoredChoice {
        let reply: Scored = serde_json::from_value(serde_json::json!({
            "id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
            "choices": [json],
            "usage": {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}
        }))
        .unwrap();
        reply.choices.into_iter().next().unwrap()
    }

    #[test]
    fn prompt_logprobs_are_read_at_each_prompt_token() {
        // Position 2 also lists a more likely alternative (top-k), which must not be read.
        let reply = choice(serde_json::json!({
            "index": 0, "text": ".", "logprobs": null, "finish_reason": "length",
            "stop_reason": null,
            "prompt_logprobs": [
                null,
                {"17": {"logprob": -1.5, "rank": 3, "decoded_token": " a"}},
                {"9": {"logprob": -0.25, "rank": 2, "decoded_token": " b"},
                 "4": {"logprob": -0.1, "rank": 1, "decoded_token": " c"}}
            ]
        }));
        let scores = read_prompt_logprobs(&[5, 17, 9], reply.prompt_logprobs).unwrap();
        assert_eq!(scores, vec![-1.5, -0.25]);
        // Read against other ids (a prompt shifted by one), the entries are not there.
        let reply = choice(serde_json::json!({
            "index": 0, "text": ".",
            "prompt_logprobs": [null, {"17": {"logprob": -1.5}}, {"9": {"logprob": -0.25}}]
        }));
        assert!(read_prompt_logprobs(&[17, 9, 5], reply.prompt_logprobs).is_err());
    }

    #[test]
    fn echoed_logprobs_are_the_prompt_s_then_the_written_token_s() {
        let reply = choice(serde_json::json!({
            "index": 0, "text": "Paris is.",
            "logprobs": {
                "text_offset": [0, 5, 8, 9],
                "token_logprobs": [null, -2.0, -0.5, -3.0],
                "tokens": ["Paris", " is", ".", "\n"],
                "top_logprobs": [null, {" is": -2.0}, {".": -0.5}, {"\n": -3.0}]
            },
            "finish_reason": "length"
        }));
        assert_eq!(
            read_echoed(&[1, 2, 3], reply.logprobs).unwrap(),
            vec![-2.0, -0.5]
        );
    }

    #[test]
    fn a_greedy_continuation_leaves_out_the_token_it_stopped_on() {
        let continued = |finish: &str, stop_reason: serde_json::Value| {
            read_continuation(choice(serde_json::json!({
                "index": 0, "text": " Paris",
                "logprobs": {"text_offset": [0, 3, 6], "token_logprobs": [-0.1, -0.2, -0.3],
                             "tokens": ["token_id:7", "token_id:8", "token_id:2"],
                             "top_logprobs": [null, null, null]},
                "finish_reason": finish, "stop_reason": stop_reason
            })))
            .unwrap()
        };
        // End of sequence: listed last, not kept.
        let eos = continued("stop", serde_json::Value::Null);
        assert_eq!((eos.tokens, eos.ended), (vec![7, 8], true));
        // The model's own stop token (its id as the reason): the same.
        assert_eq!(continued("stop", serde_json::json!(2)).tokens, vec![7, 8]);
        // Cut at max_tokens: every token kept, not ended.
        let cut = continued("length", serde_json::Value::Null);
        assert_eq!((cut.tokens, cut.ended), (vec![7, 8, 2], false));
    }

    #[test]
    fn a_reply_without_the_prompt_s_scores_is_refused_not_read_short() {
        // An engine that ignores `echo` returns only the written token's score.
        let reply = choice(serde_json::json!({
            "index": 0, "text": ".",
            "logprobs": {"text_offset": [0], "token_logprobs": [-3.0], "tokens": ["."],
                         "top_logprobs": [null]}
        }));
        assert!(read_echoed(&[1, 2, 3], reply.logprobs).is_err());
        let reply = choice(serde_json::json!({"index": 0, "text": "."}));
        assert!(read_prompt_logprobs(&[1, 2, 3], reply.prompt_logprobs).is_err());
    }
}
