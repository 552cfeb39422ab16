//! The synthetic corpus's questions are answerable, as answer matching reads passages: the
//! generator lives in `hasten-core`, the matching here.

use hasten_core::corpus::{SyntheticSpec, generate_synthetic};
use hasten_eval::answers::contains_answer;

#[test]
fn every_synthetic_answer_is_stated_in_a_passage_of_its_entity() {
    let corpus = generate_synthetic(&SyntheticSpec {
        entities: 25,
        seed: 11,
    });
    for q in &corpus.questions {
        assert!(
            corpus
                .passages
                .iter()
                .any(|p| p.title == q.entity && contains_answer(&p.text, &q.answers)),
            "no passage of {} answers {:?}",
            q.entity,
            q.question
        );
    }
}
