//! One answer as a stream of events, the same for every front end: the retrieved documents,
//! the answer's text as it is generated, then the whole answer or the failure. The stream
//! is handed out once the first text is written (a failure before it is the caller's
//! error, not an event). The generation runs in a task of its own and stops at its next
//! step once the stream is dropped (the client went away), giving its queue place back.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::Stream;
use hasten_rag::{AnswerSink, RagError};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{AnswerService, Answered, Prepared, generation_error, queue_error};
use crate::api::EdgeError;
use crate::retrieval::Retrieval;

/// What an answer's stream yields, in this order: `Documents` once, `Delta` any number of
/// times, then `Done` or `Failed`, last.
pub enum AnswerEvent {
    /// What the answer will be written from.
    Documents(Box<Retrieval>),
    /// The answer's next piece of text.
    Delta(String),
    Done(Box<Answered>),
    Failed(EdgeError),
}

/// The events of one answer; dropping it cancels the generation.
pub struct AnswerStream {
    /// Events read before the stream was handed out ([`AnswerStream::started`]), first.
    seen: VecDeque<AnswerEvent>,
    events: mpsc::UnboundedReceiver<AnswerEvent>,
}

impl Stream for AnswerStream {
    type Item = AnswerEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AnswerEvent>> {
        if let Some(event) = self.seen.pop_front() {
            return Poll::Ready(Some(event));
        }
        self.events.poll_recv(cx)
    }
}

impl AnswerStream {
    /// Waits until the generation has written its first text, ended, or failed: a failure
    /// before any text (the backend down or refusing, the queue closing) is returned as the
    /// error, so that a front end answers it with a status rather than inside a reply it
    /// has started. The events read meanwhile come first from the stream returned.
    async fn started(mut self) -> Result<Self, EdgeError> {
        while let Some(event) = self.events.recv().await {
            match event {
                AnswerEvent::Failed(error) => return Err(error),
                AnswerEvent::Documents(_) => self.seen.push_back(event),
                AnswerEvent::Delta(_) | AnswerEvent::Done(_) => {
                    self.seen.push_back(event);
                    break;
                }
            }
        }
        Ok(self)
    }

    /// Waits for the end of the answer, skipping the documents and the text.
    pub async fn answered(mut self) -> Result<Answered, EdgeError> {
        while let Some(event) = self.events.recv().await {
            match event {
                AnswerEvent::Done(answered) => return Ok(*answered),
                AnswerEvent::Failed(error) => return Err(error),
                AnswerEvent::Documents(_) | AnswerEvent::Delta(_) => {}
            }
        }
        Err(EdgeError::Generation(RagError::Cancelled))
    }
}

/// Sends the answer's text on; the receiver dropped means the client went away.
struct EdgeSink {
    events: mpsc::UnboundedSender<AnswerEvent>,
}

impl AnswerSink for EdgeSink {
    fn text(&mut self, delta: &str) {
        let _ = self.events.send(AnswerEvent::Delta(delta.to_string()));
    }

    fn cancelled(&self) -> bool {
        self.events.is_closed()
    }
}

pub(super) async fn start(
    service: AnswerService,
    prepared: Prepared,
) -> Result<AnswerStream, EdgeError> {
    let (sender, events) = mpsc::unbounded_channel();
    let span = tracing::info_span!(
        "answer_generate",
        mode = ?prepared.request.mode,
        max_tokens = prepared.request.max_new_tokens
    );
    tokio::spawn(generate(service, prepared, sender).instrument(span));
    AnswerStream {
        seen: VecDeque::new(),
        events,
    }
    .started()
    .await
}

async fn generate(
    service: AnswerService,
    prepared: Prepared,
    events: mpsc::UnboundedSender<AnswerEvent>,
) {
    let Prepared {
        retrieval,
        request,
        query,
        notes,
        backend,
        admission,
        place,
        started,
        retrieve,
    } = prepared;
    let metrics = service.metrics();
    let _ = events.send(AnswerEvent::Documents(Box::new(retrieval.clone())));
    let queued_at = Instant::now();
    let permit = tokio::select! {
        permit = admission.ready() => permit,
        () = events.closed() => {
            metrics.observe_cancelled();
            return;
        }
    };
    let permit = match permit {
        Ok(permit) => permit,
        Err(error) => {
            let error = queue_error(error);
            metrics.observe_error(&error);
            let _ = events.send(AnswerEvent::Failed(error));
            return;
        }
    };
    let queued = queued_at.elapsed();
    let mode = request.mode;
    let sink_events = events.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut sink = EdgeSink {
            events: sink_events,
        };
        let answer = backend.answer(&request, &mut sink);
        // The model (and the tenant's place) is free before the reply's last event is sent,
        // so a client that asks again as soon as it has its answer finds it free.
        drop(permit);
        drop(place);
        answer
    })
    .await;
    let event = match outcome {
        Err(join) => AnswerEvent::Failed(EdgeError::TaskFailed(join)),
        Ok(Err(RagError::Cancelled)) => {
            metrics.observe_cancelled();
            return;
        }
        Ok(Err(error)) => AnswerEvent::Failed(generation_error(error)),
        Ok(Ok(answer)) => AnswerEvent::Done(Box::new(Answered {
            retrieval,
            answer,
            mode,
            query,
            notes,
            retrieve,
            queued,
        })),
    };
    match &event {
        AnswerEvent::Done(answered) => metrics.observe(answered, started.elapsed()),
        AnswerEvent::Failed(error) => metrics.observe_error(error),
        AnswerEvent::Documents(_) | AnswerEvent::Delta(_) => {}
    }
    let _ = events.send(event);
}
