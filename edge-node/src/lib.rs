//! Hasten's edge node: homology-aware speculative retrieval (HaS) in front of the cloud
//! index, with a JSON and a gRPC API.
//!
//! - [`retrieval`]: HaS and its baselines ([`has`] holds HaS's parts: channels, hot
//!   cache, validator; [`lookup`] the baselines' query lookups);
//! - [`caches`]: each tenant's cache and every way it changes (local fallbacks, or the
//!   control plane's committed stream through [`replication`]);
//! - [`fallback`]: the cloud seam and its QUIC client;
//! - [`service`]: what every front end calls, once: [`service::retrieve`] (token,
//!   deadline, validation, admission, retrieval, metrics) and [`service::answer`]
//!   (retrieval then generation through an `LmBackend`: standard and Speculative RAG,
//!   iterative RAG and multi-hop agents, with queueing, per-tenant bounds and
//!   cancellation);
//! - front ends, thin over the services: [`http`] (JSON, OpenAI-compatible chat and
//!   embeddings, server-sent events, the admin routes) and [`grpc`]; wire types and
//!   conversions live in [`api`];
//! - [`warmup`]: filling a fresh edge's cache from a file of questions before it serves;
//! - [`document_fetch`]: documents of cached entries outside the edge's share of the
//!   corpus, fetched from the cloud by id;
//! - [`config`], [`metrics`], [`tenants`].

pub mod api;
pub mod caches;
pub mod config;
pub mod document_fetch;
pub mod fallback;
pub mod grpc;
pub mod has;
pub mod http;
pub mod keyed_limit;
pub mod lookup;
pub mod metrics;
pub mod replication;
pub mod retrieval;
pub mod service;
pub mod tenants;
pub mod warmup;

#[cfg(test)]
mod fixture;
