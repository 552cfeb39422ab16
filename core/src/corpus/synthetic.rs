//! A synthetic knowledge base, the embedded default when no real data is present.
//!
//! Like the HaS paper's Wikidata-derived queries: entities x relations x question templates.
//! Every entity has a few passages stating its facts, and several questions ask about
//! different relations of the same entity, so questions of one entity are homologous: they
//! retrieve overlapping passages while asking for different answers.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::{Corpus, Passage, Question};

/// Size and seed of the generated knowledge base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticSpec {
    pub entities: usize,
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// 300 entities give ~900 passages and ~4,800 questions: enough for popularity-skewed
    /// traffic with many homologous pairs, small enough to encode in well under a minute.
    fn default() -> Self {
        Self {
            entities: 300,
            seed: 7,
        }
    }
}

const FIRST_NAMES: &[&str] = &[
    "Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko",
    "Lars", "Mina", "Nikolai", "Olga", "Pavel", "Quinn", "Rosa", "Soren", "Talia", "Ulrich",
    "Vera", "Wendel", "Xenia", "Yusuf", "Zora", "Anselm", "Bettina", "Casimir", "Delphine",
    "Emrys", "Fenna",
];
const SURNAME_PARTS: &[&str] = &[
    "vel", "mar", "dor", "ank", "ost", "rin", "hal", "bre", "tov", "lis", "gar", "wen", "ksa",
    "mol", "thi", "rud",
];
const SURNAME_ENDINGS: &[&str] = &["ova", "ström", "ani", "ez", "berg", "ley", "ski", "ard"];
const CITIES: &[&str] = &[
    "Lisbon",
    "Tromsø",
    "Osaka",
    "Valparaíso",
    "Tbilisi",
    "Kraków",
    "Cork",
    "Mombasa",
    "Leipzig",
    "Hobart",
    "Ghent",
    "Arequipa",
    "Tartu",
    "Zadar",
    "Nagpur",
    "Córdoba",
    "Bergen",
    "Izmir",
];
const OCCUPATIONS: &[&str] = &[
    "glaciologist",
    "cartographer",
    "violin maker",
    "marine biologist",
    "typographer",
    "structural engineer",
    "archivist",
    "beekeeper",
    "astronomer",
    "translator",
    "ceramicist",
    "botanist",
];
const EMPLOYERS: &[&str] = &[
    "the Northwind Institute",
    "Halvorsen Shipping",
    "the Meridian Observatory",
    "Calder & Finch",
    "the Amber Coast Museum",
    "Solvik Laboratories",
    "the Grey Harbour Press",
    "Orrin Aerospace",
    "the Lantern Foundation",
];
const UNIVERSITIES: &[&str] = &[
    "the University of Eastmoor",
    "Kestrel College",
    "the Royal Academy of Tessaly",
    "Dunmore Polytechnic",
    "the University of Varrow",
    "Saint Aldric University",
];
const AWARDS: &[&str] = &[
    "Silver Compass Prize",
    "Orchid Medal",
    "Halden Award",
    "Blue Lantern Prize",
    "Iron Quill Award",
    "Meridian Medal",
];
const INSTRUMENTS: &[&str] = &[
    "cello",
    "oboe",
    "accordion",
    "harp",
    "bassoon",
    "mandolin",
    "sitar",
    "clarinet",
];

/// One relation: how its facts are stated and how questions ask for them.
struct Relation {
    questions: [&'static str; 2],
}

const BIRTHPLACE: Relation = Relation {
    questions: ["Where was {e} born?", "In which city was {e} born?"],
};
const BIRTH_YEAR: Relation = Relation {
    questions: ["When was {e} born?", "In what year was {e} born?"],
};
const OCCUPATION: Relation = Relation {
    questions: [
        "What is {e}'s occupation?",
        "What does {e} do for a living?",
    ],
};
const EMPLOYER: Relation = Relation {
    questions: ["Which organization employs {e}?", "Where does {e} work?"],
};
const EDUCATION: Relation = Relation {
    questions: ["Where did {e} study?", "Which university did {e} attend?"],
};
const AWARD: Relation = Relation {
    questions: ["Which award did {e} receive?", "What prize was {e} given?"],
};
const SPOUSE: Relation = Relation {
    questions: ["Who is {e} married to?", "Who is the spouse of {e}?"],
};
const INSTRUMENT: Relation = Relation {
    questions: [
        "Which instrument does {e} play?",
        "What instrument is {e} known to play?",
    ],
};

fn pick<'a>(rng: &mut StdRng, values: &[&'a str]) -> &'a str {
    values.choose(rng).copied().unwrap_or_default()
}

fn entity_name(rng: &mut StdRng) -> String {
    let first = pick(rng, FIRST_NAMES);
    let a = pick(rng, SURNAME_PARTS);
    let b = pick(rng, SURNAME_PARTS);
    let ending = pick(rng, SURNAME_ENDINGS);
    let surname = format!("{a}{b}{ending}");
    let mut chars = surname.chars();
    let capitalised = match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect::<String>(),
        None => surname,
    };
    format!("{first} {capitalised}")
}

/// Generates the knowledge base described by `spec`. Deterministic for a given spec.
pub fn generate_synthetic(spec: &SyntheticSpec) -> Corpus {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut names = HashSet::new();
    let mut corpus = Corpus {
        sources: vec![format!(
            "synthetic:entities={},seed={}",
            spec.entities, spec.seed
        )],
        ..Corpus::default()
    };
    while names.len() < spec.entities {
        let name = entity_name(&mut rng);
        if !names.insert(name.clone()) {
            continue;
        }
        let city = pick(&mut rng, CITIES);
        let year = rng.random_range(1921..=1999).to_string();
        let occupation = pick(&mut rng, OCCUPATIONS);
        let employer = pick(&mut rng, EMPLOYERS);
        let university = pick(&mut rng, UNIVERSITIES);
        let award = pick(&mut rng, AWARDS);
        let instrument = pick(&mut rng, INSTRUMENTS);
        let spouse = entity_name(&mut rng);
        let e = name.as_str();
        let passages = [
            format!(
                "{e} was born in {city} in {year}. {e} grew up near the harbour of {city} and \
                 left it at eighteen."
            ),
            format!(
                "{e} studied at {university} and works as a {occupation}. Since graduating, {e} \
                 has been employed by {employer}."
            ),
            format!(
                "{e} received the {award} for a lifetime of work. {e} is married to {spouse} and \
                 plays the {instrument} in a local ensemble."
            ),
        ];
        corpus
            .passages
            .extend(passages.into_iter().map(|text| Passage {
                title: name.clone(),
                text,
            }));
        let facts: [(&Relation, &str); 8] = [
            (&BIRTHPLACE, city),
            (&BIRTH_YEAR, &year),
            (&OCCUPATION, occupation),
            (&EMPLOYER, employer),
            (&EDUCATION, university),
            (&AWARD, award),
            (&SPOUSE, &spouse),
            (&INSTRUMENT, instrument),
        ];
        for (relation, answer) in facts {
            for template in relation.questions {
                corpus.questions.push(Question {
                    question: template.replace("{e}", e),
                    answers: vec![answer.to_string()],
                    entity: name.clone(),
                    source: "synthetic".into(),
                    relation: None,
                    gold_passage: None,
                });
            }
        }
    }
    corpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sized_by_the_spec() {
        let spec = SyntheticSpec {
            entities: 20,
            seed: 3,
        };
        let a = generate_synthetic(&spec);
        let b = generate_synthetic(&spec);
        assert_eq!(a.passages, b.passages);
        assert_eq!(a.passages.len(), 60);
        assert_eq!(a.questions.len(), 20 * 16);
        let other = generate_synthetic(&SyntheticSpec { seed: 4, ..spec });
        assert_ne!(a.passages, other.passages);
    }
}
