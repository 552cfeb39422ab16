//! A multi-hop agent on the hasten-lm runtime: the model writes each hop's sub-query, reads
//! the hop's documents into a short sub-answer, and writes the final answer from what it
//! read. Like the paper's CoRAG setting, the number of hops is a budget, not the model's
//! choice (a 135M model does not decide reliably when it knows enough). Greedy throughout,
//! so equal inputs give equal moves.

use std::ops::ControlFlow;

use hasten_lm::{ChatMessage, GenerationOptions, LanguageModel, Role, Sampling, generate};

use super::{Action, Hop, HopAgent};
use crate::error::{StepError, StepResult};
use crate::retriever::RetrievedDocument;

const PLAN_INSTRUCTION: &str = "You answer questions that need several look-ups. Write the \
next search query on one line, or the final answer on one line when asked for it.";
const READ_INSTRUCTION: &str =
    "Answer the search query from the documents in a few words, on one line.";
/// Tokens of one document in the reading prompt.
pub const DOCUMENT_TOKENS: usize = 160;
/// Most tokens of a sub-query, a sub-answer or the answer.
pub const LINE_TOKENS: usize = 24;

/// [`HopAgent`] on a local model with a fixed number of hops.
pub struct LmHopAgent<'a> {
    model: &'a LanguageModel,
    hops: usize,
    /// Most tokens of a sub-query, a sub-answer or the answer.
    line_tokens: usize,
}

impl<'a> LmHopAgent<'a> {
    pub fn new(model: &'a LanguageModel, hops: usize) -> Self {
        Self {
            model,
            hops,
            line_tokens: LINE_TOKENS,
        }
    }

    /// One greedy line after `messages` and a forced start of the reply (`prefix`).
    fn line(&self, messages: &[ChatMessage], prefix: &str) -> StepResult<String> {
        let tokenizer = &self.model.tokenizer;
        let mut prompt = self.model.chat.prompt(tokenizer, messages)?;
        prompt.extend(tokenizer.encode(prefix)?);
        let mut stop = vec![self.model.chat.end_of_turn(), tokenizer.eos()];
        if let [newline] = tokenizer.encode("\n")?.as_slice() {
            stop.push(*newline);
        }
        let options = GenerationOptions {
            max_new_tokens: self.line_tokens,
            stop_tokens: stop,
            sampling: Sampling::default(),
        };
        let (mut results, _) = generate(
            &self.model.decoder,
            std::slice::from_ref(&prompt),
            &options,
            |_, _| ControlFlow::Continue(()),
        )?;
        let tokens = results.pop().map(|r| r.tokens).unwrap_or_default();
        Ok(first_line(&tokenizer.decode(&tokens)?))
    }

    fn clip(&self, text: &str) -> StepResult<String> {
        let tokens = self.model.tokenizer.encode(text)?;
        if tokens.len() <= DOCUMENT_TOKENS {
            return Ok(text.to_owned());
        }
        Ok(self.model.tokenizer.decode(&tokens[..DOCUMENT_TOKENS])?)
    }
}

impl HopAgent for LmHopAgent<'_> {
    fn act(&self, question: &str, hops: &[Hop], must_answer: bool) -> StepResult<Action> {
        let answer = must_answer || hops.len() >= self.hops;
        let (messages, prefix) = plan_prompt(question, hops, answer);
        Ok(action(question, answer, self.line(&messages, prefix)?))
    }

    fn read(
        &self,
        question: &str,
        _hops: &[Hop],
        query: &str,
        documents: &[RetrievedDocument],
    ) -> StepResult<String> {
        let messages = read_prompt(question, query, documents, |text| self.clip(text))?;
        self.line(&messages, "")
    }
}

/// The planning prompt after `hops`, and the start forced on the reply: a search query, or
/// the final answer when `answer`.
pub fn plan_prompt(question: &str, hops: &[Hop], answer: bool) -> (Vec<ChatMessage>, &'static str) {
    let (ask, prefix) = if answer {
        ("Give the final answer.", "Answer:")
    } else {
        ("Write the next search query.", "Search:")
    };
    let messages = vec![
        ChatMessage::new(Role::System, PLAN_INSTRUCTION),
        ChatMessage::new(Role::User, format!("{}\n{ask}", transcript(question, hops))),
    ];
    (messages, prefix)
}

/// The move a planning line stands for.
pub fn action(question: &str, answer: bool, line: String) -> Action {
    if answer {
        Action::Answer(line)
    } else if line.is_empty() {
        // An empty query would retrieve at random: search the question itself instead.
        Action::Search(question.to_owned())
    } else {
        Action::Search(line)
    }
}

/// The reading prompt: each document (its title, and its text as `clip` cuts it to
/// [`DOCUMENT_TOKENS`] of the model's tokens), the question and the hop's query.
pub fn read_prompt(
    question: &str,
    query: &str,
    documents: &[RetrievedDocument],
    clip: impl Fn(&str) -> StepResult<String>,
) -> StepResult<Vec<ChatMessage>> {
    if documents.is_empty() {
        return Err(StepError::InvalidRequest("no document to read".into()));
    }
    let mut user = String::new();
    for document in documents {
        user.push_str(&format!(
            "Document: {}\n{}\n\n",
            document.title,
            clip(&document.text)?
        ));
    }
    user.push_str(&format!("Question: {question}\nSearch query: {query}"));
    Ok(vec![
        ChatMessage::new(Role::System, READ_INSTRUCTION),
        ChatMessage::new(Role::User, user),
    ])
}

/// The first line of what the model wrote.
pub fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_owned()
}

fn transcript(question: &str, hops: &[Hop]) -> String {
    let mut text = format!("Question: {question}\n");
    for hop in hops {
        text.push_str(&format!(
            "Search: {}\nFound: {}\n",
            hop.query, hop.sub_answer
        ));
    }
    text
}
