//! HotpotQA (distractor setting) JSON lines: `question`, `answer`, `supporting_facts`
//! `[[title, sentence_idx, ...]]` (some exports append the sentences), `context`
//! `[[title, [sentences]]]`. Every context paragraph becomes a passage; the question's entity
//! is the title of its first supporting fact.

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, CorpusError, Passage, Question, read_jsonl};

#[derive(Deserialize)]
struct HotpotRecord {
    question: String,
    answer: String,
    #[serde(default)]
    supporting_facts: Vec<Vec<serde_json::Value>>,
    context: Vec<(String, Vec<String>)>,
}

pub fn load_hotpot(path: &Path) -> Result<Corpus, CorpusError> {
    let records: Vec<HotpotRecord> = read_jsonl(path)?;
    let mut corpus = Corpus {
        sources: vec![format!("hotpotqa:{}", path.display())],
        ..Corpus::default()
    };
    for record in records {
        for (title, sentences) in record.context {
            let text = sentences.concat();
            corpus.passages.push(Passage {
                title,
                text: text.trim().to_string(),
            });
        }
        let entity = record
            .supporting_facts
            .first()
            .and_then(|fact| fact.first())
            .and_then(|title| title.as_str())
            .unwrap_or_default()
            .to_string();
        corpus.questions.push(Question {
            question: record.question.trim().to_string(),
            answers: vec![record.answer],
            entity,
            source: "hotpotqa".into(),
            relation: None,
            gold_passage: None,
        });
    }
    Ok(corpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    #[test]
    fn parses_context_paragraphs_and_the_first_supporting_title() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hotpot.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"question":"Which band?","answer":"Muse","supporting_facts":[["Muse (band)",[0],["s"]]],"#,
                r#""context":[["Muse (band)",["Muse are a rock band.", " They formed in 1994."]],["Other",["Text."]]]}"#,
                "\n\n"
            ),
        )
        .unwrap();
        let corpus = load_hotpot(&path).unwrap();
        assert_eq!(corpus.passages.len(), 2);
        assert_eq!(
            corpus.passages[0].text,
            "Muse are a rock band. They formed in 1994."
        );
        assert_eq!(corpus.questions[0].entity, "Muse (band)");
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hotpot.jsonl");
        std::fs::write(
            &path,
            "{\"question\":\"q\",\"answer\":\"a\",\"context\":[]}\nnot json\n",
        )
        .unwrap();
        let err = load_hotpot(&path).unwrap_err().to_string_full();
        assert!(err.contains(":2:"), "{err}");
    }
}
