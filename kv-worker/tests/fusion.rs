//! The fused prefill against plain prefills of the whole prompt, on tiny random llama and
//! qwen2 models. Every equality has a twin, a deliberately broken variant built from the
//! same pieces, that must fail it: a test that cannot tell them apart proves nothing.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use candle_core::{Device, Tensor};
use display_full_error::DisplayFullErrorExt;
use hasten_kv_worker::fusion::select::{recompute_count, top_tokens};
use hasten_kv_worker::fusion::{CACHEBLEND_LAYER, recompute_mask};
use hasten_kv_worker::{
    ExactPrefix, FusedPrefill, FusionMode, FusionSettings, PrefillOptions, SegmentKv,
    SelectionAttention, assemble, prefill,
};
use hasten_lm::testing::{TinyArch, max_abs_diff, tokens, write_tiny_model};
use hasten_lm::{AttentionMask, Decoder, ForwardRequest, KvCache, Logits, RopeStyle, RotaryTables};

const TOLERANCE: f32 = 2e-3;
/// A broken variant must be off by far more than rounding.
const BROKEN: f32 = 50.0 * TOLERANCE;
const ARCHS: [TinyArch; 2] = [TinyArch::Llama, TinyArch::Qwen2];
/// The kv-worker's default: the first chunk's stored KV taken as exact.
const STORED_LEADING: ExactPrefix = ExactPrefix {
    stored_leading: true,
    whole_chunks: 0,
};

fn tiny(arch: TinyArch, seed: u64) -> (tempfile::TempDir, Decoder) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny_model(dir.path(), arch, seed);
    let decoder = Decoder::load(&path, &Device::Cpu).expect("load tiny model");
    (dir, decoder)
}

fn span(from: usize, n: usize) -> Vec<u32> {
    (from as u32..(from + n) as u32).collect()
}

/// A plain causal prefill of `prompt` from position 0, under `mask` if given: the last
/// token's logits and every entry.
fn plain(decoder: &Decoder, prompt: &[u32], mask: Option<Tensor>) -> (Tensor, KvCache) {
    let rows = [prompt.to_vec()];
    let positions = [span(0, prompt.len())];
    let mut request = ForwardRequest::new(&rows, &positions).logits(Logits::Last);
    if let Some(mask) = mask {
        request = request.mask(AttentionMask::Custom(mask));
    }
    let out = decoder.forward(&request).expect("plain prefill");
    (out.logits.expect("logits"), out.kv)
}

struct Prompt {
    system: SegmentKv,
    chunks: Vec<Vec<u32>>,
    question: Vec<u32>,
}

impl Prompt {
    fn new(decoder: &Decoder, seed: u64, chunk_lengths: &[usize]) -> Self {
        let system = SegmentKv::prefill(decoder, tokens(seed, 9), None).expect("system prompt KV");
        let chunks = chunk_lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(seed + 1 + i as u64, n))
            .collect();
        Self {
            system,
            chunks,
            question: tokens(seed + 100, 6),
        }
    }

    /// Each chunk's Full Reuse KV: prefilled right after the system prompt.
    fn after_system(&self, decoder: &Decoder) -> Vec<SegmentKv> {
        self.chunks
            .iter()
            .map(|c| SegmentKv::prefill(decoder, c.clone(), Some(self.system.kv())).unwrap())
            .collect()
    }

    /// Each chunk prefilled alone from position 0.
    fn alone(&self, decoder: &Decoder) -> Vec<SegmentKv> {
        self.chunks
            .iter()
            .map(|c| SegmentKv::prefill(decoder, c.clone(), None).unwrap())
            .collect()
    }

    /// The leading chunk's Full Reuse KV and the others' computed alone: only the leading
    /// chunk's entries are a full prefill's.
    fn leading_exact(&self, decoder: &Decoder) -> Vec<SegmentKv> {
        let mut chunks = self.alone(decoder);
        chunks[0] = self.after_system(decoder).remove(0);
        chunks
    }

    fn whole(&self) -> Vec<u32> {
        let mut all = self.system.tokens().to_vec();
        for chunk in &self.chunks {
            all.extend_from_slice(chunk);
        }
        all.extend_from_slice(&self.question);
        all
    }

    fn run(
        &self,
        decoder: &Decoder,
        chunks: &[SegmentKv],
        settings: FusionSettings,
    ) -> FusedPrefill {
        self.run_with(decoder, chunks, settings, ExactPrefix::NONE)
    }

    fn run_with(
        &self,
        decoder: &Decoder,
        chunks: &[SegmentKv],
        settings: FusionSettings,
        options: impl Into<PrefillOptions>,
    ) -> FusedPrefill {
        let refs: Vec<&SegmentKv> = chunks.iter().collect();
        prefill(
            decoder,
            &self.system,
            &refs,
            &self.question,
            settings,
            8,
            options.into(),
        )
        .expect("fused prefill")
    }

    fn fused(&self, decoder: &Decoder, chunks: &[SegmentKv], settings: FusionSettings) -> Tensor {
        self.run(decoder, chunks, settings).logits
    }
}

fn settings(mode: FusionMode, ratio: f64) -> FusionSettings {
    FusionSettings { mode, ratio }
}

/// The valid entries of a one-row cache in position order, layer by layer: the cache a
/// plain prefill would have had, whatever order the entries were appended in.
fn by_position(cache: &KvCache) -> Vec<(Tensor, Tensor)> {
    let mut order: Vec<(u32, u32)> = cache.positions()[0]
        .iter()
        .zip(&cache.valid()[0])
        .enumerate()
        .filter(|(_, (_, valid))| **valid)
        .map(|(i, (&p, _))| (p, i as u32))
        .collect();
    order.sort_unstable();
    let ids: Vec<u32> = order.into_iter().map(|(_, i)| i).collect();
    let index = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
    cache
        .layers()
        .iter()
        .map(|l| {
            (
                l.keys()
                    .contiguous()
                    .unwrap()
                    .index_select(&index, 2)
                    .unwrap(),
                l.values()
                    .contiguous()
                    .unwrap()
                    .index_select(&index, 2)
                    .unwrap(),
            )
        })
        .collect()
}

/// Each layer's largest difference between the entries of `cache` and `expected`, in
/// position order.
fn kv_diffs(cache: &KvCache, expected: &KvCache) -> Vec<f32> {
    by_position(cache)
        .iter()
        .zip(by_position(expected))
        .map(|((k, v), (ek, ev))| max_abs_diff(k, &ek).max(max_abs_diff(v, &ev)))
        .collect()
}

/// Every layer's entries of `cache`, in position order, within [`TOLERANCE`] of `expected`'s.
fn assert_same_kv(cache: &KvCache, expected: &KvCache, label: &str) {
    for (layer, diff) in kv_diffs(cache, expected).into_iter().enumerate() {
        assert!(
            diff < TOLERANCE,
            "{label} layer {layer}: KV differs by {diff}"
        );
    }
}

#[test]
fn recomputing_every_chunk_token_equals_full_prefill() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 3);
        let prompt = Prompt::new(&decoder, 10, &[11, 7, 13]);
        let chunks = prompt.after_system(&decoder);
        let (expected, expected_kv) = plain(&decoder, &prompt.whole(), None);
        for mode in [FusionMode::FusionRag, FusionMode::CacheBlend] {
            let fused = prompt.run(&decoder, &chunks, settings(mode, 1.0));
            assert_eq!(fused.recomputed.len(), 31);
            let diff = max_abs_diff(&fused.logits, &expected);
            assert!(
                diff < TOLERANCE,
                "{arch:?} {mode:?}: logits differ by {diff}"
            );
            assert_same_kv(&fused.cache, &expected_kv, &format!("{arch:?} {mode:?}"));
        }

        // Twin: the same recomputation with the stale entries left visible.
        let refs: Vec<&SegmentKv> = chunks.iter().collect();
        let assembled = assemble(decoder.rope(), &prompt.system, &refs, 0).unwrap();
        let context = assembled.tokens.len();
        let recomputed: Vec<usize> = (assembled.system_len..context).collect();
        let mut rows = vec![
            recomputed
                .iter()
                .map(|&i| assembled.tokens[i])
                .collect::<Vec<_>>(),
        ];
        rows[0].extend_from_slice(&prompt.question);
        let positions = [span(assembled.system_len, rows[0].len())];
        let mask = recompute_mask(
            &assembled.cache.positions()[0],
            &assembled.cache.valid()[0],
            &positions[0],
            &Device::Cpu,
        )
        .unwrap();
        let unmasked = decoder
            .forward(
                &ForwardRequest::new(&rows, &positions)
                    .past(&assembled.cache)
                    .mask(AttentionMask::Custom(mask)),
            )
            .unwrap()
            .logits
            .unwrap();
        let diff = max_abs_diff(&unmasked, &expected);
        assert!(
            diff > BROKEN,
            "{arch:?}: stale entries made no difference ({diff})"
        );
    }
}

#[test]
fn an_exact_leading_chunk_is_left_out_of_selection_and_the_rest_recomputed_equals_full_prefill() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 6);
        let prompt = Prompt::new(&decoder, 30, &[11, 7, 13]);
        let (expected, expected_kv) = plain(&decoder, &prompt.whole(), None);
        let chunks = prompt.leading_exact(&decoder);
        let leading = prompt.system.len()..prompt.system.len() + 11;
        for mode in [FusionMode::FusionRag, FusionMode::CacheBlend] {
            // A budget of every chunk token, spent on the 20 that are not the leading
            // chunk's: the whole context is then a full prefill's.
            let fused = prompt.run_with(&decoder, &chunks, settings(mode, 1.0), STORED_LEADING);
            assert_eq!(fused.recomputed.len(), 20, "{arch:?} {mode:?}");
            assert!(
                fused.recomputed.iter().all(|i| !leading.contains(i)),
                "{arch:?} {mode:?}: recomputed a leading-chunk entry"
            );
            let diff = max_abs_diff(&fused.logits, &expected);
            assert!(
                diff < TOLERANCE,
                "{arch:?} {mode:?}: logits differ by {diff}"
            );
            assert_same_kv(&fused.cache, &expected_kv, &format!("{arch:?} {mode:?}"));
            // At a small budget, selection still never picks the leading chunk.
            let small = prompt.run_with(&decoder, &chunks, settings(mode, 0.3), STORED_LEADING);
            assert_eq!(small.recomputed.len(), 10, "{arch:?} {mode:?}");
            assert!(small.recomputed.iter().all(|i| !leading.contains(i)));
        }

        // Twin: the leading chunk computed alone and still taken for exact; its stale entries
        // are kept and the prefill is not a full one.
        let stale = prompt.alone(&decoder);
        let fused = prompt.run_with(
            &decoder,
            &stale,
            settings(FusionMode::FusionRag, 1.0),
            STORED_LEADING,
        );
        let diff = max_abs_diff(&fused.logits, &expected);
        assert!(
            diff > BROKEN,
            "{arch:?}: a stale leading chunk made no difference ({diff})"
        );
    }
}

#[test]
fn a_chunk_recomputed_whole_after_the_exact_leading_one_is_a_full_prefills_at_any_budget() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 7);
        let prompt = Prompt::new(&decoder, 40, &[11, 7, 13]);
        let (_, expected_kv) = plain(&decoder, &prompt.whole(), None);
        let chunks = prompt.leading_exact(&decoder);
        let system = prompt.system.len();
        let second = system + 11..system + 18;
        let whole = ExactPrefix {
            stored_leading: true,
            whole_chunks: 1,
        };
        for mode in [FusionMode::FusionRag, FusionMode::CacheBlend] {
            for ratio in [0.0, 0.3] {
                let fused = prompt.run_with(&decoder, &chunks, settings(mode, ratio), whole);
                let label = format!("{arch:?} {mode:?} {ratio}");
                // The second chunk's 7 tokens on top of the budget, which goes to the third.
                let budget = recompute_count(ratio, 31).unwrap();
                assert_eq!(fused.recomputed.len(), 7 + budget, "{label}");
                assert_eq!(
                    fused.recomputed[..7],
                    second.clone().collect::<Vec<_>>()[..]
                );
                assert!(fused.recomputed[7..].iter().all(|&i| i >= second.end));
                // System prompt, leading and second chunk: a full prefill's entries.
                assert_same_kv(
                    &prefix(&fused.cache, second.end),
                    &prefix(&expected_kv, second.end),
                    &label,
                );
            }
        }

        // Twin: without the whole chunk, the second chunk's reused entries are not a full
        // prefill's.
        let fused = prompt.run_with(
            &decoder,
            &chunks,
            settings(FusionMode::FusionRag, 0.0),
            STORED_LEADING,
        );
        let (reused, full) = (
            prefix(&fused.cache, second.end),
            prefix(&expected_kv, second.end),
        );
        let diff = kv_diffs(&reused, &full).into_iter().fold(0.0f32, f32::max);
        assert!(
            diff > BROKEN,
            "{arch:?}: a reused second chunk matched a full prefill ({diff})"
        );
    }
}

/// `cache` with its entries at positions from `end` on hidden.
fn prefix(cache: &KvCache, end: usize) -> KvCache {
    let beyond: Vec<usize> = cache.positions()[0]
        .iter()
        .enumerate()
        .filter(|&(_, &p)| p as usize >= end)
        .map(|(i, _)| i)
        .collect();
    let mut prefix = cache.clone();
    prefix.hide(0, &beyond).unwrap();
    prefix
}

#[test]
fn full_reuse_of_one_chunk_after_the_system_prompt_equals_full_prefill() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 4);
        let prompt = Prompt::new(&decoder, 20, &[17]);
        let (expected, _) = plain(&decoder, &prompt.whole(), None);
        let reuse = settings(FusionMode::FullReuse, 0.0);
        let reused = prompt.fused(&decoder, &prompt.after_system(&decoder), reuse);
        let diff = max_abs_diff(&reused, &expected);
        assert!(diff < TOLERANCE, "{arch:?}: logits differ by {diff}");
        let full = prompt.fused(
            &decoder,
            &prompt.after_system(&decoder),
            settings(FusionMode::FullPrefill, 0.0),
        );
        let diff = max_abs_diff(&full, &expected);
        assert!(diff < TOLERANCE, "{arch:?}: full prefill differs by {diff}");

        // Twin: the chunk's KV computed without the system prompt, then moved after it.
        let alone = prompt.fused(&decoder, &prompt.alone(&decoder), reuse);
        let diff = max_abs_diff(&alone, &expected);
        assert!(
            diff > BROKEN,
            "{arch:?}: the system prompt made no difference ({diff})"
        );
    }
}

/// The (1, n, n) mask of one pass over `[system, chunks.., question]` in which each chunk
/// token sees its own chunk's earlier tokens and, when `chunks_see_system`, the system
/// prompt; system and question tokens see everything before them.
fn block_diagonal(
    system: usize,
    chunks: &[usize],
    question: usize,
    chunks_see_system: bool,
) -> Tensor {
    let mut block = vec![0usize; system];
    for (k, &n) in chunks.iter().enumerate() {
        block.extend(std::iter::repeat_n(k + 1, n));
    }
    let n = block.len() + question;
    let mut allowed = vec![0u8; n * n];
    for i in 0..n {
        for j in 0..=i {
            let open = if i >= block.len() || block[i] == 0 {
                true
            } else {
                block[j] == block[i] || (chunks_see_system && block[j] == 0)
            };
            allowed[i * n + j] = u8::from(open);
        }
    }
    Tensor::from_vec(allowed, (1, n, n), &Device::Cpu).unwrap()
}

#[test]
fn reuse_without_recomputation_equals_one_pass_under_a_block_diagonal_mask() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 5);
        let lengths = [9, 14, 6];
        let prompt = Prompt::new(&decoder, 30, &lengths);
        let system = prompt.system.len();
        let question = prompt.question.len();
        let reuse = settings(FusionMode::FullReuse, 0.0);

        // Chunks computed alone and moved into place: each saw only itself.
        let reused = prompt.fused(&decoder, &prompt.alone(&decoder), reuse);
        let blocks = block_diagonal(system, &lengths, question, false);
        let (expected, _) = plain(&decoder, &prompt.whole(), Some(blocks));
        let diff = max_abs_diff(&reused, &expected);
        assert!(diff < TOLERANCE, "{arch:?}: alone: logits differ by {diff}");

        // Chunks computed after the system prompt at the places they take in this prompt.
        let mut offset = system;
        let placed: Vec<SegmentKv> = prompt
            .chunks
            .iter()
            .map(|c| {
                let rows = [c.clone()];
                let positions = [span(offset, c.len())];
                offset += c.len();
                let kv = decoder
                    .forward(
                        &ForwardRequest::new(&rows, &positions)
                            .past(prompt.system.kv())
                            .logits(Logits::None),
                    )
                    .unwrap()
                    .kv;
                SegmentKv::new(c.clone(), kv).unwrap()
            })
            .collect();
        let reused = prompt.fused(&decoder, &placed, reuse);
        let blocks = block_diagonal(system, &lengths, question, true);
        let (expected, _) = plain(&decoder, &prompt.whole(), Some(blocks));
        let diff = max_abs_diff(&reused, &expected);
        assert!(
            diff < TOLERANCE,
            "{arch:?}: placed: logits differ by {diff}"
        );

        // Twin: the plain causal pass, where chunks see each other.
        let (causal, _) = plain(&decoder, &prompt.whole(), None);
        let diff = max_abs_diff(&reused, &causal);
        assert!(
            diff > BROKEN,
            "{arch:?}: the mask made no difference ({diff})"
        );
    }
}

#[test]
fn moving_kv_by_rope_equals_recomputing_at_the_new_positions() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 6);
        let prompt = Prompt::new(&decoder, 40, &[12, 10]);
        let alone = prompt.alone(&decoder);
        let refs: Vec<&SegmentKv> = alone.iter().collect();
        let placed_at = prompt.system.len() + prompt.chunks[0].len();
        let second = &prompt.chunks[1];
        // The second chunk prefilled alone, directly at the place assembly moves it to.
        let rows = [second.clone()];
        let positions = [span(placed_at, second.len())];
        let there = decoder
            .forward(&ForwardRequest::new(&rows, &positions).logits(Logits::None))
            .unwrap()
            .kv;
        let config = decoder.config();
        let wrong_style = match config.rope_style {
            RopeStyle::Interleaved => RopeStyle::Halves,
            RopeStyle::Halves => RopeStyle::Interleaved,
        };
        let wrong = RotaryTables::new(
            config.head_dim,
            config.rope_base,
            config.context_length,
            wrong_style,
            &Device::Cpu,
        )
        .unwrap();
        for (rope, right) in [(decoder.rope(), true), (&wrong, false)] {
            let assembled = assemble(rope, &prompt.system, &refs, 0).unwrap();
            assert_eq!(
                assembled.chunk_spans[1],
                placed_at..placed_at + second.len()
            );
            let mut worst = 0.0f32;
            for (moved, fresh) in assembled.cache.layers().iter().zip(there.layers()) {
                let keys = moved.keys().narrow(2, placed_at, second.len()).unwrap();
                worst = worst.max(max_abs_diff(&keys, fresh.keys()));
            }
            if right {
                assert!(worst < TOLERANCE, "{arch:?}: moved keys differ by {worst}");
            } else {
                assert!(
                    worst > BROKEN,
                    "{arch:?}: the RoPE convention made no difference ({worst})"
                );
            }
        }
    }
}

#[test]
fn the_selected_token_count_is_the_ceiling_of_ratio_times_chunk_tokens() {
    let (_dir, decoder) = tiny(TinyArch::Llama, 7);
    for n in [7, 13, 50] {
        let prompt = Prompt::new(&decoder, 50, &[n]);
        let chunks = prompt.after_system(&decoder);
        for (ratio, expected) in [(0.05, [1, 1, 3]), (0.15, [2, 2, 8]), (1.0, [7, 13, 50])] {
            let expected = expected[[7, 13, 50].iter().position(|&m| m == n).unwrap()];
            // Twin: flooring would pick fewer wherever ratio * n is not whole.
            if (ratio * n as f64).fract() > 0.0 {
                assert_ne!((ratio * n as f64).floor() as usize, expected);
            }
            assert_eq!(recompute_count(ratio, n).unwrap(), expected);
            for mode in [FusionMode::FusionRag, FusionMode::CacheBlend] {
                let fused = prompt.run(&decoder, &chunks, settings(mode, ratio));
                assert_eq!(fused.recomputed.len(), expected, "{mode:?} {ratio} of {n}");
            }
        }
    }
}

/// Chunk-relative picks as context entries.
fn shifted(picks: Vec<usize>, by: usize) -> Vec<usize> {
    picks.into_iter().map(|i| i + by).collect()
}

/// The reference selection: `k` highest scores by plain loops and a plain sort.
fn naive_top(scores: &[f32], k: usize) -> Vec<usize> {
    let mut ranked: Vec<(f32, usize)> = scores.iter().copied().zip(0..).collect();
    ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = ranked[..k].iter().map(|&(_, i)| i).collect();
    chosen.sort_unstable();
    chosen
}

/// The question's attention weights (heads x question tokens x columns) over `chunks`
/// assembled after the system prompt, from the last layer of a pass cut after `depth` layers
/// (all when `None`); with the system prompt's length and the context's.
fn question_weights(
    decoder: &Decoder,
    prompt: &Prompt,
    chunks: &[SegmentKv],
    depth: Option<usize>,
) -> (Vec<Vec<Vec<f32>>>, usize, usize) {
    let refs: Vec<&SegmentKv> = chunks.iter().collect();
    let assembled = assemble(decoder.rope(), &prompt.system, &refs, 0).unwrap();
    let context = assembled.tokens.len();
    let rows = [prompt.question.clone()];
    let positions = [span(context, prompt.question.len())];
    let request = ForwardRequest::new(&rows, &positions)
        .past(&assembled.cache)
        .logits(Logits::None)
        .with_attention();
    let request = match depth {
        Some(depth) => request.first_layers(depth),
        None => request,
    };
    let weights = decoder
        .forward(&request)
        .unwrap()
        .attention
        .unwrap()
        .weights
        .squeeze(0)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap();
    (weights, assembled.system_len, context)
}

#[test]
fn query_guided_selection_equals_a_naive_reference() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 8);
        let prompt = Prompt::new(&decoder, 60, &[20, 15, 25]);
        let chunks = prompt.after_system(&decoder);
        let (weights, system, context) = question_weights(&decoder, &prompt, &chunks, None);
        let column_scores = |from: usize| -> Vec<f32> {
            (from..context)
                .map(|j| weights.iter().flatten().map(|row| row[j]).sum())
                .collect()
        };
        let k = 9;
        let expected: Vec<usize> = shifted(naive_top(&column_scores(system), k), system);
        let fused = prompt.run(&decoder, &chunks, settings(FusionMode::FusionRag, 0.15));
        assert_eq!(fused.recomputed, expected, "{arch:?}");
        // Twin: ranking the system prompt's columns too chooses other tokens.
        let with_system = naive_top(&column_scores(0), k);
        assert_ne!(
            with_system, expected,
            "{arch:?}: the system columns made no difference"
        );
        assert_eq!(
            top_tokens(&column_scores(system), k),
            naive_top(&column_scores(system), k)
        );
    }
}

/// With `attended_chunks`, the chunk whose columns the question attends to most in sum is
/// recomputed whole, wherever it stands, and the budget goes to the other chunks' most
/// attended tokens.
#[test]
fn the_most_attended_chunk_is_recomputed_whole_and_the_budget_spent_elsewhere() {
    let mut chosen_chunks = Vec::new();
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 8);
        let prompt = Prompt::new(&decoder, 60, &[20, 15, 25]);
        let chunks = prompt.after_system(&decoder);
        let (weights, system, context) = question_weights(&decoder, &prompt, &chunks, None);
        let scores: Vec<f32> = (system..context)
            .map(|j| weights.iter().flatten().map(|row| row[j]).sum())
            .collect();
        let mut spans = Vec::new();
        for chunk in &chunks {
            let start = spans.last().map_or(0, |s: &std::ops::Range<usize>| s.end);
            spans.push(start..start + chunk.len());
        }
        let sums: Vec<f32> = spans
            .iter()
            .map(|s| scores[s.clone()].iter().sum())
            .collect();
        let top = (0..spans.len())
            .max_by(|&a, &b| sums[a].partial_cmp(&sums[b]).unwrap().then(b.cmp(&a)))
            .unwrap();
        chosen_chunks.push(top);
        let mut others = scores.clone();
        others[spans[top].clone()].fill(f32::NEG_INFINITY);
        let k = 9;
        let mut expected: Vec<usize> = spans[top]
            .clone()
            .chain(naive_top(&others, k))
            .map(|i| i + system)
            .collect();
        expected.sort_unstable();
        let options = PrefillOptions {
            exact: ExactPrefix::NONE,
            selection: SelectionAttention::LastLayer,
            attended_chunks: 1,
        };
        let fused = prompt.run_with(
            &decoder,
            &chunks,
            settings(FusionMode::FusionRag, 0.15),
            options,
        );
        assert_eq!(
            fused.recomputed, expected,
            "{arch:?}: chunk {top} of {sums:?}"
        );
    }
    // Twin: a choice by place (the first chunk, as `whole_chunks` makes) would not pass.
    assert!(
        chosen_chunks.iter().any(|&chunk| chunk != 0),
        "every model attended most to the first chunk: {chosen_chunks:?}"
    );
}

#[test]
fn all_layers_selection_ranks_by_the_attention_summed_over_layers() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 8);
        let prompt = Prompt::new(&decoder, 60, &[20, 15, 25]);
        let chunks = prompt.after_system(&decoder);
        // Each layer's columns, read from a pass cut after that layer, added up here.
        let layers = decoder.config().layers;
        let mut scores = Vec::new();
        let mut system = 0;
        for depth in 1..=layers {
            let (weights, system_len, context) =
                question_weights(&decoder, &prompt, &chunks, Some(depth));
            system = system_len;
            scores.resize(context - system, 0.0f32);
            for (score, j) in scores.iter_mut().zip(system..context) {
                *score += weights.iter().flatten().map(|row| row[j]).sum::<f32>();
            }
        }
        let k = 9;
        let expected = shifted(naive_top(&scores, k), system);
        let options = PrefillOptions {
            exact: ExactPrefix::NONE,
            selection: SelectionAttention::AllLayers,
            attended_chunks: 0,
        };
        let settings = settings(FusionMode::FusionRag, 0.15);
        let fused = prompt.run_with(&decoder, &chunks, settings, options);
        assert_eq!(fused.recomputed, expected, "{arch:?}");
        // Twin: the last layer's attention alone picks other tokens.
        let last_layer = prompt.run(&decoder, &chunks, settings);
        assert_ne!(
            last_layer.recomputed, expected,
            "{arch:?}: summing the layers changed nothing"
        );
    }
}

#[test]
fn cacheblend_selection_equals_a_naive_reference() {
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 9);
        let prompt = Prompt::new(&decoder, 70, &[20, 15, 25]);
        let chunks = prompt.after_system(&decoder);
        let refs: Vec<&SegmentKv> = chunks.iter().collect();
        let assembled = assemble(decoder.rope(), &prompt.system, &refs, 0).unwrap();
        let system = assembled.system_len;
        let context = assembled.tokens.len();
        // The full prefill's entries, all layers, for the naive deviation.
        let (_, full) = plain(&decoder, &assembled.tokens, None);
        let deviation = |layer: usize| -> Vec<f32> {
            let grid = |t: &Tensor| t.squeeze(0).unwrap().to_vec3::<f32>().unwrap();
            let reused = &assembled.cache.layers()[layer];
            let fresh = &full.layers()[layer];
            let pairs = [
                (grid(reused.keys()), grid(fresh.keys())),
                (grid(reused.values()), grid(fresh.values())),
            ];
            (system..context)
                .map(|j| {
                    let mut sum = 0.0f32;
                    for (a, b) in &pairs {
                        for head in 0..a.len() {
                            for d in 0..a[head][j].len() {
                                sum += (a[head][j][d] - b[head][j][d]).powi(2);
                            }
                        }
                    }
                    sum
                })
                .collect()
        };
        let k = 9;
        let expected: Vec<usize> = shifted(naive_top(&deviation(CACHEBLEND_LAYER), k), system);
        let fused = prompt.run(&decoder, &chunks, settings(FusionMode::CacheBlend, 0.15));
        assert_eq!(fused.recomputed, expected, "{arch:?}");
        // Twin: the first layer's deviation ranks other tokens.
        let first: Vec<usize> = shifted(naive_top(&deviation(0), k), system);
        assert_ne!(first, expected, "{arch:?}: the layer made no difference");
    }
}

#[test]
fn a_context_over_the_window_is_refused_with_its_counts() {
    let (_dir, decoder) = tiny(TinyArch::Llama, 10);
    let prompt = Prompt::new(&decoder, 80, &[120, 120]);
    let chunks = prompt.after_system(&decoder);
    let refs: Vec<&SegmentKv> = chunks.iter().collect();
    let error = prefill(
        &decoder,
        &prompt.system,
        &refs,
        &prompt.question,
        FusionSettings::default(),
        32,
        ExactPrefix::NONE.into(),
    )
    .unwrap_err()
    .to_string_full();
    assert!(
        error.contains("249 tokens") && error.contains("window of 256"),
        "{error}"
    );
}

#[test]
fn quality_measures_are_zero_against_themselves_and_grow_with_reuse() {
    use hasten_kv_worker::quality::{first_token_kl, kv_deviation_per_layer};
    for arch in ARCHS {
        let (_dir, decoder) = tiny(arch, 11);
        let prompt = Prompt::new(&decoder, 90, &[14, 11, 9]);
        let chunks = prompt.after_system(&decoder);
        let run = |mode, ratio| prompt.run(&decoder, &chunks, settings(mode, ratio));
        let full = run(FusionMode::FullPrefill, 0.0);
        let context = full.context_tokens;
        let deviation = |cache| -> f64 {
            kv_deviation_per_layer(cache, &full.cache, context)
                .unwrap()
                .iter()
                .sum()
        };
        let recomputed = run(FusionMode::FusionRag, 1.0);
        let reused = run(FusionMode::FullReuse, 0.0);
        assert_eq!(deviation(&full.cache), 0.0);
        assert!(deviation(&recomputed.cache) < 1e-5, "{arch:?}");
        assert!(deviation(&reused.cache) > 1e-2, "{arch:?}");
        assert_eq!(first_token_kl(&full.logits, &full.logits).unwrap(), 0.0);
        assert!(first_token_kl(&recomputed.logits, &full.logits).unwrap() < 1e-4);
        assert!(first_token_kl(&reused.logits, &full.logits).unwrap() > 1e-4);
    }
}
