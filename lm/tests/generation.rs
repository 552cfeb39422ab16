//! Batched generation and one-pass scoring against their one-at-a-time references.
#![allow(clippy::expect_used)]

mod support;

use std::ops::ControlFlow;

use candle_core::{Device, IndexOp};
use hasten_lm::{
    Decoder, FinishReason, ForwardRequest, GenerationOptions, Logits, Sampling, generate, left_pad,
    log_softmax, score, score_incrementally, score_shared,
};
use support::{TinyArch, tokens, write_tiny_model};

fn greedy(max_new_tokens: usize) -> GenerationOptions {
    GenerationOptions {
        max_new_tokens,
        stop_tokens: Vec::new(),
        sampling: Sampling::default(),
    }
}

#[test]
fn a_padded_batch_decodes_exactly_what_each_prompt_decodes_alone() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let decoder =
            Decoder::load(&write_tiny_model(dir.path(), arch, 5), &Device::Cpu).expect("load");
        // Lengths far apart are prefilled row by row and stacked; lengths close together in
        // one padded pass. Either way the batch must decode what each row decodes alone.
        let far_apart = vec![tokens(1, 3), tokens(2, 17), tokens(3, 9)];
        let close = vec![tokens(4, 16), tokens(5, 17), tokens(6, 15)];
        for prompts in [far_apart, close] {
            let (batched, _) = generate(&decoder, &prompts, &greedy(12), |_, _| {
                ControlFlow::Continue(())
            })
            .expect("batch");
            for (row, prompt) in prompts.iter().enumerate() {
                let (alone, _) = generate(
                    &decoder,
                    std::slice::from_ref(prompt),
                    &greedy(12),
                    |_, _| ControlFlow::Continue(()),
                )
                .expect("alone");
                assert_eq!(
                    batched[row].tokens,
                    alone[0].tokens,
                    "{arch:?} row {row} of {}",
                    prompts.len()
                );
                for (a, b) in batched[row].logprobs.iter().zip(&alone[0].logprobs) {
                    assert!((a - b).abs() < 1e-3, "{arch:?} row {row}: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn sequences_that_finish_early_leave_the_batch_without_changing_the_others() {
    // Rows 0 and 1 end early (at 2 and 7 tokens), so the batch shrinks twice; what the
    // rest decodes must still be what each decodes alone.
    let limits = [2usize, 7, usize::MAX];
    let stop_at = |limits: [usize; 3]| {
        let mut counts = [0usize; 3];
        move |row: usize, _| {
            counts[row] += 1;
            if counts[row] >= limits[row] {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    };
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let decoder =
            Decoder::load(&write_tiny_model(dir.path(), arch, 5), &Device::Cpu).expect("load");
        let prompts = vec![tokens(1, 5), tokens(2, 11), tokens(3, 8)];
        let (batched, _) =
            generate(&decoder, &prompts, &greedy(12), stop_at(limits)).expect("batch");
        let mut alone_rows = Vec::new();
        for (row, prompt) in prompts.iter().enumerate() {
            let mut only = [usize::MAX; 3];
            only[0] = limits[row];
            let (alone, _) = generate(
                &decoder,
                std::slice::from_ref(prompt),
                &greedy(12),
                stop_at(only),
            )
            .expect("alone");
            assert_eq!(batched[row], alone[0], "{arch:?} row {row}");
            alone_rows.push(alone[0].tokens.clone());
        }
        assert_eq!(
            batched.iter().map(|g| g.tokens.len()).collect::<Vec<_>>(),
            [2, 7, 12]
        );
        // Distinct continuations: rows swapped when the batch shrinks would show.
        assert_ne!(alone_rows[1][..7], alone_rows[2][..7], "{arch:?}");
    }
}

#[test]
fn padding_that_is_not_masked_changes_what_short_prompts_decode() {
    // The broken variant of the test above: attend to the padding, and the short prompt's
    // continuation is no longer its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let decoder = Decoder::load(
        &write_tiny_model(dir.path(), TinyArch::Llama, 5),
        &Device::Cpu,
    )
    .expect("load");
    let prompts = vec![tokens(1, 3), tokens(2, 17)];
    let batch = left_pad(&prompts, 0);
    let unmasked = decoder
        .forward(&ForwardRequest::new(&batch.tokens, &batch.positions))
        .expect("unmasked")
        .logits
        .expect("logits");
    let alone = decoder
        .forward(&ForwardRequest::new(&prompts[..1], &[vec![0, 1, 2]]))
        .expect("alone")
        .logits
        .expect("logits");
    let diff = support::max_abs_diff(&unmasked.i(0..1).expect("row"), &alone);
    assert!(diff > 0.01, "padding made no difference ({diff})");
}

#[test]
fn generation_stops_at_a_stop_token_or_the_length_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let decoder = Decoder::load(
        &write_tiny_model(dir.path(), TinyArch::Llama, 5),
        &Device::Cpu,
    )
    .expect("load");
    let prompt = vec![tokens(4, 5)];
    let (free, timings) = generate(&decoder, &prompt, &greedy(8), |_, _| {
        ControlFlow::Continue(())
    })
    .expect("free");
    assert_eq!(free[0].tokens.len(), 8);
    assert_eq!(free[0].finish, FinishReason::Length);
    assert_eq!(timings.generated_tokens, 8);
    assert_eq!(timings.prompt_tokens, 5);
    let stop = free[0].tokens[3];
    let first_stop = free[0]
        .tokens
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let options = GenerationOptions {
        stop_tokens: vec![stop],
        ..greedy(8)
    };
    let (stopped, _) = generate(
        &decoder,
        &prompt,
        &options,
        |_, _| ControlFlow::Continue(()),
    )
    .expect("stopped");
    assert_eq!(stopped[0].tokens, free[0].tokens[..first_stop]);
    assert_eq!(stopped[0].finish, FinishReason::Stop);
    let mut seen = Vec::new();
    let (cut, _) = generate(&decoder, &prompt, &greedy(8), |_, id| {
        seen.push(id);
        if seen.len() == 2 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .expect("cut");
    assert_eq!(cut[0].tokens, free[0].tokens[..2]);
    assert_eq!(seen, free[0].tokens[..2]);
}

#[test]
fn sampling_is_reproducible_from_its_seed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let decoder = Decoder::load(
        &write_tiny_model(dir.path(), TinyArch::Qwen2, 5),
        &Device::Cpu,
    )
    .expect("load");
    let prompt = vec![tokens(6, 4)];
    let sampled = |seed| {
        let options = GenerationOptions {
            sampling: Sampling {
                temperature: 1.5,
                top_p: 1.0,
                seed,
            },
            ..greedy(16)
        };
        generate(
            &decoder,
            &prompt,
            &options,
            |_, _| ControlFlow::Continue(()),
        )
        .expect("sample")
        .0[0]
            .tokens
            .clone()
    };
    assert_eq!(sampled(1), sampled(1));
    assert_ne!(sampled(1), sampled(2));
}

#[test]
fn a_context_read_once_gives_the_scores_of_each_row_read_alone() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let decoder =
            Decoder::load(&write_tiny_model(dir.path(), arch, 13), &Device::Cpu).expect("load");
        let context = tokens(81, 14);
        let continuations = vec![tokens(82, 6), tokens(83, 1), tokens(84, 11)];
        let shared = score_shared(&decoder, &context, &continuations).expect("shared");
        let max_gap = |context: &[u32], scores: &[Vec<f32>]| -> f32 {
            continuations
                .iter()
                .zip(scores)
                .flat_map(|(continuation, row)| {
                    let reference =
                        score_incrementally(&decoder, context, continuation).expect("incremental");
                    assert_eq!(row.len(), reference.len());
                    row.iter()
                        .zip(reference)
                        .map(|(a, b)| (a - b).abs())
                        .collect::<Vec<_>>()
                })
                .fold(0.0, f32::max)
        };
        assert!(max_gap(&context, &shared) < 2e-3, "{arch:?}");
        // Broken variant: continuations scored after another context are not these scores,
        // so the rows did read the shared context.
        let mut other = context.clone();
        other[3] = other[3].wrapping_add(1) % 64;
        let elsewhere = score_shared(&decoder, &other, &continuations).expect("other");
        assert!(max_gap(&context, &elsewhere) > 1e-3, "{arch:?}");
    }
}

#[test]
fn one_pass_scores_equal_token_by_token_scores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let decoder = Decoder::load(
        &write_tiny_model(dir.path(), TinyArch::Qwen2, 9),
        &Device::Cpu,
    )
    .expect("load");
    let pairs = vec![
        (tokens(71, 12), tokens(72, 5)),
        (tokens(73, 4), tokens(74, 9)),
        (tokens(75, 20), tokens(76, 1)),
    ];
    let batched = score(&decoder, &pairs).expect("score");
    for (row, (context, continuation)) in pairs.iter().enumerate() {
        let reference = score_incrementally(&decoder, context, continuation).expect("incremental");
        assert_eq!(batched[row].len(), reference.len());
        for (a, b) in batched[row].iter().zip(&reference) {
            assert!((a - b).abs() < 2e-3, "row {row}: {a} vs {b}");
        }
    }
    // Broken variant: reading each token's score one column late gives other numbers.
    let (context, continuation) = &pairs[0];
    let whole = [context.as_slice(), continuation.as_slice()].concat();
    let positions = vec![(0..whole.len() as u32).collect::<Vec<_>>()];
    let logits = decoder
        .forward(&ForwardRequest::new(std::slice::from_ref(&whole), &positions).logits(Logits::All))
        .expect("all")
        .logits
        .expect("logits");
    let log_probs = log_softmax(&logits).expect("log softmax");
    let late: Vec<f32> = continuation
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            log_probs
                .i((0, context.len() + i, id as usize))
                .expect("index")
                .to_scalar::<f32>()
                .expect("scalar")
        })
        .collect();
    let gap: f32 = late
        .iter()
        .zip(&batched[0])
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(gap > 0.1, "an off-by-one read went unnoticed ({gap})");
}

#[test]
fn generated_log_probabilities_equal_scoring_the_generated_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let decoder = Decoder::load(
        &write_tiny_model(dir.path(), TinyArch::Llama, 12),
        &Device::Cpu,
    )
    .expect("load");
    let prompts = vec![tokens(91, 6), tokens(92, 14)];
    let (generated, _) = generate(&decoder, &prompts, &greedy(10), |_, _| {
        ControlFlow::Continue(())
    })
    .expect("generate");
    for (prompt, row) in prompts.iter().zip(&generated) {
        assert_eq!(row.logprobs.len(), row.tokens.len());
        let reference = score_incrementally(&decoder, prompt, &row.tokens).expect("score");
        for (a, b) in row.logprobs.iter().zip(&reference) {
            assert!((a - b).abs() < 2e-3, "{a} against {b}");
        }
    }
}
