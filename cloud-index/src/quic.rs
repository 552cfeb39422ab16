//! The QUIC fast path: one bidirectional stream per request, one length-prefixed
//! `QuicRequest` in, one `QuicResponse` out.

use display_full_error::DisplayFullErrorExt;
use std::net::SocketAddr;

use hasten_core::trace_export::set_remote_parent;
use hasten_proto::frame::{DEFAULT_MAX_FRAME_BYTES, FrameError, read_frame, write_frame};
use hasten_proto::v1::quic_error::Code;
use hasten_proto::v1::{QuicError, QuicRequest, QuicResponse, quic_request, quic_response};
use tracing::Instrument;

use crate::backend::SearchBackend;
use crate::error::SearchError;

/// Binds a QUIC server endpoint.
pub fn bind(addr: SocketAddr, config: quinn::ServerConfig) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::server(config, addr)
}

/// Serves connections on `endpoint` until it is closed.
pub async fn serve<B: SearchBackend>(endpoint: quinn::Endpoint, service: B) {
    while let Some(incoming) = endpoint.accept().await {
        let service = service.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            match incoming.await {
                Ok(connection) => serve_connection(connection, service).await,
                Err(err) => {
                    tracing::debug!(%remote, error = %err.display_full(), "QUIC handshake failed")
                }
            }
        });
    }
}

async fn serve_connection<B: SearchBackend>(connection: quinn::Connection, service: B) {
    let remote = connection.remote_address();
    tracing::debug!(%remote, "QUIC connection open");
    loop {
        match connection.accept_bi().await {
            Ok((send, recv)) => {
                let service = service.clone();
                let span = tracing::debug_span!("quic_request", %remote);
                tokio::spawn(handle_stream(send, recv, service).instrument(span));
            }
            Err(err) => {
                tracing::debug!(%remote, error = %err.display_full(), "QUIC connection closed");
                return;
            }
        }
    }
}

fn error_response(code: Code, message: String) -> QuicResponse {
    QuicResponse {
        body: Some(quic_response::Body::Error(QuicError {
            code: code as i32,
            message,
        })),
    }
}

fn error_code(err: &SearchError) -> Code {
    match err {
        SearchError::InvalidArgument(_) => Code::InvalidArgument,
        SearchError::ShardUnavailable { .. } | SearchError::ShuttingDown => Code::Unavailable,
        SearchError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        SearchError::Overloaded(_) => Code::ResourceExhausted,
        SearchError::Index(_)
        | SearchError::Task(_)
        | SearchError::BatchLost(_)
        | SearchError::NoAnswer(_) => Code::Internal,
    }
}

async fn respond<B: SearchBackend>(
    service: &B,
    request: Result<QuicRequest, FrameError>,
) -> QuicResponse {
    let request = match request {
        Ok(request) => request,
        Err(err) => {
            return error_response(
                Code::InvalidArgument,
                format!("bad request frame: {}", err.display_full()),
            );
        }
    };
    match request.body {
        Some(quic_request::Body::Search(search)) => match service.search(search).await {
            Ok(response) => QuicResponse {
                body: Some(quic_response::Body::Search(response)),
            },
            Err(err) => error_response(error_code(&err), err.to_string_full()),
        },
        Some(quic_request::Body::Documents(documents)) => {
            match service.documents(documents).await {
                Ok(response) => QuicResponse {
                    body: Some(quic_response::Body::Documents(response)),
                },
                Err(err) => error_response(error_code(&err), err.to_string_full()),
            }
        }
        Some(quic_request::Body::Info(_)) => QuicResponse {
            body: Some(quic_response::Body::Info(service.info())),
        },
        None => error_response(Code::InvalidArgument, "request has no body".into()),
    }
}

async fn handle_stream<B: SearchBackend>(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    service: B,
) {
    let request = read_frame::<_, QuicRequest>(&mut recv, DEFAULT_MAX_FRAME_BYTES).await;
    if let Err(FrameError::Io(err)) = &request {
        tracing::debug!(error = %err.display_full(), "request stream broke before a full frame arrived");
        return;
    }
    // The request's span joins the caller's trace when it sent one.
    let span = tracing::info_span!("quic_request");
    if let Ok(request) = &request {
        set_remote_parent(&span, &request.traceparent);
    }
    let response = respond(&service, request).instrument(span).await;
    if let Err(err) = write_frame(&mut send, &response).await {
        tracing::debug!(error = %err.display_full(), "could not write the response");
        return;
    }
    if let Err(err) = send.finish() {
        tracing::debug!(error = %err.display_full(), "could not finish the response stream");
    }
}
