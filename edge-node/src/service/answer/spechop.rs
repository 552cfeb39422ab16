//! Multi-hop RAG (`POST /v1/spechop`): a multi-hop agent on this edge's language model (a sub-query, its
//! documents and a one-line sub-answer per hop, then the answer), sequential or with
//! SpecHop (hasten-spec-retrieval): while a hop's exact retrieval is in flight at the cloud,
//! the agent goes on from the edge's own guess, HaS's draft (cache and fuzzy channels
//! re-ranked exactly, whatever the homology verdict), up to `threads` hops ahead. The strict
//! verifier commits a hop only when the cloud returned the same documents in the same order,
//! so the answer is the sequential agent's. Every hop's exact result enters the edge's hot
//! cache as a fallback's does, so later sub-queries, from this request or another, are
//! guessed from it.

use std::sync::Arc;

use hasten_spec_retrieval::hop::{
    Hop, HopAgent, HopOutcome, HopSettings, HopSpeculator, HopStats, LmHopAgent, Verifier,
    run_sequential_agent, run_spechop,
};
use hasten_spec_retrieval::{ExactRetriever, RetrievedDocument};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::AnswerService;
use super::iterative::{
    Cancellable, EngineHandle, IterativeModel, RunContext, edge_error, retrieved,
};
use crate::api::{EdgeError, InvalidArgument};
use crate::retrieval::{EngineError, StageTimings};
use crate::tenants::Tenant;

/// `POST /v1/spechop` body. Without settings, SpecHop with 3 threads and the strict
/// verifier over two hops of 3 documents (HotpotQA's two-hop questions).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecHopBody {
    pub question: Option<String>,
    /// `false`: the sequential agent, waiting for every retrieval.
    pub speculate: Option<bool>,
    /// Most hops awaiting verification at once (SpecHop's k).
    pub threads: Option<u32>,
    /// `strict` (identical ordered documents: lossless) or `jaccard` (token-set Jaccard of
    /// the sub-answers, SpecHop's rule-based verifier: may diverge).
    pub verifier: Option<String>,
    /// With `jaccard`: the least similarity that commits a hop.
    pub jaccard_threshold: Option<f64>,
    /// Hops before the agent answers.
    pub hops: Option<u32>,
    /// Documents retrieved per hop.
    pub documents: Option<u32>,
}

/// A validated `/v1/spechop` request.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecHopInput {
    pub question: String,
    pub settings: HopSettings,
    /// Threads and verifier; `None`: sequential.
    pub speculation: Option<(usize, Verifier)>,
}

const DEFAULT_THREADS: u32 = 3;
const MAX_THREADS: u32 = 8;
const DEFAULT_HOPS: u32 = 2;
const MAX_HOPS: u32 = 6;
const DEFAULT_DOCUMENTS: u32 = 3;
const MAX_DOCUMENTS: u32 = 10;
/// The SpecHop evaluation's threshold.
const DEFAULT_JACCARD: f64 = 0.5;

fn bounded(
    field: &str,
    value: Option<u32>,
    default: u32,
    max: u32,
) -> Result<usize, InvalidArgument> {
    match value.unwrap_or(default) {
        n if (1..=max).contains(&n) => Ok(n as usize),
        n => Err(InvalidArgument::new(
            field,
            format!("must be 1-{max}, got {n}"),
        )),
    }
}

impl AnswerService {
    /// Checks a `/v1/spechop` body; errors name the field.
    pub fn validate_spechop(&self, body: SpecHopBody) -> Result<SpecHopInput, InvalidArgument> {
        let question = self
            .validate(crate::api::answer::AnswerBody {
                question: body.question,
                ..Default::default()
            })?
            .question;
        let settings = HopSettings {
            k_documents: bounded(
                "documents",
                body.documents,
                DEFAULT_DOCUMENTS,
                MAX_DOCUMENTS,
            )?,
            max_hops: bounded("hops", body.hops, DEFAULT_HOPS, MAX_HOPS)?,
        };
        if body.speculate == Some(false) {
            if body.threads.is_some() || body.verifier.is_some() || body.jaccard_threshold.is_some()
            {
                return Err(InvalidArgument::new(
                    "speculate",
                    "is false: threads, verifier and jaccard_threshold do not apply",
                ));
            }
            return Ok(SpecHopInput {
                question,
                settings,
                speculation: None,
            });
        }
        let threads = bounded("threads", body.threads, DEFAULT_THREADS, MAX_THREADS)?;
        let verifier = match (body.verifier.as_deref(), body.jaccard_threshold) {
            (None | Some("strict"), None) => Verifier::Strict,
            (None | Some("strict"), Some(_)) => {
                return Err(InvalidArgument::new(
                    "jaccard_threshold",
                    "applies only with \"verifier\": \"jaccard\"",
                ));
            }
            (Some("jaccard"), threshold) => {
                let threshold = threshold.unwrap_or(DEFAULT_JACCARD);
                if !(0.0..=1.0).contains(&threshold) {
                    return Err(InvalidArgument::new(
                        "jaccard_threshold",
                        format!("must be within [0, 1], got {threshold}"),
                    ));
                }
                Verifier::Jaccard(threshold)
            }
            (Some(other), _) => {
                return Err(InvalidArgument::new(
                    "verifier",
                    format!("must be \"strict\" or \"jaccard\", got {other:?}"),
                ));
            }
        };
        Ok(SpecHopInput {
            question,
            settings,
            speculation: Some((threads, verifier)),
        })
    }

    /// Runs one multi-hop request on the local model, behind the answers' queue.
    pub async fn spechop(
        &self,
        tenant: Tenant,
        input: SpecHopInput,
    ) -> Result<SpecHopReply, EdgeError> {
        let span = tracing::info_span!(
            "spechop",
            speculate = input.speculation.is_some(),
            hops = input.settings.max_hops
        );
        let started = std::time::Instant::now();
        let (outcome, queued_ms) = self
            .on_iterative_model(&tenant.clone(), move |context| run(context, tenant, &input))
            .instrument(span)
            .await?;
        Ok(SpecHopReply {
            answer: outcome.answer,
            hops: outcome.hops,
            speculation: outcome.speculation,
            timings: SpecHopTimingsJson {
                queue_ms: queued_ms,
                total_ms: started.elapsed().as_secs_f64() * 1e3,
            },
        })
    }
}

fn run(
    context: RunContext<'_>,
    tenant: Tenant,
    input: &SpecHopInput,
) -> Result<HopOutcome, EdgeError> {
    let agent: Box<dyn HopAgent + '_> = match context.model {
        IterativeModel::Local(model) => Box::new(LmHopAgent::new(model, input.settings.max_hops)),
        IterativeModel::Engine(engine) => Box::new(
            engine
                .hop_agent(input.settings.max_hops)
                .map_err(edge_error)?,
        ),
    };
    let agent = Cancellable {
        inner: agent.as_ref(),
        departure: context.departure,
    };
    let engine = context.engine;
    let encoder = context.service.encoder().as_ref();
    let exact: Arc<dyn ExactRetriever<Error = EngineError>> = Arc::new(CachingCloudRetriever {
        engine: engine.clone(),
        tenant: tenant.clone(),
    });
    match input.speculation {
        None => run_sequential_agent(
            &agent,
            &input.question,
            encoder,
            exact.as_ref(),
            &input.settings,
        ),
        Some((threads, verifier)) => run_spechop(
            &agent,
            &input.question,
            encoder,
            &exact,
            &mut DraftSpeculator { engine, tenant },
            &input.settings,
            threads,
            verifier,
        ),
    }
    .map_err(edge_error)
}

/// The cloud as the agent's exact retriever, each result cached for the tenant.
struct CachingCloudRetriever {
    engine: EngineHandle,
    tenant: Tenant,
}

impl ExactRetriever for CachingCloudRetriever {
    type Error = EngineError;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> Result<Vec<Vec<RetrievedDocument>>, EngineError> {
        queries
            .iter()
            .map(|query| {
                let (tenant, vector) = (self.tenant.clone(), query.clone());
                let documents = self.engine.block_on(move |engine| async move {
                    let mut timings = StageTimings::default();
                    engine
                        .exact_from_cloud(&tenant, None, vector, k, None, &mut timings)
                        .await
                })??;
                Ok(documents.into_iter().map(retrieved).collect())
            })
            .collect()
    }
}

/// HaS's draft as the guess: the tenant's cache channel and the fuzzy channel, re-ranked by
/// exact inner product, top k; empty when neither found anything.
struct DraftSpeculator {
    engine: EngineHandle,
    tenant: Tenant,
}

impl HopSpeculator for DraftSpeculator {
    type Error = EngineError;

    fn speculate(
        &mut self,
        query: &[f32],
        k: usize,
    ) -> Result<Vec<RetrievedDocument>, EngineError> {
        let speculation = self.engine.engine.speculate(
            &self.tenant,
            query,
            k,
            false,
            &mut StageTimings::default(),
        )?;
        Ok(speculation
            .draft
            .into_iter()
            .take(k)
            .map(|(score, document)| RetrievedDocument {
                id: document.id,
                score,
                title: document.title.as_str().into(),
                text: document.text.as_str().into(),
                vector: document.vector.as_slice().into(),
            })
            .collect())
    }
}

/// `POST /v1/spechop` reply.
#[derive(Clone, Debug, Serialize)]
pub struct SpecHopReply {
    pub answer: String,
    /// The committed trajectory: what the sequential agent did, under the strict verifier.
    pub hops: Vec<Hop>,
    /// SpecHop's statistics; absent for a sequential run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<HopStats>,
    pub timings: SpecHopTimingsJson,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct SpecHopTimingsJson {
    pub queue_ms: f64,
    pub total_ms: f64,
}
