//! Homology-aware speculative retrieval (HaS, Lin et al.): the pieces the engine drafts and
//! validates with. The cache channel and fuzzy channel draft; the hot cache and its inverted
//! index remember fallbacks; the homology validator decides.

pub mod channels;
pub mod hot_cache;
pub mod validator;

pub use channels::{CacheChannel, DocumentStore, EdgeDocument, FuzzyChannel, in_edge_share};
pub use hot_cache::{CacheChange, CachedQuery, HotCache, QueryId};
pub use validator::{HomologyValidator, ValidationRules, Verdict, VoteWeighting};
