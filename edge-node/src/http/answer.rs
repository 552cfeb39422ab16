//! `POST /v1/answer` over HTTP: a JSON reply, or server-sent events when the body asks to
//! `stream` (`documents` first, then `delta` events with the answer's text, then `answer`
//! with the whole reply, or `error`).

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use hasten_rag::Finish;

use crate::api::EdgeError;
use crate::api::answer::{
    AnswerBody, AnswerReply, AnswerTimingsJson, DraftJson, DraftingJson, KvStagesJson, ModeJson,
};
use crate::api::conversions::error_json;
use crate::api::json::{DocumentJson, OutcomeJson, parse_json_object};
use crate::http::{BodyLimits, client_timeout, read_json_bytes};
use crate::retrieval::Outcome;
use crate::service::answer::{AnswerEvent, AnswerInput, AnswerService, Answered};

#[derive(Clone)]
struct AnswerState {
    service: AnswerService,
    body: BodyLimits,
}

/// `POST /v1/answer`.
pub fn answer_routes(service: AnswerService, body: BodyLimits) -> Router {
    Router::new()
        .route("/v1/answer", post(answer))
        .with_state(AnswerState { service, body })
}

async fn answer(State(state): State<AnswerState>, headers: HeaderMap, body: Body) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let parsed = read_answer_input(&state, &headers, body).await;
    let stream = parsed.as_ref().is_ok_and(|(_, stream)| *stream);
    let input = parsed.map(|(input, _)| input);
    let prepared = match state
        .service
        .prepare(authorization, client_timeout(&headers), input)
        .await
    {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    let events = match state.service.stream(prepared).await {
        Ok(events) => events,
        Err(error) => return error.into_response(),
    };
    if !stream {
        return match events.answered().await {
            Ok(answered) => axum::Json(reply(answered)).into_response(),
            Err(error) => error.into_response(),
        };
    }
    let events = events.map(|event| {
        Ok::<_, Infallible>(match event {
            AnswerEvent::Documents(retrieval) => {
                let documents: Vec<DocumentJson> = retrieval
                    .documents
                    .into_iter()
                    .map(DocumentJson::from)
                    .collect();
                json_event("documents", &documents)
            }
            AnswerEvent::Delta(text) => json_event("delta", &serde_json::json!({ "text": text })),
            AnswerEvent::Done(answered) => json_event("answer", &reply(*answered)),
            AnswerEvent::Failed(error) => json_event("error", &error_json(&error)),
        })
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

fn json_event<T: serde::Serialize>(name: &str, value: &T) -> Event {
    Event::default()
        .event(name)
        .json_data(value)
        .unwrap_or_else(|_| Event::default().event("error").data("unserialisable event"))
}

/// The request body, parsed and validated: the input and whether to stream.
async fn read_answer_input(
    state: &AnswerState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(AnswerInput, bool), EdgeError> {
    let bytes = read_json_bytes(headers, body, state.body).await?;
    let body: AnswerBody = parse_json_object(&bytes)?;
    let stream = body.stream;
    Ok((state.service.validate(body)?, stream))
}

/// `finish_reason` as OpenAI names it.
pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How an answer's retrieval went.
pub fn outcome(answered: &Answered) -> OutcomeJson {
    match answered.retrieval.outcome {
        Outcome::Accepted => OutcomeJson::Accepted,
        Outcome::Fallback => OutcomeJson::Fallback,
    }
}

/// Where an answer's time went, as the JSON API reports it.
pub fn timings(answered: &Answered) -> AnswerTimingsJson {
    let t = &answered.answer.timings;
    AnswerTimingsJson {
        retrieve_ms: millis(answered.retrieve),
        queue_ms: millis(answered.queued),
        prefill_ms: millis(t.prefill),
        first_token_ms: millis(answered.first_token()),
        decode_ms: millis(t.decode),
        verify_ms: millis(t.verify),
        total_ms: millis(answered.total()),
        kv: t.kv.map(|kv| KvStagesJson {
            queue_ms: millis(kv.queue),
            load_ms: millis(kv.load),
            assemble_ms: millis(kv.assemble),
            select_ms: millis(kv.select),
            recompute_ms: millis(kv.recompute),
            memory_hits: kv.memory_hits,
            disk_hits: kv.disk_hits,
            computed_chunks: kv.computed_chunks,
            recomputed_tokens: kv.recomputed_tokens,
        }),
    }
}

/// An answer as the JSON API returns it.
pub fn reply(answered: Answered) -> AnswerReply {
    let timings = timings(&answered);
    let retrieval = outcome(&answered);
    let Answered {
        retrieval: retrieved,
        answer,
        mode,
        query,
        notes,
        ..
    } = answered;
    AnswerReply {
        answer: answer.text,
        mode: match mode {
            hasten_rag::AnswerMode::Standard => ModeJson::Standard,
            hasten_rag::AnswerMode::Speculative => ModeJson::Speculative,
        },
        retrieval,
        documents: retrieved
            .documents
            .into_iter()
            .map(DocumentJson::from)
            .collect(),
        used: answer.documents_used,
        rationale: answer.rationale,
        drafts: answer
            .drafts
            .into_iter()
            .map(|d| DraftJson {
                documents: d.documents,
                rationale: d.rationale,
                answer: d.answer,
                draft_logprob: d.draft_logprob,
                consistency_logprob: d.consistency_logprob,
                reflection_logprob: d.reflection_logprob,
                score: d.score,
            })
            .collect(),
        prompt_tokens: answer.prompt_tokens,
        generated_tokens: answer.generated_tokens,
        finish_reason: finish_reason(answer.finish).into(),
        drafting: (mode == hasten_rag::AnswerMode::Speculative).then_some(DraftingJson {
            prompt_tokens: answer.drafting.prompt_tokens,
            generated_tokens: answer.drafting.generated_tokens,
        }),
        query,
        dropped_turns: answer.dropped_turns,
        notes,
        timings,
    }
}
