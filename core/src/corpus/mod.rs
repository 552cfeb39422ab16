//! Corpus types and loaders: passages to index and questions (with gold answers and the
//! entity they ask about) to drive workloads and evaluation.

mod hotpot;
mod squad;
mod synthetic;
mod wiki18;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use hotpot::load_hotpot;
pub use squad::load_squad;
pub use synthetic::{SyntheticSpec, generate_synthetic};
pub use wiki18::load_wiki18;

/// Global document identifier: the document's row in the corpus bundle.
pub type DocId = u64;

/// A passage of the corpus with its identifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    pub id: DocId,
    pub title: String,
    pub text: String,
}

impl Document {
    /// The text the encoder sees: the title gives a passage its subject, which many
    /// paragraphs (SQuAD's especially) never name in their body.
    pub fn embedding_text(&self) -> String {
        passage_embedding_text(&self.title, &self.text)
    }
}

fn passage_embedding_text(title: &str, text: &str) -> String {
    if title.is_empty() {
        text.to_string()
    } else {
        format!("{title}. {text}")
    }
}

/// A passage before it is given an identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Passage {
    pub title: String,
    pub text: String,
}

impl Passage {
    pub fn embedding_text(&self) -> String {
        passage_embedding_text(&self.title, &self.text)
    }
}

/// A question with its gold answers and target entity (a Wikipedia title for real data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub question: String,
    pub answers: Vec<String>,
    pub entity: String,
    /// Where the question came from (`squad`, `hotpotqa`, `synthetic`).
    pub source: String,
}

/// Passages and questions gathered from one or more sources.
#[derive(Clone, Debug, Default)]
pub struct Corpus {
    pub passages: Vec<Passage>,
    pub questions: Vec<Question>,
    /// Human-readable description of each source, recorded in the bundle manifest.
    pub sources: Vec<String>,
}

impl Corpus {
    /// Appends `other`, dropping passages already present (same title and text) and
    /// passages with no text.
    pub fn extend(&mut self, other: Corpus) {
        let mut seen: HashSet<Passage> = self.passages.iter().cloned().collect();
        for passage in other.passages {
            if !passage.text.trim().is_empty() && seen.insert(passage.clone()) {
                self.passages.push(passage);
            }
        }
        self.questions.extend(other.questions);
        self.sources.extend(other.sources);
    }
}

/// Where to read a corpus from. Empty means the synthetic knowledge base.
#[derive(Clone, Debug, Default)]
pub struct CorpusSources {
    pub squad: Vec<PathBuf>,
    pub hotpot: Vec<PathBuf>,
    pub wiki18: Vec<PathBuf>,
    pub synthetic: Option<SyntheticSpec>,
}

impl CorpusSources {
    pub fn is_empty(&self) -> bool {
        self.squad.is_empty()
            && self.hotpot.is_empty()
            && self.wiki18.is_empty()
            && self.synthetic.is_none()
    }

    /// Loads and merges every source; with no source at all, the default synthetic
    /// knowledge base.
    pub fn load(&self) -> Result<Corpus, CorpusError> {
        let mut corpus = Corpus::default();
        for path in &self.squad {
            corpus.extend(load_squad(path)?);
        }
        for path in &self.hotpot {
            corpus.extend(load_hotpot(path)?);
        }
        for path in &self.wiki18 {
            corpus.extend(load_wiki18(path)?);
        }
        if let Some(spec) = &self.synthetic {
            corpus.extend(generate_synthetic(spec));
        } else if self.is_empty() {
            corpus.extend(generate_synthetic(&SyntheticSpec::default()));
        }
        if corpus.passages.is_empty() {
            return Err(CorpusError::Empty);
        }
        Ok(corpus)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("the sources hold no passages")]
    Empty,
}

fn read_to_string(path: &Path) -> Result<String, CorpusError> {
    std::fs::read_to_string(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses a JSON-lines file, one `T` per non-empty line.
fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, CorpusError> {
    read_to_string(path)?
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|source| CorpusError::Json {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_drops_duplicate_and_empty_passages() {
        let p = |t: &str, x: &str| Passage {
            title: t.into(),
            text: x.into(),
        };
        let mut a = Corpus {
            passages: vec![p("A", "one"), p("B", "two")],
            ..Corpus::default()
        };
        a.extend(Corpus {
            passages: vec![p("A", "one"), p("A", "three"), p("C", "  ")],
            ..Corpus::default()
        });
        assert_eq!(
            a.passages,
            vec![p("A", "one"), p("B", "two"), p("A", "three")]
        );
    }
}
