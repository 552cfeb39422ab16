//! The verifier's side of Speculative RAG: every draft scored in one forward pass, all drafts
//! in one batch (paper, section 3.3), after the question prompt they share is read once.
//!
//! A row is the question prompt followed by the draft as the assistant's turn, the
//! self-reflection statement as the user's next turn, and "Yes" as the assistant's reply.
//! Turns rather than one run of text because the verifiers here are chat models: "Yes" is
//! then the answer to a question they were asked. One pass gives every token's
//! log-probability; the draft's tokens sum to the self-consistency score, "Yes"'s to the
//! self-reflection score.

use std::ops::Range;

use hasten_lm::{LanguageModel, LmError, score_shared};

use crate::error::Result;
use crate::prompt::{REFLECTION_STATEMENT, REFLECTION_YES, draft_text, verifier_context};

/// The drafts laid out for scoring: every row follows the same `context` (the question
/// prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerificationRows {
    pub context: Vec<u32>,
    pub rows: Vec<VerificationRow>,
}

/// One draft laid out for scoring after the shared context: `continuation[draft]` are the
/// draft's tokens and `continuation[yes]` the affirmative reply's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerificationRow {
    pub continuation: Vec<u32>,
    pub draft: Range<usize>,
    pub yes: Range<usize>,
}

/// The verifier's two scores of one draft, in log space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// log P(rationale, answer | question).
    pub consistency: f32,
    /// log P("Yes" | question, draft, reflection statement).
    pub reflection: f32,
}

impl VerificationRow {
    /// Reads both scores from the continuation's per-token log-probabilities.
    pub fn verdict(&self, logprobs: &[f32]) -> Verdict {
        let sum =
            |range: &Range<usize>| logprobs.get(range.clone()).map_or(0.0, |s| s.iter().sum());
        Verdict {
            consistency: sum(&self.draft),
            reflection: sum(&self.yes),
        }
    }
}

/// Lays out `(rationale, answer)` drafts for the verifier.
pub fn verification_rows(
    verifier: &LanguageModel,
    question: &str,
    drafts: &[(&str, &str)],
) -> Result<VerificationRows> {
    let tokenizer = &verifier.tokenizer;
    let start = tokenizer.control_token("<|im_start|>").ok_or_else(|| {
        LmError::InvalidInput("the verifier's vocabulary has no <|im_start|> marker".into())
    })?;
    let end = verifier.chat.end_of_turn();
    let context = verifier_context(verifier, question)?;
    let newline = tokenizer.encode("\n")?;
    // Everything between the draft and the reply is the same for every draft.
    let mut between = vec![end];
    between.extend(&newline);
    between.push(start);
    between.extend(tokenizer.encode(&format!("user\n{REFLECTION_STATEMENT}"))?);
    between.push(end);
    between.extend(&newline);
    between.push(start);
    between.extend(tokenizer.encode("assistant\n")?);
    let yes = tokenizer.encode(REFLECTION_YES)?;
    let rows = drafts
        .iter()
        .map(|(rationale, answer)| {
            let draft = tokenizer.encode(&draft_text(rationale, answer))?;
            let mut continuation = draft.clone();
            continuation.extend(&between);
            let yes_start = continuation.len();
            continuation.extend(&yes);
            Ok(VerificationRow {
                draft: 0..draft.len(),
                yes: yes_start..continuation.len(),
                continuation,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(VerificationRows { context, rows })
}

/// The verdicts on a batch of drafts, and the tokens the verifier read for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Verification {
    pub verdicts: Vec<Verdict>,
    pub tokens: usize,
}

/// Scores every draft with one batched forward pass of the verifier over the drafts, after
/// one pass over the question prompt they share.
pub fn verify(
    verifier: &LanguageModel,
    question: &str,
    drafts: &[(&str, &str)],
) -> Result<Verification> {
    let _span = tracing::info_span!("rag_verify", drafts = drafts.len()).entered();
    if drafts.is_empty() {
        return Ok(Verification {
            verdicts: Vec::new(),
            tokens: 0,
        });
    }
    let VerificationRows { context, rows } = verification_rows(verifier, question, drafts)?;
    let continuations: Vec<Vec<u32>> = rows.iter().map(|row| row.continuation.clone()).collect();
    let scores = score_shared(&verifier.decoder, &context, &continuations)?;
    Ok(Verification {
        verdicts: rows
            .iter()
            .zip(&scores)
            .map(|(row, logprobs)| row.verdict(logprobs))
            .collect(),
        tokens: context.len() + continuations.iter().map(Vec::len).sum::<usize>(),
    })
}
