//! The DPR-style wiki18 passage split as JSON lines: `id`, `contents`, where the first
//! line of `contents` is the article title in double quotes.

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, CorpusError, Passage, read_jsonl};

#[derive(Deserialize)]
struct Wiki18Record {
    contents: String,
}

fn split_contents(contents: &str) -> Passage {
    match contents.split_once('\n') {
        Some((first, rest)) => Passage {
            title: first.trim().trim_matches('"').to_string(),
            text: rest.trim().to_string(),
        },
        None => Passage {
            title: String::new(),
            text: contents.trim().to_string(),
        },
    }
}

pub fn load_wiki18(path: &Path) -> Result<Corpus, CorpusError> {
    let records: Vec<Wiki18Record> = read_jsonl(path)?;
    Ok(Corpus {
        passages: records
            .iter()
            .map(|r| split_contents(&r.contents))
            .collect(),
        questions: Vec::new(),
        sources: vec![format!("wiki18:{}", path.display())],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn title_is_the_quoted_first_line() {
        let p = split_contents("\"Aaron\"\nAaron is a prophet.");
        assert_eq!(p.title, "Aaron");
        assert_eq!(p.text, "Aaron is a prophet.");
        let untitled = split_contents("no title here");
        assert_eq!(untitled.title, "");
        assert_eq!(untitled.text, "no title here");
    }
}
