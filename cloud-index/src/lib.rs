//! Hasten's cloud tier: exact inner-product search over a corpus bundle (faiss flat index),
//! batched, served to edges over QUIC and to everyone else over gRPC.

pub mod config;
pub mod grpc;
pub mod quic;
pub mod searcher;

pub use searcher::{CloudService, ExactSearcher, SearchError};
