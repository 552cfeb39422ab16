//! Paraphrases of EntityQuestions' one-template-per-relation questions, so that homologous
//! queries about one subject and relation are not verbatim repeats (the HaS paper paraphrased
//! with 5 templates per relation). `[X]` stands for the subject.

/// Five paraphrase templates for each of EntityQuestions' 24 relations.
const TEMPLATES: &[(&str, [&str; 5])] = &[
    (
        "P17",
        [
            "In what country is [X]?",
            "[X] is in which country?",
            "What country does [X] belong to?",
            "Which nation is [X] part of?",
            "Name the country where [X] is located.",
        ],
    ),
    (
        "P19",
        [
            "What is [X]'s place of birth?",
            "In which city was [X] born?",
            "What is the birthplace of [X]?",
            "Where does [X] come from originally?",
            "Which town was [X] born in?",
        ],
    ),
    (
        "P20",
        [
            "What is [X]'s place of death?",
            "In which city did [X] die?",
            "Where did [X] pass away?",
            "What was the place of death of [X]?",
            "Which town did [X] die in?",
        ],
    ),
    (
        "P26",
        [
            "Who is [X]'s spouse?",
            "Who did [X] marry?",
            "Who is the husband or wife of [X]?",
            "To whom is [X] married?",
            "Name the spouse of [X].",
        ],
    ),
    (
        "P36",
        [
            "Which city is the capital of [X]?",
            "What is [X]'s capital city?",
            "Where is the seat of government of [X]?",
            "Name the capital of [X].",
            "[X] has which city as its capital?",
        ],
    ),
    (
        "P40",
        [
            "Who are the children of [X]?",
            "Who is a son or daughter of [X]?",
            "Name a child of [X].",
            "Which person is [X]'s offspring?",
            "Who did [X] have as a child?",
        ],
    ),
    (
        "P50",
        [
            "Who wrote [X]?",
            "[X] was written by whom?",
            "Which writer authored [X]?",
            "Who is [X] by?",
            "Name the author of [X].",
        ],
    ),
    (
        "P69",
        [
            "Where did [X] study?",
            "Which school did [X] attend?",
            "What is [X]'s alma mater?",
            "At which institution was [X] educated?",
            "Where did [X] go to university?",
        ],
    ),
    (
        "P106",
        [
            "What is [X]'s occupation?",
            "What does [X] do for a living?",
            "What profession does [X] have?",
            "What is [X]'s job?",
            "Which occupation is [X] known for?",
        ],
    ),
    (
        "P112",
        [
            "Who is the founder of [X]?",
            "Who established [X]?",
            "By whom was [X] founded?",
            "Who started [X]?",
            "Name the founder of [X].",
        ],
    ),
    (
        "P127",
        [
            "Who is the owner of [X]?",
            "[X] is owned by whom?",
            "Which company or person owns [X]?",
            "To whom does [X] belong?",
            "Who has ownership of [X]?",
        ],
    ),
    (
        "P131",
        [
            "In which region is [X]?",
            "Which administrative area is [X] in?",
            "Where can [X] be found?",
            "What region contains [X]?",
            "[X] lies in which area?",
        ],
    ),
    (
        "P136",
        [
            "What genre is [X]?",
            "What musical genre is [X] associated with?",
            "Which style of music does [X] perform?",
            "What kind of music is [X] known for?",
            "[X] plays which genre of music?",
        ],
    ),
    (
        "P159",
        [
            "Where is [X] headquartered?",
            "In which city are [X]'s headquarters?",
            "Where is [X] based?",
            "Where are the main offices of [X]?",
            "Which city hosts the headquarters of [X]?",
        ],
    ),
    (
        "P170",
        [
            "Who created [X]?",
            "Who is the creator of [X]?",
            "Who came up with [X]?",
            "[X] was made by whom?",
            "Whose creation is [X]?",
        ],
    ),
    (
        "P175",
        [
            "Who is the performer of [X]?",
            "Which artist performed [X]?",
            "[X] was performed by whom?",
            "Who recorded [X]?",
            "Who sang [X]?",
        ],
    ),
    (
        "P176",
        [
            "Who manufactures [X]?",
            "Which company makes [X]?",
            "What is the manufacturer of [X]?",
            "[X] is made by which company?",
            "Who produced [X]?",
        ],
    ),
    (
        "P264",
        [
            "Which record label is [X] signed to?",
            "What is [X]'s record label?",
            "Which label released [X]'s music?",
            "[X] records for which label?",
            "What label is [X] on?",
        ],
    ),
    (
        "P276",
        [
            "Where is [X]?",
            "What is the location of [X]?",
            "In what place is [X] situated?",
            "Where can one find [X]?",
            "Where is [X] to be found?",
        ],
    ),
    (
        "P407",
        [
            "In what language is [X] written?",
            "What is the language of [X]?",
            "[X] was written in which language?",
            "Which language is [X] in?",
            "What language was used to write [X]?",
        ],
    ),
    (
        "P413",
        [
            "Which position does [X] play?",
            "What is [X]'s playing position?",
            "In what position does [X] play?",
            "What role does [X] play on the team?",
            "Where on the field does [X] play?",
        ],
    ),
    (
        "P495",
        [
            "What is the country of origin of [X]?",
            "In which country did [X] originate?",
            "[X] was made in which country?",
            "Which country produced [X]?",
            "Where does [X] come from?",
        ],
    ),
    (
        "P740",
        [
            "Where was [X] formed?",
            "In which city did [X] form?",
            "What is the place of formation of [X]?",
            "Where did [X] get started?",
            "Where was [X] established?",
        ],
    ),
    (
        "P800",
        [
            "What is [X] best known for?",
            "What is [X]'s notable work?",
            "Which work made [X] famous?",
            "What is [X] known for?",
            "What is [X] renowned for?",
        ],
    ),
];

/// Paraphrases of a question about `subject` under `relation` (none for a relation without
/// templates).
pub fn paraphrases(relation: &str, subject: &str) -> Vec<String> {
    TEMPLATES
        .iter()
        .find(|(r, _)| *r == relation)
        .map(|(_, templates)| {
            templates
                .iter()
                .map(|t| t.replace("[X]", subject))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relation_has_five_distinct_templates_naming_the_subject() {
        assert_eq!(TEMPLATES.len(), 24);
        for (relation, templates) in TEMPLATES {
            let set: std::collections::HashSet<&str> = templates.iter().copied().collect();
            assert_eq!(set.len(), 5, "{relation}");
            assert!(templates.iter().all(|t| t.matches("[X]").count() == 1));
        }
        let p = paraphrases("P19", "Ada Lovelace");
        assert_eq!(p.len(), 5);
        assert!(
            p.iter()
                .all(|q| q.contains("Ada Lovelace") && !q.contains("[X]"))
        );
        assert!(paraphrases("P9999", "x").is_empty());
    }
}
