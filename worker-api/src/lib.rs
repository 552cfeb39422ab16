//! What an edge needs of Hasten's generation workers, without their engines: [`RemoteLm`]
//! (the `Generation` service as an [`hasten_rag::LmBackend`]), [`kv::KvPool`] (a pool of
//! FusionRAG KV workers, routed by chunk ownership), and the wire conversions the workers'
//! servers share with these clients ([`generation`], [`kv`]).

pub mod generation;
pub mod kv;
mod remote_lm;

pub use remote_lm::RemoteLm;
