//! SQuAD v1.1 JSON (`data[].title`, `data[].paragraphs[].context`, `qas[].question`,
//! `qas[].answers[].text`): one passage per paragraph; the article title is every
//! question's target entity, so questions of one article are homologous.

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, CorpusError, Passage, Question, passage_fingerprint, read_to_string};

#[derive(Deserialize)]
struct SquadFile {
    data: Vec<Article>,
}

#[derive(Deserialize)]
struct Article {
    title: String,
    paragraphs: Vec<Paragraph>,
}

#[derive(Deserialize)]
struct Paragraph {
    context: String,
    #[serde(default)]
    qas: Vec<Qa>,
}

#[derive(Deserialize)]
struct Qa {
    question: String,
    #[serde(default)]
    answers: Vec<Answer>,
}

#[derive(Deserialize)]
struct Answer {
    text: String,
}

/// SQuAD titles use underscores for spaces (`Super_Bowl_50`).
fn display_title(title: &str) -> String {
    title.replace('_', " ")
}

pub fn load_squad(path: &Path) -> Result<Corpus, CorpusError> {
    let file: SquadFile =
        serde_json::from_str(&read_to_string(path)?).map_err(|source| CorpusError::Json {
            path: path.to_path_buf(),
            line: 0,
            source,
        })?;
    let mut corpus = Corpus {
        sources: vec![format!("squad:{}", path.display())],
        ..Corpus::default()
    };
    for article in file.data {
        let title = display_title(&article.title);
        for paragraph in article.paragraphs {
            let text = paragraph.context.trim().to_string();
            let gold_passage = Some(passage_fingerprint(&text));
            for qa in paragraph.qas {
                let mut answers: Vec<String> = qa.answers.into_iter().map(|a| a.text).collect();
                answers.dedup();
                if !answers.is_empty() {
                    corpus.questions.push(Question {
                        question: qa.question.trim().to_string(),
                        answers,
                        entity: title.clone(),
                        source: "squad".into(),
                        relation: None,
                        gold_passage,
                    });
                }
            }
            corpus.passages.push(Passage {
                title: title.clone(),
                text,
            });
        }
    }
    Ok(corpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    #[test]
    fn parses_articles_paragraphs_and_questions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("squad.json");
        std::fs::write(
            &path,
            r#"{"version":"1.1","data":[{"title":"Super_Bowl_50","paragraphs":[
                {"context":"Super Bowl 50 was played in Santa Clara.","qas":[
                    {"id":"1","question":"Where was Super Bowl 50 played?","answers":[{"answer_start":28,"text":"Santa Clara"},{"answer_start":28,"text":"Santa Clara"}]}]}]}]}"#,
        )
        .unwrap();
        let corpus = load_squad(&path).unwrap();
        assert_eq!(corpus.passages.len(), 1);
        assert_eq!(corpus.passages[0].title, "Super Bowl 50");
        assert_eq!(corpus.questions.len(), 1);
        assert_eq!(corpus.questions[0].answers, vec!["Santa Clara".to_string()]);
        assert_eq!(corpus.questions[0].entity, "Super Bowl 50");
        assert_eq!(
            corpus.questions[0].gold_passage,
            Some(passage_fingerprint(&corpus.passages[0].text))
        );
    }

    #[test]
    fn malformed_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.json");
        std::fs::write(&path, "{\"data\": 3}").unwrap();
        let err = load_squad(&path).unwrap_err().to_string_full();
        assert!(err.contains("bad.json"), "{err}");
    }
}
