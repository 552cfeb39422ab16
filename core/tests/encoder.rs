//! The encoder against an independent implementation and on real sentence pairs, in every
//! runtime: ONNX Runtime and candle, and candle on CUDA in a build with the `cuda` feature
//! (run on a GPU machine; see docs/benchmarks/encoder.md).

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use display_full_error::DisplayFullErrorExt;
use std::path::PathBuf;

use hasten_core::encoder::{DEFAULT_MODEL_DIR, EncoderRuntime, TextEncoder};
use hasten_core::vector::dot;

fn model_dir() -> PathBuf {
    std::env::var_os("HASTEN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DEFAULT_MODEL_DIR)
        })
}

/// One encoder per runtime; `make models` installs what the CPU runtimes need.
fn encoders() -> Vec<TextEncoder> {
    let cuda = cfg!(feature = "cuda").then_some(EncoderRuntime::Cuda);
    [EncoderRuntime::Onnx, EncoderRuntime::Candle]
        .into_iter()
        .chain(cuda)
        .map(|runtime| {
            let encoder = TextEncoder::load_with(&model_dir(), runtime)
                .expect("model missing: run `make models`");
            assert_eq!(encoder.runtime(), runtime);
            encoder
        })
        .collect()
}

/// Without the `cuda` feature the `cuda` runtime is refused with an error that says why,
/// never silently replaced by the CPU.
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_runtime_without_the_feature_is_refused() {
    let err = TextEncoder::load_with(&model_dir(), EncoderRuntime::Cuda).unwrap_err();
    assert!(
        matches!(err, hasten_core::encoder::EncoderError::Cuda(_)),
        "{err}"
    );
    assert!(err.to_string_full().contains("`cuda` feature"), "{err}");
}

/// Golden values come from `tests/golden/minilm_reference.py`: a numpy implementation of the
/// BERT forward pass written from the model's safetensors weights, with transformers'
/// pure-Python WordPiece tokenizer (`BertTokenizerLegacy`), mean pooling and L2 normalisation
/// (no candle, no Rust tokenizer). Produced with
/// `python3 core/tests/golden/minilm_reference.py models/all-MiniLM-L6-v2`.
#[test]
fn matches_the_independent_reference_embedding() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/minilm_golden.json")).unwrap();
    for encoder in encoders() {
        for sentence in golden["sentences"].as_array().unwrap() {
            let text = sentence["text"].as_str().unwrap();
            let expected: Vec<f32> = sentence["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let got = encoder.encode_one(text).unwrap();
            assert_eq!(got.len(), expected.len());
            let max_diff = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                max_diff < 1e-4,
                "{:?}: max abs difference {max_diff} from the reference",
                encoder.runtime()
            );
            assert!(dot(&got, &expected) > 0.99999);
        }
    }
}

#[test]
fn paraphrases_score_clearly_above_unrelated_sentences() {
    for encoder in encoders() {
        let v = encoder
            .encode(&[
                "How tall is the Eiffel Tower?",
                "What is the height of the Eiffel Tower?",
                "The recipe calls for two cups of flour and a pinch of salt.",
            ])
            .unwrap();
        let paraphrase = dot(&v[0], &v[1]);
        let unrelated = dot(&v[0], &v[2]);
        assert!(paraphrase > 0.8, "paraphrase similarity {paraphrase}");
        assert!(unrelated < 0.2, "unrelated similarity {unrelated}");
        for vector in &v {
            assert!((dot(vector, vector) - 1.0).abs() < 1e-5, "not unit length");
        }
    }
}

#[test]
fn padding_in_a_batch_does_not_change_an_embedding() {
    for encoder in encoders() {
        let short = "Where was Super Bowl 50 played?";
        let long = "Super Bowl 50 was an American football game to determine the champion of the \
                National Football League for the 2015 season, played at Levi's Stadium.";
        let alone = encoder.encode_one(short).unwrap();
        let batched = encoder.encode(&[long, short]).unwrap();
        let diff = alone
            .iter()
            .zip(&batched[1])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "padding changed the embedding by {diff}");
    }
}

#[test]
fn texts_beyond_the_token_limit_are_truncated_not_refused() {
    for encoder in encoders() {
        let long = "retrieval ".repeat(2000);
        let v = encoder.encode_one(&long).unwrap();
        assert_eq!(v.len(), encoder.dimension());
        assert!(v.iter().all(|x| x.is_finite()));
    }
}

/// The two runtimes agree on real passages of mixed lengths, batched as a corpus build
/// batches them (sorted by length, padded per batch).
#[test]
fn the_runtimes_agree_on_a_batch_of_passages() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/minilm_golden.json")).unwrap();
    let mut texts: Vec<String> = golden["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    // Longer texts built from the short ones, so that batches mix lengths up to the limit.
    for n in [3, 10, 40] {
        texts.push(texts[..n.min(texts.len())].join(" ").repeat(n / 3 + 1));
    }
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let [onnx, candle] = encoders().try_into().unwrap();
    let (a, b) = (onnx.encode(&texts).unwrap(), candle.encode(&texts).unwrap());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let cosine = dot(x, y);
        assert!(
            cosine >= 0.9999,
            "text {i}: cosine {cosine} between the runtimes"
        );
    }
}
