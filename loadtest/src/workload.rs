//! Popularity-skewed workloads: entities drawn from a Zipf law over a seeded popularity
//! ranking, then one of the drawn entity's questions uniformly, so popular entities recur
//! with different questions: the homologous traffic HaS feeds on.

use std::collections::BTreeMap;

use hasten_core::Question;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand_distr::{Distribution, Zipf};

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("no questions to draw from (check the question sources)")]
    NoQuestions,
    #[error("invalid Zipf exponent {0}: must be finite and at least 0 (0 is uniform)")]
    Exponent(f64),
}

/// Draws `count` questions: entity by Zipf(`exponent`) over a popularity ranking shuffled
/// with `seed`, then a question of that entity uniformly.
pub fn zipf_workload(
    questions: &[Question],
    count: usize,
    exponent: f64,
    seed: u64,
) -> Result<Vec<Question>, WorkloadError> {
    let mut by_entity: BTreeMap<&str, Vec<&Question>> = BTreeMap::new();
    for q in questions.iter().filter(|q| !q.entity.is_empty()) {
        by_entity.entry(q.entity.as_str()).or_default().push(q);
    }
    if by_entity.is_empty() {
        return Err(WorkloadError::NoQuestions);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ranking: Vec<&Vec<&Question>> = by_entity.values().collect();
    ranking.shuffle(&mut rng);
    let zipf =
        Zipf::new(ranking.len() as f64, exponent).map_err(|_| WorkloadError::Exponent(exponent))?;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let rank = zipf.sample(&mut rng) as usize;
        let entity = ranking[rank.clamp(1, ranking.len()) - 1];
        if let Some(q) = entity.choose(&mut rng) {
            out.push((*q).clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn questions(entities: usize, per_entity: usize) -> Vec<Question> {
        (0..entities)
            .flat_map(|e| {
                (0..per_entity).map(move |i| Question {
                    question: format!("q{i} about e{e}"),
                    answers: vec![format!("a{i}")],
                    entity: format!("e{e}"),
                    source: "test".into(),
                })
            })
            .collect()
    }

    #[test]
    fn draws_are_skewed_seeded_and_cover_several_questions_per_entity() {
        let qs = questions(200, 5);
        let w = zipf_workload(&qs, 2000, 1.1, 3).unwrap();
        assert_eq!(w, zipf_workload(&qs, 2000, 1.1, 3).unwrap());
        assert_ne!(w, zipf_workload(&qs, 2000, 1.1, 4).unwrap());
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for q in &w {
            *counts.entry(q.entity.as_str()).or_default() += 1;
        }
        let mut sorted: Vec<usize> = counts.values().copied().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        // Zipf(1.1) over 200 entities puts roughly a fifth of all draws on the top entity.
        assert!(
            sorted[0] > 250 && sorted[0] < 600,
            "top entity drew {}",
            sorted[0]
        );
        let top = counts
            .iter()
            .max_by_key(|(_, c)| **c)
            .map(|(e, _)| *e)
            .unwrap();
        let distinct: std::collections::HashSet<&str> = w
            .iter()
            .filter(|q| q.entity == top)
            .map(|q| q.question.as_str())
            .collect();
        assert_eq!(distinct.len(), 5);
    }

    #[test]
    fn empty_input_and_bad_exponent_are_errors() {
        assert!(matches!(
            zipf_workload(&[], 10, 1.1, 1),
            Err(WorkloadError::NoQuestions)
        ));
        assert!(matches!(
            zipf_workload(&questions(3, 1), 10, -1.0, 1),
            Err(WorkloadError::Exponent(_))
        ));
        assert!(matches!(
            zipf_workload(&questions(3, 1), 10, f64::NAN, 1),
            Err(WorkloadError::Exponent(_))
        ));
        assert_eq!(
            zipf_workload(&questions(3, 1), 10, 0.0, 1).unwrap().len(),
            10
        );
    }
}
