//! What Hasten's services share: the text encoder, corpus and bundle types, vector-index
//! wrappers over faiss, answer matching, vector checks, and the ready-file and shutdown
//! handling every server shares. Nothing here knows about a network.

pub mod bundle;
pub mod config;
pub mod corpus;
pub mod encoder;
pub mod eval;
pub mod index;
pub mod lifecycle;
pub mod logging;
pub mod threads;
pub mod vector;

pub use corpus::{DocId, Document, Question};
