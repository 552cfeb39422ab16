//! The drafter's side of Speculative RAG: one answer and rationale per document subset, all
//! subsets decoded in one batch, and each draft's log-probability under the drafter.

use std::ops::ControlFlow;

use hasten_lm::{
    GenerationOptions, GenerationTimings, LanguageModel, Sampling, generate_interruptible,
};

use crate::error::{RagError, Result};
use crate::prompt::{ANSWER_LABEL, RATIONALE_LABEL, drafter_prompt};
use crate::request::Document;

/// One draft as the drafter wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Indices into the request's documents.
    pub documents: Vec<usize>,
    pub rationale: String,
    pub answer: String,
    /// False when no "Rationale:" label followed the answer (the draft ran out of tokens
    /// in its answer, or left the layout).
    pub labelled: bool,
    /// The generated tokens (after the forced "Answer:").
    pub tokens: Vec<u32>,
    /// log P(tokens | prompt): the sum of the generated tokens' log-probabilities.
    pub logprob: f32,
}

#[derive(Debug, Clone)]
pub struct Drafting {
    pub drafts: Vec<Draft>,
    pub generation: GenerationTimings,
}

/// Writes one draft per subset with the drafter: one batched greedy `generate` for all of
/// them, which also gives each draft's log-probability. Decoding stops at the first step
/// where `cancelled` says the caller went away.
pub fn write_drafts(
    drafter: &LanguageModel,
    question: &str,
    documents: &[Document],
    subsets: &[Vec<usize>],
    draft_tokens: usize,
    cancelled: &dyn Fn() -> bool,
) -> Result<Drafting> {
    let _span = tracing::info_span!("rag_draft", drafts = subsets.len(), draft_tokens).entered();
    let prompts = subsets
        .iter()
        .map(|subset| {
            let chosen = subset
                .iter()
                .map(|&i| {
                    documents.get(i).ok_or_else(|| {
                        RagError::invalid(
                            "documents",
                            format!("a subset names document {i} of {}", documents.len()),
                        )
                    })
                })
                .collect::<Result<Vec<&Document>>>()?;
            drafter_prompt(drafter, question, &chosen, draft_tokens)
        })
        .collect::<Result<Vec<_>>>()?;
    let options = GenerationOptions {
        max_new_tokens: draft_tokens,
        stop_tokens: vec![drafter.chat.end_of_turn(), drafter.tokenizer.eos()],
        // The paper drafts greedily (temperature 0): the subsets supply the diversity.
        sampling: Sampling::default(),
    };
    // A draft ends with its rationale's line: what follows is never parsed, so decoding it
    // would only cost time (and dilute the draft's probability with text nobody reads).
    let mut written: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let (generated, generation) = generate_interruptible(
        &drafter.decoder,
        &prompts,
        &options,
        cancelled,
        |row, id| {
            if cancelled() {
                return ControlFlow::Break(());
            }
            let Some(tokens) = written.get_mut(row) else {
                return ControlFlow::Continue(());
            };
            tokens.push(id);
            match drafter.tokenizer.decode(tokens) {
                Ok(text) if draft_ended(&text) => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        },
    )?;

    // log P(rationale, answer | subset prompt): the log-probabilities the drafter gave its
    // own tokens as it wrote them (a draft that stopped at once scores log 1 = 0).
    let logprobs: Vec<f32> = generated.iter().map(|g| g.logprobs.iter().sum()).collect();

    let drafts = subsets
        .iter()
        .zip(generated)
        .zip(logprobs)
        .map(|((subset, generated), logprob)| {
            let text = drafter.tokenizer.decode(&generated.tokens)?;
            let parsed = parse_draft(&text);
            Ok(Draft {
                documents: subset.clone(),
                rationale: parsed.rationale,
                answer: parsed.answer,
                labelled: parsed.labelled,
                tokens: generated.tokens,
                logprob,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    tracing::debug!(
        unlabelled = drafts.iter().filter(|d| !d.labelled).count(),
        "drafts written"
    );
    Ok(Drafting { drafts, generation })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedDraft {
    pub rationale: String,
    pub answer: String,
    /// False when no "Rationale:" label followed the answer.
    pub labelled: bool,
}

/// Splits what the drafter wrote after "Answer:" into answer and rationale: the answer is the
/// first non-empty line (or what precedes a "Rationale:" label on it), the rationale the next
/// non-empty line, without its label. Only those lines are read, so a draft cut where
/// [`draft_ended`] says parses as the whole draft would.
pub fn parse_draft(text: &str) -> ParsedDraft {
    let parts = split_draft(text);
    ParsedDraft {
        rationale: parts.rationale.to_string(),
        answer: without_citation(parts.answer).to_string(),
        labelled: parts.labelled,
    }
}

/// Whether the draft's rationale line has ended: anything written after it leaves
/// [`parse_draft`]'s result as it is.
pub fn draft_ended(text: &str) -> bool {
    split_draft(text).ended
}

struct DraftParts<'a> {
    answer: &'a str,
    rationale: &'a str,
    labelled: bool,
    ended: bool,
}

fn split_draft(text: &str) -> DraftParts<'_> {
    let text = text.trim_start();
    // An engine's drafter is asked to open with the label; the local one is started after it.
    let text = strip_label(text, ANSWER_LABEL).map_or(text, str::trim_start);
    let line_end = text.find('\n').unwrap_or(text.len());
    let (answer, rest) = match find_label(&text[..line_end], RATIONALE_LABEL) {
        Some(at) => (&text[..at], &text[at..]),
        None => (&text[..line_end], &text[line_end..]),
    };
    let rest = rest.trim_start();
    let (rest, labelled) = match strip_label(rest, RATIONALE_LABEL) {
        Some(after) => (after.trim_start(), true),
        None => (rest, false),
    };
    let (rationale, ended) = match rest.find('\n') {
        Some(at) => (&rest[..at], true),
        None => (rest, false),
    };
    DraftParts {
        answer: answer.trim(),
        rationale: rationale.trim(),
        labelled,
        ended,
    }
}

/// Where `label` (ASCII, any case) first occurs in `text`.
fn find_label(text: &str, label: &str) -> Option<usize> {
    // The label is ASCII, so a byte-wise match is a match of whole characters.
    text.as_bytes()
        .windows(label.len())
        .position(|window| window.eq_ignore_ascii_case(label.as_bytes()))
}

/// `text` after `label` (ASCII, any case) when it starts with it.
fn strip_label<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let head = text.as_bytes().get(..label.len())?;
    head.eq_ignore_ascii_case(label.as_bytes())
        .then(|| &text[label.len()..])
}

/// The answer without a leading document marker such as "[3] ": small drafters copy the
/// prompt's numbering into their answers, which is not part of any answer.
fn without_citation(answer: &str) -> &str {
    let trimmed = answer.trim_start();
    if let Some(rest) = trimmed.strip_prefix('[')
        && let Some(close) = rest.find(']')
        && close > 0
        && rest[..close]
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
    {
        return rest[close + 1..].trim_start();
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_splits_into_its_answer_line_and_rationale_line() {
        let parsed = parse_draft(" Canberra\nRationale: Document 1 says it is the capital.\nMore");
        assert_eq!(parsed.answer, "Canberra");
        assert_eq!(parsed.rationale, "Document 1 says it is the capital.");
        assert!(parsed.labelled);
        let lower = parse_draft("Paris rationale: it says so");
        assert_eq!(
            (lower.answer.as_str(), lower.rationale.as_str()),
            ("Paris", "it says so")
        );
        let engine = parse_draft("Answer: Paris\nRationale:\n  It says so.\n");
        assert_eq!(
            (engine.answer.as_str(), engine.rationale.as_str()),
            ("Paris", "It says so.")
        );
    }

    #[test]
    fn a_draft_without_a_labelled_rationale_keeps_its_answer() {
        let cut = parse_draft(" The Nile");
        assert_eq!(
            (cut.answer.as_str(), cut.rationale.as_str()),
            ("The Nile", "")
        );
        assert!(!cut.labelled);
        let unlabelled = parse_draft(" Warsaw\nShe was born there.");
        assert_eq!(unlabelled.answer, "Warsaw");
        assert_eq!(unlabelled.rationale, "She was born there.");
        assert!(!unlabelled.labelled);
        assert_eq!(parse_draft("").answer, "");
    }

    #[test]
    fn a_copied_document_marker_is_not_part_of_the_answer() {
        assert_eq!(parse_draft(" [3] Lucy Saunders").answer, "Lucy Saunders");
        assert_eq!(parse_draft("[1, 2] Paul Meany").answer, "Paul Meany");
        assert_eq!(parse_draft(" [a] list").answer, "[a] list");
        assert_eq!(parse_draft(" [] x").answer, "[] x");
    }

    #[test]
    fn a_draft_cut_where_it_ends_parses_as_the_whole_draft() {
        let drafts = [
            " Canberra\nRationale: It is the capital.\nAnswer: Sydney\n",
            " Warsaw Rationale: born there\nmore",
            "\n\n [2] Lucy\r\nrationale:\n\n It says so.\r\nNext line",
            " Paris\n\n",
            " No rationale follows",
        ];
        for draft in drafts {
            let whole = parse_draft(draft);
            let cut = draft
                .char_indices()
                .map(|(i, c)| &draft[..i + c.len_utf8()])
                .find(|prefix| draft_ended(prefix));
            match cut {
                Some(prefix) => {
                    assert_eq!(parse_draft(prefix), whole, "{draft:?} cut to {prefix:?}");
                    // One character less and the rationale line has not ended yet.
                    let shorter = &prefix[..prefix.len() - 1];
                    assert!(!draft_ended(shorter), "{shorter:?}");
                }
                None => assert!(whole.rationale.is_empty() || !draft.ends_with('\n')),
            }
        }
        assert!(draft_ended("Paris\nRationale: it says so\n"));
        assert!(!draft_ended("Paris\nRationale: it says so"));
        assert!(!draft_ended("Paris\n"));
        assert!(!draft_ended("Paris\nRationale:\n\n"));
    }

    #[test]
    fn non_ascii_text_does_not_break_parsing() {
        let parsed = parse_draft(" İstanbul\nRationale: groß ist İstanbul.");
        assert_eq!(parsed.answer, "İstanbul");
        assert_eq!(parsed.rationale, "groß ist İstanbul.");
    }
}
