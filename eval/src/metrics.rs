//! Answer quality metrics of extractive QA, as SQuAD's evaluation script computes them:
//! normalised exact match, token-level F1, and containment as in the open-domain RAG papers.
//!
//! Punctuation is deleted, not turned into spaces, so "U.S." matches "US" as in SQuAD
//! ([`crate::answers`] splits on it instead, for matching answers inside passages).

use std::collections::HashMap;

/// Lower case, punctuation and the articles a/an/the removed, whitespace collapsed.
pub fn normalize(text: &str) -> String {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !is_punctuation(*c))
        .collect();
    lowered
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// ASCII punctuation (SQuAD's `string.punctuation`) and the typographic quotes, dashes and
/// ellipsis that model outputs are full of.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(
            c,
            '\u{2018}'
                | '\u{2019}'
                | '\u{201C}'
                | '\u{201D}'
                | '\u{2013}'
                | '\u{2014}'
                | '\u{2026}'
                | '\u{00AB}'
                | '\u{00BB}'
                | '\u{00BF}'
                | '\u{00A1}'
        )
}

/// True when the normalised prediction equals the normalised gold answer.
pub fn exact_match(prediction: &str, gold: &str) -> bool {
    normalize(prediction) == normalize(gold)
}

/// Token-level F1 between the normalised prediction and gold answer: the harmonic mean of
/// the precision and recall of their shared tokens (a multiset overlap, as SQuAD counts).
pub fn f1(prediction: &str, gold: &str) -> f32 {
    let predicted = normalize(prediction);
    let expected = normalize(gold);
    let predicted: Vec<&str> = predicted.split_whitespace().collect();
    let expected: Vec<&str> = expected.split_whitespace().collect();
    if predicted.is_empty() || expected.is_empty() {
        // SQuAD: two empty answers agree; an empty one against a real one does not.
        return if predicted.is_empty() && expected.is_empty() {
            1.0
        } else {
            0.0
        };
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for token in &expected {
        *counts.entry(token).or_default() += 1;
    }
    let mut shared = 0usize;
    for token in &predicted {
        if let Some(count) = counts.get_mut(token)
            && *count > 0
        {
            *count -= 1;
            shared += 1;
        }
    }
    if shared == 0 {
        return 0.0;
    }
    let precision = shared as f32 / predicted.len() as f32;
    let recall = shared as f32 / expected.len() as f32;
    2.0 * precision * recall / (precision + recall)
}

/// True when the normalised prediction contains the normalised gold answer as whole tokens
/// (the "answer in response" accuracy of free-form RAG evaluations).
pub fn contains(prediction: &str, gold: &str) -> bool {
    let needle = normalize(gold);
    if needle.is_empty() {
        return false;
    }
    format!(" {} ", normalize(prediction)).contains(&format!(" {needle} "))
}

/// The best score of `prediction` against any of several gold answers.
pub fn best_of<T: PartialOrd + Copy>(
    prediction: &str,
    golds: &[String],
    metric: impl Fn(&str, &str) -> T,
) -> Option<T> {
    golds
        .iter()
        .map(|g| metric(prediction, g))
        .fold(None, |best, x| match best {
            Some(b) if b >= x => Some(b),
            _ => Some(x),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_drops_case_punctuation_articles_and_extra_space() {
        assert_eq!(normalize("The  Denver Broncos!"), "denver broncos");
        assert_eq!(normalize("an apple,\ta day"), "apple day");
        assert_eq!(normalize("  A. "), "");
        assert_eq!(
            normalize("U.S. “Théâtre” – Français…"),
            "us théâtre français"
        );
        assert!(exact_match("U.S.", "US"));
    }

    #[test]
    fn exact_match_ignores_what_normalisation_drops() {
        assert!(exact_match("The Eiffel Tower.", "eiffel tower"));
        assert!(!exact_match("Eiffel Tower in Paris", "Eiffel Tower"));
    }

    #[test]
    fn f1_counts_shared_tokens_as_a_multiset() {
        assert!((f1("Eiffel Tower", "the Eiffel Tower") - 1.0).abs() < 1e-6);
        // 1 shared of 3 predicted and 1 gold: p = 1/3, r = 1, f1 = 0.5.
        assert!((f1("Paris in France", "Paris") - 0.5).abs() < 1e-6);
        // Repeats count once per gold occurrence.
        assert!((f1("paris paris", "paris") - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(f1("London", "Paris"), 0.0);
        assert_eq!(f1("", ""), 1.0);
        assert_eq!(f1("the", "Paris"), 0.0);
    }

    #[test]
    fn contains_matches_whole_tokens_only() {
        assert!(contains(
            "It was played at Santa Clara, California.",
            "Santa Clara"
        ));
        assert!(!contains(
            "It was played at Santa Claraville.",
            "Santa Clara"
        ));
        assert!(!contains("anything", "the"));
    }

    #[test]
    fn best_of_takes_the_best_gold_answer() {
        let golds = vec!["Paris".to_string(), "City of Light".to_string()];
        assert_eq!(
            best_of("the city of light", &golds, exact_match),
            Some(true)
        );
        assert_eq!(best_of("x", &[], f1), None);
    }
}
