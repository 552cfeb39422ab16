//! The whole answer path under load: streamed chat completions through edges answering on
//! KV workers, Hasten against the standard RAG stack and each of its halves alone.

pub mod compare;
pub mod evaluate;
pub mod exchange;
pub mod report;
pub mod summary;
pub mod systems;
