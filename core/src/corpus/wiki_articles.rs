//! Full Wikipedia articles as JSON lines (`id`, `title`, `text`, ...), split the way DPR
//! split Wikipedia: consecutive passages of at most 100 words, each under its article's title
//! (the encoder reads "title. text"; see [`super::Passage::embedding_text`]).

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, CorpusError, Passage, read_jsonl};

/// Words per passage: DPR's split.
pub const PASSAGE_WORDS: usize = 100;

#[derive(Deserialize)]
struct ArticleRecord {
    title: String,
    text: String,
}

/// The article's text as passages of at most `words` words, in order; at most `limit` of them
/// (the article's first ones) when given.
pub fn split_article(text: &str, words: usize, limit: Option<usize>) -> Vec<String> {
    let all: Vec<&str> = text.split_whitespace().collect();
    all.chunks(words.max(1))
        .take(limit.unwrap_or(usize::MAX))
        .map(|chunk| chunk.join(" "))
        .collect()
}

/// Every article of the file as DPR passages; `max_passages_per_article` keeps each article's
/// first ones (its lead first) to bound the corpus.
pub fn load_wiki_articles(
    path: &Path,
    max_passages_per_article: Option<usize>,
) -> Result<Corpus, CorpusError> {
    let records: Vec<ArticleRecord> = read_jsonl(path)?;
    let mut corpus = Corpus {
        sources: vec![match max_passages_per_article {
            Some(limit) => format!(
                "wiki-articles:{} (at most {limit} per article)",
                path.display()
            ),
            None => format!("wiki-articles:{}", path.display()),
        }],
        ..Corpus::default()
    };
    for record in records {
        let title = record.title.trim().to_string();
        for text in split_article(&record.text, PASSAGE_WORDS, max_passages_per_article) {
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
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn articles_split_into_hundred_word_passages_in_order_under_their_title() {
        let words: Vec<String> = (0..250).map(|i| format!("w{i}")).collect();
        let text = format!(
            "{}\nHistory.\n{}",
            words[..120].join(" "),
            words[120..].join(" ")
        );
        let passages = split_article(&text, 100, None);
        assert_eq!(passages.len(), 3);
        assert!(passages[0].starts_with("w0 w1 ") && passages[0].ends_with(" w99"));
        assert_eq!(passages[0].split(' ').count(), 100);
        // The heading line is text like any other, as in DPR's split.
        assert!(passages[1].contains("w119 History. w120"));
        assert_eq!(passages[2].split(' ').count(), 51);
        assert_eq!(split_article(&text, 100, Some(1)), passages[..1]);
        assert!(split_article("   ", 100, None).is_empty());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("articles.jsonl");
        let record = serde_json::json!({"id": "x:1", "title": " Warsaw ", "source": "s",
            "text": text, "why": ["squad"]});
        std::fs::write(&path, format!("{record}\n")).unwrap();
        let corpus = load_wiki_articles(&path, Some(2)).unwrap();
        assert_eq!(corpus.passages.len(), 2);
        assert!(corpus.passages.iter().all(|p| p.title == "Warsaw"));
        assert_eq!(corpus.passages[1].text, passages[1]);
    }
}
