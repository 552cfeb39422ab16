//! The stateless decoder against candle's own models and against itself: whatever way the
//! caller splits, pads, masks or moves the KV cache, the numbers must be the ones a plain
//! prefill computes.
#![allow(clippy::expect_used)]

mod support;

use candle_core::quantized::gguf_file;
use candle_core::{Device, IndexOp, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use hasten_lm::{
    AttentionMask, Decoder, ForwardRequest, GgufFile, KvCache, Logits, PackedKv, WeightFormat,
};
use support::{TinyArch, max_abs_diff, tokens, write_tiny_model};

const TOLERANCE: f32 = 2e-3;

fn positions(from: u32, n: usize) -> Vec<Vec<u32>> {
    vec![(from..from + n as u32).collect()]
}

fn tiny(arch: TinyArch, seed: u64) -> (tempfile::TempDir, std::path::PathBuf, Decoder) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), arch, seed);
    let decoder = Decoder::load(&path, &Device::Cpu).expect("load tiny model");
    (dir, path, decoder)
}

/// candle's ready-made model over `prompt`, then one token at a time over `continuation`:
/// the last-position logits of each call.
fn candle_logits(
    path: &std::path::Path,
    arch: TinyArch,
    prompt: &[u32],
    continuation: &[u32],
) -> Vec<Tensor> {
    let mut file = std::fs::File::open(path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("read");
    let input = |ids: &[u32]| {
        Tensor::new(ids, &Device::Cpu)
            .expect("ids")
            .unsqueeze(0)
            .expect("batch")
    };
    let mut out = Vec::new();
    match arch {
        TinyArch::Llama => {
            let mut model =
                quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)
                    .expect("candle llama");
            out.push(model.forward(&input(prompt), 0).expect("forward"));
            for (i, &id) in continuation.iter().enumerate() {
                out.push(
                    model
                        .forward(&input(&[id]), prompt.len() + i)
                        .expect("forward"),
                );
            }
        }
        TinyArch::Qwen2 => {
            let mut model =
                quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)
                    .expect("candle qwen2");
            out.push(model.forward(&input(prompt), 0).expect("forward"));
            for (i, &id) in continuation.iter().enumerate() {
                out.push(
                    model
                        .forward(&input(&[id]), prompt.len() + i)
                        .expect("forward"),
                );
            }
        }
    }
    out
}

/// The same calls through the stateless core, the caller carrying the cache.
fn our_logits(decoder: &Decoder, prompt: &[u32], continuation: &[u32]) -> Vec<Tensor> {
    let out = decoder
        .forward(&ForwardRequest::new(
            &[prompt.to_vec()],
            &positions(0, prompt.len()),
        ))
        .expect("prefill");
    let mut cache = out.kv;
    let mut logits = vec![out.logits.expect("logits")];
    for (i, &id) in continuation.iter().enumerate() {
        let out = decoder
            .forward(
                &ForwardRequest::new(&[vec![id]], &positions((prompt.len() + i) as u32, 1))
                    .past(&cache),
            )
            .expect("decode");
        cache.append(out.kv).expect("append");
        logits.push(out.logits.expect("logits"));
    }
    logits
}

/// Both of the decoder's attention paths against candle's model: candle's operations on
/// every prompt, lm's kernels where the prompt is short enough to be read through candle's
/// (then decoding through lm's). A 200-token prompt, read by lm's kernels, differs here by
/// up to 0.09: the tiny model's 8-bit activations turn last-bit differences into whole
/// quantisation steps. `attention_in_lms_kernels_equals_candles_operations` holds lm's
/// kernels to candle's operations on f32 weights instead.
fn assert_matches_candle(arch: TinyArch) {
    let (_dir, path, decoder) = tiny(arch, 7);
    let mut file = GgufFile::open(&path).expect("open");
    let reference = Decoder::from_gguf(&mut file, &Device::Cpu, WeightFormat::AsStored)
        .expect("load")
        .with_fused_attention(false);
    // 200: decoding reads the cache in more than one chunk (lm's decode attention).
    for (seed, len) in [(1, 1), (2, 9), (3, 40), (4, 200)] {
        let prompt = tokens(seed, len);
        let continuation = tokens(seed + 100, 6);
        let theirs = candle_logits(&path, arch, &prompt, &continuation);
        let paths: &[(&str, &Decoder)] = if len <= 40 {
            &[
                ("lm's kernels", &decoder),
                ("candle's operations", &reference),
            ]
        } else {
            &[("candle's operations", &reference)]
        };
        for (name, decoder) in paths {
            let ours = our_logits(decoder, &prompt, &continuation);
            for (step, (a, b)) in theirs.iter().zip(&ours).enumerate() {
                let diff = max_abs_diff(a, b);
                assert!(
                    diff < TOLERANCE,
                    "{arch:?} through {name}, prompt {len} step {step}: logits differ by {diff}"
                );
            }
        }
    }
}

#[test]
fn logits_equal_candles_quantized_llama_on_contiguous_prompts() {
    assert_matches_candle(TinyArch::Llama);
}

#[test]
fn logits_equal_candles_quantized_qwen2_on_contiguous_prompts() {
    assert_matches_candle(TinyArch::Qwen2);
}

#[test]
fn prefill_of_a_then_b_equals_prefill_of_ab() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let (_dir, _path, decoder) = tiny(arch, 11);
        let a = tokens(21, 13);
        let b = tokens(22, 8);
        let ab = [a.clone(), b.clone()].concat();
        let whole = decoder
            .forward(
                &ForwardRequest::new(std::slice::from_ref(&ab), &positions(0, ab.len()))
                    .logits(Logits::All),
            )
            .expect("whole");
        let first = decoder
            .forward(
                &ForwardRequest::new(std::slice::from_ref(&a), &positions(0, a.len()))
                    .logits(Logits::None),
            )
            .expect("a");
        let second = decoder
            .forward(
                &ForwardRequest::new(
                    std::slice::from_ref(&b),
                    &positions(a.len() as u32, b.len()),
                )
                .past(&first.kv)
                .logits(Logits::All),
            )
            .expect("b");
        let whole_logits = whole.logits.expect("logits");
        let tail = whole_logits.narrow(1, a.len(), b.len()).expect("tail");
        let diff = max_abs_diff(&tail, &second.logits.expect("logits"));
        assert!(diff < TOLERANCE, "{arch:?}: logits of b differ by {diff}");
        let mut split = first.kv;
        split.append(second.kv).expect("append");
        for (layer, (x, y)) in whole.kv.layers().iter().zip(split.layers()).enumerate() {
            assert!(
                max_abs_diff(x.keys(), y.keys()) < TOLERANCE,
                "{arch:?} layer {layer}: keys differ"
            );
            assert!(
                max_abs_diff(x.values(), y.values()) < TOLERANCE,
                "{arch:?} layer {layer}: values differ"
            );
        }
    }
}

#[test]
fn keys_moved_by_rope_equal_keys_recomputed_at_the_new_positions() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let (_dir, _path, decoder) = tiny(arch, 13);
        let chunk = tokens(31, 17);
        let at = |start: u32| {
            decoder
                .forward(
                    &ForwardRequest::new(
                        std::slice::from_ref(&chunk),
                        &positions(start, chunk.len()),
                    )
                    .logits(Logits::None),
                )
                .expect("prefill")
                .kv
        };
        let recomputed = at(100);
        let mut moved = at(0);
        let unmoved = moved.clone();
        moved
            .relocate(decoder.rope(), positions(100, chunk.len()))
            .expect("relocate");
        for (layer, (x, y)) in recomputed.layers().iter().zip(moved.layers()).enumerate() {
            let diff = max_abs_diff(x.keys(), y.keys());
            assert!(
                diff < TOLERANCE,
                "{arch:?} layer {layer}: moved keys differ by {diff}"
            );
        }
        // The check can fail: keys left at their old positions are far from the recomputed ones.
        let stale = max_abs_diff(recomputed.layers()[0].keys(), unmoved.layers()[0].keys());
        assert!(
            stale > 0.1,
            "{arch:?}: position made no difference ({stale})"
        );
        assert_eq!(moved.positions(), recomputed.positions());
    }
}

#[test]
fn a_block_diagonal_mask_equals_prefilling_each_chunk_alone() {
    let (_dir, _path, decoder) = tiny(TinyArch::Llama, 17);
    let first = tokens(41, 7);
    let second = tokens(42, 5);
    let both = [first.clone(), second.clone()].concat();
    let n = both.len();
    let mut allowed = vec![0u8; n * n];
    for i in 0..n {
        for j in 0..=i {
            let same_chunk = (i < first.len()) == (j < first.len());
            allowed[i * n + j] = u8::from(same_chunk);
        }
    }
    let mask = Tensor::from_vec(allowed, (1, n, n), &Device::Cpu).expect("mask");
    let joint = decoder
        .forward(
            &ForwardRequest::new(std::slice::from_ref(&both), &positions(0, n))
                .mask(AttentionMask::Custom(mask))
                .logits(Logits::All),
        )
        .expect("masked");
    let alone = decoder
        .forward(
            &ForwardRequest::new(
                std::slice::from_ref(&second),
                &positions(first.len() as u32, second.len()),
            )
            .logits(Logits::All),
        )
        .expect("alone");
    let joint_tail = joint
        .logits
        .expect("logits")
        .narrow(1, first.len(), second.len())
        .expect("tail");
    let diff = max_abs_diff(&joint_tail, &alone.logits.expect("logits"));
    assert!(diff < TOLERANCE, "second chunk differs by {diff}");
    // Causal attention across the chunks gives other logits: the mask is what made them equal.
    let causal = decoder
        .forward(&ForwardRequest::new(&[both], &positions(0, n)).logits(Logits::All))
        .expect("causal");
    let causal_tail = causal
        .logits
        .expect("logits")
        .narrow(1, first.len(), second.len())
        .expect("tail");
    assert!(max_abs_diff(&causal_tail, &joint_tail) > 0.01);
}

#[test]
fn rolling_back_the_cache_equals_never_having_gone_ahead() {
    let (_dir, _path, decoder) = tiny(TinyArch::Qwen2, 19);
    let a = tokens(51, 10);
    let wrong = tokens(52, 4);
    let right = tokens(53, 3);
    let prefill = decoder
        .forward(
            &ForwardRequest::new(&[[a.clone(), wrong].concat()], &positions(0, 14))
                .logits(Logits::None),
        )
        .expect("prefill");
    let mut cache = prefill.kv;
    cache.truncate(a.len()).expect("truncate");
    assert_eq!(cache.len(), a.len());
    let resumed = decoder
        .forward(
            &ForwardRequest::new(std::slice::from_ref(&right), &positions(10, 3))
                .past(&cache)
                .logits(Logits::All),
        )
        .expect("resume");
    let straight = decoder
        .forward(
            &ForwardRequest::new(&[[a, right].concat()], &positions(0, 13)).logits(Logits::All),
        )
        .expect("straight");
    let tail = straight
        .logits
        .expect("logits")
        .narrow(1, 10, 3)
        .expect("tail");
    assert!(max_abs_diff(&tail, &resumed.logits.expect("logits")) < TOLERANCE);
}

#[test]
fn attention_weights_are_returned_for_the_last_layer_on_request() {
    let (_dir, _path, decoder) = tiny(TinyArch::Llama, 23);
    let prompt = tokens(61, 6);
    let past = decoder
        .forward(
            &ForwardRequest::new(std::slice::from_ref(&prompt), &positions(0, 6))
                .logits(Logits::None),
        )
        .expect("past")
        .kv;
    let question = tokens(62, 3);
    let out = decoder
        .forward(
            &ForwardRequest::new(&[question], &positions(6, 3))
                .past(&past)
                .with_attention(),
        )
        .expect("forward");
    let seen = out.attention.expect("attention requested");
    assert_eq!(seen.weights.dims(), &[1, support::HEADS, 3, 9]);
    assert_eq!(
        seen.queries.dims(),
        &[1, support::HEADS, 3, support::HIDDEN / support::HEADS]
    );
    let sums = seen
        .weights
        .sum(3)
        .expect("sum")
        .flatten_all()
        .expect("flat")
        .to_vec1::<f32>()
        .expect("vec");
    assert!(
        sums.iter().all(|s| (s - 1.0).abs() < 1e-4),
        "rows do not sum to 1: {sums:?}"
    );
    // Causal: the first question token (position 6) cannot see the two after it.
    let hidden = seen
        .weights
        .i((0, .., 0, 7..))
        .expect("future")
        .sum_all()
        .expect("sum")
        .to_scalar::<f32>()
        .expect("scalar");
    assert_eq!(hidden, 0.0);
    let plain = decoder
        .forward(&ForwardRequest::new(&[vec![1]], &positions(6, 1)).past(&past))
        .expect("plain");
    assert!(plain.attention.is_none());
}

#[test]
fn attention_summed_over_layers_is_the_sum_of_each_layers_attention() {
    let (_dir, _path, decoder) = tiny(TinyArch::Qwen2, 31);
    let past = decoder
        .forward(&ForwardRequest::new(&[tokens(63, 7)], &positions(0, 7)).logits(Logits::None))
        .expect("past")
        .kv;
    let question = [tokens(64, 3)];
    let question_positions = positions(7, 3);
    let ask = || {
        ForwardRequest::new(&question, &question_positions)
            .past(&past)
            .logits(Logits::None)
    };
    // Each layer's own weights: the last layer of a pass cut after it.
    let per_layer: Vec<Tensor> = (1..=support::LAYERS)
        .map(|layers| {
            decoder
                .forward(&ask().first_layers(layers).with_attention())
                .expect("layer pass")
                .attention
                .expect("attention requested")
                .weights
        })
        .collect();
    let summed = decoder
        .forward(&ask().with_attention_summed_over_layers())
        .expect("summed pass")
        .attention
        .expect("attention requested")
        .weights;
    let total = per_layer
        .iter()
        .skip(1)
        .try_fold(per_layer[0].clone(), |sum, w| sum + w)
        .expect("sum");
    let gap = max_abs_diff(&summed, &total);
    assert!(gap < 1e-5, "summed readout off the layers' sum by {gap}");
    // The last layer alone is not that sum: the readout really adds the layers up.
    let last_only = max_abs_diff(&summed, per_layer.last().expect("a layer"));
    assert!(
        last_only > 0.1,
        "summed readout within {last_only} of the last layer's"
    );
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let (_dir, _path, decoder) = tiny(TinyArch::Llama, 29);
    let outside = decoder.forward(&ForwardRequest::new(
        &[vec![support::VOCAB as u32]],
        &positions(0, 1),
    ));
    assert!(
        outside
            .expect_err("token outside vocabulary")
            .to_string()
            .contains("outside the vocabulary")
    );
    let ragged = [vec![1, 2], vec![3]];
    let ragged_positions = [vec![0, 1], vec![0]];
    assert!(
        decoder
            .forward(&ForwardRequest::new(&ragged, &ragged_positions))
            .is_err()
    );
    let far = decoder.forward(&ForwardRequest::new(
        &[vec![1]],
        &positions(support::CONTEXT as u32, 1),
    ));
    assert!(
        far.expect_err("beyond context")
            .to_string()
            .contains("context")
    );
    let empty: [Vec<u32>; 0] = [];
    assert!(
        decoder
            .forward(&ForwardRequest::new(&empty, &empty))
            .is_err()
    );
    let mut one_row = KvCache::new();
    one_row
        .append(
            decoder
                .forward(&ForwardRequest::new(&[vec![1]], &positions(0, 1)))
                .expect("one")
                .kv,
        )
        .expect("append");
    let two_rows = [vec![1], vec![2]];
    let two_positions = [vec![1], vec![1]];
    assert!(
        decoder
            .forward(&ForwardRequest::new(&two_rows, &two_positions).past(&one_row))
            .is_err()
    );
}

#[test]
fn a_prompt_read_in_chunks_equals_one_read_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), TinyArch::Qwen2, 31);
    let whole = Decoder::load(&path, &Device::Cpu)
        .expect("load")
        .with_prefill_chunk(usize::MAX);
    let chunked = Decoder::load(&path, &Device::Cpu)
        .expect("load")
        .with_prefill_chunk(16);
    let prompts = vec![tokens(81, 50), tokens(82, 23)];
    let batch = hasten_lm::left_pad(&prompts, 0);
    let read = |decoder: &Decoder| {
        decoder
            .forward(&ForwardRequest::new(&batch.tokens, &batch.positions).valid(&batch.valid))
            .expect("forward")
    };
    let (a, b) = (read(&whole), read(&chunked));
    let diff = max_abs_diff(&a.logits.expect("logits"), &b.logits.expect("logits"));
    assert!(diff < TOLERANCE, "last logits differ by {diff}");
    assert_eq!(a.kv.len(), b.kv.len());
    assert_eq!(a.kv.valid(), b.kv.valid());
    for (x, y) in a.kv.layers().iter().zip(b.kv.layers()) {
        assert!(max_abs_diff(x.keys(), y.keys()) < TOLERANCE);
        assert!(max_abs_diff(x.values(), y.values()) < TOLERANCE);
    }
}

#[test]
fn a_long_prompt_stops_between_its_chunks_when_its_caller_leaves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), TinyArch::Qwen2, 31);
    let decoder = Decoder::load(&path, &Device::Cpu)
        .expect("load")
        .with_prefill_chunk(16);
    let rows = [tokens(83, 50)];
    let positions = [(0..50).collect::<Vec<u32>>()];
    let asked = std::cell::Cell::new(0);
    let left_after_one = || {
        asked.set(asked.get() + 1);
        true
    };
    let stopped =
        decoder.forward(&ForwardRequest::new(&rows, &positions).interruptible(&left_after_one));
    assert!(matches!(stopped, Err(hasten_lm::LmError::Interrupted)));
    assert_eq!(asked.get(), 1, "asked once, before the second chunk");
    // Asked before each chunk after the first (50 tokens: 4 chunks); one that stays gets
    // the whole pass.
    let stays = || {
        asked.set(asked.get() + 1);
        false
    };
    asked.set(0);
    let out = decoder
        .forward(&ForwardRequest::new(&rows, &positions).interruptible(&stays))
        .expect("forward");
    assert_eq!(asked.get(), 3);
    assert_eq!(out.kv.len(), 50);
}

/// On the CPU, long prompts and decoding attend through lm's kernels; candle's operations
/// are the reference. A padded batch (a mask) prefilled by blocks of queries, then decoded
/// over a past longer than the kernel's chunks, two tokens at a time too. The weights are
/// f32: with 8-bit activations (the quantised formats), a last-bit difference in the
/// attention can move one activation to the next step, and a tiny model's logits by ~0.1.
#[test]
fn attention_in_lms_kernels_equals_candles_operations() {
    const F32_TOLERANCE: f32 = 1e-4;
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_tiny_model(dir.path(), arch, 41);
        let load = |fused: bool| {
            let mut file = GgufFile::open(&path).expect("open");
            Decoder::from_gguf(&mut file, &Device::Cpu, WeightFormat::F32)
                .expect("load")
                .with_fused_attention(fused)
        };
        let (fused, candle) = (load(true), load(false));
        let prompts = vec![tokens(91, 190), tokens(92, 137)];
        let batch = hasten_lm::left_pad(&prompts, 0);
        let prefill = |decoder: &Decoder| {
            decoder
                .forward(
                    &ForwardRequest::new(&batch.tokens, &batch.positions)
                        .valid(&batch.valid)
                        .logits(Logits::Trailing(3)),
                )
                .expect("prefill")
        };
        let (ours, theirs) = (prefill(&fused), prefill(&candle));
        let diff = max_abs_diff(
            ours.logits.as_ref().expect("logits"),
            theirs.logits.as_ref().expect("logits"),
        );
        assert!(
            diff < F32_TOLERANCE,
            "{arch:?} prefill: logits differ by {diff}"
        );
        let mut caches = [ours.kv, theirs.kv];
        for (step, width) in [1, 2, 1].into_iter().enumerate() {
            let next = caches[0].next_positions();
            let new_tokens: Vec<Vec<u32>> = (0..2)
                .map(|row| tokens(93 + (step * 2 + row) as u64, width))
                .collect();
            let new_positions: Vec<Vec<u32>> = next
                .iter()
                .map(|&p| (p..p + width as u32).collect())
                .collect();
            let mut logits = Vec::new();
            for (decoder, cache) in [&fused, &candle].into_iter().zip(caches.iter_mut()) {
                let out = decoder
                    .forward(
                        &ForwardRequest::new(&new_tokens, &new_positions)
                            .past(cache)
                            .logits(Logits::All),
                    )
                    .expect("decode");
                cache.append(out.kv).expect("append");
                logits.push(out.logits.expect("logits"));
            }
            let diff = max_abs_diff(&logits[0], &logits[1]);
            assert!(
                diff < F32_TOLERANCE,
                "{arch:?} step {step}: logits differ by {diff}"
            );
        }
        for (x, y) in caches[0].layers().iter().zip(caches[1].layers()) {
            assert!(
                max_abs_diff(x.values(), y.values()) < F32_TOLERANCE,
                "{arch:?}: values differ"
            );
        }
    }
}

#[test]
fn a_pass_over_the_first_layers_equals_those_layers_of_a_full_pass() {
    let (_dir, _path, decoder) = tiny(TinyArch::Qwen2, 19);
    let prompt = tokens(51, 12);
    let rows = [prompt.clone()];
    let full = decoder
        .forward(&ForwardRequest::new(&rows, &positions(0, 12)).logits(Logits::None))
        .expect("full");
    let first = decoder
        .forward(
            &ForwardRequest::new(&rows, &positions(0, 12))
                .logits(Logits::None)
                .first_layers(1),
        )
        .expect("first layer");
    assert_eq!(first.kv.layers().len(), 1);
    assert_eq!(
        max_abs_diff(first.kv.layers()[0].values(), full.kv.layers()[0].values()),
        0.0
    );
    for bad in [
        ForwardRequest::new(&rows, &positions(0, 12)).first_layers(1),
        ForwardRequest::new(&rows, &positions(0, 12))
            .logits(Logits::None)
            .first_layers(0),
        ForwardRequest::new(&rows, &positions(0, 12))
            .logits(Logits::None)
            .first_layers(3),
    ] {
        assert!(decoder.forward(&bad).is_err());
    }
}

#[test]
fn a_cache_rebuilt_from_stored_parts_equals_the_prefill_it_came_from() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let (_dir, _path, decoder) = tiny(arch, 17);
        let chunk = tokens(37, 11);
        let prefill = decoder
            .forward(
                &ForwardRequest::new(std::slice::from_ref(&chunk), &positions(40, chunk.len()))
                    .logits(Logits::None),
            )
            .expect("prefill")
            .kv;
        let parts = || -> Vec<(Tensor, Tensor)> {
            prefill
                .layers()
                .iter()
                .map(|l| (l.raw_keys().clone(), l.values().clone()))
                .collect()
        };
        let rebuilt = KvCache::from_stored(
            parts(),
            positions(40, chunk.len()).remove(0),
            decoder.rope(),
        )
        .expect("rebuild");
        assert_eq!(rebuilt.positions(), prefill.positions());
        assert_eq!(rebuilt.valid(), prefill.valid());
        for (x, y) in prefill.layers().iter().zip(rebuilt.layers()) {
            assert_eq!(max_abs_diff(x.keys(), y.keys()), 0.0);
            assert_eq!(max_abs_diff(x.values(), y.values()), 0.0);
        }
        // Rebuilt at other positions, the keys are rotated there, not copied.
        let elsewhere =
            KvCache::from_stored(parts(), positions(0, chunk.len()).remove(0), decoder.rope())
                .expect("rebuild at 0");
        assert!(max_abs_diff(prefill.layers()[0].keys(), elsewhere.layers()[0].keys()) > 0.1);
        // A position per token, and layers of one shape.
        assert!(KvCache::from_stored(parts(), positions(40, 3).remove(0), decoder.rope()).is_err());
        let mut ragged = parts();
        ragged[1].1 = ragged[1].1.narrow(2, 0, 5).expect("narrow");
        assert!(
            KvCache::from_stored(ragged, positions(40, chunk.len()).remove(0), decoder.rope())
                .is_err()
        );
    }
}

#[test]
fn packed_segments_placed_together_equal_per_layer_concatenation_and_relocation() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let (_dir, _path, decoder) = tiny(arch, 19);
        let segment = |seed: u64, n: usize| {
            let chunk = tokens(seed, n);
            decoder
                .forward(
                    &ForwardRequest::new(std::slice::from_ref(&chunk), &positions(0, n))
                        .logits(Logits::None),
                )
                .expect("prefill")
                .kv
        };
        let parts = [segment(41, 9), segment(43, 13), segment(47, 6)];
        let packed: Vec<PackedKv> = parts
            .iter()
            .map(|p| PackedKv::pack(p).expect("pack"))
            .collect();
        for (part, packed) in parts.iter().zip(&packed) {
            let unpacked = packed.cache().expect("views");
            for (x, y) in part.layers().iter().zip(unpacked.layers()) {
                assert_eq!(max_abs_diff(x.keys(), y.keys()), 0.0);
                assert_eq!(max_abs_diff(x.values(), y.values()), 0.0);
            }
        }
        let mut expected = KvCache::concat(parts.to_vec()).expect("concat");
        expected
            .relocate(decoder.rope(), positions(5, 28))
            .expect("relocate");
        let refs: Vec<&PackedKv> = packed.iter().collect();
        let mut placed = PackedKv::place(&refs, decoder.rope(), 5, 4).expect("place");
        assert_eq!(placed.positions(), expected.positions());
        for (layer, (x, y)) in expected.layers().iter().zip(placed.layers()).enumerate() {
            for (a, b) in [
                (x.raw_keys(), y.raw_keys()),
                (x.keys(), y.keys()),
                (x.values(), y.values()),
            ] {
                let diff = max_abs_diff(a, b);
                assert!(diff < 1e-6, "{arch:?} layer {layer}: differs by {diff}");
            }
        }
        // Twin: placed one position off, the keys are not the relocated ones.
        let shifted = PackedKv::place(&refs, decoder.rope(), 6, 0).expect("place");
        assert!(
            max_abs_diff(expected.layers()[1].keys(), shifted.layers()[1].keys()) > 0.1,
            "{arch:?}: the placement's positions made no difference"
        );
        // Appending fills the room, and neither the packed parts nor their views change.
        let before: Vec<Vec<f32>> = packed.iter().map(flat_values).collect();
        let next = decoder
            .forward(
                &ForwardRequest::new(&[tokens(53, 4)], &positions(33, 4))
                    .past(&placed)
                    .logits(Logits::None),
            )
            .expect("extend")
            .kv;
        placed.append(next.clone()).expect("append");
        assert_eq!(placed.len(), 32);
        let tail = placed.layers()[1].values().narrow(2, 28, 4).expect("tail");
        assert_eq!(max_abs_diff(&tail, next.layers()[1].values()), 0.0);
        let after: Vec<Vec<f32>> = packed.iter().map(flat_values).collect();
        assert_eq!(
            before, after,
            "{arch:?}: a placed cache wrote into its parts"
        );
        // Only one valid row packs.
        let mut hidden = parts[0].clone();
        hidden.hide(0, &[2]).expect("hide");
        assert!(PackedKv::pack(&hidden).is_err());
        assert!(PackedKv::place(&[], decoder.rope(), 0, 0).is_err());
    }
}

fn flat_values(packed: &PackedKv) -> Vec<f32> {
    let cache = packed.cache().expect("views");
    cache
        .layers()
        .iter()
        .flat_map(|l| {
            l.values()
                .flatten_all()
                .expect("flatten")
                .to_vec1::<f32>()
                .expect("values")
        })
        .collect()
}

#[test]
fn trailing_logits_are_the_last_columns_of_all_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), TinyArch::Qwen2, 33);
    let whole = Decoder::load(&path, &Device::Cpu)
        .expect("load")
        .with_prefill_chunk(usize::MAX);
    // 50 tokens in chunks of 16: the last chunk holds 2, so 2 trailing columns are read in
    // chunks and 9 in one pass.
    let chunked = Decoder::load(&path, &Device::Cpu)
        .expect("load")
        .with_prefill_chunk(16);
    let prompts = vec![tokens(84, 50), tokens(85, 31)];
    let batch = hasten_lm::left_pad(&prompts, 0);
    let request = ForwardRequest::new(&batch.tokens, &batch.positions).valid(&batch.valid);
    let all = whole
        .forward(&request.clone().logits(Logits::All))
        .expect("all")
        .logits
        .expect("logits");
    for (decoder, n) in [(&whole, 9), (&chunked, 9), (&chunked, 2)] {
        let trailing = decoder
            .forward(&request.clone().logits(Logits::Trailing(n)))
            .expect("trailing")
            .logits
            .expect("logits");
        assert_eq!(trailing.dims(), &[2, n, all.dim(2).expect("vocab")]);
        let last = all.narrow(1, 50 - n, n).expect("last columns");
        let diff = max_abs_diff(&last, &trailing);
        assert!(diff < TOLERANCE, "{n} trailing columns differ by {diff}");
        // Broken variant: the window one column early.
        let early = all.narrow(1, 49 - n, n).expect("early columns");
        assert!(
            max_abs_diff(&early, &trailing) > 0.1,
            "a shifted window went unnoticed"
        );
    }
    for n in [0, 51] {
        assert!(
            whole
                .forward(&request.clone().logits(Logits::Trailing(n)))
                .is_err(),
            "{n} trailing columns of 50 is refused"
        );
    }
}
