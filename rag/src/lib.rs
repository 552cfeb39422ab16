//! Answer generation over retrieved documents: standard RAG and Speculative RAG (Wang et
//! al., 2024) behind one [`LmBackend`] seam.
//!
//! Standard RAG has the larger model (the verifier) read every document and answer,
//! streaming the text. Speculative RAG clusters the documents ([`cluster`]), drafts an
//! answer with a rationale from each one-document-per-cluster subset with the small model in
//! one batch ([`subsets`], [`draft`]), scores every draft with the large model in one
//! forward pass ([`verify`]) and answers with the best. The QA metrics are `hasten_eval::metrics`;
//! [`queue`] the bounded queue in front of a model.

pub mod answer;
pub mod backend;
pub mod cluster;
pub mod draft;
pub mod error;
pub mod prompt;
pub mod queue;
pub mod request;
pub mod rewrite;
pub mod sink;
pub mod speculative;
pub mod standard;
pub mod stop;
pub mod subsets;
pub mod verify;

pub use answer::{
    Answer, AnswerTimings, BackendInfo, DraftReport, DraftingTokens, Finish, KvStages,
};
pub use backend::{LmBackend, LocalLm};
pub use error::{RagError, Result};
/// A conversation's turns and their roles, re-exported so callers need not name hasten-lm.
pub use hasten_lm::{ChatMessage, Role};
/// The load options of [`LocalLm::load_with`], re-exported so callers need not name hasten-lm.
pub use hasten_lm::{DeviceKind, WeightFormat};
pub use queue::{Admission, ModelQueue, QueueError};
pub use request::{
    AnswerMode, AnswerRequest, ChatTurn, Decoding, Document, DraftSelection, MAX_DRAFTS,
    MAX_NEW_TOKENS, MAX_STOP_STRINGS, SpeculativeSettings,
};
pub use sink::AnswerSink;
