//! Workloads: questions drawn day by day from a popularity model, so popular entities recur
//! with different questions (the homologous traffic HaS feeds on). A workload can be saved
//! to JSON lines and replayed.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use hasten_core::Question;
use rand::SeedableRng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde::{Deserialize, Serialize};

use crate::popularity::DailyPopularity;

/// One query of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadQuery {
    pub seq: usize,
    pub day: usize,
    pub question: String,
    pub answers: Vec<String>,
    pub entity: String,
    pub source: String,
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

/// Draws `count` queries spread evenly over the days of `popularity`: each day an entity by
/// its weight, then one of its questions uniformly. `entity_names` is the list the
/// popularity indexes into (see [`entities`]).
pub fn generate(
    questions: &[Question],
    entity_names: &[String],
    popularity: &DailyPopularity,
    count: usize,
    seed: u64,
) -> Result<Vec<WorkloadQuery>, WorkloadError> {
    let mut by_entity: BTreeMap<&str, Vec<&Question>> = BTreeMap::new();
    for q in questions.iter().filter(|q| !q.entity.is_empty()) {
        by_entity.entry(q.entity.as_str()).or_default().push(q);
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
            let Some(q) = by_entity
                .get(name.as_str())
                .and_then(|qs| qs.choose(&mut rng))
            else {
                continue;
            };
            out.push(WorkloadQuery {
                seq: out.len(),
                day,
                question: q.question.clone(),
                answers: q.answers.clone(),
                entity: q.entity.clone(),
                source: q.source.clone(),
            });
        }
    }
    if out.is_empty() {
        return Err(WorkloadError::NoQuestions);
    }
    Ok(out)
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
    WorkloadStats {
        queries: workload.len(),
        days: days.len(),
        entities: entities.len(),
        homologous_share: homologous as f64 / n,
        exact_repeat_share: repeats as f64 / n,
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
        message: e.to_string(),
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| WorkloadError::File {
                path: format!("{}:{}", path.display(), i + 1),
                message: e.to_string(),
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
    fn stats_separate_repeats_from_homologous_queries() {
        let q = |day: usize, entity: &str, question: &str| WorkloadQuery {
            seq: 0,
            day,
            question: question.into(),
            answers: vec![],
            entity: entity.into(),
            source: "t".into(),
        };
        let w = vec![
            q(0, "A", "x"),
            q(0, "A", "y"),
            q(0, "A", "x"),
            q(1, "A", "z"),
            q(1, "B", "w"),
        ];
        let s = stats(&w);
        assert_eq!(s.homologous_share, 1.0 / 5.0);
        assert_eq!(s.exact_repeat_share, 1.0 / 5.0);
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
                .to_string()
                .contains("w.jsonl:1")
        );
    }
}
