//! What a caller asks for: a question, the retrieved documents and how to answer, and the
//! checks that refuse a request before any model runs.

use hasten_lm::Role;
use serde::{Deserialize, Serialize};

use crate::error::{RagError, Result};

/// Longest answer a request may ask for; beyond it a CPU edge would stall for minutes.
pub const MAX_NEW_TOKENS: usize = 1024;
/// Most drafts per request: they are decoded as one batch, so m bounds the batch size.
pub const MAX_DRAFTS: usize = 16;
/// Most stop strings per request (OpenAI's bound).
pub const MAX_STOP_STRINGS: usize = 4;

/// A system message or an earlier turn of the conversation, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTurn {
    pub role: Role,
    pub content: String,
}

impl ChatTurn {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// How the answer's tokens are chosen and where it ends, beyond `max_new_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Decoding {
    /// 0 is greedy (the default). Speculative mode drafts greedily whatever this is, as the
    /// paper does: the document subsets supply the diversity.
    pub temperature: f32,
    /// Nucleus sampling's probability mass, in (0, 1]; 1 draws from every token.
    pub top_p: f32,
    /// Seeds the sampler, so a sampled answer can be reproduced.
    pub seed: u64,
    /// The answer ends before the first of these strings (at most [`MAX_STOP_STRINGS`]).
    pub stop: Vec<String>,
}

impl Default for Decoding {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            stop: Vec::new(),
        }
    }
}

impl Decoding {
    /// The sampler's settings.
    pub fn sampling(&self) -> hasten_lm::Sampling {
        hasten_lm::Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
        }
    }

    /// Refuses values out of range, naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(RagError::invalid(
                "temperature",
                format!("is {}; it must be between 0 and 2", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(RagError::invalid(
                "top_p",
                format!("is {}; it must be in (0, 1]", self.top_p),
            ));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(RagError::invalid(
                "stop",
                format!(
                    "has {} strings; at most {MAX_STOP_STRINGS} are allowed",
                    self.stop.len()
                ),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(RagError::invalid("stop", "holds an empty string"));
        }
        Ok(())
    }
}

/// A retrieved document. `vector` is its embedding, needed when Speculative RAG clusters.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Document {
    pub title: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
    /// The corpus document id when the document came from retrieval: a KV worker finds the
    /// document's stored KV by it instead of tokenizing the text again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
}

impl Document {
    pub fn new(title: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            text: text.into(),
            vector: None,
            id: None,
        }
    }

    pub fn with_vector(mut self, vector: Vec<f32>) -> Self {
        self.vector = Some(vector);
        self
    }

    pub fn with_id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerMode {
    /// The verifier reads every document and writes the answer.
    #[default]
    Standard,
    /// The drafter answers from document subsets in parallel; the verifier picks a draft.
    Speculative,
}

impl AnswerMode {
    /// The mode's name, as its JSON form and its metrics label spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Speculative => "speculative",
        }
    }
}

/// How the final draft is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftSelection {
    /// The highest draft + self-consistency + self-reflection score (the paper's method).
    #[default]
    Verifier,
    /// A draft picked at random, without verification (the paper's ablation).
    Random { seed: u64 },
}

/// Speculative RAG's knobs, with the paper's defaults (m = 5 drafts over k = 2 clusters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpeculativeSettings {
    /// m: drafts written in parallel, each from its own document subset.
    pub drafts: usize,
    /// k: clusters, and so documents per subset (one from each cluster).
    pub clusters: usize,
    /// False is the ablation "random sampling without clustering": subsets of k documents
    /// drawn from all of them, and vectors are not needed.
    pub clustering: bool,
    pub selection: DraftSelection,
    /// Most tokens per draft (rationale and answer together).
    pub draft_tokens: usize,
    /// Seeds k-means++ and the subset sampling, so the same request gets the same drafts.
    pub seed: u64,
}

impl Default for SpeculativeSettings {
    fn default() -> Self {
        Self {
            drafts: 5,
            clusters: 2,
            clustering: true,
            selection: DraftSelection::Verifier,
            draft_tokens: 32,
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerRequest {
    pub question: String,
    pub documents: Vec<Document>,
    #[serde(default)]
    pub mode: AnswerMode,
    /// Most tokens of the answer in standard mode. Speculative drafts (rationale and answer)
    /// are bounded by `speculative.draft_tokens` instead; the limit is checked in both modes.
    pub max_new_tokens: usize,
    #[serde(default)]
    pub speculative: SpeculativeSettings,
    /// The client's system messages and the conversation's earlier turns, oldest first; the
    /// question is the last user turn. Oldest turns are left out when they do not fit.
    #[serde(default)]
    pub conversation: Vec<ChatTurn>,
    #[serde(default)]
    pub decoding: Decoding,
}

impl AnswerRequest {
    /// A standard-mode request with default speculative settings.
    pub fn new(question: impl Into<String>, documents: Vec<Document>) -> Self {
        Self {
            question: question.into(),
            documents,
            mode: AnswerMode::Standard,
            max_new_tokens: 64,
            speculative: SpeculativeSettings::default(),
            conversation: Vec::new(),
            decoding: Decoding::default(),
        }
    }

    /// Refuses a request that cannot be answered, naming the field. Speculative settings are
    /// only checked in speculative mode: a standard request may carry any defaults.
    pub fn validate(&self) -> Result<()> {
        if self.question.trim().is_empty() {
            return Err(RagError::invalid("question", "is empty"));
        }
        if self.documents.is_empty() {
            return Err(RagError::invalid(
                "documents",
                "is empty: answering needs at least one retrieved document",
            ));
        }
        if self.max_new_tokens == 0 || self.max_new_tokens > MAX_NEW_TOKENS {
            return Err(RagError::invalid(
                "max_new_tokens",
                format!(
                    "is {}; it must be between 1 and {MAX_NEW_TOKENS}",
                    self.max_new_tokens
                ),
            ));
        }
        self.decoding.validate()?;
        if self.mode == AnswerMode::Speculative {
            self.validate_speculative()?;
        }
        Ok(())
    }

    fn validate_speculative(&self) -> Result<()> {
        let settings = &self.speculative;
        if settings.drafts == 0 || settings.drafts > MAX_DRAFTS {
            return Err(RagError::invalid(
                "speculative.drafts",
                format!(
                    "is {}; it must be between 1 and {MAX_DRAFTS}",
                    settings.drafts
                ),
            ));
        }
        if settings.clusters == 0 || settings.clusters > self.documents.len() {
            return Err(RagError::invalid(
                "speculative.clusters",
                format!(
                    "is {}; it must be between 1 and the number of documents ({})",
                    settings.clusters,
                    self.documents.len()
                ),
            ));
        }
        if settings.draft_tokens == 0 || settings.draft_tokens > MAX_NEW_TOKENS {
            return Err(RagError::invalid(
                "speculative.draft_tokens",
                format!(
                    "is {}; it must be between 1 and {MAX_NEW_TOKENS}",
                    settings.draft_tokens
                ),
            ));
        }
        if settings.clustering {
            self.validate_vectors()?;
        }
        Ok(())
    }

    /// Clustering is cosine k-means: every document needs a finite, non-zero vector of one
    /// dimension.
    fn validate_vectors(&self) -> Result<()> {
        let mut dimension = None;
        for (index, document) in self.documents.iter().enumerate() {
            let Some(vector) = &document.vector else {
                return Err(RagError::invalid(
                    "documents",
                    format!(
                        "document {index} has no vector; speculative mode clusters documents by \
                         their vectors (set speculative.clustering = false to sample without)"
                    ),
                ));
            };
            let expected = *dimension.get_or_insert(vector.len());
            if vector.len() != expected {
                return Err(RagError::invalid(
                    "documents",
                    format!(
                        "document {index} has a vector of {} dimensions, document 0 one of \
                         {expected}",
                        vector.len()
                    ),
                ));
            }
            if vector.iter().any(|x| !x.is_finite()) || vector.iter().all(|x| *x == 0.0) {
                return Err(RagError::invalid(
                    "documents",
                    format!("document {index} has a zero or non-finite vector"),
                ));
            }
        }
        Ok(())
    }
}
