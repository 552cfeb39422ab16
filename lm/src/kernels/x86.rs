//! The AVX2 and AVX-512 kernels: the runtime's only `unsafe` besides one CUDA call.
//!
//! Each kernel is a `#[target_feature]` function, entered through a token ([`Avx2`],
//! [`Avx512`]) that exists only once run-time detection found those features: that is the
//! safety argument for every call below. Inside, the only unsafe operations are unaligned
//! loads and stores, each on a slice of at least the accessed width (cut by `chunks_exact`
//! or by an index range that panics rather than reach past its end).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::attention::KEY_TILE;
use super::{
    ActivationRow, BLOCK, Layout, PAIR, SUPER_BLOCK_BLOCKS, ScaleGroup, SuperBlockFactors,
    WeightRow,
};

/// Runs `$kernel::<M>` on each group of at most `GROUP` activation rows (the sizes listed
/// are `1..=GROUP`), `M` the group's size, so that each group's accumulators stay in
/// registers and each weight is unpacked once per group.
macro_rules! in_row_groups {
    ($kernel:ident, $w:expr, $rows:expr, $out:expr, [$($m:literal),+]) => {{
        const GROUP: usize = [$($m),+].len();
        // A size missing from the list would leave its groups' outputs unwritten: refused
        // at compile time, so the arm below that skips is never taken.
        const _: () = {
            let sizes = [$($m),+];
            let mut i = 0;
            while i < GROUP {
                assert!(sizes[i] == i + 1, "in_row_groups! lists the sizes 1..=GROUP in order");
                i += 1;
            }
        };
        for (group, out) in $rows.chunks(GROUP).zip($out.chunks_mut(GROUP)) {
            match group.len() {
                $($m => {
                    if let Ok(group) = <&[ActivationRow<'_>; $m]>::try_from(group) {
                        $kernel::<$m>($w, group, out)
                    }
                })+
                _ => {}
            }
        }
    }};
}

/// Proof that the CPU has AVX2 and FMA.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2(());

/// Proof that the CPU has AVX-512 F, BW and VL, and VNNI.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512(());

impl Avx2 {
    pub(super) fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Self(()))
    }

    /// `out[i]`: the weight row's dot product with activation row `i`.
    pub(super) fn dots(self, w: WeightRow<'_>, rows: &[ActivationRow<'_>], out: &mut [f32]) {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe {
            if w.super_blocks.is_empty() {
                in_row_groups!(avx2_dots, w, rows, out, [1, 2, 3, 4])
            } else {
                debug_assert!(rows.iter().all(|r| r.scale_group == ScaleGroup::SuperBlock));
                in_row_groups!(avx2_super_block_dots, w, rows, out, [1, 2, 3, 4])
            }
        }
    }

    /// As `scalar::largest_magnitude`.
    pub(super) fn largest_magnitude(self, block: &[f32]) -> f32 {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_largest_magnitude(block) }
    }

    /// As `scalar::quantize_block`, bit for bit.
    pub(super) fn quantize_block(self, block: &[f32], d: f32, out: &mut [i8]) -> i32 {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_quantize_block(block, d, out) }
    }

    /// `out[q * columns + column + j] = scale * (query q . key row j)`, rows of `head_dim`
    /// (a multiple of 8) values. Each key row is read from memory once for all queries.
    #[allow(clippy::too_many_arguments)] // the loop's operands, each used
    pub(super) fn attention_scores(
        self,
        queries: &[f32],
        keys: &[f32],
        head_dim: usize,
        scale: f32,
        out: &mut [f32],
        columns: usize,
        column: usize,
    ) {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_scores(queries, keys, head_dim, scale, out, columns, column) }
    }

    /// `acc[q] += weights[q * columns + column + j] * value row j` for every query `q`.
    pub(super) fn attention_mix(
        self,
        weights: &[f32],
        columns: usize,
        column: usize,
        values: &[f32],
        head_dim: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_mix(weights, columns, column, values, head_dim, acc) }
    }

    /// Replaces each score `s` by `e^(s - max)` and returns their sum (a softmax's terms).
    pub(super) fn softmax_terms(self, scores: &mut [f32], max: f32) -> f32 {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_softmax_terms(scores, max) }
    }

    /// `out[j] = scale * (query . key j)` for a tile of [`KEY_TILE`] keys stored transposed.
    pub(super) fn tile_scores(
        self,
        query: &[f32],
        keys_t: &[f32],
        scale: f32,
        out: &mut [f32; KEY_TILE],
    ) {
        // SAFETY: `self` exists only where AVX2 and FMA were detected.
        unsafe { avx2_tile_scores(query, keys_t, scale, out) }
    }

    /// `acc += sum_j weights[j] * value row j`, for one query.
    pub(super) fn tile_mix(
        self,
        weights: &[f32],
        values: &[f32],
        head_dim: usize,
        acc: &mut [f32],
    ) {
        if head_dim.is_multiple_of(SLAB) {
            // SAFETY: `self` exists only where AVX2 and FMA were detected.
            unsafe { avx2_tile_mix(weights, values, head_dim, acc) }
        } else {
            self.attention_mix(weights, weights.len(), 0, values, head_dim, acc);
        }
    }
}

impl Avx512 {
    pub(super) fn detect() -> Option<Self> {
        // AVX2 and FMA too (every AVX-512 CPU has them): the kernels share AVX2 helpers.
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        .then_some(Self(()))
    }

    /// As [`Avx2::dots`].
    pub(super) fn dots(self, w: WeightRow<'_>, rows: &[ActivationRow<'_>], out: &mut [f32]) {
        // SAFETY: `self` exists only where AVX-512 F/BW/VL and VNNI, AVX2 and FMA were
        // detected.
        unsafe {
            if w.super_blocks.is_empty() {
                in_row_groups!(avx512_dots, w, rows, out, [1, 2, 3, 4, 5, 6, 7, 8])
            } else {
                in_row_groups!(
                    avx512_super_block_dots,
                    w,
                    rows,
                    out,
                    [1, 2, 3, 4, 5, 6, 7, 8]
                )
            }
        }
    }

    /// As [`Avx2::largest_magnitude`].
    pub(super) fn largest_magnitude(self, block: &[f32]) -> f32 {
        // SAFETY: `self` exists only where AVX2 was detected too.
        unsafe { avx2_largest_magnitude(block) }
    }

    /// As [`Avx2::quantize_block`].
    pub(super) fn quantize_block(self, block: &[f32], d: f32, out: &mut [i8]) -> i32 {
        // SAFETY: `self` exists only where AVX2 was detected too.
        unsafe { avx2_quantize_block(block, d, out) }
    }
}

/// The first 32 bytes of `values` (of bytes, signed or not).
#[target_feature(enable = "avx2")]
fn load256<T: Copy>(values: &[T]) -> __m256i {
    assert!(std::mem::size_of_val(values) >= 32);
    // SAFETY: 32 readable bytes, checked above; the load is unaligned.
    unsafe { _mm256_loadu_si256(values.as_ptr().cast()) }
}

/// The first 64 bytes of `values`.
#[target_feature(enable = "avx512f")]
fn load512<T: Copy>(values: &[T]) -> __m512i {
    assert!(std::mem::size_of_val(values) >= 64);
    // SAFETY: 64 readable bytes, checked above; the load is unaligned.
    unsafe { _mm512_loadu_si512(values.as_ptr().cast()) }
}

/// Byte `e` is `value` where bit `e` of `bits` is set, else 0: high bits put in place.
#[target_feature(enable = "avx2")]
fn bits_avx2(bits: u32, value: i8) -> __m256i {
    // Byte e takes byte e / 8 of `bits`, then is all ones iff bit e % 8 of it is set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0x0000_0000_0000_0000,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let all_but_own_bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(
        _mm256_or_si256(spread, all_but_own_bit),
        _mm256_set1_epi64x(-1),
    );
    _mm256_and_si256(set, _mm256_set1_epi8(value))
}

/// `acc + scale * (w . a)` in eight lanes (each the sum of four products): unsigned weight
/// bytes by signed activations.
#[target_feature(enable = "avx2,fma")]
fn block_fma_avx2(w: __m256i, a: __m256i, scale: __m256, acc: __m256) -> __m256 {
    // Pairs of products fit in i16: at most 2 x 31 x 127 for 4- and 5-bit weights, and
    // 2 x 128 x 127 for signed weights' magnitudes.
    let pairs = _mm256_maddubs_epi16(w, a);
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), scale, acc)
}

/// [`block_fma_avx2`] for signed weights: |w| times a with w's sign.
#[target_feature(enable = "avx2,fma")]
fn signed_block_fma_avx2(w: __m256i, a: __m256i, scale: __m256, acc: __m256) -> __m256 {
    block_fma_avx2(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w), scale, acc)
}

#[target_feature(enable = "avx2")]
fn sum256(v: __m256) -> f32 {
    let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    let one = _mm_add_ss(pairs, _mm_shuffle_ps::<0b01>(pairs, pairs));
    _mm_cvtss_f32(one)
}

/// Each pair's two blocks add into two accumulators: one chain of multiply-adds (4 cycles
/// each) per weight row left a lone activation row waiting on the chain instead of on memory.
#[target_feature(enable = "avx2,fma")]
fn avx2_dots<const M: usize>(w: WeightRow<'_>, rows: &[ActivationRow<'_>; M], out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); M];
    let mut acc_second = [_mm256_setzero_ps(); M];
    match w.layout {
        Layout::Bytes => {
            for (p, quants) in w.quants.chunks_exact(PAIR).enumerate() {
                let (signed_first, signed_second) = (load256(quants), load256(&quants[BLOCK..]));
                let (b0, b1) = (2 * p, 2 * p + 1);
                for ((acc, acc_second), row) in acc.iter_mut().zip(&mut acc_second).zip(rows) {
                    let a = &row.quants[p * PAIR..(p + 1) * PAIR];
                    let (s0, s1) = (w.scales[b0] * row.scales[b0], w.scales[b1] * row.scales[b1]);
                    *acc =
                        signed_block_fma_avx2(signed_first, load256(a), _mm256_set1_ps(s0), *acc);
                    *acc_second = signed_block_fma_avx2(
                        signed_second,
                        load256(&a[BLOCK..]),
                        _mm256_set1_ps(s1),
                        *acc_second,
                    );
                }
            }
        }
        Layout::Nibbles | Layout::NibblesAndFifthBits => {
            let nibble = _mm256_set1_epi8(0x0f);
            for (p, quants) in w.quants.chunks_exact(BLOCK).enumerate() {
                let packed = load256(quants);
                let mut first = _mm256_and_si256(packed, nibble);
                let mut second = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
                if w.layout == Layout::NibblesAndFifthBits {
                    let high = w.high[p];
                    first = _mm256_or_si256(first, bits_avx2(high as u32, 0x10));
                    second = _mm256_or_si256(second, bits_avx2((high >> 32) as u32, 0x10));
                }
                let (b0, b1) = (2 * p, 2 * p + 1);
                for ((acc, acc_second), row) in acc.iter_mut().zip(&mut acc_second).zip(rows) {
                    let a = &row.quants[p * PAIR..(p + 1) * PAIR];
                    let (s0, s1) = (w.scales[b0] * row.scales[b0], w.scales[b1] * row.scales[b1]);
                    *acc = block_fma_avx2(first, load256(a), _mm256_set1_ps(s0), *acc);
                    *acc_second = block_fma_avx2(
                        second,
                        load256(&a[BLOCK..]),
                        _mm256_set1_ps(s1),
                        *acc_second,
                    );
                }
            }
        }
    }
    for (((value, acc), acc_second), row) in out.iter_mut().zip(acc).zip(acc_second).zip(rows) {
        let (acc, tail) = offsets_fma_avx2(w.offsets, row.sums, _mm256_add_ps(acc, acc_second));
        *value = sum256(acc) + tail;
    }
}

/// A Q4_K super-block's factors against `M` activation rows: each row's eight per-block
/// scales (weight scale times activation scale) into `combined`, and the eight blocks'
/// offsets times the row's block sums added to `offset_acc`. The scales and offsets are
/// multiplied out in one register each (the same products as `WeightRow::scale` and
/// `WeightRow::offset`).
#[target_feature(enable = "avx2,fma")]
fn super_block_factors_avx2<const M: usize>(
    factors: &SuperBlockFactors,
    first_block: usize,
    rows: &[ActivationRow<'_>; M],
    combined: &mut [[f32; SUPER_BLOCK_BLOCKS]; M],
    offset_acc: &mut [__m256; M],
) {
    let blocks = first_block..first_block + SUPER_BLOCK_BLOCKS;
    let scales = _mm256_mul_ps(_mm256_set1_ps(factors.d), bytes_f32x8(factors.scales));
    let offsets = _mm256_mul_ps(_mm256_set1_ps(-factors.dmin), bytes_f32x8(factors.mins));
    // Each block's scale is then a broadcast load; a lane permute from the register was no
    // faster (the 1.5B the same, the 0.5B ~4% slower, on AVX2).
    for ((combined, acc), row) in combined.iter_mut().zip(offset_acc).zip(rows) {
        let product = _mm256_mul_ps(scales, load_f32x8(&row.scales[blocks.clone()]));
        store_f32x8(combined, product);
        *acc = _mm256_fmadd_ps(offsets, load_f32x8(&row.sums[blocks.clone()]), *acc);
    }
}

/// [`avx2_dots`] for rows whose factors are Q4_K super-blocks, on activations with one scale
/// per super-block ([`ScaleGroup::SuperBlock`]). Each block's products are multiplied by its
/// 6-bit scale as 16-bit integers and a super-block's summed as 32-bit ones (at most
/// 4 x 2 x (2 x 15 x 127) x 63 a lane: no overflow, and exact in f32), then take one float
/// multiply-add by `d * d_a`: per pair of blocks and row four integer instructions instead of
/// a conversion, a broadcast and a multiply-add per block. The offsets (a multiply-add per
/// super-block) are summed in a second pass, so that the first keeps its registers.
#[target_feature(enable = "avx2,fma")]
fn avx2_super_block_dots<const M: usize>(
    w: WeightRow<'_>,
    rows: &[ActivationRow<'_>; M],
    out: &mut [f32],
) {
    const VALUES: usize = SUPER_BLOCK_BLOCKS * BLOCK;
    let nibble = _mm256_set1_epi8(0x0f);
    // Byte shuffles that broadcast 16-bit lane j of a 128-bit half to all of it.
    let lane_broadcasts: [__m256i; SUPER_BLOCK_BLOCKS] = std::array::from_fn(|j| {
        let low = 2 * j as i16;
        _mm256_set1_epi16(((low + 1) << 8) | low)
    });
    let mut acc = [_mm256_setzero_ps(); M];
    let super_blocks = w.super_blocks.iter().zip(w.quants.chunks_exact(VALUES / 2));
    for (s, (factors, quants)) in super_blocks.enumerate() {
        let first_block = s * SUPER_BLOCK_BLOCKS;
        // The eight scales as 16-bit lanes in both halves: block j's is one byte shuffle.
        let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi64x(
            0,
            i64::from_le_bytes(factors.scales),
        )));
        let mut sums = [_mm256_setzero_si256(); M];
        for (p, pair) in quants.chunks_exact(BLOCK).enumerate() {
            let packed = load256(pair);
            let first = _mm256_and_si256(packed, nibble);
            let second = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
            let scale_first = _mm256_shuffle_epi8(scales, lane_broadcasts[2 * p]);
            let scale_second = _mm256_shuffle_epi8(scales, lane_broadcasts[2 * p + 1]);
            let start = first_block * BLOCK + p * PAIR;
            for (sum, row) in sums.iter_mut().zip(rows) {
                let a = &row.quants[start..start + PAIR];
                let first = _mm256_madd_epi16(_mm256_maddubs_epi16(first, load256(a)), scale_first);
                let second = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(second, load256(&a[BLOCK..])),
                    scale_second,
                );
                *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(first, second));
            }
        }
        for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(rows) {
            let scale = _mm256_set1_ps(factors.d * row.scales[first_block]);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *acc);
        }
    }
    let mut offset_acc = [_mm256_setzero_ps(); M];
    for (s, factors) in w.super_blocks.iter().enumerate() {
        let blocks = s * SUPER_BLOCK_BLOCKS..(s + 1) * SUPER_BLOCK_BLOCKS;
        let offsets = _mm256_mul_ps(_mm256_set1_ps(-factors.dmin), bytes_f32x8(factors.mins));
        for (acc, row) in offset_acc.iter_mut().zip(rows) {
            *acc = _mm256_fmadd_ps(offsets, load_f32x8(&row.sums[blocks.clone()]), *acc);
        }
    }
    for ((value, acc), offsets) in out.iter_mut().zip(acc).zip(offset_acc) {
        *value = sum256(_mm256_add_ps(acc, offsets));
    }
}

/// Eight unsigned bytes as eight f32 lanes.
#[target_feature(enable = "avx2")]
fn bytes_f32x8(bytes: [u8; 8]) -> __m256 {
    let packed = _mm_set_epi64x(0, i64::from_le_bytes(bytes));
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed))
}

/// `scalar::largest_magnitude` eight lanes at a time.
#[target_feature(enable = "avx2")]
fn avx2_largest_magnitude(block: &[f32]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let magnitudes: [__m256; 4] =
        std::array::from_fn(|i| _mm256_andnot_ps(sign, load_f32x8(&block[8 * i..])));
    let largest = _mm256_max_ps(
        _mm256_max_ps(magnitudes[0], magnitudes[1]),
        _mm256_max_ps(magnitudes[2], magnitudes[3]),
    );
    let half = _mm_max_ps(
        _mm256_castps256_ps128(largest),
        _mm256_extractf128_ps::<1>(largest),
    );
    let half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps::<0b01>(half, half)))
}

/// `scalar::quantize_block` eight lanes at a time: the same product and rounding (half
/// away from zero: truncate, then step away where the dropped part is at least a half; the
/// part is exact below 2^23), so the same bits.
#[target_feature(enable = "avx2")]
fn avx2_quantize_block(block: &[f32], d: f32, out: &mut [i8]) -> i32 {
    let sign = _mm256_set1_ps(-0.0);
    let values: [__m256; 4] = std::array::from_fn(|i| load_f32x8(&block[8 * i..]));
    let inverse = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let quants = values.map(|v| {
        let x = _mm256_mul_ps(v, inverse);
        let toward_zero = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
        let dropped = _mm256_andnot_ps(sign, _mm256_sub_ps(x, toward_zero));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(dropped, _mm256_set1_ps(0.5));
        let step = _mm256_or_ps(_mm256_and_ps(x, sign), _mm256_set1_ps(1.0));
        _mm256_cvttps_epi32(_mm256_add_ps(toward_zero, _mm256_and_ps(away, step)))
    });
    // Packing works within 128-bit halves: the bytes come out as each vector's first four
    // values, then each one's last four; the permutation puts the 32 back in order.
    let words = [
        _mm256_packs_epi32(quants[0], quants[1]),
        _mm256_packs_epi32(quants[2], quants[3]),
    ];
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    assert!(out.len() >= BLOCK);
    // SAFETY: 32 writable bytes, checked above; the store is unaligned.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes) };
    let total = _mm256_add_epi32(
        _mm256_add_epi32(quants[0], quants[1]),
        _mm256_add_epi32(quants[2], quants[3]),
    );
    let total = _mm_add_epi32(
        _mm256_castsi256_si128(total),
        _mm256_extracti128_si256::<1>(total),
    );
    let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b00_00_11_10>(total));
    let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b00_00_00_01>(total));
    _mm_cvtsi128_si32(total)
}

/// `acc` plus `offsets[b] * sums[b]` lane by lane over whole groups of eight blocks, and
/// the sum of the products past the last group (both empty where the format has no
/// offsets).
#[target_feature(enable = "avx2,fma")]
fn offsets_fma_avx2(offsets: &[f32], sums: &[f32], mut acc: __m256) -> (__m256, f32) {
    let (offsets, sums) = (offsets.chunks_exact(8), sums.chunks_exact(8));
    let tail = (offsets.remainder().iter())
        .zip(sums.remainder())
        .map(|(offset, sum)| offset * sum)
        .sum();
    for (offsets, sums) in offsets.zip(sums) {
        acc = _mm256_fmadd_ps(load_f32x8(offsets), load_f32x8(sums), acc);
    }
    (acc, tail)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn avx512_dots<const M: usize>(w: WeightRow<'_>, rows: &[ActivationRow<'_>; M], out: &mut [f32]) {
    let mut acc = [_mm512_setzero_ps(); M];
    // Lanes 0-7 hold block A's partial sums, lanes 8-15 block B's: scale each half by its own.
    let pair_scale = |w: &[f32], a: &[f32]| {
        _mm512_mask_blend_ps(
            0xff00,
            _mm512_set1_ps(w[0] * a[0]),
            _mm512_set1_ps(w[1] * a[1]),
        )
    };
    match w.layout {
        Layout::Bytes => {
            for (p, quants) in w.quants.chunks_exact(PAIR).enumerate() {
                let signed = load512(quants);
                let negative = _mm512_movepi8_mask(signed);
                let magnitude = _mm512_abs_epi8(signed);
                let scales = &w.scales[2 * p..2 * p + 2];
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let a = load512(&row.quants[p * PAIR..(p + 1) * PAIR]);
                    // Activations lie in [-127, 127], so negating one never overflows.
                    let a = _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a);
                    let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitude, a);
                    let scale = pair_scale(scales, &row.scales[2 * p..2 * p + 2]);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, *acc);
                }
            }
        }
        Layout::Nibbles | Layout::NibblesAndFifthBits => {
            let nibble = _mm256_set1_epi8(0x0f);
            for (p, quants) in w.quants.chunks_exact(BLOCK).enumerate() {
                let packed = load256(quants);
                let first = _mm256_and_si256(packed, nibble);
                let second = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
                let mut weights = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
                if w.layout == Layout::NibblesAndFifthBits {
                    let fifth = _mm512_maskz_mov_epi8(w.high[p], _mm512_set1_epi8(0x10));
                    weights = _mm512_or_si512(weights, fifth);
                }
                let scales = &w.scales[2 * p..2 * p + 2];
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let a = load512(&row.quants[p * PAIR..(p + 1) * PAIR]);
                    let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), weights, a);
                    let scale = pair_scale(scales, &row.scales[2 * p..2 * p + 2]);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, *acc);
                }
            }
        }
    }
    for ((value, acc), row) in out.iter_mut().zip(acc).zip(rows) {
        let (offsets, tail) = offsets_fma_avx2(w.offsets, row.sums, _mm256_setzero_ps());
        *value = _mm512_reduce_add_ps(acc) + sum256(offsets) + tail;
    }
}

/// [`avx512_dots`] for rows whose factors are Q4_K super-blocks: a pair of blocks is one
/// VNNI product, as there, with the scales of [`super_block_factors_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn avx512_super_block_dots<const M: usize>(
    w: WeightRow<'_>,
    rows: &[ActivationRow<'_>; M],
    out: &mut [f32],
) {
    const VALUES: usize = SUPER_BLOCK_BLOCKS * BLOCK;
    let nibble = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); M];
    let mut offset_acc = [_mm256_setzero_ps(); M];
    let mut combined = [[0.0f32; SUPER_BLOCK_BLOCKS]; M];
    let super_blocks = w.super_blocks.iter().zip(w.quants.chunks_exact(VALUES / 2));
    for (s, (factors, quants)) in super_blocks.enumerate() {
        let first_block = s * SUPER_BLOCK_BLOCKS;
        super_block_factors_avx2(factors, first_block, rows, &mut combined, &mut offset_acc);
        for (p, pair) in quants.chunks_exact(BLOCK).enumerate() {
            let packed = load256(pair);
            let first = _mm256_and_si256(packed, nibble);
            let second = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
            let weights = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
            let start = s * VALUES + p * PAIR;
            for ((acc, row), combined) in acc.iter_mut().zip(rows).zip(&combined) {
                let a = load512(&row.quants[start..start + PAIR]);
                let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), weights, a);
                // Lanes 0-7 hold block A's partial sums, lanes 8-15 block B's.
                let scale = _mm512_mask_blend_ps(
                    0xff00,
                    _mm512_set1_ps(combined[2 * p]),
                    _mm512_set1_ps(combined[2 * p + 1]),
                );
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, *acc);
            }
        }
    }
    for ((value, acc), offsets) in out.iter_mut().zip(acc).zip(offset_acc) {
        *value = _mm512_reduce_add_ps(acc) + sum256(offsets);
    }
}

/// The first 8 values of `values`.
#[target_feature(enable = "avx")]
fn load_f32x8(values: &[f32]) -> __m256 {
    assert!(values.len() >= 8);
    // SAFETY: 8 readable values, checked above; the load is unaligned.
    unsafe { _mm256_loadu_ps(values.as_ptr()) }
}

/// Writes `v` to the first 8 values of `out`.
#[target_feature(enable = "avx")]
fn store_f32x8(out: &mut [f32], v: __m256) {
    assert!(out.len() >= 8);
    // SAFETY: 8 writable values, checked above; the store is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) }
}

#[target_feature(enable = "avx2,fma")]
fn avx2_scores(
    queries: &[f32],
    keys: &[f32],
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
    columns: usize,
    column: usize,
) {
    for (j, key) in keys.chunks_exact(head_dim).enumerate() {
        for (q, query) in queries.chunks_exact(head_dim).enumerate() {
            // Two sums, so that consecutive multiply-adds do not wait on each other.
            let mut sums = [_mm256_setzero_ps(); 2];
            for (i, (k, x)) in key.chunks_exact(8).zip(query.chunks_exact(8)).enumerate() {
                sums[i % 2] = _mm256_fmadd_ps(load_f32x8(k), load_f32x8(x), sums[i % 2]);
            }
            out[q * columns + column + j] = scale * sum256(_mm256_add_ps(sums[0], sums[1]));
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn avx2_mix(
    weights: &[f32],
    columns: usize,
    column: usize,
    values: &[f32],
    head_dim: usize,
    acc: &mut [f32],
) {
    for (j, value) in values.chunks_exact(head_dim).enumerate() {
        for (q, acc) in acc.chunks_exact_mut(head_dim).enumerate() {
            let weight = _mm256_set1_ps(weights[q * columns + column + j]);
            for (a, v) in acc.chunks_exact_mut(8).zip(value.chunks_exact(8)) {
                store_f32x8(a, _mm256_fmadd_ps(weight, load_f32x8(v), load_f32x8(a)));
            }
        }
    }
}

/// Values of a head kept in registers by [`avx2_tile_mix`]: eight vectors of eight.
const SLAB: usize = 64;

#[target_feature(enable = "avx2,fma")]
fn avx2_tile_scores(query: &[f32], keys_t: &[f32], scale: f32, out: &mut [f32; KEY_TILE]) {
    // One accumulator per eight keys: eight independent chains of multiply-adds, no
    // horizontal sums.
    let mut sums = [_mm256_setzero_ps(); KEY_TILE / 8];
    for (&x, keys) in query.iter().zip(keys_t.chunks_exact(KEY_TILE)) {
        let x = _mm256_set1_ps(x);
        for (sum, k) in sums.iter_mut().zip(keys.chunks_exact(8)) {
            *sum = _mm256_fmadd_ps(x, load_f32x8(k), *sum);
        }
    }
    let scale = _mm256_set1_ps(scale);
    for (sum, o) in sums.iter().zip(out.chunks_exact_mut(8)) {
        store_f32x8(o, _mm256_mul_ps(*sum, scale));
    }
}

#[target_feature(enable = "avx2,fma")]
fn avx2_tile_mix(weights: &[f32], values: &[f32], head_dim: usize, acc: &mut [f32]) {
    // Each 64 values of the output stay in registers across the tile's value rows.
    for (slab, acc) in acc.chunks_exact_mut(SLAB).enumerate() {
        let mut sums = [_mm256_setzero_ps(); SLAB / 8];
        for (sum, a) in sums.iter_mut().zip(acc.chunks_exact(8)) {
            *sum = load_f32x8(a);
        }
        for (&w, value) in weights.iter().zip(values.chunks_exact(head_dim)) {
            let w = _mm256_set1_ps(w);
            let value = &value[slab * SLAB..(slab + 1) * SLAB];
            for (sum, v) in sums.iter_mut().zip(value.chunks_exact(8)) {
                *sum = _mm256_fmadd_ps(w, load_f32x8(v), *sum);
            }
        }
        for (sum, a) in sums.iter().zip(acc.chunks_exact_mut(8)) {
            store_f32x8(a, *sum);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn avx2_softmax_terms(scores: &mut [f32], max: f32) -> f32 {
    let shift = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut chunks = scores.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let terms = exp_avx2(_mm256_sub_ps(load_f32x8(chunk), shift));
        store_f32x8(chunk, terms);
        sum = _mm256_add_ps(sum, terms);
    }
    let mut total = sum256(sum);
    for score in chunks.into_remainder() {
        *score = (*score - max).exp();
        total += *score;
    }
    total
}

/// `e^x` in eight lanes, within a few ulp: `x = n ln 2 + r` with `|r| <= ln 2 / 2`, a degree-7
/// polynomial for `e^r` (Cephes' `expf`), and `2^n` built in the exponent bits. Below
/// `ln` of the smallest normal float the result is 0, so that `-inf` (a closed entry) gives 0.
#[target_feature(enable = "avx2,fma")]
fn exp_avx2(x: __m256) -> __m256 {
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_55));
    let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 in two parts, so that `n * ln 2` is exact in the first.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e_r = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    let exponent = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let result = _mm256_mul_ps(e_r, _mm256_castsi256_ps(exponent));
    _mm256_andnot_ps(underflow, result)
}
