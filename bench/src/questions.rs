//! The questions of an evaluation: read from JSONL, each with its gold answers and, in the
//! HotpotQA distractor format, its own passages.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result, bail};
use hasten_core::encoder::TextEncoder;
use hasten_rag::Document;
use serde::Deserialize;

/// The gold answer: one string (HotpotQA) or a list of aliases (TriviaQA, NQ, PopQA).
#[derive(Deserialize)]
#[serde(untagged)]
enum Gold {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Record {
    question: String,
    #[serde(alias = "answers")]
    answer: Gold,
    #[serde(default)]
    context: Option<Vec<(String, Vec<String>)>>,
}

pub struct Question {
    pub question: String,
    pub golds: Vec<String>,
    /// The question's own passages (`context`); empty when the file has none and the
    /// passages are retrieved instead.
    pub documents: Vec<Document>,
}

/// Reads up to `limit` questions. With `need_context` every question must bring its
/// passages; without it, passages the file has are read and the caller decides what to do
/// with them. A line that is not a question is an error naming its number.
pub fn read_questions(
    path: &Path,
    limit: Option<usize>,
    need_context: bool,
) -> Result<Vec<Question>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut questions = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|limit| questions.len() >= limit) {
            break;
        }
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), number + 1);
        let record: Record = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}: expected question, answer (or answers) and, unless passages are \
                 retrieved, context [[title, [sentences]]]",
                at()
            )
        })?;
        let golds: Vec<String> = match record.answer {
            Gold::One(answer) => vec![answer],
            Gold::Many(answers) => answers,
        }
        .into_iter()
        .filter(|a| !a.trim().is_empty())
        .collect();
        if golds.is_empty() {
            bail!("{}: the question has no gold answer", at());
        }
        let documents: Vec<Document> = record
            .context
            .unwrap_or_default()
            .into_iter()
            .map(|(title, sentences)| {
                let text = sentences
                    .iter()
                    .map(|s| s.trim())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                Document::new(title.trim(), text)
            })
            .collect();
        if need_context && documents.is_empty() {
            bail!(
                "{}: the question has no context paragraphs (give --retrieve-from BUNDLE to \
                 retrieve its passages instead)",
                at()
            );
        }
        questions.push(Question {
            question: record.question.trim().to_string(),
            golds,
            documents,
        });
    }
    if questions.is_empty() {
        bail!("{} holds no questions", path.display());
    }
    Ok(questions)
}

/// Gives every document its vector, encoding one question's documents in one batch, with
/// the text the edge's bundles encode (`title. text`).
pub fn encode_documents(encoder: &TextEncoder, documents: &mut [Document]) -> Result<()> {
    let texts: Vec<String> = documents
        .iter()
        .map(|d| {
            hasten_core::Document {
                id: 0,
                title: d.title.clone(),
                text: d.text.clone(),
            }
            .embedding_text()
        })
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = encoder.encode(&texts).context("encoding the documents")?;
    if vectors.len() != documents.len() {
        bail!(
            "the encoder returned {} vectors for {} documents",
            vectors.len(),
            documents.len()
        );
    }
    for (document, vector) in documents.iter_mut().zip(vectors) {
        document.vector = Some(vector);
    }
    Ok(())
}
