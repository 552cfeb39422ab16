//! Answer matching for the document hit rate, as in the HaS and DPR evaluations: a passage
//! hits when it contains a gold answer after normalisation (lower case, punctuation and the
//! articles a/an/the removed, whitespace collapsed).

/// Normalises text for answer matching.
pub fn normalize_answer(text: &str) -> String {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect();
    lowered
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// True when `text` contains any of `answers` as whole normalised tokens.
pub fn contains_answer(text: &str, answers: &[String]) -> bool {
    let haystack = format!(" {} ", normalize_answer(text));
    answers.iter().any(|answer| {
        let needle = normalize_answer(answer);
        !needle.is_empty() && haystack.contains(&format!(" {needle} "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_drops_case_punctuation_and_articles() {
        assert_eq!(normalize_answer("The  Denver Broncos!"), "denver broncos");
        assert_eq!(normalize_answer("an apple, a day"), "apple day");
    }

    #[test]
    fn matching_is_on_whole_tokens() {
        let answers = vec!["Santa Clara".to_string()];
        assert!(contains_answer(
            "It was played at Santa Clara, California.",
            &answers
        ));
        assert!(!contains_answer(
            "It was played at Santa Claraville.",
            &answers
        ));
        assert!(!contains_answer("anything", &["the".to_string()]));
    }
}
