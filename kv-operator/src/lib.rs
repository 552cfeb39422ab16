//! Hasten's KV worker operator: the `KvWorkerPool` custom resource, the pure function from a
//! pool to the objects that run it, and the controller that applies them, switches corpus
//! versions once preprocessed, and holds a leader lease so that one replica acts.

pub mod config;
pub mod controller;
pub mod crd;
pub mod error;
pub mod lease;
pub mod metrics;
pub mod publish;
pub mod reconcile;
pub mod resources;
pub mod validate;

pub use error::Error;
