//! Hasten's edge node: homology-aware speculative retrieval (HaS) in front of the cloud
//! index, with a JSON and a gRPC API.
//!
//! - [`retrieval`]: HaS and its baselines ([`has`] holds HaS's parts: channels, hot
//!   cache, validator; [`lookup`] the baselines' query lookups);
//! - [`caches`]: each tenant's cache and every way it changes (local fallbacks, or the
//!   control plane's committed stream through [`replication`]);
//! - [`fallback`]: the cloud seam and its QUIC client;
//! - [`pipeline`]: one request path for both front ends ([`http`], [`grpc`]), whose wire
//!   types and conversions live in [`api`];
//! - [`answer`]: `/v1/answer`, OpenAI chat completions and `Edge.Answer`, retrieval then
//!   generation through an `LmBackend`; [`embeddings`]: OpenAI's `/v1/embeddings` with the
//!   edge's encoder;
//! - [`warmup`]: filling a fresh edge's cache from a file of questions before it serves;
//! - [`document_fetch`]: documents of cached entries outside the edge's share of the
//!   corpus, fetched from the cloud by id;
//! - [`config`], [`metrics`], [`tenants`].

pub mod answer;
pub mod api;
pub mod caches;
pub mod config;
pub mod document_fetch;
pub mod embeddings;
pub mod fallback;
pub mod grpc;
pub mod has;
pub mod http;
pub mod http_server;
pub mod lookup;
pub mod metrics;
pub mod pipeline;
pub mod replication;
pub mod retrieval;
pub mod tenants;
pub mod warmup;

#[cfg(test)]
mod fixture;
