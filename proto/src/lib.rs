//! Hasten's wire layer: the protobuf messages and gRPC services generated from
//! `proto/hasten/v1/*.proto`, the length-prefixed frame codec used on QUIC streams,
//! and the TLS configuration shared by every link (QUIC and gRPC).

pub mod control;
pub mod frame;
pub mod quic;
pub mod tls;

/// Generated messages and services of package `hasten.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("hasten.v1");
}
