//! Chat prompts as token ids, in the ChatML layout that SmolLM2 and Qwen2 are tuned on
//! (`<|im_start|>role\ncontent<|im_end|>\n`). Markers are inserted by id, never parsed
//! out of the text, so message content cannot open or close a turn.

use crate::error::{LmError, Result};
use crate::tokenizer::GgufTokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// The ids of ChatML's turn markers for one tokenizer.
#[derive(Debug, Clone, Copy)]
pub struct ChatTemplate {
    start: u32,
    end: u32,
}

impl ChatTemplate {
    pub fn for_tokenizer(tokenizer: &GgufTokenizer) -> Result<Self> {
        match (
            tokenizer.control_token("<|im_start|>"),
            tokenizer.control_token("<|im_end|>"),
        ) {
            (Some(start), Some(end)) => Ok(Self { start, end }),
            _ => Err(LmError::InvalidInput(
                "the model's vocabulary has no ChatML markers (<|im_start|>, <|im_end|>)".into(),
            )),
        }
    }

    /// The token that opens a turn.
    pub fn start_of_turn(&self) -> u32 {
        self.start
    }

    /// The token that ends a turn; generation stops on it.
    pub fn end_of_turn(&self) -> u32 {
        self.end
    }

    /// The prompt for `messages`, ending with an open assistant turn.
    pub fn prompt(&self, tokenizer: &GgufTokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = tokenizer.bos_prefix().into_iter().collect();
        for message in messages {
            self.turn(tokenizer, message, &mut ids)?;
        }
        ids.push(self.start);
        ids.extend(tokenizer.encode("assistant\n")?);
        Ok(ids)
    }

    fn turn(
        &self,
        tokenizer: &GgufTokenizer,
        message: &ChatMessage,
        ids: &mut Vec<u32>,
    ) -> Result<()> {
        ids.push(self.start);
        ids.extend(tokenizer.encode(&format!("{}\n{}", message.role.name(), message.content))?);
        ids.push(self.end);
        ids.extend(tokenizer.encode("\n")?);
        Ok(())
    }
}
