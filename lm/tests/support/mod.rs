//! Test support: tiny random-weight GGUF models written by the tests themselves, and the
//! real models where `HASTEN_LM_DIR` points at them.
// Test support panics on setup failures, like the tests themselves.
#![allow(dead_code, unused_imports, clippy::expect_used)]

use std::path::{Path, PathBuf};

pub use hasten_lm::testing::*;

/// The real model `file` under `HASTEN_LM_DIR`: `None` when the variable is unset (the test
/// says it is skipped); a panic when it is set but the file is missing, so that a CI run
/// that installed the models cannot silently skip.
pub fn real_model(file: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("HASTEN_LM_DIR") else {
        eprintln!("HASTEN_LM_DIR is unset: skipping the test on {file}");
        return None;
    };
    let path = Path::new(&dir).join(file);
    assert!(
        path.is_file(),
        "HASTEN_LM_DIR is set but {} is missing (run `make models`)",
        path.display()
    );
    Some(path)
}

pub const SMALL_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const LARGE_MODEL: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// An optional real model (not installed by `make models`): `None` when absent.
pub fn optional_real_model(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("HASTEN_LM_DIR")?;
    let path = Path::new(&dir).join(file);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "{} is not installed (`make models-large`): skipping",
            path.display()
        );
        None
    }
}
