//! Iterative RAG (`POST /v1/ralm`) on this edge's language model, retrieving from the cloud
//! every few generated tokens: sequentially (`ralm-seq`) or with RaLMSpec (hasten-spec-
//! retrieval: the request's own document cache speculates, the cloud verifies a stride of
//! retrievals in one batched search, generation rolls back to the first mismatch), whose
//! answer is the sequential one token for token. The reply carries the speculation's
//! statistics.

use hasten_spec_retrieval::ralm::{
    LocalDocumentCache, Os3Settings, RalmGenerator, RalmOutput, RalmSettings, RalmStepper,
    SpeculationSettings, SpeculationStats, Stride, run_sequential, run_speculative,
};
use hasten_spec_retrieval::{ExactRetriever, RetrievedDocument};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::AnswerService;
use super::iterative::{
    Cancellable, EngineHandle, IterativeModel, RunContext, edge_error, retrieved,
};
use crate::api::{EdgeError, InvalidArgument};
use crate::fallback::CloudSearch;
use crate::retrieval::EngineError;
use crate::tenants::Tenant;

/// How many retrievals RaLMSpec speculates before verifying: a number, or `os3`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StrideJson {
    Fixed(u32),
    Named(String),
}

/// `POST /v1/ralm` body. Without `speculation` settings the paper's RaLMSpec+PSA runs.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RalmBody {
    pub question: Option<String>,
    pub max_tokens: Option<i64>,
    /// `false`: retrieve from the cloud before every step (`ralm-seq`).
    pub speculate: Option<bool>,
    pub stride: Option<StrideJson>,
    /// Documents of each cloud answer put into the request's cache (1: no prefetching).
    pub prefetch: Option<u32>,
    /// Run the next step while a verification is in flight.
    pub asynchronous: Option<bool>,
}

/// A validated `/v1/ralm` request.
#[derive(Clone, Debug, PartialEq)]
pub struct RalmInput {
    pub question: String,
    pub max_tokens: usize,
    /// `None`: sequential.
    pub speculation: Option<SpeculationSettings>,
}

/// Most documents a cloud answer may put into the cache (the paper prefetches 20).
const MAX_PREFETCH: u32 = 100;
/// Largest fixed stride.
const MAX_STRIDE: u32 = 64;

impl AnswerService {
    /// Checks a `/v1/ralm` body; errors name the field.
    pub fn validate_ralm(&self, body: RalmBody) -> Result<RalmInput, InvalidArgument> {
        let question = self.validate(crate::api::answer::AnswerBody {
            question: body.question,
            max_tokens: body
                .max_tokens
                .or(Some(RalmSettings::default().max_new_tokens as i64)),
            ..Default::default()
        })?;
        if body.speculate == Some(false) {
            if body.stride.is_some() || body.prefetch.is_some() || body.asynchronous.is_some() {
                return Err(InvalidArgument::new(
                    "speculate",
                    "is false: stride, prefetch and asynchronous do not apply",
                ));
            }
            return Ok(RalmInput {
                question: question.question,
                max_tokens: question.max_tokens,
                speculation: None,
            });
        }
        let all = SpeculationSettings::all_techniques();
        let stride = match body.stride {
            None => all.stride,
            Some(StrideJson::Fixed(s)) if (1..=MAX_STRIDE).contains(&s) => {
                Stride::Fixed(s as usize)
            }
            Some(StrideJson::Named(name)) if name == "os3" => Stride::Os3(Os3Settings::default()),
            Some(other) => {
                return Err(InvalidArgument::new(
                    "stride",
                    format!("must be 1-{MAX_STRIDE} or \"os3\", got {other:?}"),
                ));
            }
        };
        let prefetch = match body.prefetch {
            None => all.prefetch,
            Some(n) if (1..=MAX_PREFETCH).contains(&n) => n as usize,
            Some(n) => {
                return Err(InvalidArgument::new(
                    "prefetch",
                    format!("must be 1-{MAX_PREFETCH}, got {n}"),
                ));
            }
        };
        Ok(RalmInput {
            question: question.question,
            max_tokens: question.max_tokens,
            speculation: Some(SpeculationSettings {
                stride,
                prefetch,
                asynchronous: body.asynchronous.unwrap_or(all.asynchronous),
            }),
        })
    }

    /// Runs one iterative-RAG request on the iterative model, behind the answers' queue.
    pub async fn ralm(&self, tenant: &Tenant, input: RalmInput) -> Result<RalmReply, EdgeError> {
        let span = tracing::info_span!(
            "ralm",
            speculate = input.speculation.is_some(),
            max_tokens = input.max_tokens
        );
        let (output, queued_ms) = self
            .on_iterative_model(tenant, move |context| run(context, &input))
            .instrument(span)
            .await?;
        Ok(RalmReply::new(output, queued_ms))
    }
}

fn run(context: RunContext<'_>, input: &RalmInput) -> Result<RalmOutput, EdgeError> {
    let settings = RalmSettings {
        max_new_tokens: input.max_tokens,
        ..RalmSettings::default()
    };
    let generator: Box<dyn RalmStepper + '_> = match context.model {
        IterativeModel::Local(model) => {
            Box::new(RalmGenerator::new(model, &input.question, settings).map_err(edge_error)?)
        }
        IterativeModel::Engine(engine) => {
            Box::new(engine.ralm(&input.question, settings).map_err(edge_error)?)
        }
    };
    let generator = Cancellable {
        inner: generator.as_ref(),
        departure: context.departure,
    };
    let cloud = CloudRetriever(context.engine);
    let encoder = context.service.encoder().as_ref();
    match &input.speculation {
        None => run_sequential(&generator, encoder, &cloud),
        Some(speculation) => run_speculative(
            &generator,
            encoder,
            &cloud,
            &mut LocalDocumentCache::new(),
            speculation,
        ),
    }
    .map_err(edge_error)
}

/// The cloud as RaLM's exact retriever: one batched search per call.
struct CloudRetriever(EngineHandle);

impl ExactRetriever for CloudRetriever {
    type Error = EngineError;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> Result<Vec<Vec<RetrievedDocument>>, EngineError> {
        let queries = queries.to_vec();
        let results = self.0.block_on(move |engine| async move {
            engine.cloud().search_batch(&queries, k, None).await
        })??;
        Ok(results
            .into_iter()
            .map(|documents| documents.into_iter().map(retrieved).collect())
            .collect())
    }
}

/// `POST /v1/ralm` reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RalmReply {
    pub answer: String,
    pub tokens: usize,
    /// The document each generation step read, in order.
    pub documents: Vec<u64>,
    /// RaLMSpec's statistics; absent for a sequential run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationStats>,
    pub timings: RalmTimingsJson,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct RalmTimingsJson {
    pub queue_ms: f64,
    pub generation_ms: f64,
    /// Waiting for the cloud (what no generation step overlapped).
    pub retrieval_wait_ms: f64,
    pub encoding_ms: f64,
    pub total_ms: f64,
}

impl RalmReply {
    fn new(output: RalmOutput, queue_ms: f64) -> Self {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Self {
            answer: output.text,
            tokens: output.tokens.len(),
            documents: output.documents,
            speculation: output.speculation,
            timings: RalmTimingsJson {
                queue_ms,
                generation_ms: ms(output.timings.generation),
                retrieval_wait_ms: ms(output.timings.retrieval_wait),
                encoding_ms: ms(output.timings.encoding),
                total_ms: queue_ms + ms(output.timings.total),
            },
        }
    }
}
