//! The RAG prompt as three kinds of independently tokenized segments, so that a chunk's
//! tokens (and so its stored KV) are the same whatever comes before or after it:
//!
//! ```text
//! system:   <bos>? <|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\nDocuments:\n
//! chunk:    {title}\n{text}\n\n                       (text capped at DOCUMENT_TOKEN_CAP tokens)
//! question: Question: {question}<|im_end|>\n<|im_start|>assistant\n
//! ```
//!
//! Chunks carry no "[i]" number: a label that depends on the chunk's place would make its KV
//! depend on it too. Full prefill reads the very same token ids, so the modes differ only in
//! how the KV is computed.

use hasten_lm::LanguageModel;
use hasten_rag::prompt::{DOCUMENT_TOKEN_CAP, STANDARD_INSTRUCTION};

use crate::error::Result;

pub fn system_tokens(model: &LanguageModel) -> Result<Vec<u32>> {
    let (tokenizer, chat) = (&model.tokenizer, &model.chat);
    let mut ids: Vec<u32> = tokenizer.bos_prefix().into_iter().collect();
    ids.push(chat.start_of_turn());
    ids.extend(tokenizer.encode(&format!("system\n{STANDARD_INSTRUCTION}"))?);
    ids.push(chat.end_of_turn());
    ids.extend(tokenizer.encode("\n")?);
    ids.push(chat.start_of_turn());
    ids.extend(tokenizer.encode("user\nDocuments:\n")?);
    Ok(ids)
}

pub fn chunk_tokens(model: &LanguageModel, title: &str, text: &str) -> Result<Vec<u32>> {
    let tokenizer = &model.tokenizer;
    let mut text_ids = tokenizer.encode(text.trim())?;
    text_ids.truncate(DOCUMENT_TOKEN_CAP);
    let title = title.trim();
    let mut ids = if title.is_empty() {
        Vec::new()
    } else {
        tokenizer.encode(&format!("{title}\n"))?
    };
    ids.extend(text_ids);
    ids.extend(tokenizer.encode("\n\n")?);
    Ok(ids)
}

pub fn question_tokens(model: &LanguageModel, question: &str) -> Result<Vec<u32>> {
    let (tokenizer, chat) = (&model.tokenizer, &model.chat);
    let mut ids = tokenizer.encode(&format!("Question: {}", question.trim()))?;
    ids.push(chat.end_of_turn());
    ids.extend(tokenizer.encode("\n")?);
    ids.push(chat.start_of_turn());
    ids.extend(tokenizer.encode("assistant\n")?);
    Ok(ids)
}

/// What ends an answer.
pub fn stop_tokens(model: &LanguageModel) -> Vec<u32> {
    vec![model.chat.end_of_turn(), model.tokenizer.eos()]
}
