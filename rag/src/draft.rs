//! The drafter's side of Speculative RAG: one rationale and answer per document subset, all
//! subsets decoded in one batch, and each draft's log-probability under the drafter.

use std::ops::ControlFlow;

use hasten_lm::{
    GenerationOptions, GenerationTimings, LanguageModel, Sampling, generate_interruptible,
};

use crate::error::{RagError, Result};
use crate::prompt::{ANSWER_LABEL, drafter_prompt};
use crate::request::Document;

/// One draft as the drafter wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Indices into the request's documents.
    pub documents: Vec<usize>,
    pub rationale: String,
    pub answer: String,
    /// False when the drafter never wrote "Answer:" and the answer is the rationale's last
    /// sentence.
    pub labelled: bool,
    /// The generated tokens (after the forced "Rationale:").
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
    // A draft ends with its answer's line: what follows is never parsed, so decoding it
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
                Ok(text) if answer_line_ended(&text) => ControlFlow::Break(()),
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
    pub labelled: bool,
}

/// Splits what the drafter wrote after "Rationale:" into rationale and answer. The answer is
/// the line after the first "Answer:" (any case). A small model may never write the label,
/// or run out of tokens before the answer: then the answer is the rationale's last sentence,
/// the likeliest place for a conclusion, and `labelled` is false.
pub fn parse_draft(text: &str) -> ParsedDraft {
    let parsed = parse_labelled(text);
    ParsedDraft {
        answer: without_citation(&parsed.answer).to_string(),
        ..parsed
    }
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

/// Where the first "Answer:" label (any case) starts.
fn answer_label(text: &str) -> Option<usize> {
    // The label is ASCII, so a byte-wise match is a match of whole characters.
    text.as_bytes()
        .windows(ANSWER_LABEL.len())
        .position(|window| window.eq_ignore_ascii_case(ANSWER_LABEL.as_bytes()))
}

/// Whether `text` holds a labelled answer whose line has ended: anything written after it
/// leaves [`parse_draft`]'s result as it is.
pub fn answer_line_ended(text: &str) -> bool {
    answer_label(text).is_some_and(|at| text[at + ANSWER_LABEL.len()..].trim_start().contains('\n'))
}

fn parse_labelled(text: &str) -> ParsedDraft {
    if let Some(at) = answer_label(text) {
        let rationale = text[..at].trim().to_string();
        let answer = text[at + ANSWER_LABEL.len()..]
            .trim_start()
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        if !answer.is_empty() {
            return ParsedDraft {
                rationale,
                answer,
                labelled: true,
            };
        }
        return ParsedDraft {
            answer: last_sentence(&rationale),
            rationale,
            labelled: false,
        };
    }
    let rationale = text.trim().to_string();
    ParsedDraft {
        answer: last_sentence(&rationale),
        rationale,
        labelled: false,
    }
}

/// The last non-empty sentence of `text` (sentences end at '.', '!' or '?' followed by
/// whitespace, or at a line break).
fn last_sentence(text: &str) -> String {
    let mut sentences = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        let next_is_space = chars.get(k + 1).is_none_or(|&(_, n)| n.is_whitespace());
        if c == '\n' || (matches!(c, '.' | '!' | '?') && next_is_space) {
            sentences.push(&text[start..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    sentences.push(&text[start..]);
    sentences
        .iter()
        .map(|s| s.trim())
        .rfind(|s| !s.is_empty())
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_labelled_draft_splits_into_rationale_and_answer() {
        let parsed =
            parse_draft(" Document 1 says Canberra is the capital.\nAnswer: Canberra\n\nMore");
        assert_eq!(parsed.rationale, "Document 1 says Canberra is the capital.");
        assert_eq!(parsed.answer, "Canberra");
        assert!(parsed.labelled);
        let lower = parse_draft("It is Paris. answer: Paris");
        assert_eq!(lower.answer, "Paris");
    }

    #[test]
    fn without_the_label_the_last_sentence_is_the_answer() {
        let parsed = parse_draft(" The river is long. It flows through Egypt. The Nile");
        assert!(!parsed.labelled);
        assert_eq!(parsed.answer, "The Nile");
        let dangling = parse_draft(" Marie Curie was born in Warsaw.\nAnswer:");
        assert_eq!(dangling.answer, "Marie Curie was born in Warsaw.");
        assert_eq!(parse_draft("").answer, "");
    }

    #[test]
    fn a_copied_document_marker_is_not_part_of_the_answer() {
        assert_eq!(
            parse_draft("Docs agree. Answer: [3] Lucy Saunders").answer,
            "Lucy Saunders"
        );
        assert_eq!(
            parse_draft("[1, 2] Paul Meany is a singer.").answer,
            "Paul Meany is a singer."
        );
        assert_eq!(parse_draft("Answer: [a] list").answer, "[a] list");
        assert_eq!(parse_draft("Answer: [] x").answer, "[] x");
    }

    #[test]
    fn a_draft_cut_where_its_answer_line_ends_parses_as_the_whole_draft() {
        let drafts = [
            " Canberra is the capital.\nAnswer: Canberra\n\nMore text. Answer: Sydney\n",
            " It says so.\nAnswer:\n  Warsaw\nand more",
            " answer: [2] Lucy\r\nNext line",
            " No label here.\nJust text.\n",
            " Dangling.\nAnswer:  \n\n",
        ];
        for draft in drafts {
            let whole = parse_draft(draft);
            let cut = draft
                .char_indices()
                .map(|(i, c)| &draft[..i + c.len_utf8()])
                .find(|prefix| answer_line_ended(prefix));
            match cut {
                Some(prefix) => {
                    assert_eq!(parse_draft(prefix), whole, "{draft:?} cut to {prefix:?}");
                    // One character less and the answer line has not ended yet.
                    let shorter = &prefix[..prefix.len() - 1];
                    assert!(!answer_line_ended(shorter), "{shorter:?}");
                }
                None => assert!(!whole.labelled, "{draft:?}"),
            }
        }
        assert!(answer_line_ended("Answer: Paris\n"));
        assert!(!answer_line_ended("Answer: Paris"));
        assert!(!answer_line_ended("Answer:\n\n"));
    }

    #[test]
    fn non_ascii_text_does_not_break_parsing() {
        let parsed = parse_draft("İstanbul ist groß. Answer: İstanbul");
        assert_eq!(parsed.answer, "İstanbul");
        assert_eq!(last_sentence("Ça va? Très bien"), "Très bien");
    }
}
