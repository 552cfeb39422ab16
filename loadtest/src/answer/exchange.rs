//! One streamed chat completion (`POST /v1/chat/completions`, `stream: true`), as an
//! OpenAI client sends it: the answer's text, when its first text arrived, the gaps between
//! its text chunks, and Hasten's extension on the last chunk (how retrieval went, where the
//! time went).

use display_full_error::DisplayFullErrorExt;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::driver::{Exchange, post_json};
use crate::workload::WorkloadQuery;

/// The model name that asks an edge for a standard RAG answer.
pub const STANDARD_MODEL: &str = "hasten-rag";

/// A streamed chat completion of at most `max_tokens`, over `k` documents, greedy.
pub struct ChatAnswer {
    pub k: usize,
    pub max_tokens: usize,
}

/// What a streamed answer came to.
#[derive(Clone, Debug, Default)]
pub struct AnswerReply {
    pub text: String,
    /// From the query's intended send time to its first text (none when no text came).
    pub first_text: Option<Duration>,
    /// Between consecutive text chunks (the edge streams each decoded piece as it comes).
    pub gaps: Vec<Duration>,
    /// `accepted` (HaS's draft served) or `fallback` (the cloud's documents).
    pub retrieval: Option<String>,
    pub timings: Option<StageTimings>,
}

/// The edge's account of an answer's time (`hasten.timings` of the last chunk), ms.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StageTimings {
    pub retrieve_ms: f64,
    /// Waiting for the answer backend behind the edge's earlier answers.
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub first_token_ms: f64,
    pub decode_ms: f64,
    pub total_ms: f64,
    #[serde(default)]
    pub kv: Option<KvStages>,
}

/// A KV worker's prefill by stage (ms), and its chunks by where their KV came from.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct KvStages {
    pub queue_ms: f64,
    pub load_ms: f64,
    pub assemble_ms: f64,
    pub select_ms: f64,
    pub recompute_ms: f64,
    pub memory_hits: u32,
    pub disk_hits: u32,
    pub computed_chunks: u32,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    hasten: Option<Extension>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Extension {
    #[serde(default)]
    retrieval: Option<String>,
    #[serde(default)]
    timings: Option<StageTimings>,
}

/// Reads server-sent events' `data:` lines from a byte stream that splits them anywhere.
#[derive(Default)]
struct EventLines {
    pending: Vec<u8>,
}

impl EventLines {
    /// The complete `data:` payloads `bytes` finishes.
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut payloads = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                payloads.push(data.trim_start().to_string());
            }
        }
        payloads
    }
}

impl AnswerReply {
    /// Folds one event's payload in, at `now`; `Err` for an error event or bad JSON.
    fn take(
        &mut self,
        payload: &str,
        now: Instant,
        intended: Instant,
        last_text: &mut Option<Instant>,
    ) -> Result<(), String> {
        if payload == "[DONE]" {
            return Ok(());
        }
        let chunk: Chunk =
            serde_json::from_str(payload).map_err(|e| format!("bad event {payload:?}: {e}"))?;
        if let Some(error) = chunk.error {
            return Err(format!("error event: {error}"));
        }
        let text: String = chunk
            .choices
            .iter()
            .filter_map(|c| c.delta.content.as_deref())
            .collect();
        if !text.is_empty() {
            match *last_text {
                None => self.first_text = Some(now.saturating_duration_since(intended)),
                Some(previous) => self.gaps.push(now.saturating_duration_since(previous)),
            }
            *last_text = Some(now);
            self.text.push_str(&text);
        }
        if let Some(extension) = chunk.hasten {
            self.retrieval = extension.retrieval;
            self.timings = extension.timings;
        }
        Ok(())
    }
}

impl Exchange for ChatAnswer {
    type Reply = AnswerReply;

    async fn exchange(
        &self,
        client: &reqwest::Client,
        url: &str,
        query: &WorkloadQuery,
        intended: Instant,
    ) -> Result<AnswerReply, String> {
        let body = serde_json::json!({
            "model": STANDARD_MODEL,
            "messages": [{"role": "user", "content": query.question}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": true,
            "k": self.k,
        });
        let mut response = post_json(client, &format!("{url}/v1/chat/completions"), &body).await?;
        let mut reply = AnswerReply::default();
        let mut lines = EventLines::default();
        let mut last_text = None;
        let mut done = false;
        while let Some(bytes) = response
            .chunk()
            .await
            .map_err(|e| format!("stream broken: {}", e.display_full()))?
        {
            let now = Instant::now();
            for payload in lines.push(&bytes) {
                done |= payload == "[DONE]";
                reply.take(&payload, now, intended, &mut last_text)?;
            }
        }
        if !done {
            return Err("the stream ended before [DONE]".into());
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_are_read_whole_and_text_times_are_kept() {
        let mut lines = EventLines::default();
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Denver\"}}]}\n\n",
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" Broncos\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],",
            "\"hasten\":{\"retrieval\":\"accepted\",\"timings\":{\"retrieve_ms\":1.5,",
            "\"queue_ms\":0,\"prefill_ms\":20,\"first_token_ms\":30,\"decode_ms\":9,",
            "\"total_ms\":41,\"kv\":{\"queue_ms\":1,\"load_ms\":2,\"assemble_ms\":3,",
            "\"select_ms\":4,\"recompute_ms\":5,\"memory_hits\":3,\"disk_hits\":2,",
            "\"computed_chunks\":0}}}}\n\n",
            "data: [DONE]\n\n"
        );
        let start = Instant::now();
        let mut reply = AnswerReply::default();
        let mut last = None;
        let mut payloads = Vec::new();
        // Seven bytes at a time: events and even UTF-8 are cut mid-way.
        for piece in stream.as_bytes().chunks(7) {
            payloads.extend(lines.push(piece));
        }
        assert_eq!(payloads.len(), 5, "{payloads:?}");
        for (i, payload) in payloads.iter().enumerate() {
            let now = start + Duration::from_millis(100 * i as u64);
            reply.take(payload, now, start, &mut last).unwrap();
        }
        assert_eq!(reply.text, "Denver Broncos");
        assert_eq!(reply.first_text, Some(Duration::from_millis(100)));
        assert_eq!(reply.gaps, vec![Duration::from_millis(100)]);
        assert_eq!(reply.retrieval.as_deref(), Some("accepted"));
        let kv = reply.timings.and_then(|t| t.kv).unwrap();
        assert_eq!((kv.memory_hits, kv.disk_hits), (3, 2));

        let mut failed = AnswerReply::default();
        let error =
            r#"{"error":{"message":"overloaded","type":"server_error","code":"overloaded"}}"#;
        assert!(failed.take(error, start, start, &mut None).is_err());
    }
}
