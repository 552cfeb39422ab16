//! Two runs' answers to the same workload compared question by question: what
//! `hasten-loadtest compare-answers` prints, for a setting changed between runs (a worker
//! option, an edge flag) where one run's report cannot pair them.

use std::collections::HashMap;
use std::path::Path;

use hasten_eval::paired::{PairedDifference, RESAMPLES, paired_difference};
use serde::Deserialize;

use super::summary::Quality;

/// The fields of an answers log line (`logs/answers-N.jsonl`) a comparison reads.
#[derive(Debug, Clone, Deserialize)]
pub struct LoggedAnswer {
    pub seq: usize,
    pub answer: Option<String>,
    pub gold: Vec<String>,
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}")]
    Parse {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Every answer of a log, by workload sequence number.
pub fn read_answers(path: &Path) -> Result<HashMap<usize, LoggedAnswer>, CompareError> {
    let text = std::fs::read_to_string(path).map_err(|source| CompareError::Read {
        path: path.display().to_string(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            let answer: LoggedAnswer =
                serde_json::from_str(line).map_err(|source| CompareError::Parse {
                    path: path.display().to_string(),
                    line: i + 1,
                    source,
                })?;
            Ok((answer.seq, answer))
        })
        .collect()
}

/// `other` against `base` over the questions both answered without error and with gold
/// answers to score.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerComparison {
    pub base_f1: f64,
    pub other_f1: f64,
    /// other's F1 minus base's, with its 95% bootstrap interval.
    pub f1: PairedDifference,
    /// Pairs whose answer texts differ.
    pub differing: usize,
}

pub fn compare(
    base: &HashMap<usize, LoggedAnswer>,
    other: &HashMap<usize, LoggedAnswer>,
    seed: u64,
) -> Option<AnswerComparison> {
    let scored = |a: &LoggedAnswer| -> Option<(f64, String)> {
        if a.error.is_some() {
            return None;
        }
        let text = a.answer.clone()?;
        Some((Quality::of(&text, &a.gold)?.f1, text))
    };
    let mut seqs: Vec<usize> = base.keys().copied().collect();
    seqs.sort_unstable();
    let (mut base_f1, mut other_f1, mut differing) = (0.0, 0.0, 0);
    let mut differences = Vec::new();
    for seq in seqs {
        let (Some((b, b_text)), Some((o, o_text))) = (
            base.get(&seq).and_then(scored),
            other.get(&seq).and_then(scored),
        ) else {
            continue;
        };
        base_f1 += b;
        other_f1 += o;
        differing += usize::from(b_text != o_text);
        differences.push(o - b);
    }
    let f1 = paired_difference(&differences, RESAMPLES, seed)?;
    let n = f1.pairs as f64;
    Some(AnswerComparison {
        base_f1: base_f1 / n,
        other_f1: other_f1 / n,
        f1,
        differing,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn log(answers: &[(usize, &str, Option<&str>)]) -> HashMap<usize, LoggedAnswer> {
        answers
            .iter()
            .map(|&(seq, text, error)| {
                (
                    seq,
                    LoggedAnswer {
                        seq,
                        answer: Some(text.into()),
                        gold: vec!["Bobby Brown".into()],
                        error: error.map(Into::into),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn pairs_by_sequence_and_leaves_out_errors() {
        let base = log(&[(0, "Bobby Brown", None), (1, "Elton", None), (2, "x", None)]);
        // Seq 2 failed in the other run: not a pair; seq 1 improved from 0 to 1.
        let other = log(&[
            (1, "Bobby Brown", None),
            (0, "Bobby Brown", None),
            (2, "Bobby Brown", Some("timeout")),
        ]);
        let c = compare(&base, &other, 1).unwrap();
        assert_eq!(c.f1.pairs, 2);
        assert_eq!(c.differing, 1);
        assert!((c.base_f1 - 0.5).abs() < 1e-12 && (c.other_f1 - 1.0).abs() < 1e-12);
        assert!((c.f1.mean - 0.5).abs() < 1e-12);
        assert!(compare(&base, &HashMap::new(), 1).is_none());
    }

    #[test]
    fn reads_a_log_and_names_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers-0.jsonl");
        std::fs::write(
            &path,
            "{\"seq\":3,\"answer\":\"a\",\"gold\":[\"a\"],\"error\":null,\"ttft_s\":1.0}\n",
        )
        .unwrap();
        assert_eq!(
            read_answers(&path).unwrap()[&3].answer.as_deref(),
            Some("a")
        );
        std::fs::write(&path, "{\"seq\":3}\nnot json\n").unwrap();
        let error = read_answers(&path).unwrap_err().to_string();
        assert!(error.contains("line 1"), "{error}");
    }
}
