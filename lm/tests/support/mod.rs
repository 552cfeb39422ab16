//! Test support: the tiny random-weight models and the real models where `HASTEN_LM_DIR`
//! points at them, from `hasten_lm::testing` (shared with the crates built on the runtime).
#![allow(unused_imports)]

pub use hasten_lm::testing::*;
