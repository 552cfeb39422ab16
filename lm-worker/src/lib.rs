//! A generation worker: the `Generation` gRPC service ([`service`]) answering over
//! documents its caller retrieved, with hasten-rag on its own models, and [`RemoteLm`], the
//! [`hasten_rag::LmBackend`] that lets an edge send its generation there.

pub mod config;
pub mod conversions;
pub mod metrics;
pub mod remote;
pub mod service;

pub use remote::RemoteLm;
pub use service::GenerationService;
