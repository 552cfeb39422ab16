//! The corpus files a bundle is built from, as the command line names them: one set of flags
//! for `cloud-index build` and for `hasten-loadtest`, which hands them on to it.

use std::ffi::OsString;
use std::path::PathBuf;

use super::{ArticleFilter, CorpusSources, SyntheticSpec};

#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct CorpusFiles {
    /// SQuAD v1.1 JSON file: passages and questions (repeatable).
    #[arg(long)]
    pub squad: Vec<PathBuf>,
    /// HotpotQA JSON-lines file; every context paragraph becomes a passage (repeatable).
    #[arg(long)]
    pub hotpot: Vec<PathBuf>,
    /// wiki18 passage JSON-lines file (repeatable).
    #[arg(long)]
    pub wiki18: Vec<PathBuf>,
    /// Full-article JSON-lines file (`title`, `text`, gzipped or not; e.g.
    /// wiki-entity-articles.jsonl.gz), split into passages of at most 100 words under their
    /// title, as DPR did (repeatable).
    #[arg(long)]
    pub wiki_articles: Vec<PathBuf>,
    /// Keep only each article's first N passages of --wiki-articles.
    #[arg(long)]
    pub max_passages_per_article: Option<usize>,
    /// EntityQuestions JSON-lines file (gzipped or not): questions about a subject under a
    /// Wikidata relation, their passages from --wiki-articles (repeatable).
    #[arg(long)]
    pub entity_questions: Vec<PathBuf>,
    /// Keep only the EntityQuestions whose subject's article the corpus holds.
    #[arg(long)]
    pub entity_questions_with_article: bool,
}

impl CorpusFiles {
    /// Where to read the corpus from, with the synthetic knowledge base when asked for.
    pub fn into_sources(self, synthetic: Option<SyntheticSpec>) -> CorpusSources {
        CorpusSources {
            squad: self.squad,
            hotpot: self.hotpot,
            wiki18: self.wiki18,
            wiki_articles: self.wiki_articles,
            max_passages_per_article: self.max_passages_per_article,
            entity_questions: self.entity_questions,
            entity_question_filter: if self.entity_questions_with_article {
                ArticleFilter::WithArticle
            } else {
                ArticleFilter::All
            },
            synthetic,
        }
    }

    /// The same files as flags of `cloud-index build`.
    pub fn to_flags(&self) -> Vec<OsString> {
        let mut flags = Vec::new();
        for (flag, paths) in [
            ("--squad", &self.squad),
            ("--hotpot", &self.hotpot),
            ("--wiki18", &self.wiki18),
            ("--wiki-articles", &self.wiki_articles),
            ("--entity-questions", &self.entity_questions),
        ] {
            for path in paths {
                flags.extend([OsString::from(flag), path.into()]);
            }
        }
        if let Some(limit) = self.max_passages_per_article {
            flags.extend([
                "--max-passages-per-article".into(),
                limit.to_string().into(),
            ]);
        }
        if self.entity_questions_with_article {
            flags.push("--entity-questions-with-article".into());
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        files: CorpusFiles,
    }

    #[test]
    fn the_flags_parse_back_into_the_same_files() {
        let files = CorpusFiles {
            squad: vec!["a.json".into(), "b.json".into()],
            hotpot: vec!["h.jsonl".into()],
            wiki18: Vec::new(),
            wiki_articles: vec!["articles.jsonl.gz".into()],
            max_passages_per_article: Some(3),
            entity_questions: vec!["eq.jsonl.gz".into()],
            entity_questions_with_article: true,
        };
        let parsed =
            Command::parse_from(std::iter::once(OsString::from("build")).chain(files.to_flags()));
        assert_eq!(parsed.files, files);
        let none = Command::parse_from(["build"]);
        assert_eq!(none.files, CorpusFiles::default());
        assert!(none.files.to_flags().is_empty());
    }
}
