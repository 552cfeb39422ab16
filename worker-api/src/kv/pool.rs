//! [`KvPool`]: an [`LmBackend`] that sends generation to a pool of KV workers over gRPC.
//! Retrieved documents go as chunk ids of the edge's corpus version (the worker reads their
//! stored KV and tokens, never tokenizing the text again); documents without an id go as
//! text. The worker tried first is the one that owns most of the request's chunks
//! ([`super::routing`], so their KV is in its memory) or, round robin, the next in turn. A
//! worker that is down or full is skipped for the next one; a refusal (unknown chunk, corpus
//! version not held, context too long) is the answer's error, not retried. The members can
//! change while serving ([`KvPool::set_workers`]: an operator's assignment through the
//! control plane); a request keeps the members it started with.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hasten_proto::grpc_client_tls::GrpcClientTls;
use hasten_proto::v1 as pb;
use hasten_proto::v1::kv_generation_client::KvGenerationClient;
use hasten_proto::worker::{lazy_channel, worker_uri};
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, AnswerSink, AnswerTimings, BackendInfo, DraftingTokens,
    Finish, KvStages, LmBackend, RagError,
};
use parking_lot::RwLock;
use tokio::runtime::Handle;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::routing::{KvRouting, route};
use super::{FusionSettings, Variant, mode_proto, variant_proto};

/// How often a call in flight looks whether its caller went away.
const CANCEL_CHECK: Duration = Duration::from_millis(50);

struct Worker {
    endpoint: String,
    client: KvGenerationClient<Channel>,
}

/// The workers a request is sent among.
struct Members {
    workers: Vec<Worker>,
    /// The workers as given (`host:port`): the names chunks are assigned by, the same on
    /// every edge given the same list.
    names: Vec<String>,
}

pub struct KvPool {
    members: RwLock<Arc<Members>>,
    tls: Option<GrpcClientTls>,
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
            .field("workers", &self.workers())
            .field("corpus_version", &self.corpus_version)
            .finish()
    }
}

/// Clients of the workers at `authorities`, reusing those of `known` with the same address.
fn connect_members(
    authorities: &[String],
    tls: Option<&GrpcClientTls>,
    known: &[Worker],
) -> Result<Members, RagError> {
    let workers = authorities
        .iter()
        .map(|authority| {
            let endpoint = worker_uri(authority, tls.is_some());
            if let Some(worker) = known.iter().find(|w| w.endpoint == endpoint) {
                return Ok(Worker {
                    endpoint,
                    client: worker.client.clone(),
                });
            }
            let channel = lazy_channel(&endpoint, tls).map_err(|source| RagError::Worker {
                endpoint: endpoint.clone(),
                retryable: false,
                source: Box::new(source),
            })?;
            Ok(Worker {
                client: KvGenerationClient::new(channel),
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
    Ok(Members {
        workers,
        names: authorities.to_vec(),
    })
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
        tls: Option<GrpcClientTls>,
        corpus_version: String,
        settings: FusionSettings,
        variant: Variant,
        routing: KvRouting,
    ) -> Result<Self, RagError> {
        let members = connect_members(authorities, tls.as_ref(), &[])?;
        Ok(Self {
            members: RwLock::new(Arc::new(members)),
            tls,
            routing,
            corpus_version,
            settings,
            variant,
            next: AtomicUsize::new(0),
            runtime: Handle::current(),
        })
    }

    /// The workers' addresses, in the order chunks are assigned over them.
    pub fn workers(&self) -> Vec<String> {
        self.members.read().names.clone()
    }

    /// Replaces the members with the workers at `authorities` (keeping the connections of
    /// those that stay); returns whether anything changed. An empty list is refused: the
    /// pool keeps its members.
    pub fn set_workers(&self, authorities: &[String]) -> Result<bool, RagError> {
        let current = Arc::clone(&self.members.read());
        if current.names == authorities {
            return Ok(false);
        }
        let members = connect_members(authorities, self.tls.as_ref(), &current.workers)?;
        *self.members.write() = Arc::new(members);
        Ok(true)
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
        max_new_tokens: usize,
        sink: &mut dyn AnswerSink,
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
        let mut cancel_check = tokio::time::interval(CANCEL_CHECK);
        loop {
            // Dropping the stream cancels the call.
            let event = tokio::select! {
                event = events.message() => event.map_err(fail)?,
                _ = cancel_check.tick() => {
                    if sink.cancelled() {
                        return Err(RagError::Cancelled);
                    }
                    continue;
                }
            };
            let Some(event) = event else { break };
            match event.event {
                Some(pb::kv_generate_event::Event::Delta(text)) => {
                    *sent_text = true;
                    sink.text(&text);
                }
                Some(pb::kv_generate_event::Event::Answer(answer)) => {
                    return Ok(answer_from_proto(answer, documents, max_new_tokens));
                }
                None => {}
            }
        }
        Err(fail(Status::internal("the stream ended before the answer")))
    }
}

fn answer_from_proto(answer: pb::KvGenerated, documents: usize, max_new_tokens: usize) -> Answer {
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
            kv: Some(KvStages {
                queue: us(t.queue_us),
                load: us(t.load_us),
                assemble: us(t.assemble_us),
                select: us(t.select_us),
                recompute: us(t.recompute_us),
                memory_hits: answer.memory_hits,
                disk_hits: answer.disk_hits,
                computed_chunks: answer.computed_chunks,
                recomputed_tokens: answer.recomputed_tokens,
            }),
        },
        prompt_tokens: answer.context_tokens as usize,
        generated_tokens: answer.generated_tokens as usize,
        finish: if answer.generated_tokens as usize >= max_new_tokens {
            Finish::Length
        } else {
            Finish::Stop
        },
        drafting: DraftingTokens::default(),
        dropped_turns: 0,
    }
}

/// Refuses what KV workers cannot do: they answer in standard mode, greedily, from the
/// question alone (their prompt is assembled from stored document KV).
fn check_kv_request(request: &AnswerRequest) -> Result<(), RagError> {
    let refuse = |field: &'static str, message: &str| {
        Err(RagError::InvalidRequest {
            field,
            message: message.into(),
        })
    };
    if request.mode == AnswerMode::Speculative {
        return refuse(
            "mode",
            "speculative answers need `lm_model` or `lm_worker`; KV workers answer in \
             standard mode",
        );
    }
    if !request.conversation.is_empty() {
        return refuse(
            "messages",
            "holds system messages or earlier turns; KV workers answer the last user \
             message alone (send one user message, or use `lm_model`/`lm_worker`)",
        );
    }
    let decoding = &request.decoding;
    if decoding.temperature > 0.0 || decoding.top_p < 1.0 {
        return refuse(
            "temperature",
            "KV workers decode greedily: send temperature 0 and top_p 1",
        );
    }
    if !decoding.stop.is_empty() {
        return refuse("stop", "is not supported by KV workers");
    }
    Ok(())
}

impl LmBackend for KvPool {
    fn check(&self, request: &AnswerRequest) -> Result<(), RagError> {
        request.validate()?;
        check_kv_request(request)
    }

    fn serves(&self, mode: AnswerMode) -> bool {
        mode == AnswerMode::Standard
    }

    fn answer(
        &self,
        request: &AnswerRequest,
        sink: &mut dyn AnswerSink,
    ) -> Result<Answer, RagError> {
        self.check(request)?;
        let wire = self.request_proto(request);
        let ids: Vec<u64> = request.documents.iter().filter_map(|d| d.id).collect();
        let members = Arc::clone(&self.members.read());
        let order: Vec<usize> = match self.routing {
            KvRouting::KvAware if !ids.is_empty() => route(&members.names, &ids),
            _ => {
                let first = self.next.fetch_add(1, Ordering::Relaxed);
                (0..members.workers.len())
                    .map(|i| (first + i) % members.workers.len())
                    .collect()
            }
        };
        let mut last = None;
        for index in order {
            let worker = &members.workers[index];
            let _span = tracing::info_span!("kv_generate", endpoint = %worker.endpoint).entered();
            let mut sent_text = false;
            match self.runtime.block_on(self.call(
                worker,
                wire.clone(),
                request.documents.len(),
                request.max_new_tokens,
                sink,
                &mut sent_text,
            )) {
                // Text already streamed cannot be taken back: no retry after it.
                Err(error) if error.is_retryable() && !sent_text => {
                    tracing::warn!(error = %error.display_full(), "KV worker unavailable, trying the next");
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
                self.workers().join(", "),
                self.routing,
                self.settings.mode.name(),
                self.settings.ratio * 100.0,
                self.corpus_version
            ),
            device: "remote".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::kv::FusionMode;

    fn pool(workers: &[&str]) -> KvPool {
        let workers: Vec<String> = workers.iter().map(|w| w.to_string()).collect();
        KvPool::connect_lazy(
            &workers,
            None,
            "v1".into(),
            FusionSettings {
                mode: FusionMode::FusionRag,
                ratio: 0.15,
            },
            Variant::Similarity,
            KvRouting::KvAware,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn members_change_and_routing_follows_them() {
        let pool = pool(&["w-0:7510", "w-1:7510"]);
        let before = route(&pool.workers(), &[1, 2, 3]);
        assert!(
            !pool
                .set_workers(&["w-0:7510".into(), "w-1:7510".into()])
                .unwrap()
        );
        let three: Vec<String> = ["w-0:7510", "w-1:7510", "w-2:7510"]
            .map(String::from)
            .to_vec();
        assert!(pool.set_workers(&three).unwrap());
        assert_eq!(pool.workers(), three);
        assert_eq!(pool.members.read().workers.len(), 3);
        assert_eq!(before.len(), 2);
        assert_eq!(route(&pool.workers(), &[1, 2, 3]).len(), 3);
        assert!(pool.set_workers(&[]).is_err(), "an empty pool is refused");
        assert_eq!(pool.workers(), three, "and the members stay");
    }
}
