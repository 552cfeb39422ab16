//! SpecHop (continuous speculation for multi-hop retrieval agents): while a hop's exact
//! retrieval is in flight, the agent goes on from a speculated result, up to `k` hops ahead;
//! each exact result, in order, commits the hop it stood for or discards it and everything
//! after it. With the strict verifier (identical ordered document ids) the trajectory is the
//! sequential agent's by construction; the paper's token-set Jaccard verifier of sub-answers
//! may commit a hop the exact documents would have answered differently.
//!
//! The agent is a seam ([`HopAgent`]): what it searches next and what it reads from a hop's
//! documents; exact retrieval runs on its own threads so that its latency overlaps the
//! agent's work.

mod agent;
mod run;
#[cfg(test)]
mod tests;
mod verify;

pub use agent::{
    DOCUMENT_TOKENS, LINE_TOKENS, LmHopAgent, action, first_line, plan_prompt, read_prompt,
};
pub use run::{run_sequential_agent, run_spechop};
pub use verify::{Verifier, token_set_jaccard};

use crate::error::{RetrieverError, StepResult};
use crate::retriever::RetrievedDocument;

/// The agent's next move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Retrieve for this sub-query.
    Search(String),
    /// The final answer.
    Answer(String),
}

/// One hop of a trajectory: the sub-query, the documents retrieved for it and what the
/// agent read from them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Hop {
    pub query: String,
    pub documents: Vec<u64>,
    pub sub_answer: String,
}

/// A multi-hop agent, deterministic (greedy) so that equal inputs give equal moves.
pub trait HopAgent {
    /// The next action after `hops`; with `must_answer` (the hop budget is spent) an answer.
    fn act(&self, question: &str, hops: &[Hop], must_answer: bool) -> StepResult<Action>;
    /// The sub-answer for `query` from `documents`, after `hops`.
    fn read(
        &self,
        question: &str,
        hops: &[Hop],
        query: &str,
        documents: &[RetrievedDocument],
    ) -> StepResult<String>;
}

/// Guesses a sub-query's exact result at once (the edge's cache or fuzzy channel, a share of
/// the corpus).
pub trait HopSpeculator {
    /// Reaches the run's caller whole ([`crate::SpecError::Speculation`]).
    type Error: RetrieverError;

    fn speculate(&mut self, query: &[f32], k: usize)
    -> Result<Vec<RetrievedDocument>, Self::Error>;
}

/// Shape of an agent run.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HopSettings {
    /// Documents retrieved per hop.
    pub k_documents: usize,
    /// Hops before the agent must answer.
    pub max_hops: usize,
}

impl Default for HopSettings {
    fn default() -> Self {
        Self {
            k_documents: 5,
            max_hops: 4,
        }
    }
}

/// A finished agent run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HopOutcome {
    pub answer: String,
    pub hops: Vec<Hop>,
    /// `None` for the sequential agent.
    pub speculation: Option<HopStats>,
}

/// What SpecHop did on one question.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HopStats {
    /// Hops continued from a speculated result.
    pub speculated: usize,
    /// Speculated hops the verifier committed.
    pub committed: usize,
    /// Hops discarded, the failed one and everything after it.
    pub discarded: usize,
    /// Most hops awaiting verification at once (never above `k`).
    pub max_live: usize,
    /// Exact retrievals issued (discarded ones included).
    pub exact_calls: usize,
}
