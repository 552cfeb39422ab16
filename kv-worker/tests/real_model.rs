//! The fused prefill on the real SmolLM2 model and real text: recomputing every chunk token
//! answers exactly as full prefill does. Skipped (with a message) when `HASTEN_LM_DIR` is
//! unset; `make test` sets it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;

use candle_core::Device;
use hasten_kv_worker::prompt::{chunk_tokens, question_tokens};
use hasten_kv_worker::{ExactPrefix, FusionMode, FusionSettings, KvEngine, SegmentKv, prefill};
use hasten_lm::testing::{SMALL_MODEL, max_abs_diff, real_model};
use hasten_lm::{LanguageModel, WeightFormat};

fn engine() -> Option<KvEngine> {
    let path = real_model(SMALL_MODEL)?;
    let model = LanguageModel::load_with(&path, &Device::Cpu, WeightFormat::Fast).unwrap();
    Some(KvEngine::new(Arc::new(model)).unwrap())
}

const PASSAGES: [(&str, &str); 3] = [
    (
        "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. \
         It is named after the engineer Gustave Eiffel, whose company designed and built the \
         tower from 1887 to 1889 as the centrepiece of the 1889 World's Fair.",
    ),
    (
        "Gustave Eiffel",
        "Alexandre Gustave Eiffel was a French civil engineer born in Dijon in 1832. A graduate \
         of the Ecole Centrale des Arts et Manufactures, he made his name with various bridges \
         for the French railway network, most famously the Garabit viaduct.",
    ),
    (
        "Garabit viaduct",
        "The Garabit viaduct is a railway arch bridge spanning the Truyere river near Ruynes-en-\
         Margeride, Cantal, France. It was constructed between 1882 and 1884 by Gustave Eiffel.",
    ),
];
const QUESTION: &str = "In which city was the engineer of the Eiffel Tower born?";

#[test]
fn recomputing_every_token_answers_as_full_prefill_does_on_smollm2() {
    let Some(engine) = engine() else { return };
    let model = engine.model();
    let chunks: Vec<SegmentKv> = PASSAGES
        .iter()
        .map(|(title, text)| {
            engine
                .full_reuse_kv(chunk_tokens(model, title, text).unwrap())
                .unwrap()
        })
        .collect();
    let refs: Vec<&SegmentKv> = chunks.iter().collect();
    let settings = |mode, ratio| FusionSettings { mode, ratio };
    let answer = |mode, ratio| {
        engine
            .answer(
                QUESTION,
                &refs,
                settings(mode, ratio),
                16,
                ExactPrefix::NONE.into(),
                &mut |_: &str| {},
            )
            .unwrap()
    };
    let full = answer(FusionMode::FullPrefill, 0.0);
    assert!(!full.tokens.is_empty());
    for mode in [FusionMode::FusionRag, FusionMode::CacheBlend] {
        let fused = answer(mode, 1.0);
        assert_eq!(fused.recomputed.len(), full.recomputed.len());
        assert_eq!(
            fused.tokens, full.tokens,
            "{mode:?}: {:?} vs {:?}",
            fused.text, full.text
        );
    }

    // The first-token distributions: equal at 100%, and the check can fail: reused chunks
    // that never saw each other are measurably off.
    let question = question_tokens(model, QUESTION).unwrap();
    let logits = |mode, ratio| {
        prefill(
            &model.decoder,
            engine.system(),
            &refs,
            &question,
            settings(mode, ratio),
            16,
            ExactPrefix::NONE.into(),
        )
        .unwrap()
        .logits
    };
    let reference = logits(FusionMode::FullPrefill, 0.0);
    let recomputed = max_abs_diff(&logits(FusionMode::FusionRag, 1.0), &reference);
    let reused = max_abs_diff(&logits(FusionMode::FullReuse, 0.0), &reference);
    assert!(
        recomputed < 0.05,
        "100% recomputation is off by {recomputed}"
    );
    assert!(
        reused > 10.0 * recomputed.max(0.01),
        "full reuse is off by only {reused}"
    );
}
