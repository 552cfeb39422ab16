//! Workloads: questions drawn day by day from a popularity model, so popular entities recur
//! with different questions (the homologous traffic HaS feeds on). A question under a known
//! relation is asked in its data set's words or one of the relation's paraphrases. A
//! workload can be saved to JSON lines and replayed.

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use hasten_core::Question;
use hasten_eval::answers::normalize_answer;
use rand::SeedableRng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde::{Deserialize, Serialize};

use crate::paraphrase::paraphrases;
use crate::popularity::DailyPopularity;

/// One query of a workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadQuery {
    pub seq: usize,
    pub day: usize,
    pub question: String,
    pub answers: Vec<String>,
    pub entity: String,
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
    /// Fingerprint of the question's gold passage, where its data set names one (SQuAD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold_passage: Option<u64>,
    /// What drew the entity on its day.
    #[serde(default)]
    pub popularity: PopularitySource,
}

/// Where an entity's weight on a day came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PopularitySource {
    #[default]
    Model,
    PageViews,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("no questions to draw from (check the question sources)")]
    NoQuestions,
    #[error("popularity refers to entity {0}, beyond the {1} entities")]
    Entity(usize, usize),
    #[error("day {0} has no positive weight")]
    EmptyDay(usize),
    #[error("{path}: {message}")]
    File { path: String, message: String },
}

/// Distinct entities of `questions` that have at least one question, in a stable order.
pub fn entities(questions: &[Question]) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> = questions
        .iter()
        .filter(|q| !q.entity.is_empty())
        .map(|q| q.entity.as_str())
        .collect();
    set.into_iter().map(str::to_string).collect()
}

/// Drops every subject with a relation asked twice with different answers: an ambiguous name
/// matched to one article although its questions are about several entities (EntityQuestions'
/// `Washington County`). Returns the questions kept and the subjects dropped.
pub fn drop_ambiguous_subjects(questions: Vec<Question>) -> (Vec<Question>, usize) {
    let mut answers: HashMap<(&str, &str), BTreeSet<String>> = HashMap::new();
    let mut ambiguous: HashSet<String> = HashSet::new();
    for q in &questions {
        let Some(relation) = q.relation.as_deref() else {
            continue;
        };
        let key: BTreeSet<String> = q.answers.iter().map(|a| normalize_answer(a)).collect();
        match answers.entry((q.entity.as_str(), relation)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(key);
            }
            std::collections::hash_map::Entry::Occupied(slot) => {
                if *slot.get() != key {
                    ambiguous.insert(q.entity.clone());
                }
            }
        }
    }
    let dropped = ambiguous.len();
    let kept = questions
        .into_iter()
        .filter(|q| !ambiguous.contains(&q.entity))
        .collect();
    (kept, dropped)
}

/// The texts a question may be asked in: its own, then its relation's paraphrases.
fn phrasings(question: &Question) -> Vec<String> {
    let mut texts = vec![question.question.clone()];
    if let Some(relation) = &question.relation {
        texts.extend(paraphrases(relation, &question.entity));
    }
    texts
}

/// Draws `count` queries spread evenly over the days of `popularity`: each day an entity by
/// its weight, then one of its questions uniformly, then one of that question's phrasings
/// uniformly. `entity_names` is the list the popularity indexes into (see [`entities`]).
pub fn generate(
    questions: &[Question],
    entity_names: &[String],
    popularity: &DailyPopularity,
    count: usize,
    seed: u64,
) -> Result<Vec<WorkloadQuery>, WorkloadError> {
    let mut by_entity: BTreeMap<&str, Vec<(&Question, Vec<String>)>> = BTreeMap::new();
    for q in questions.iter().filter(|q| !q.entity.is_empty()) {
        by_entity
            .entry(q.entity.as_str())
            .or_default()
            .push((q, phrasings(q)));
    }
    if by_entity.is_empty() || popularity.days.is_empty() {
        return Err(WorkloadError::NoQuestions);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let days = popularity.days.len();
    let mut out = Vec::with_capacity(count);
    for (day, weights) in popularity.days.iter().enumerate() {
        let quota = count / days + usize::from(day < count % days);
        let dist = WeightedIndex::new(weights.iter().map(|(_, w)| *w))
            .map_err(|_| WorkloadError::EmptyDay(day))?;
        for _ in 0..quota {
            let (entity, _) = weights[dist.sample(&mut rng)];
            let name = entity_names
                .get(entity)
                .ok_or(WorkloadError::Entity(entity, entity_names.len()))?;
            let Some((q, texts)) = by_entity
                .get(name.as_str())
                .and_then(|qs| qs.choose(&mut rng))
            else {
                continue;
            };
            let Some(text) = texts.choose(&mut rng) else {
                continue;
            };
            let observed = popularity
                .observed
                .get(day)
                .is_some_and(|listed| listed.contains(&entity));
            out.push(WorkloadQuery {
                seq: out.len(),
                day,
                question: text.clone(),
                answers: q.answers.clone(),
                entity: q.entity.clone(),
                source: q.source.clone(),
                relation: q.relation.clone(),
                gold_passage: q.gold_passage,
                popularity: if observed {
                    PopularitySource::PageViews
                } else {
                    PopularitySource::Model
                },
            });
        }
    }
    if out.is_empty() {
        return Err(WorkloadError::NoQuestions);
    }
    Ok(out)
}

/// `count` questions of `questions` drawn uniformly at random, none asking what a query of
/// `workload` asks (the same text, or the same relation of the same entity in another
/// phrasing): the "random queries" the HaS paper pre-fills the cache with for its ablation
/// without the fuzzy channel in validation. Fewer when the pool runs out.
pub fn random_questions<'q>(
    questions: &'q [Question],
    workload: &[WorkloadQuery],
    count: usize,
    seed: u64,
) -> Vec<&'q Question> {
    let asked: HashSet<&str> = workload.iter().map(|q| q.question.as_str()).collect();
    let asked_relations: HashSet<(&str, &str)> = workload
        .iter()
        .filter_map(|q| Some((q.entity.as_str(), q.relation.as_deref()?)))
        .collect();
    // One question per text, in text order, so that the draw depends only on the seed.
    let pool: Vec<&Question> = questions
        .iter()
        .filter(|q| {
            q.relation
                .as_deref()
                .is_none_or(|relation| !asked_relations.contains(&(q.entity.as_str(), relation)))
        })
        .map(|q| (q.question.trim(), q))
        .filter(|(text, _)| !text.is_empty() && !asked.contains(text))
        .collect::<BTreeMap<&str, &Question>>()
        .into_values()
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    pool.choose_multiple(&mut rng, count).copied().collect()
}

/// How homologous a workload is.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkloadStats {
    pub queries: usize,
    pub days: usize,
    pub entities: usize,
    /// Share of queries with an earlier query of the same day about the same entity that asks
    /// something else (the HaS paper: over 60% of TopViews queries, 55-85% week by week).
    pub homologous_share: f64,
    /// Share of queries repeating an earlier question of the same day word for word.
    pub exact_repeat_share: f64,
    /// Share of queries whose text no earlier query of the workload asked (on any day): the
    /// ones a cache cannot answer by remembering the question.
    pub first_occurrence_share: f64,
    /// Chance that two queries drawn at random ask about the same entity (the sum of the
    /// squared entity shares): the CAR a validator picking cached queries blindly would get.
    pub same_entity_chance: f64,
    /// Share of queries whose entity was drawn by its real page views (the rest: the model).
    pub page_views_share: f64,
}

/// Sequence numbers of the queries whose text no earlier query asked.
pub fn first_occurrences(workload: &[WorkloadQuery]) -> HashSet<usize> {
    let mut ordered: Vec<&WorkloadQuery> = workload.iter().collect();
    ordered.sort_by_key(|q| q.seq);
    let mut asked: HashSet<&str> = HashSet::new();
    ordered
        .into_iter()
        .filter(|q| asked.insert(q.question.as_str()))
        .map(|q| q.seq)
        .collect()
}

pub fn stats(workload: &[WorkloadQuery]) -> WorkloadStats {
    let mut seen_entities: HashSet<(usize, &str)> = HashSet::new();
    let mut seen_questions: HashSet<(usize, &str)> = HashSet::new();
    let mut entities: HashSet<&str> = HashSet::new();
    let mut days: HashSet<usize> = HashSet::new();
    let (mut homologous, mut repeats) = (0usize, 0usize);
    for q in workload {
        entities.insert(&q.entity);
        days.insert(q.day);
        let repeat = !seen_questions.insert((q.day, &q.question));
        let same_entity = !seen_entities.insert((q.day, &q.entity));
        repeats += usize::from(repeat);
        homologous += usize::from(same_entity && !repeat);
    }
    let n = workload.len().max(1) as f64;
    let mut per_entity: HashMap<&str, usize> = HashMap::new();
    for q in workload {
        *per_entity.entry(&q.entity).or_default() += 1;
    }
    let page_views = workload
        .iter()
        .filter(|q| q.popularity == PopularitySource::PageViews)
        .count();
    WorkloadStats {
        queries: workload.len(),
        days: days.len(),
        entities: entities.len(),
        homologous_share: homologous as f64 / n,
        exact_repeat_share: repeats as f64 / n,
        first_occurrence_share: first_occurrences(workload).len() as f64 / n,
        same_entity_chance: per_entity.values().map(|&c| (c as f64 / n).powi(2)).sum(),
        page_views_share: page_views as f64 / n,
    }
}

pub fn write_jsonl(path: &Path, workload: &[WorkloadQuery]) -> Result<(), WorkloadError> {
    let error = |e: &dyn std::fmt::Display| WorkloadError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| error(&e))?);
    for q in workload {
        serde_json::to_writer(&mut file, q).map_err(|e| error(&e))?;
        file.write_all(b"\n").map_err(|e| error(&e))?;
    }
    file.flush().map_err(|e| error(&e))
}

pub fn read_jsonl(path: &Path) -> Result<Vec<WorkloadQuery>, WorkloadError> {
    let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::File {
        path: path.display().to_string(),
        message: e.to_string_full(),
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| WorkloadError::File {
                path: format!("{}:{}", path.display(), i + 1),
                message: e.to_string_full(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::popularity::ZipfModel;

    fn questions(entities: usize, per_entity: usize) -> Vec<Question> {
        (0..entities)
            .flat_map(|e| {
                (0..per_entity).map(move |i| Question {
                    question: format!("q{i} about e{e}"),
                    answers: vec![format!("a{i}")],
                    entity: format!("e{e:03}"),
                    source: "test".into(),
                    relation: None,
                    gold_passage: None,
                })
            })
            .collect()
    }

    #[test]
    fn generation_is_seeded_spread_over_days_and_homologous() {
        let qs = questions(100, 8);
        let names = entities(&qs);
        let popularity = ZipfModel::default().daily(names.len()).unwrap();
        let w = generate(&qs, &names, &popularity, 700, 3).unwrap();
        assert_eq!(w, generate(&qs, &names, &popularity, 700, 3).unwrap());
        assert_eq!(w.len(), 700);
        assert!(w.iter().filter(|q| q.day == 6).count() == 100);
        let s = stats(&w);
        assert_eq!(s.days, 7);
        // 100 draws a day from 100 entities under Zipf(1): a third of the queries ask
        // something new about an entity already asked about that day.
        assert!(s.homologous_share > 0.25, "{s:?}");
        assert!(s.exact_repeat_share < s.homologous_share, "{s:?}");
    }

    #[test]
    fn random_questions_are_seeded_distinct_and_never_ask_what_the_workload_asks() {
        let mut qs = questions(50, 4);
        qs[0].relation = Some("P50".into());
        qs[1].relation = Some("P50".into());
        let names = entities(&qs);
        let popularity = ZipfModel::default().daily(names.len()).unwrap();
        let mut w = generate(&qs, &names, &popularity, 120, 3).unwrap();
        // The workload asks e000's P50 in a paraphrase only: its dataset text must stay out.
        w[0].question = "Who wrote the works of e000?".into();
        w[0].entity = "e000".into();
        w[0].relation = Some("P50".into());
        let drawn: Vec<&str> = random_questions(&qs, &w, 40, 9)
            .iter()
            .map(|q| q.question.as_str())
            .collect();
        let again: Vec<&str> = random_questions(&qs, &w, 40, 9)
            .iter()
            .map(|q| q.question.as_str())
            .collect();
        assert_eq!(drawn, again);
        assert_eq!(drawn.len(), 40);
        assert_eq!(drawn.iter().collect::<HashSet<_>>().len(), 40);
        let asked: HashSet<&str> = w.iter().map(|q| q.question.as_str()).collect();
        assert!(drawn.iter().all(|t| !asked.contains(t)));
        assert!(
            !drawn
                .iter()
                .any(|t| *t == qs[0].question || *t == qs[1].question)
        );
        let pool = random_questions(&qs, &w, usize::MAX, 9).len();
        assert!(pool < 200 - 2 && pool > 40, "{pool}");
    }

    #[test]
    fn stats_separate_repeats_from_homologous_queries() {
        let q = |day: usize, entity: &str, question: &str| WorkloadQuery {
            seq: 0,
            day,
            question: question.into(),
            answers: vec![],
            entity: entity.into(),
            source: "t".into(),
            relation: None,
            gold_passage: None,
            popularity: PopularitySource::Model,
        };
        let w: Vec<WorkloadQuery> = [
            q(0, "A", "x"),
            q(0, "A", "y"),
            q(0, "A", "x"),
            q(1, "A", "z"),
            q(1, "B", "w"),
        ]
        .into_iter()
        .enumerate()
        .map(|(seq, q)| WorkloadQuery { seq, ..q })
        .collect();
        let s = stats(&w);
        assert_eq!(s.homologous_share, 1.0 / 5.0);
        assert_eq!(s.exact_repeat_share, 1.0 / 5.0);
        // "x" on day 0 is asked again; "z" and "w" are new on day 1.
        assert_eq!(s.first_occurrence_share, 4.0 / 5.0);
        assert!((s.same_entity_chance - (0.8f64.powi(2) + 0.2f64.powi(2))).abs() < 1e-12);
        assert_eq!(s.page_views_share, 0.0);
    }

    #[test]
    fn first_occurrences_follow_the_sequence_not_the_slice_order() {
        let q = |seq: usize, question: &str| WorkloadQuery {
            seq,
            day: 0,
            question: question.into(),
            answers: vec![],
            entity: "E".into(),
            source: "t".into(),
            relation: None,
            gold_passage: None,
            popularity: PopularitySource::Model,
        };
        let w = vec![q(2, "a"), q(0, "a"), q(1, "b"), q(3, "b")];
        assert_eq!(first_occurrences(&w), HashSet::from([0, 1]));
    }

    fn entity_question(subject: &str, relation: &str, answer: &str) -> Question {
        Question {
            question: format!("Where was {subject} born?"),
            answers: vec![answer.into()],
            entity: subject.into(),
            source: "entityquestions".into(),
            relation: Some(relation.into()),
            gold_passage: None,
        }
    }

    #[test]
    fn relation_questions_are_asked_in_several_phrasings_with_their_answers() {
        let qs = vec![
            entity_question("Ada Lovelace", "P19", "London"),
            entity_question("Alan Turing", "P19", "Maida Vale"),
        ];
        let names = entities(&qs);
        let popularity = ZipfModel::default().daily(names.len()).unwrap();
        let w = generate(&qs, &names, &popularity, 400, 5).unwrap();
        let texts: HashSet<&str> = w.iter().map(|q| q.question.as_str()).collect();
        // Two subjects, each in its own words and the relation's five paraphrases.
        assert_eq!(texts.len(), 12, "{texts:?}");
        for q in &w {
            assert!(q.question.contains(&q.entity), "{q:?}");
            let expected = if q.entity == "Ada Lovelace" {
                "London"
            } else {
                "Maida Vale"
            };
            assert_eq!(q.answers, [expected]);
            assert_eq!(q.relation.as_deref(), Some("P19"));
        }
    }

    #[test]
    fn subjects_with_conflicting_answers_under_one_relation_are_dropped() {
        let qs = vec![
            entity_question("Washington County", "P17", "United States"),
            entity_question("Washington County", "P131", "Oregon"),
            entity_question("Washington County", "P131", "Maine"),
            entity_question("Ada Lovelace", "P19", "London"),
            entity_question("Ada Lovelace", "P19", "london"),
            entity_question("Ada Lovelace", "P26", "William King"),
        ];
        let (kept, dropped) = drop_ambiguous_subjects(qs);
        assert_eq!(dropped, 1);
        assert_eq!(kept.len(), 3);
        assert!(kept.iter().all(|q| q.entity == "Ada Lovelace"));
    }

    #[test]
    fn page_view_entities_are_tagged() {
        let qs = questions(20, 2);
        let names = entities(&qs);
        let mut popularity = ZipfModel::default().daily(names.len()).unwrap();
        for day in &mut popularity.observed {
            day.insert(popularity_top(&popularity.days[0]));
        }
        let w = generate(&qs, &names, &popularity, 300, 2).unwrap();
        let s = stats(&w);
        assert!(
            s.page_views_share > 0.0 && s.page_views_share < 1.0,
            "{s:?}"
        );
        for q in &w {
            let listed = popularity.observed[q.day]
                .contains(&names.iter().position(|n| *n == q.entity).unwrap());
            assert_eq!(listed, q.popularity == PopularitySource::PageViews);
        }
    }

    fn popularity_top(day: &[(usize, f64)]) -> usize {
        day[0].0
    }

    #[test]
    fn jsonl_round_trips() {
        let qs = questions(5, 2);
        let names = entities(&qs);
        let popularity = ZipfModel::default().daily(names.len()).unwrap();
        let w = generate(&qs, &names, &popularity, 20, 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        write_jsonl(&path, &w).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), w);
        std::fs::write(&path, "{\"seq\": 1}\n").unwrap();
        assert!(
            read_jsonl(&path)
                .unwrap_err()
                .to_string_full()
                .contains("w.jsonl:1")
        );
    }
}
