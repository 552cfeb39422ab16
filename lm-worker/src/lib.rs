//! A generation worker: the `Generation` gRPC service ([`service`]) answering over
//! documents its caller retrieved, with hasten-rag on its own models. Its client, the
//! `LmBackend` an edge sends generation through, is `hasten_worker_api::RemoteLm`.

pub mod config;
pub mod metrics;
pub mod service;

pub use service::GenerationService;
