//! Homology-aware speculative retrieval (HaS, Lin et al.): draft from the edge's caches,
//! validate the draft through homologous cached queries, fall back to the cloud otherwise.

pub mod channels;
pub mod engine;
pub mod hot_cache;
pub mod validator;

pub use channels::{CacheChannel, EdgeDocument, FuzzyChannel};
pub use engine::{
    CloudDocument, CloudSearch, EngineError, EngineSettings, HasEngine, MatchedQuery, Outcome,
    Retrieval, RetrievalPolicy, RetrievedDocument, Speculation, StageTimings,
};
pub use hot_cache::{CacheChange, CachedQuery, HotCache, QueryId};
pub use validator::{HomologyValidator, Verdict};
