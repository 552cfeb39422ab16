//! [`KvPool`]: an [`LmBackend`] that sends generation to a pool of KV workers over gRPC.
//! Retrieved documents go as chunk ids of the edge's corpus version (the worker reads their
//! stored KV and tokens, never tokenizing the text again); documents without an id go as
//! text. The worker tried first is the one that owns most of the request's chunks
//! ([`crate::routing`], so their KV is in its memory) or, round robin, the next in turn. A
//! worker that is down or full is skipped for the next one; a refusal (unknown chunk, corpus
//! version not held, context too long) is the answer's error, not retried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_client::KvGenerationClient;
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, AnswerTimings, BackendInfo, LmBackend, RagError,
};
use tokio::runtime::Handle;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use crate::conversions::{mode_proto, variant_proto};
use crate::fusion::FusionSettings;
use crate::routing::{KvRouting, route};
use crate::store::Variant;

/// How long a connection attempt to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct Worker {
    endpoint: String,
    client: KvGenerationClient<Channel>,
}

pub struct KvPool {
    workers: Vec<Worker>,
    /// The workers as configured (`host:port`): the names chunks are assigned by, the same on
    /// every edge given the same list.
    names: Vec<String>,
    routing: KvRouting,
    corpus_version: String,
    settings: FusionSettings,
    variant: Variant,
    /// The worker the next request starts at (round robin).
    next: AtomicUsize,
    /// The runtime the gRPC calls run on; [`LmBackend::answer`] blocks on it, so it is called
    /// from a blocking thread, as the edge does.
    runtime: Handle,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool")
            .field(
                "workers",
                &self.workers.iter().map(|w| &w.endpoint).collect::<Vec<_>>(),
            )
            .field("corpus_version", &self.corpus_version)
            .finish()
    }
}

fn failure(endpoint: &str, status: Status) -> RagError {
    RagError::Worker {
        endpoint: endpoint.to_string(),
        retryable: matches!(
            status.code(),
            Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded
        ),
        source: Box::new(status),
    }
}

impl KvPool {
    /// Clients of the workers at `authorities` (`host:port`), over TLS when `tls` is given,
    /// answering over `corpus_version`'s chunks. Connects on first use; call within a tokio
    /// runtime.
    pub fn connect_lazy(
        authorities: &[String],
        tls: Option<ClientTlsConfig>,
        corpus_version: String,
        settings: FusionSettings,
        variant: Variant,
        routing: KvRouting,
    ) -> Result<Self, RagError> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let workers = authorities
            .iter()
            .map(|authority| {
                let endpoint = format!("{scheme}://{authority}");
                let invalid = |source: tonic::transport::Error| RagError::Worker {
                    endpoint: endpoint.clone(),
                    retryable: false,
                    source: Box::new(source),
                };
                let mut channel = Endpoint::from_shared(endpoint.clone())
                    .map_err(invalid)?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true);
                if let Some(tls) = &tls {
                    channel = channel.tls_config(tls.clone()).map_err(invalid)?;
                }
                Ok(Worker {
                    client: KvGenerationClient::new(channel.connect_lazy()),
                    endpoint,
                })
            })
            .collect::<Result<Vec<_>, RagError>>()?;
        if workers.is_empty() {
            return Err(RagError::InvalidRequest {
                field: "kv_workers",
                message: "names no worker".into(),
            });
        }
        Ok(Self {
            workers,
            names: authorities.to_vec(),
            routing,
            corpus_version,
            settings,
            variant,
            next: AtomicUsize::new(0),
            runtime: Handle::current(),
        })
    }

    fn request_proto(&self, request: &AnswerRequest) -> pb::KvGenerateRequest {
        let chunks = request
            .documents
            .iter()
            .map(|d| pb::KvChunk {
                chunk: Some(match d.id {
                    Some(id) => pb::kv_chunk::Chunk::Id(id),
                    None => pb::kv_chunk::Chunk::Text(pb::KvTextChunk {
                        title: d.title.clone(),
                        text: d.text.clone(),
                    }),
                }),
            })
            .collect();
        pb::KvGenerateRequest {
            question: request.question.clone(),
            chunks,
            corpus_version: self.corpus_version.clone(),
            mode: mode_proto(self.settings.mode) as i32,
            recompute_ratio: Some(self.settings.ratio as f32),
            variant: variant_proto(self.variant) as i32,
            max_new_tokens: request.max_new_tokens as u32,
        }
    }

    async fn call(
        &self,
        worker: &Worker,
        request: pb::KvGenerateRequest,
        documents: usize,
        on_text: &mut dyn FnMut(&str),
        sent_text: &mut bool,
    ) -> Result<Answer, RagError> {
        let fail = |status| failure(&worker.endpoint, status);
        let mut events = worker
            .client
            .clone()
            .generate(request)
            .await
            .map_err(fail)?
            .into_inner();
        while let Some(event) = events.message().await.map_err(fail)? {
            match event.event {
                Some(pb::kv_generate_event::Event::Delta(text)) => {
                    *sent_text = true;
                    on_text(&text);
                }
                Some(pb::kv_generate_event::Event::Answer(answer)) => {
                    return Ok(answer_from_proto(answer, documents));
                }
                None => {}
            }
        }
        Err(fail(Status::internal("the stream ended before the answer")))
    }
}

fn answer_from_proto(answer: pb::KvGenerated, documents: usize) -> Answer {
    let t = answer.timings.unwrap_or_default();
    let us = Duration::from_micros;
    let prefill = us(t.load_us + t.assemble_us + t.select_us + t.recompute_us);
    Answer {
        text: answer.text,
        rationale: None,
        documents_used: (0..documents).collect(),
        drafts: Vec::new(),
        timings: AnswerTimings {
            prefill,
            first_token: us(t.first_token_us),
            decode: us(t.total_us.saturating_sub(t.first_token_us)),
            verify: Duration::ZERO,
            total: us(t.total_us),
        },
        prompt_tokens: answer.context_tokens as usize,
        generated_tokens: answer.generated_tokens as usize,
    }
}

impl LmBackend for KvPool {
    fn answer(
        &self,
        request: &AnswerRequest,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Answer, RagError> {
        request.validate()?;
        if request.mode == AnswerMode::Speculative {
            return Err(RagError::InvalidRequest {
                field: "mode",
                message: "speculative answers need `lm_model` or `lm_worker`; KV workers \
                          answer in standard mode"
                    .into(),
            });
        }
        let wire = self.request_proto(request);
        let ids: Vec<u64> = request.documents.iter().filter_map(|d| d.id).collect();
        let order: Vec<usize> = match self.routing {
            KvRouting::KvAware if !ids.is_empty() => route(&self.names, &ids),
            _ => {
                let first = self.next.fetch_add(1, Ordering::Relaxed);
                (0..self.workers.len())
                    .map(|i| (first + i) % self.workers.len())
                    .collect()
            }
        };
        let mut last = None;
        for index in order {
            let worker = &self.workers[index];
            let _span = tracing::info_span!("kv_generate", endpoint = %worker.endpoint).entered();
            let mut sent_text = false;
            match self.runtime.block_on(self.call(
                worker,
                wire.clone(),
                request.documents.len(),
                on_text,
                &mut sent_text,
            )) {
                // Text already streamed cannot be taken back: no retry after it.
                Err(error) if error.is_retryable() && !sent_text => {
                    tracing::warn!(%error, "KV worker unavailable, trying the next");
                    last = Some(error);
                }
                outcome => return outcome,
            }
        }
        Err(last.unwrap_or_else(|| RagError::InvalidRequest {
            field: "kv_workers",
            message: "names no worker".into(),
        }))
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            drafter: "none (KV workers answer in standard mode)".into(),
            verifier: format!(
                "KV workers ({}, {:?}), {} at {:.0}%, corpus version {}",
                self.workers
                    .iter()
                    .map(|w| w.endpoint.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.routing,
                self.settings.mode.name(),
                self.settings.ratio * 100.0,
                self.corpus_version
            ),
            device: "remote".into(),
        }
    }
}
