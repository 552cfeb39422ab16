//! `Edge.Answer`, the gRPC twin of `POST /v1/answer`: the retrieved documents, then the
//! answer's text as it is generated, then the whole answer, as a stream of events.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use futures::stream::{self, StreamExt};
use hasten_lm_worker::conversions::{draft_proto, micros, mode_from_proto, mode_proto};
use hasten_proto::v1 as pb;
use hasten_rag::AnswerMode;
use tokio::sync::mpsc;
use tonic::Status;

use super::json::{AnswerBody, ModeJson};
use super::{AnswerService, Answered};
use crate::api::json::{DocumentJson, OutcomeJson};
use crate::api::{EdgeError, InvalidArgument};
use crate::retrieval::Outcome;

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
    })
}

fn outcome(outcome: Outcome) -> pb::Outcome {
    pb::Outcome::from(match outcome {
        Outcome::Accepted => OutcomeJson::Accepted,
        Outcome::Fallback => OutcomeJson::Fallback,
    })
}

fn event(event: pb::answer_event::Event) -> pb::AnswerEvent {
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

/// Checks and retrieves (any refusal is the call's status), then streams the answer.
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
    let documents = pb::RetrievedDocuments {
        documents: prepared
            .retrieval
            .documents
            .iter()
            .cloned()
            .map(|d| pb::Document::from(DocumentJson::from(d)))
            .collect(),
        outcome: outcome(prepared.retrieval.outcome) as i32,
    };
    let (sender, receiver) = mpsc::unbounded_channel();
    let service = service.clone();
    let finished = tokio::spawn(async move { service.generate(prepared, Some(sender)).await });
    let head =
        stream::once(async move { Ok(event(pb::answer_event::Event::Documents(documents))) });
    let deltas = stream::unfold(receiver, |mut receiver| async move {
        let text = receiver.recv().await?;
        Some((Ok(event(pb::answer_event::Event::Delta(text))), receiver))
    });
    let tail = stream::once(async move {
        match finished.await {
            Ok(Ok(answered)) => Ok(event(pb::answer_event::Event::Answer(response_proto(
                answered,
            )))),
            Ok(Err(error)) => Err(Status::from(error)),
            Err(join) => Err(Status::from(EdgeError::TaskFailed(join))),
        }
    });
    Ok(head.chain(deltas).chain(tail).boxed())
}
