//! Hasten's edge node: homology-aware speculative retrieval (HaS) in front of the cloud
//! index, with a JSON and a gRPC API.

pub mod api;
pub mod cloud;
pub mod config;
pub mod engine;
pub mod grpc;
pub mod has;
pub mod http;
pub mod lookup;
pub mod metrics;
pub mod replication;
pub mod service;
pub mod tenants;
