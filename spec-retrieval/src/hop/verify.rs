//! Whether a speculated hop stands.

use crate::retriever::RetrievedDocument;

/// How a speculated hop is checked against the exact retrieval.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verifier {
    /// The same documents in the same order: the next state is the exact one's, so the
    /// trajectory is the sequential agent's (lossless).
    Strict,
    /// The sub-answers read from the speculated and from the exact documents share at least
    /// this token-set Jaccard similarity (SpecHop's rule-based verifier); may diverge.
    Jaccard(f64),
}

impl Verifier {
    /// Whether the exact documents' sub-answer must be computed to decide.
    pub fn needs_exact_reading(self) -> bool {
        matches!(self, Self::Jaccard(_))
    }

    pub(super) fn documents_agree(
        speculated: &[RetrievedDocument],
        exact: &[RetrievedDocument],
    ) -> bool {
        speculated.len() == exact.len() && speculated.iter().zip(exact).all(|(s, e)| s.id == e.id)
    }
}

/// Token-set Jaccard similarity of two texts after normalisation (lower case, letters and
/// digits only): |A ∩ B| / |A ∪ B|, 1 for two empty texts.
pub fn token_set_jaccard(a: &str, b: &str) -> f64 {
    let tokens = |text: &str| -> std::collections::BTreeSet<String> {
        text.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (a, b) = (tokens(a), tokens(b));
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}
