//! Query rewriting for chat: the model turns a follow-up question ("Who did they beat?")
//! into a standalone one ("Who did the Denver Broncos beat in Super Bowl 50?") for
//! retrieval. Off by default at the edge (`chat_query_rewrite`); a backend that cannot
//! rewrite leaves the edge's rule in place.

use std::ops::ControlFlow;

use hasten_lm::{ChatMessage, GenerationOptions, LanguageModel, Role, Sampling, generate};

use crate::error::{RagError, Result};
use crate::request::ChatTurn;

/// Most tokens a rewrite may take: one question.
pub const REWRITE_TOKENS: usize = 48;

/// Earlier turns shown to the rewriting model, newest kept: a follow-up refers to what was
/// just said.
const REWRITE_TURNS: usize = 6;

/// Longest turn shown, in characters (a client may put its own context in a turn).
const TURN_CHARS: usize = 600;

const REWRITE_INSTRUCTION: &str = "You rewrite questions; you never answer them. Rewrite \
the user's last question as one standalone question that can be understood without the \
conversation: replace pronouns and references with the names they stand for. Reply with the \
rewritten question only.";

/// One worked example before the request: small models otherwise answer the question.
const EXAMPLE: (&str, &str) = (
    "Conversation:\nUser: Who wrote Hamlet?\nAssistant: William Shakespeare.\n\nLast \
     question: When was he born?",
    "When was William Shakespeare born?",
);

/// The rewrite prompt: the instruction, a worked example, then the recent conversation and
/// the last question as one user message (system messages are the client's instructions,
/// not context).
pub fn rewrite_messages(conversation: &[ChatTurn], question: &str) -> Vec<ChatMessage> {
    let turns: Vec<&ChatTurn> = conversation
        .iter()
        .filter(|turn| turn.role != Role::System)
        .collect();
    let recent = &turns[turns.len().saturating_sub(REWRITE_TURNS)..];
    let mut transcript = String::from("Conversation:\n");
    for turn in recent {
        let speaker = match turn.role {
            Role::Assistant => "Assistant",
            _ => "User",
        };
        let text: String = turn.content.trim().chars().take(TURN_CHARS).collect();
        transcript.push_str(&format!("{speaker}: {text}\n"));
    }
    transcript.push_str(&format!("\nLast question: {}", question.trim()));
    vec![
        ChatMessage::new(Role::System, REWRITE_INSTRUCTION),
        ChatMessage::new(Role::User, EXAMPLE.0),
        ChatMessage::new(Role::Assistant, EXAMPLE.1),
        ChatMessage::new(Role::User, transcript),
    ]
}

/// The standalone question in a model's reply: its first non-empty line, without a label
/// or quotes; `None` when nothing is left.
pub fn standalone_question(reply: &str) -> Option<String> {
    let line = reply.lines().map(str::trim).find(|line| !line.is_empty())?;
    let line = ["Standalone question:", "Question:", "Rewritten question:"]
        .iter()
        .find_map(|label| line.strip_prefix(label))
        .unwrap_or(line);
    let line = line.trim().trim_matches(|c| c == '"' || c == '\'').trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// Rewrites with `model`, greedily.
pub fn rewrite_locally(
    model: &LanguageModel,
    conversation: &[ChatTurn],
    question: &str,
) -> Result<String> {
    let _span = tracing::info_span!("rag_rewrite", turns = conversation.len()).entered();
    let prompt = model
        .chat
        .prompt(&model.tokenizer, &rewrite_messages(conversation, question))?;
    let options = GenerationOptions {
        max_new_tokens: REWRITE_TOKENS,
        stop_tokens: vec![model.chat.end_of_turn(), model.tokenizer.eos()],
        sampling: Sampling::default(),
    };
    let (generated, _) = generate(&model.decoder, &[prompt], &options, |_, _| {
        ControlFlow::Continue(())
    })?;
    let tokens = generated
        .first()
        .map(|g| g.tokens.as_slice())
        .unwrap_or(&[]);
    let reply = model.tokenizer.decode(tokens)?;
    standalone_question(&reply).ok_or_else(|| RagError::Rewrite(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_is_the_first_line_without_its_label_or_quotes() {
        assert_eq!(
            standalone_question("\n Question: \"Who did the Broncos beat?\"\nMore text").as_deref(),
            Some("Who did the Broncos beat?")
        );
        assert_eq!(standalone_question("  \n "), None);
        assert_eq!(standalone_question("Question:"), None);
    }

    #[test]
    fn the_prompt_holds_the_recent_turns_and_the_last_question_but_no_system_message() {
        let mut conversation = vec![ChatTurn::new(Role::System, "Be terse.")];
        for i in 0..10 {
            conversation.push(ChatTurn::new(Role::User, format!("question {i}")));
            conversation.push(ChatTurn::new(Role::Assistant, format!("answer {i}")));
        }
        let messages = rewrite_messages(&conversation, "Who did they beat?");
        let user = &messages[3].content;
        assert!(!user.contains("Be terse."));
        assert!(user.contains("User: question 7\nAssistant: answer 7\n"));
        assert!(!user.contains("question 6"), "only the last six turns");
        assert!(user.ends_with("Last question: Who did they beat?"));
    }
}
