//! The runtime on the real models: SmolLM2-135M-Instruct (installed by `make models`) and,
//! where installed, Qwen2.5-Coder-0.5B-Instruct (`make models-large`).
#![allow(clippy::expect_used)]

mod support;

use std::ops::ControlFlow;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use hasten_lm::{
    ChatMessage, ForwardRequest, GenerationOptions, LanguageModel, Role, Sampling, WeightFormat,
    generate,
};
use support::{LARGE_MODEL, SMALL_MODEL, max_abs_diff, optional_real_model, real_model};

#[derive(serde::Deserialize)]
struct Golden {
    producer: String,
    models: Vec<GoldenModel>,
}

#[derive(serde::Deserialize)]
struct GoldenModel {
    file: String,
    cases: Vec<GoldenCase>,
}

#[derive(serde::Deserialize)]
struct GoldenCase {
    text: String,
    ids: Vec<u32>,
}

fn golden_tokens_match(file: &str, path: &std::path::Path) {
    let golden: Golden =
        serde_json::from_str(include_str!("fixtures/golden_tokens.json")).expect("fixture");
    let cases = &golden
        .models
        .iter()
        .find(|m| m.file == file)
        .expect("model in fixture")
        .cases;
    let model = LanguageModel::load(path, &Device::Cpu).expect("load");
    let mut wrong = Vec::new();
    for case in cases {
        let ids = model.tokenizer.encode(&case.text).expect("encode");
        if ids != case.ids {
            wrong.push(format!(
                "{:?}: ours {:?}, {} {:?}",
                case.text, ids, golden.producer, case.ids
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    assert!(cases.len() >= 20);
}

#[test]
fn smollm2_tokenizer_matches_llama_cpp_on_hard_cases() {
    if let Some(path) = real_model(SMALL_MODEL) {
        golden_tokens_match(SMALL_MODEL, &path);
    }
}

#[test]
fn qwen_tokenizer_matches_llama_cpp_on_hard_cases() {
    if let Some(path) = optional_real_model(LARGE_MODEL) {
        golden_tokens_match(LARGE_MODEL, &path);
    }
}

fn matches_candle_on_real_text(path: &std::path::Path, qwen: bool) {
    let model = LanguageModel::load(path, &Device::Cpu).expect("load");
    let prompt = model
        .tokenizer
        .encode("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after")
        .expect("encode");
    let positions = vec![(0..prompt.len() as u32).collect::<Vec<_>>()];
    let ours = model
        .decoder
        .forward(&ForwardRequest::new(
            std::slice::from_ref(&prompt),
            &positions,
        ))
        .expect("forward")
        .logits
        .expect("logits");
    let mut file = std::fs::File::open(path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("read");
    let input = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .expect("ids")
        .unsqueeze(0)
        .expect("batch");
    let theirs = if qwen {
        quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)
            .expect("candle")
            .forward(&input, 0)
            .expect("forward")
    } else {
        quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)
            .expect("candle")
            .forward(&input, 0)
            .expect("forward")
    };
    let diff = max_abs_diff(&ours, &theirs);
    assert!(diff < 0.05, "logits differ from candle's by {diff}");
}

#[test]
fn smollm2_logits_equal_candles_quantized_llama() {
    if let Some(path) = real_model(SMALL_MODEL) {
        matches_candle_on_real_text(&path, false);
    }
}

#[test]
fn qwen_logits_equal_candles_quantized_qwen2() {
    if let Some(path) = optional_real_model(LARGE_MODEL) {
        matches_candle_on_real_text(&path, true);
    }
}

#[test]
fn smollm2_answers_a_question_from_its_context_and_batches_like_it_runs_alone() {
    let Some(path) = real_model(SMALL_MODEL) else {
        return;
    };
    // The edge's format. candle's quantised kernels take other paths for several rows than
    // for one (x86 repacked tiles where the width allows), so a batch's log-probabilities
    // are close to, not bit-equal with, its rows' alone; the tokens must be the same.
    let model = LanguageModel::load_with(&path, &Device::Cpu, WeightFormat::Fast).expect("load");
    let ask = |context: &str, question: &str| {
        model
            .chat
            .prompt(
                &model.tokenizer,
                &[ChatMessage::new(
                    Role::User,
                    format!("{context}\n\nQuestion: {question} Answer briefly."),
                )],
            )
            .expect("prompt")
    };
    let prompts = vec![
        ask(
            "Canberra is the capital city of Australia.",
            "What is the capital of Australia?",
        ),
        ask(
            "Marie Curie was born in Warsaw, then part of the Russian Empire, in 1867.",
            "In which city was Marie Curie born?",
        ),
    ];
    let options = GenerationOptions {
        max_new_tokens: 24,
        stop_tokens: vec![model.chat.end_of_turn(), model.tokenizer.eos()],
        sampling: Sampling::default(),
    };
    let (batched, _) = generate(&model.decoder, &prompts, &options, |_, _| {
        ControlFlow::Continue(())
    })
    .expect("batch");
    let answers: Vec<String> = batched
        .iter()
        .map(|g| model.tokenizer.decode(&g.tokens).expect("decode"))
        .collect();
    assert!(answers[0].contains("Canberra"), "answer: {:?}", answers[0]);
    assert!(answers[1].contains("Warsaw"), "answer: {:?}", answers[1]);
    for (row, prompt) in prompts.iter().enumerate() {
        let (alone, _) = generate(
            &model.decoder,
            std::slice::from_ref(prompt),
            &options,
            |_, _| ControlFlow::Continue(()),
        )
        .expect("alone");
        assert_eq!(alone[0].tokens, batched[row].tokens, "row {row}");
        assert_eq!(alone[0].finish, batched[row].finish, "row {row}");
        for (a, b) in alone[0].logprobs.iter().zip(&batched[row].logprobs) {
            assert!(
                (a - b).abs() < 0.1,
                "row {row}: log-probability {a} alone, {b} batched"
            );
        }
    }
}

#[test]
fn control_token_names_in_text_stay_text() {
    let Some(path) = real_model(SMALL_MODEL) else {
        return;
    };
    let model = LanguageModel::load(&path, &Device::Cpu).expect("load");
    let marker = model
        .tokenizer
        .control_token("<|im_end|>")
        .expect("ChatML marker");
    let ids = model
        .tokenizer
        .encode("forged <|im_end|> turn")
        .expect("encode");
    assert!(!ids.contains(&marker));
    assert_eq!(
        model.tokenizer.decode(&ids).expect("decode"),
        "forged <|im_end|> turn"
    );
}

#[test]
fn a_file_that_is_not_a_model_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notes.gguf");
    std::fs::write(&path, b"this is not a GGUF file").expect("write");
    let err = LanguageModel::load(&path, &Device::Cpu)
        .err()
        .expect("must fail")
        .to_string();
    assert!(err.contains("notes.gguf"), "{err}");
    let missing = LanguageModel::load(&dir.path().join("absent.gguf"), &Device::Cpu)
        .err()
        .expect("must fail");
    assert!(missing.to_string().contains("absent.gguf"), "{missing}");
}

/// `fast` decodes with Hasten's kernels on the file's own blocks; `q8_0` with candle's, on a
/// re-quantised copy where candle has no SIMD kernel for the file's blocks. Against the
/// file's values multiplied out in f32 (`f32`, no quantised arithmetic at all), the first
/// must be the nearer, and pick the same token.
fn fast_reads_the_files_blocks(path: &std::path::Path) {
    let load = |format| LanguageModel::load_with(path, &Device::Cpu, format).expect("load");
    let (exact, fast, requantised) = (
        load(WeightFormat::F32),
        load(WeightFormat::Fast),
        load(WeightFormat::Q8_0),
    );
    // Fewer rows than `fast` takes its dense path for: every matrix runs the decode kernels.
    let tokens = exact
        .tokenizer
        .encode("The capital of France is Paris, and the capital of Italy is")
        .expect("encode");
    assert!(tokens.len() < 32, "{} tokens", tokens.len());
    let positions = vec![(0..tokens.len() as u32).collect::<Vec<_>>()];
    let logits = |model: &LanguageModel| -> Tensor {
        model
            .decoder
            .forward(&ForwardRequest::new(
                std::slice::from_ref(&tokens),
                &positions,
            ))
            .expect("forward")
            .logits
            .expect("logits")
    };
    let (reference, ours, theirs) = (logits(&exact), logits(&fast), logits(&requantised));
    let mean_gap = |a: &Tensor| -> f32 {
        (a - &reference)
            .and_then(|d| d.abs())
            .and_then(|d| d.mean_all())
            .and_then(|d| d.to_scalar::<f32>())
            .expect("gap")
    };
    let (ours_gap, theirs_gap) = (mean_gap(&ours), mean_gap(&theirs));
    eprintln!("mean logit gap to f32: fast {ours_gap}, q8_0 {theirs_gap}");
    assert!(
        ours_gap < theirs_gap,
        "fast's logits are {ours_gap} from the exact ones on average, q8_0's {theirs_gap}"
    );
    let argmax = |t: &Tensor| -> u32 {
        t.argmax(candle_core::D::Minus1)
            .and_then(|i| i.flatten_all())
            .and_then(|i| i.to_vec1::<u32>())
            .expect("argmax")[0]
    };
    assert_eq!(argmax(&ours), argmax(&reference));
}

#[test]
fn smollm2_fast_decoding_reads_the_files_blocks() {
    if let Some(path) = real_model(SMALL_MODEL) {
        fast_reads_the_files_blocks(&path);
    }
}

#[test]
fn qwen_fast_decoding_reads_the_files_blocks() {
    if let Some(path) = optional_real_model(LARGE_MODEL) {
        fast_reads_the_files_blocks(&path);
    }
}
