//! A chat's messages as an answer reads them: the last user message is the question, the
//! system messages and earlier turns go into the model's prompt, and retrieval runs on a
//! standalone question ([`retrieval_query`]).

use hasten_rag::{ChatTurn, Role};
use serde::Deserialize;
use serde_json::Value;

use crate::api::InvalidArgument;

/// A question of fewer words than this is read with the user's previous turn ("And in
/// 1998?").
pub const SHORT_QUESTION_WORDS: usize = 6;
/// Words by which a question refers back to an earlier turn ("Who did they beat?").
pub const REFERRING_WORDS: &[&str] = &[
    "he", "him", "his", "she", "her", "hers", "it", "its", "they", "them", "their", "theirs",
    "this", "that", "these", "those", "there", "then",
];

/// One message as OpenAI's chat API sends it.
#[derive(Debug, Deserialize)]
pub struct ChatMessageJson {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    #[serde(default)]
    pub tool_calls: Option<Value>,
}

/// The question and what came before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// The last user message.
    pub question: String,
    /// System messages and earlier turns, oldest first.
    pub earlier: Vec<ChatTurn>,
}

/// Reads `messages`: system (or `developer`), user and assistant turns, ending with a user
/// message. Tool calls and non-text content are refused, naming the message.
pub fn read_messages(messages: &[ChatMessageJson]) -> Result<Conversation, InvalidArgument> {
    let mut turns = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let role = match message.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(InvalidArgument::new(
                    format!("messages[{index}].role"),
                    format!(
                        "`{other}` is not supported: this edge reads system, user and \
                         assistant messages (no tools)"
                    ),
                ));
            }
        };
        if message
            .tool_calls
            .as_ref()
            .is_some_and(|calls| !calls.is_null())
        {
            return Err(InvalidArgument::new(
                format!("messages[{index}].tool_calls"),
                "tool calls are not supported",
            ));
        }
        turns.push(ChatTurn::new(role, text_of(index, &message.content)?));
    }
    match turns.pop() {
        Some(last) if last.role == Role::User && !last.content.trim().is_empty() => {
            Ok(Conversation {
                question: last.content.trim().to_string(),
                earlier: turns,
            })
        }
        Some(_) => Err(InvalidArgument::new(
            "messages",
            "must end with a non-empty `user` message: it is the question answered",
        )),
        None => Err(InvalidArgument::new(
            "messages",
            "needs at least one `user` message",
        )),
    }
}

/// A message's text: string content, or the text parts of an array.
fn text_of(index: usize, content: &Value) -> Result<String, InvalidArgument> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(
                |part| match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(text)) => Ok(text),
                    (kind, _) => Err(InvalidArgument::new(
                        format!("messages[{index}].content"),
                        format!(
                            "holds a `{}` part; only text parts are read",
                            kind.unwrap_or("untyped")
                        ),
                    )),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("\n")),
        _ => Err(InvalidArgument::new(
            format!("messages[{index}].content"),
            "must be text or an array of text parts",
        )),
    }
}

/// The standalone question retrieval runs on: the question, preceded by the user's previous
/// turn when the question is short (fewer than [`SHORT_QUESTION_WORDS`] words) or refers
/// back (holds one of [`REFERRING_WORDS`]); then its last `max_chars` characters, cut at a
/// word boundary, since a long message (a client's own "stuff" prompt) ends with its
/// question.
pub fn retrieval_query(conversation: &Conversation, max_chars: usize) -> String {
    let question = conversation.question.as_str();
    let previous = conversation
        .earlier
        .iter()
        .rev()
        .find(|turn| turn.role == Role::User);
    let query = match previous {
        Some(previous) if needs_context(question) => {
            format!("{} {question}", previous.content.trim())
        }
        _ => question.to_string(),
    };
    last_chars(&query, max_chars)
}

fn needs_context(question: &str) -> bool {
    let words: Vec<String> = question
        .split_whitespace()
        .map(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|word| !word.is_empty())
        .collect();
    words.len() < SHORT_QUESTION_WORDS
        || words
            .iter()
            .any(|word| REFERRING_WORDS.contains(&word.as_str()))
}

/// The last `max_chars` characters of `text`, starting at a word when the cut falls inside
/// one.
fn last_chars(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    let chars = text.chars().count();
    if chars <= max_chars {
        return text.to_string();
    }
    let tail: String = text.chars().skip(chars - max_chars).collect();
    match tail.split_once(char::is_whitespace) {
        Some((_, rest)) if !rest.trim().is_empty() => rest.trim().to_string(),
        _ => tail,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn messages(value: Value) -> Vec<ChatMessageJson> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_last_user_message_is_the_question_and_the_rest_is_kept_in_order() {
        let read = read_messages(&messages(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Who won Super Bowl 50?"},
            {"role": "assistant", "content": "The Denver Broncos."},
            {"role": "user", "content": [{"type": "text", "text": "Who did they beat?"}]},
        ])))
        .unwrap();
        assert_eq!(read.question, "Who did they beat?");
        assert_eq!(
            read.earlier,
            vec![
                ChatTurn::new(Role::System, "Be brief."),
                ChatTurn::new(Role::User, "Who won Super Bowl 50?"),
                ChatTurn::new(Role::Assistant, "The Denver Broncos."),
            ]
        );
        assert_eq!(
            retrieval_query(&read, 2000),
            "Who won Super Bowl 50? Who did they beat?"
        );
    }

    #[test]
    fn a_standalone_question_is_retrieved_alone() {
        let read = read_messages(&messages(json!([
            {"role": "user", "content": "Who won Super Bowl 50?"},
            {"role": "assistant", "content": "The Denver Broncos."},
            {"role": "user", "content": "Which river flows through the city of Warsaw?"},
        ])))
        .unwrap();
        assert_eq!(
            retrieval_query(&read, 2000),
            "Which river flows through the city of Warsaw?"
        );
        let short = read_messages(&messages(json!([
            {"role": "user", "content": "When was Marie Curie born?"},
            {"role": "user", "content": "And Pierre?"},
        ])))
        .unwrap();
        assert_eq!(
            retrieval_query(&short, 2000),
            "When was Marie Curie born? And Pierre?"
        );
    }

    #[test]
    fn a_long_message_is_retrieved_by_its_end() {
        let context = "lorem ipsum ".repeat(700);
        let read = read_messages(&messages(json!([
            {"role": "user", "content": format!("{context}\nQuestion: Where is the Eiffel Tower located today?")},
        ])))
        .unwrap();
        let query = retrieval_query(&read, 100);
        assert!(query.chars().count() <= 100, "{query}");
        assert!(query.ends_with("Where is the Eiffel Tower located today?"));
        assert!(
            !query.starts_with(' ') && !query.starts_with("psum"),
            "{query}"
        );
    }

    #[test]
    fn what_cannot_be_read_is_refused_naming_the_message() {
        let refused = |value: Value| read_messages(&messages(value)).unwrap_err().field;
        assert_eq!(
            refused(json!([{"role": "tool", "content": "42"}])),
            "messages[0].role"
        );
        assert_eq!(
            refused(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])),
            "messages[0].content"
        );
        assert_eq!(
            refused(
                json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
            ),
            "messages"
        );
        assert_eq!(
            refused(json!([{"role": "system", "content": "x"}])),
            "messages"
        );
        assert_eq!(refused(json!([])), "messages");
    }
}
