//! `Edge.Answer`, the gRPC twin of `POST /v1/answer`: the retrieved documents, then the
//! answer's text as it is generated, then the whole answer, as a stream of events.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use hasten_proto::v1 as pb;
use hasten_rag::AnswerMode;
use hasten_worker_api::generation::{draft_proto, micros, mode_from_proto, mode_proto};
use tonic::Status;

use crate::api::answer::{AnswerBody, ModeJson, StopJson};
use crate::api::json::{DocumentJson, OutcomeJson};
use crate::api::{EdgeError, InvalidArgument};
use crate::http::answer::finish_reason;
use crate::retrieval::Outcome;
use crate::service::answer::{AnswerEvent, AnswerService, Answered};

pub type AnswerEvents = Pin<Box<dyn Stream<Item = Result<pb::AnswerEvent, Status>> + Send>>;

/// The request as the JSON API's body, so that both are validated by one function.
fn body_from_proto(request: pb::AnswerRequest) -> Result<AnswerBody, InvalidArgument> {
    let mode = mode_from_proto(request.mode)
        .map_err(|error| InvalidArgument::new(error.field, error.message))?;
    Ok(AnswerBody {
        question: Some(request.question),
        k: request.k.map(i64::from),
        mode: match mode {
            AnswerMode::Standard => ModeJson::Standard,
            AnswerMode::Speculative => ModeJson::Speculative,
        },
        max_tokens: request.max_tokens.map(i64::from),
        stream: true,
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed,
        stop: (!request.stop.is_empty()).then_some(StopJson::Many(request.stop)),
    })
}

fn outcome(outcome: Outcome) -> pb::Outcome {
    pb::Outcome::from(match outcome {
        Outcome::Accepted => OutcomeJson::Accepted,
        Outcome::Fallback => OutcomeJson::Fallback,
    })
}

fn event_of(event: pb::answer_event::Event) -> pb::AnswerEvent {
    pb::AnswerEvent { event: Some(event) }
}

/// An answer as the gRPC API returns it.
pub fn response_proto(answered: Answered) -> pb::AnswerResponse {
    let first_token = answered.first_token();
    let total = answered.total();
    let Answered {
        retrieval,
        answer,
        mode,
        query,
        notes,
        retrieve,
        queued,
    } = answered;
    let t = answer.timings;
    let index = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
    pb::AnswerResponse {
        answer: answer.text,
        mode: mode_proto(mode) as i32,
        retrieval: outcome(retrieval.outcome) as i32,
        documents: retrieval
            .documents
            .into_iter()
            .map(|d| pb::Document::from(DocumentJson::from(d)))
            .collect(),
        used: answer.documents_used.into_iter().map(index).collect(),
        rationale: answer.rationale,
        drafts: answer.drafts.into_iter().map(draft_proto).collect(),
        prompt_tokens: answer.prompt_tokens as u64,
        generated_tokens: answer.generated_tokens as u64,
        finish_reason: finish_reason(answer.finish).into(),
        draft_prompt_tokens: answer.drafting.prompt_tokens as u64,
        draft_generated_tokens: answer.drafting.generated_tokens as u64,
        query,
        notes,
        timings: Some(pb::AnswerTimings {
            retrieve_us: micros(retrieve),
            queue_us: micros(queued),
            prefill_us: micros(t.prefill),
            first_token_us: micros(first_token),
            decode_us: micros(t.decode),
            verify_us: micros(t.verify),
            total_us: micros(total),
        }),
    }
}

/// Checks, retrieves and admits (any refusal is the call's status), then streams the
/// answer; a client that cancels the call drops the stream and so the generation.
pub async fn answer_events(
    service: &AnswerService,
    authorization: Option<&str>,
    timeout: Result<Option<Duration>, InvalidArgument>,
    request: pb::AnswerRequest,
) -> Result<AnswerEvents, EdgeError> {
    let input = body_from_proto(request)
        .and_then(|body| service.validate(body))
        .map_err(EdgeError::from);
    let prepared = service.prepare(authorization, timeout, input).await?;
    let events = service.stream(prepared).await?.map(|event| match event {
        AnswerEvent::Documents(retrieval) => Ok(event_of(pb::answer_event::Event::Documents(
            pb::RetrievedDocuments {
                outcome: outcome(retrieval.outcome) as i32,
                documents: retrieval
                    .documents
                    .into_iter()
                    .map(|d| pb::Document::from(DocumentJson::from(d)))
                    .collect(),
            },
        ))),
        AnswerEvent::Delta(text) => Ok(event_of(pb::answer_event::Event::Delta(text))),
        AnswerEvent::Done(answered) => Ok(event_of(pb::answer_event::Event::Answer(
            response_proto(*answered),
        ))),
        AnswerEvent::Failed(error) => Err(Status::from(error)),
    });
    Ok(events.boxed())
}
