//! What Hasten's services share: the text encoder, corpus and bundle types, vector-index
//! wrappers over faiss, answer matching, vector checks, and the ready-file and shutdown
//! handling every server shares, and the metrics registry with its HTTP routes. Nothing
//! here opens a socket.

pub mod bundle;
pub mod config;
pub mod corpus;
pub mod encoder;
pub mod index;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod progress;
pub mod ranking;
pub mod retry;
pub mod threads;
pub mod trace_export;
pub mod vector;

pub use corpus::{DocId, Document, Question};
