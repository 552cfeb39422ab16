//! The tests' tiny backend (lm's tiny chat models, `hasten_lm::testing`) and documents.
#![allow(dead_code)]

use std::path::Path;

use hasten_rag::{Document, LocalLm};

use crate::support::{TinyArch, load_tiny};

/// A tiny drafter (llama) and a different tiny verifier (qwen2).
pub fn tiny_backend(dir: &Path) -> LocalLm {
    LocalLm::new(
        load_tiny(dir, TinyArch::Llama, 3),
        load_tiny(dir, TinyArch::Qwen2, 4),
    )
}

/// Short documents in two obvious clusters (by vector): 0, 2, 4 about rivers, 1, 3, 5
/// about mountains.
pub fn clustered_documents() -> Vec<Document> {
    let texts = [
        ("Nile", "The Nile flows north."),
        ("Alps", "The Alps are high."),
        ("Amazon", "The Amazon is wide."),
        ("Andes", "The Andes are long."),
        ("Danube", "The Danube is blue."),
        ("Atlas", "The Atlas is dry."),
    ];
    texts
        .iter()
        .enumerate()
        .map(|(i, (title, text))| {
            let jitter = 0.05 * i as f32;
            let vector = if i % 2 == 0 {
                vec![1.0, jitter, 0.1]
            } else {
                vec![jitter, 1.0, 0.1]
            };
            Document::new(*title, *text).with_vector(vector)
        })
        .collect()
}
