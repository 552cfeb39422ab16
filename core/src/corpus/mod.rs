//! Corpus types and loaders: passages to index and questions (with gold answers and the
//! entity they ask about) to drive workloads and evaluation.

mod entity_questions;
mod files;
mod hotpot;
mod squad;
mod synthetic;
mod wiki18;
mod wiki_articles;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use entity_questions::{ArticleFilter, load_entity_questions};
pub use files::CorpusFiles;
pub use hotpot::load_hotpot;
pub use squad::load_squad;
pub use synthetic::{SyntheticSpec, generate_synthetic};
pub use wiki_articles::{PASSAGE_WORDS, load_wiki_articles, split_article};
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
    /// Where the question came from (`squad`, `hotpotqa`, `entityquestions`, `synthetic`).
    pub source: String,
    /// The relation asked about, where the data set names one (EntityQuestions: a Wikidata
    /// property such as `P19`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
    /// [`passage_fingerprint`] of the passage the question was written from, where the data
    /// set names one (SQuAD: the question's paragraph). A fingerprint of the text rather
    /// than a row, so it survives deduplication and renumbering at build time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold_passage: Option<u64>,
}

/// A stable 64-bit fingerprint of a passage's text (FNV-1a over its UTF-8 bytes), so that
/// an evaluation can tell whether a returned passage is a question's gold passage.
pub fn passage_fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
    /// Full Wikipedia articles, split into DPR passages.
    pub wiki_articles: Vec<PathBuf>,
    /// Keeps each article's first passages only.
    pub max_passages_per_article: Option<usize>,
    /// EntityQuestions files: questions only; their passages come from `wiki_articles`.
    pub entity_questions: Vec<PathBuf>,
    pub entity_question_filter: ArticleFilter,
    pub synthetic: Option<SyntheticSpec>,
}

impl CorpusSources {
    pub fn is_empty(&self) -> bool {
        self.squad.is_empty()
            && self.hotpot.is_empty()
            && self.wiki18.is_empty()
            && self.wiki_articles.is_empty()
            && self.entity_questions.is_empty()
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
        for path in &self.wiki_articles {
            corpus.extend(load_wiki_articles(path, self.max_passages_per_article)?);
        }
        for path in &self.entity_questions {
            corpus.extend(load_entity_questions(path, self.entity_question_filter)?);
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
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: invalid JSON")]
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

/// A text file, gunzipped when it is gzip (by its magic bytes, whatever its name).
pub fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let bytes = std::fs::read(path)?;
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    }
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(bytes.as_slice()).read_to_string(&mut text)?;
    Ok(text)
}

fn read_to_string(path: &Path) -> Result<String, CorpusError> {
    read_text(path).map_err(|source| CorpusError::Io {
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
    fn gzip_and_plain_files_read_alike_and_bad_gzip_is_an_error() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let text = "{\"a\": 1}\nline two é\n";
        let plain = dir.path().join("plain.jsonl");
        std::fs::write(&plain, text).unwrap();
        let zipped = dir.path().join("zipped.jsonl.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        std::fs::write(&zipped, encoder.finish().unwrap()).unwrap();
        assert_eq!(read_text(&plain).unwrap(), text);
        assert_eq!(read_text(&zipped).unwrap(), text);
        let broken = dir.path().join("broken.gz");
        std::fs::write(&broken, [0x1f, 0x8b, 0x08, 0x00, 0x01]).unwrap();
        assert!(read_text(&broken).is_err());
    }

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
