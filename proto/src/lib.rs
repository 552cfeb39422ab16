//! Hasten's wire layer: the protobuf messages and gRPC services generated from
//! `proto/hasten/v1/*.proto`, the length-prefixed frame codec used on QUIC streams, the
//! largest encoded size of a search's answer, and the TLS configuration shared by every
//! link (QUIC and gRPC).

pub mod auth;
pub mod client_auth;
pub mod codec;
pub mod control;
mod encoded_event;
pub mod frame;
pub mod grpc_client_tls;
pub mod grpc_tls;
pub mod health;
pub mod quic;
pub mod reload;
pub mod response_size;
pub mod tls;
pub mod worker;

pub use encoded_event::EncodedEvent;

/// A remaining budget as `SearchRequest.timeout_ms`: at least 1 ms, since 0 on the wire means
/// "the server's default", not "nothing left".
pub fn wire_timeout_ms(budget: std::time::Duration) -> u32 {
    u32::try_from(budget.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// Generated messages and services of package `hasten.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("hasten.v1");
}

/// The ControlPlane server control-plane nodes run: `Subscribe` streams [`EncodedEvent`]s,
/// each event encoded once for all its subscribers (`build.rs` generates it apart from
/// [`v1`], whose messages it uses).
pub mod encoded_events {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/encoded_events/hasten.v1.rs"));
}
