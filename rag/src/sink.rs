//! [`AnswerSink`]: where a backend sends an answer's text as it is generated, and how it
//! learns that nobody waits for it any more.

/// Where a backend sends the answer's text, and how it learns that nobody waits for it.
/// A closure taking each piece of text is a sink that is never cancelled.
pub trait AnswerSink {
    /// The answer's next text: token by token in standard mode, once (the chosen draft) in
    /// speculative mode.
    fn text(&mut self, delta: &str);
    /// Whether the caller went away: generation then stops at its next step with
    /// [`RagError::Cancelled`](crate::RagError::Cancelled).
    fn cancelled(&self) -> bool {
        false
    }
}

impl<F: FnMut(&str)> AnswerSink for F {
    fn text(&mut self, delta: &str) {
        self(delta)
    }
}
