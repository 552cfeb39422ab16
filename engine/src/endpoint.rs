//! One engine's HTTP API: its address, key and deadline, JSON calls and streamed chat
//! completions.

use display_full_error::DisplayFullErrorExt;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::EngineError;
use crate::wire::{ChatChunk, ErrorReply};

/// Most characters of an engine's error body kept in a message.
const ERROR_BODY_CHARS: usize = 400;

#[derive(Debug, Clone)]
pub struct Endpoint {
    http: reqwest::Client,
    /// The OpenAI API's base, `/v1` included, without a trailing slash.
    pub base: String,
    /// The server's root (the base without `/v1`), where engines keep their own routes.
    pub root: String,
    pub model: String,
    api_key: Option<String>,
    pub timeout: Duration,
}

impl Endpoint {
    pub fn new(
        http: reqwest::Client,
        base: &str,
        model: String,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Self {
        let base = base.trim_end_matches('/').to_string();
        let root = base.strip_suffix("/v1").unwrap_or(&base).to_string();
        Self {
            http,
            base,
            root,
            model,
            api_key,
            timeout,
        }
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    pub fn timed_out(&self, url: &str) -> EngineError {
        EngineError::Timeout {
            url: url.to_string(),
            seconds: self.timeout.as_secs_f64(),
        }
    }

    /// `GET url` as JSON, within the deadline.
    pub async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, EngineError> {
        let call = async {
            let response = self
                .authorized(self.http.get(url))
                .send()
                .await
                .map_err(|source| http_error(url, source))?;
            read_json(url, success(url, response).await?).await
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out(url))?
    }

    /// `POST url` of `body`, the reply as JSON, within the deadline.
    pub async fn post_json<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        url: &str,
        body: &B,
    ) -> Result<T, EngineError> {
        let call = async {
            let response = self
                .authorized(self.http.post(url))
                .json(body)
                .send()
                .await
                .map_err(|source| http_error(url, source))?;
            read_json(url, success(url, response).await?).await
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out(url))?
    }

    /// Opens a streamed chat completion of `body` (which asks for `stream: true`). Dropping
    /// the stream closes the request, which a streaming engine reads as a cancellation.
    pub async fn chat_stream<B: Serialize + ?Sized>(
        &self,
        body: &B,
    ) -> Result<ChatEvents, EngineError> {
        let url = format!("{}/chat/completions", self.base);
        let open = async {
            let response = self
                .authorized(self.http.post(&url))
                .json(body)
                .send()
                .await
                .map_err(|source| http_error(&url, source))?;
            success(&url, response).await
        };
        let response = tokio::time::timeout(self.timeout, open)
            .await
            .map_err(|_| self.timed_out(&url))??;
        Ok(ChatEvents {
            events: response.bytes_stream().eventsource().boxed(),
            timeout: self.timeout,
            url,
            done: false,
        })
    }
}

/// The chunks of a streamed chat completion, each awaited within the deadline.
pub struct ChatEvents {
    events: BoxStream<'static, Result<Event, EventStreamError<reqwest::Error>>>,
    timeout: Duration,
    pub url: String,
    done: bool,
}

impl ChatEvents {
    /// The next chunk; `None` after `[DONE]`. A stream that ends without `[DONE]` ends as
    /// well: whether the answer was whole is for the caller to tell by its finish reason.
    pub async fn next(&mut self) -> Result<Option<ChatChunk>, EngineError> {
        if self.done {
            return Ok(None);
        }
        let event = tokio::time::timeout(self.timeout, self.events.next())
            .await
            .map_err(|_| EngineError::Timeout {
                url: self.url.clone(),
                seconds: self.timeout.as_secs_f64(),
            })?;
        let Some(event) = event else {
            self.done = true;
            return Ok(None);
        };
        let event = event.map_err(|source| EngineError::Reply {
            url: self.url.clone(),
            message: source.to_string_full(),
        })?;
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        serde_json::from_str(&event.data)
            .map(Some)
            .map_err(|source| EngineError::Reply {
                url: self.url.clone(),
                message: format!("{source} in {}", clip(&event.data)),
            })
    }
}

fn http_error(url: &str, source: reqwest::Error) -> EngineError {
    EngineError::Http {
        url: url.to_string(),
        source,
    }
}

async fn read_json<T: DeserializeOwned>(
    url: &str,
    response: reqwest::Response,
) -> Result<T, EngineError> {
    let body = response
        .text()
        .await
        .map_err(|source| http_error(url, source))?;
    serde_json::from_str(&body).map_err(|source| EngineError::Reply {
        url: url.to_string(),
        message: format!("{source} in {}", clip(&body)),
    })
}

/// The response when its status is a success; else the engine's error message.
async fn success(url: &str, response: reqwest::Response) -> Result<reqwest::Response, EngineError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<ErrorReply>(&body)
        .map(|reply| reply.error.message)
        .unwrap_or_else(|_| clip(&body).to_string());
    Err(EngineError::Status {
        url: url.to_string(),
        status: status.as_u16(),
        message,
    })
}

/// At most [`ERROR_BODY_CHARS`] characters of `text`.
fn clip(text: &str) -> &str {
    match text.char_indices().nth(ERROR_BODY_CHARS) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_the_base_without_its_api_version() {
        let endpoint = |base: &str| {
            Endpoint::new(
                reqwest::Client::new(),
                base,
                "m".into(),
                None,
                Duration::from_secs(1),
            )
        };
        let vllm = endpoint("http://vllm:8000/v1/");
        assert_eq!(vllm.base, "http://vllm:8000/v1");
        assert_eq!(vllm.root, "http://vllm:8000");
        let proxied = endpoint("https://gw.example/llm");
        assert_eq!(proxied.root, "https://gw.example/llm");
    }

    #[test]
    fn error_bodies_are_clipped_on_a_character_boundary() {
        let long = "é".repeat(ERROR_BODY_CHARS + 10);
        assert_eq!(clip(&long).chars().count(), ERROR_BODY_CHARS);
        assert_eq!(clip("short"), "short");
    }
}
