//! EntityQuestions (Sciavolino et al., 2021) as JSON lines: `question`, `answers`, `subject`
//! (the entity asked about), `relation` (a Wikidata property such as `P19`), `split`,
//! `has_article`. Questions about one subject under several relations are homologous.

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, CorpusError, Question, read_jsonl};

#[derive(Deserialize)]
struct EntityQuestionRecord {
    question: String,
    answers: Vec<String>,
    subject: String,
    relation: String,
    #[serde(default)]
    has_article: bool,
}

/// Which questions to keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ArticleFilter {
    /// Every question.
    #[default]
    All,
    /// Only questions whose subject's article the corpus holds (`has_article`).
    WithArticle,
}

/// The file's questions (no passages: their articles come from the article corpus).
pub fn load_entity_questions(path: &Path, filter: ArticleFilter) -> Result<Corpus, CorpusError> {
    let records: Vec<EntityQuestionRecord> = read_jsonl(path)?;
    let questions = records
        .into_iter()
        .filter(|r| filter == ArticleFilter::All || r.has_article)
        .map(|r| Question {
            question: r.question.trim().to_string(),
            answers: r.answers,
            entity: r.subject,
            source: "entityquestions".into(),
            relation: Some(r.relation),
            gold_passage: None,
        })
        .collect();
    Ok(Corpus {
        passages: Vec::new(),
        questions,
        sources: vec![format!("entityquestions:{}", path.display())],
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn questions_keep_their_subject_and_relation_and_the_filter_applies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eq.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": "P19.dev.0", "split": "dev", "relation": "P19", "template": "Where was [X] born?", "subject": "Ada Lovelace", "question": "Where was Ada Lovelace born? ", "answers": ["London"], "has_article": true}"#,
                "\n",
                r#"{"id": "P106.dev.1", "split": "dev", "relation": "P106", "template": "t", "subject": "Nobody", "question": "What does Nobody do?", "answers": ["x", "y"], "has_article": false}"#,
                "\n"
            ),
        )
        .unwrap();
        let all = load_entity_questions(&path, ArticleFilter::All).unwrap();
        assert_eq!(all.questions.len(), 2);
        let q = &all.questions[0];
        assert_eq!(q.question, "Where was Ada Lovelace born?");
        assert_eq!(q.entity, "Ada Lovelace");
        assert_eq!(q.relation.as_deref(), Some("P19"));
        assert_eq!(all.questions[1].answers, ["x", "y"]);
        let held = load_entity_questions(&path, ArticleFilter::WithArticle).unwrap();
        assert_eq!(held.questions.len(), 1);
        assert_eq!(held.questions[0].entity, "Ada Lovelace");
    }
}
