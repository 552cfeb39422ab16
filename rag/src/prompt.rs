//! Prompts as token ids: the standard RAG prompt, the drafter's subset prompt and the
//! verifier's question prompt, with documents truncated so that a prompt and its answer
//! fit the model's context.

use hasten_lm::{ChatMessage, LanguageModel, Role};

use crate::error::{RagError, Result};
use crate::request::{ChatTurn, Document};

/// Most tokens of one document's text in a prompt: retrieved passages are ~100 words, and a
/// longer one would crowd out the rest on a small model.
pub const DOCUMENT_TOKEN_CAP: usize = 384;
/// [`DOCUMENT_TOKEN_CAP`] in characters, for prompts built without a tokenizer (English
/// text averages about four characters a token).
pub const DOCUMENT_CHAR_CAP: usize = DOCUMENT_TOKEN_CAP * 4;
/// Fewer tokens than this per document make a document useless: refuse instead.
pub const MIN_DOCUMENT_TOKENS: usize = 8;

/// Standard RAG's system turn: a short answer, nothing else.
pub const STANDARD_INSTRUCTION: &str =
    "Answer the question using the documents. Reply with a short answer only.";
/// The drafter's system turn: the layout the drafts are parsed from. A filled-in example
/// would be copied by small models (Qwen2.5-0.5B answered "Paris" about Australia), so the
/// layout is given with placeholders only. The answer comes first: a rationale first ran
/// small drafters out of their token budget before they wrote an answer
/// (docs/benchmarks/speculative-rag.md, "Answer first").
pub const DRAFT_INSTRUCTION: &str = "Answer the question from the documents. Reply as\nAnswer: <short answer>\nRationale: <what the documents say>";
/// The verifier's system turn: the paper's layout, rationale then answer (each draft is laid
/// out so by [`draft_text`]), without documents to refer to.
pub const VERIFY_INSTRUCTION: &str =
    "Answer the question. Reply as\nRationale: <why>\nAnswer: <short answer>";
/// What the drafter's turn is started with, so that every draft opens with its answer.
pub const ANSWER_LABEL: &str = "Answer:";
pub const RATIONALE_LABEL: &str = "Rationale:";
/// The self-reflection statement of the paper (appendix F: the wording matters little).
pub const REFLECTION_STATEMENT: &str =
    "Do you think the explanation supports the answer? (Yes or No)";
pub const REFLECTION_YES: &str = "Yes";

/// The verifier's prompt for standard RAG, and how many of the conversation's earlier turns
/// were left out to fit it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandardPrompt {
    pub ids: Vec<u32>,
    pub dropped_turns: usize,
}

/// The verifier's prompt for standard RAG: the instruction and the client's system
/// messages, the conversation's earlier turns, then every document's text (without its
/// title, see [`Titles`]) and the question. The
/// oldest turns are left out first when the prompt would not fit the context with room for
/// the documents.
pub fn standard_prompt(
    model: &LanguageModel,
    question: &str,
    documents: &[&Document],
    conversation: &[ChatTurn],
    max_new_tokens: usize,
) -> Result<StandardPrompt> {
    let reserved = Reserved {
        tokens: max_new_tokens,
        field: "max_new_tokens",
    };
    let system = system_text(conversation);
    let turns: Vec<&ChatTurn> = conversation
        .iter()
        .filter(|turn| turn.role != Role::System)
        .collect();
    let build = |earlier: &[&ChatTurn], texts: &[String]| {
        let messages = standard_message_list(&system, earlier, documents, texts, question);
        model.chat.prompt(&model.tokenizer, &messages)
    };
    let encoded = encode_documents(model, documents)?;
    let mut dropped_turns = 0;
    loop {
        let earlier = &turns[dropped_turns..];
        match fit_documents(model, documents, &encoded, &reserved, |texts| {
            build(earlier, texts)
        }) {
            Err(RagError::InvalidRequest {
                field: "question", ..
            }) if dropped_turns < turns.len() => dropped_turns += 1,
            Ok(ids) => return Ok(StandardPrompt { ids, dropped_turns }),
            Err(error) => return Err(error),
        }
    }
}

/// Standard RAG's prompt as chat messages, for an engine that applies its own chat template
/// and counts its own tokens: the same instruction, turns and document layout as
/// [`standard_prompt`], each document cut to [`DOCUMENT_CHAR_CAP`] characters (no tokenizer
/// here to cut by tokens). Whether it fits is the engine's to say.
pub fn standard_messages(
    question: &str,
    documents: &[&Document],
    conversation: &[ChatTurn],
) -> Vec<ChatMessage> {
    let texts = capped_texts(documents);
    let earlier: Vec<&ChatTurn> = conversation
        .iter()
        .filter(|turn| turn.role != Role::System)
        .collect();
    standard_message_list(
        &system_text(conversation),
        &earlier,
        documents,
        &texts,
        question,
    )
}

fn standard_message_list(
    system: &str,
    earlier: &[&ChatTurn],
    documents: &[&Document],
    texts: &[String],
    question: &str,
) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::new(Role::System, system)];
    messages.extend(
        earlier
            .iter()
            .map(|turn| ChatMessage::new(turn.role, turn.content.clone())),
    );
    messages.push(ChatMessage::new(
        Role::User,
        documents_and_question(documents, texts, question, Titles::Omitted),
    ));
    messages
}

/// The documents' texts cut to [`DOCUMENT_CHAR_CAP`], for prompts built without a tokenizer.
fn capped_texts(documents: &[&Document]) -> Vec<String> {
    documents
        .iter()
        .map(|d| cut_at_char_boundary(d.text.trim(), DOCUMENT_CHAR_CAP).to_string())
        .collect()
}

/// The first `max` bytes of `text`, ending on a character boundary.
fn cut_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The standard instruction, then the client's system messages.
fn system_text(conversation: &[ChatTurn]) -> String {
    let mut text = String::from(STANDARD_INSTRUCTION);
    for turn in conversation.iter().filter(|t| t.role == Role::System) {
        text.push_str("\n\n");
        text.push_str(turn.content.trim());
    }
    text
}

/// The drafter's prompt for one subset, ending inside the assistant turn after
/// [`ANSWER_LABEL`].
pub fn drafter_prompt(
    model: &LanguageModel,
    question: &str,
    documents: &[&Document],
    draft_tokens: usize,
) -> Result<Vec<u32>> {
    let prefix = model.tokenizer.encode(ANSWER_LABEL)?;
    let reserved = Reserved {
        tokens: draft_tokens,
        field: "speculative.draft_tokens",
    };
    let encoded = encode_documents(model, documents)?;
    fit_documents(model, documents, &encoded, &reserved, |texts| {
        let mut ids = model.chat.prompt(
            &model.tokenizer,
            &drafter_message_list(documents, texts, question),
        )?;
        ids.extend_from_slice(&prefix);
        Ok(ids)
    })
}

/// The drafter's prompt for one subset as chat messages, for an engine (documents cut to
/// [`DOCUMENT_CHAR_CAP`] characters, as in [`standard_messages`]). The engine's reply is
/// asked to open with [`ANSWER_LABEL`] rather than started with it: not every engine
/// continues a partial assistant turn.
pub fn drafter_messages(question: &str, documents: &[&Document]) -> Vec<ChatMessage> {
    drafter_message_list(documents, &capped_texts(documents), question)
}

fn drafter_message_list(
    documents: &[&Document],
    texts: &[String],
    question: &str,
) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(Role::System, DRAFT_INSTRUCTION),
        ChatMessage::new(
            Role::User,
            documents_and_question(documents, texts, question, Titles::Shown),
        ),
    ]
}

/// The verifier's context: the question alone (the paper's verifier skips the documents and
/// judges the draft by its rationale).
pub fn verifier_context(model: &LanguageModel, question: &str) -> Result<Vec<u32>> {
    Ok(model
        .chat
        .prompt(&model.tokenizer, &verifier_messages(question))?)
}

/// [`verifier_context`] as chat messages, for an engine.
pub fn verifier_messages(question: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(Role::System, VERIFY_INSTRUCTION),
        ChatMessage::new(Role::User, format!("Question: {}", question.trim())),
    ]
}

/// A draft as the verifier reads it (and as its consistency is scored).
pub fn draft_text(rationale: &str, answer: &str) -> String {
    format!("{RATIONALE_LABEL} {rationale}\n{ANSWER_LABEL} {answer}")
}

/// Whether a prompt puts each document's title above its text.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Titles {
    /// Standard RAG: on Qwen2.5-Coder-0.5B the titles cost 3.5 F1 points over HotpotQA-100
    /// and SQuAD-100 together (docs/benchmarks/answers.md, "The prompt").
    Omitted,
    /// The drafter's prompt (not measured without them).
    Shown,
}

fn documents_and_question(
    documents: &[&Document],
    texts: &[String],
    question: &str,
    titles: Titles,
) -> String {
    let mut content = String::from("Documents:\n");
    for (i, (document, text)) in documents.iter().zip(texts).enumerate() {
        let title = document.title.trim();
        if titles == Titles::Omitted || title.is_empty() {
            content.push_str(&format!("[{}] {text}\n\n", i + 1));
        } else {
            content.push_str(&format!("[{}] {title}\n{text}\n\n", i + 1));
        }
    }
    content.push_str(&format!("Question: {}", question.trim()));
    content
}

/// Room kept after a prompt for the tokens to generate, and the request field that set it.
struct Reserved {
    tokens: usize,
    field: &'static str,
}

/// The documents' texts as token ids, once per prompt (fitting may build it several times).
fn encode_documents(model: &LanguageModel, documents: &[&Document]) -> Result<Vec<Vec<u32>>> {
    Ok(documents
        .iter()
        .map(|d| model.tokenizer.encode(d.text.trim()))
        .collect::<hasten_lm::Result<_>>()?)
}

/// Builds the prompt with every document's text cut to one token budget, the largest (up to
/// [`DOCUMENT_TOKEN_CAP`]) with which prompt plus the reserved new tokens fit the context.
fn fit_documents(
    model: &LanguageModel,
    documents: &[&Document],
    encoded: &[Vec<u32>],
    reserved: &Reserved,
    build: impl Fn(&[String]) -> hasten_lm::Result<Vec<u32>>,
) -> Result<Vec<u32>> {
    let context = model.decoder.rope().max_positions();
    if reserved.tokens >= context {
        return Err(RagError::invalid(
            reserved.field,
            format!(
                "asks for {} tokens; the model's context holds {context}",
                reserved.tokens
            ),
        ));
    }
    let reserved = reserved.tokens;
    let room = context - reserved;
    let empty = vec![String::new(); documents.len()];
    let overhead = build(&empty)?.len();
    if overhead + MIN_DOCUMENT_TOKENS * documents.len() > room {
        return Err(RagError::invalid(
            "question",
            format!(
                "with the instructions and the layout of {} documents takes {overhead} tokens; the \
                 model's context of {context} leaves {room} after {reserved} new tokens",
                documents.len()
            ),
        ));
    }
    let mut budget = ((room - overhead) / documents.len().max(1)).min(DOCUMENT_TOKEN_CAP);
    // Text cut at a token boundary can re-tokenise a little longer: shrink and retry.
    loop {
        let texts = encoded
            .iter()
            .map(|ids| truncate(model, ids, budget))
            .collect::<Result<Vec<_>>>()?;
        let prompt = build(&texts)?;
        if prompt.len() <= room {
            return Ok(prompt);
        }
        let excess = prompt.len() - room;
        let shrink = excess.div_ceil(documents.len().max(1));
        if budget < MIN_DOCUMENT_TOKENS + shrink {
            return Err(RagError::invalid(
                "documents",
                format!("do not fit the model's context of {context} tokens"),
            ));
        }
        budget -= shrink;
    }
}

/// The text of the first `budget` tokens, without a character cut in half.
fn truncate(model: &LanguageModel, ids: &[u32], budget: usize) -> Result<String> {
    let kept = &ids[..ids.len().min(budget)];
    let text = model.tokenizer.decode(kept)?;
    Ok(text.trim_end_matches('\u{FFFD}').trim().to_string())
}
