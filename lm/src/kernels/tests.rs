//! The kernels against candle's reading of the same GGML blocks and against the scalar
//! reference, on random blocks of every supported format, at every row count, matrix height
//! and width around the kernels' boundaries (a pair of blocks, a group of activation
//! rows, the worker pool's share of weight rows).

use std::borrow::Cow;

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use half::f16;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    Activations, BLOCK, BlockFormat, Isa, Kernel, PAIR, PackedMatrix, SUPER_BLOCK_BLOCKS,
    ScaleGroup, matmul_shared_with,
};

const FORMATS: [BlockFormat; 4] = [
    BlockFormat::Q4_1,
    BlockFormat::Q5_0,
    BlockFormat::Q8_0,
    BlockFormat::Q4K,
];

/// A row width of `units` of the format's smallest packable width (a pair of blocks, or a
/// Q4_K super-block).
fn width(format: BlockFormat, units: usize) -> usize {
    units * format.stored_values().max(PAIR)
}

/// How the random blocks' scales are drawn.
#[derive(Clone, Copy)]
enum Scales {
    /// Any small value, as a real file has.
    Random,
    /// Powers of two: with integer activations every product and sum is exact in f32.
    PowersOfTwo,
}

fn f16_bytes(value: f32) -> [u8; 2] {
    f16::from_f32(value).to_le_bytes()
}

/// `blocks` random GGML blocks of `format`, as a GGUF file stores them.
fn random_blocks(format: BlockFormat, blocks: usize, scales: Scales, rng: &mut StdRng) -> Vec<u8> {
    let scale = |rng: &mut StdRng| match scales {
        Scales::Random => rng.random_range(-0.05f32..0.05),
        Scales::PowersOfTwo => [0.25f32, 0.5, 1.0, -0.5][rng.random_range(0..4)],
    };
    let mut bytes = Vec::with_capacity(blocks * format.stored_bytes());
    for _ in 0..blocks {
        bytes.extend(f16_bytes(scale(rng)));
        let rest = match format {
            BlockFormat::Q4_1 => {
                bytes.extend(f16_bytes(scale(rng)));
                BLOCK / 2
            }
            BlockFormat::Q5_0 => 4 + BLOCK / 2,
            BlockFormat::Q8_0 => BLOCK,
            BlockFormat::Q4K => {
                bytes.extend(f16_bytes(scale(rng)));
                // The 6-bit factors kept to 0-3 with power-of-two scales, so that sums stay
                // within f32's exact integers.
                let factor_mask = match scales {
                    Scales::Random => 0xff,
                    Scales::PowersOfTwo => 0x03,
                };
                bytes.extend((0..12).map(|_| rng.random::<u8>() & factor_mask));
                128
            }
        };
        bytes.extend((0..rest).map(|_| rng.random::<u8>()));
    }
    bytes
}

/// candle's decoding of the same bytes: the values the file means.
fn candle_values(format: BlockFormat, bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
    let dtype = match format {
        BlockFormat::Q4_1 => GgmlDType::Q4_1,
        BlockFormat::Q5_0 => GgmlDType::Q5_0,
        BlockFormat::Q8_0 => GgmlDType::Q8_0,
        BlockFormat::Q4K => GgmlDType::Q4K,
    };
    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype).unwrap();
    QTensor::new(storage, (n, k))
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn random_matrix(
    format: BlockFormat,
    n: usize,
    k: usize,
    scales: Scales,
    rng: &mut StdRng,
) -> (Vec<u8>, PackedMatrix) {
    let bytes = random_blocks(format, n * k / format.stored_values(), scales, rng);
    let packed = PackedMatrix::from_ggml(format, &bytes, n, k).unwrap();
    (bytes, packed)
}

/// `x` times the transposed `weights` (`n` rows of `k`), in f64.
fn exact_matmul(weights: &[f32], n: usize, k: usize, x: &[f32], rows: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; rows * n];
    for r in 0..rows {
        for o in 0..n {
            out[r * n + o] = (0..k)
                .map(|e| f64::from(weights[o * k + e]) * f64::from(x[r * k + e]))
                .sum();
        }
    }
    out
}

#[test]
fn packing_keeps_the_values_the_file_means() {
    let mut rng = StdRng::seed_from_u64(7);
    for format in FORMATS {
        let (n, k) = (5, width(format, 3));
        let (bytes, packed) = random_matrix(format, n, k, Scales::Random, &mut rng);
        let ours = packed.dequantize();
        let candle = candle_values(format, &bytes, n, k);
        assert_eq!(ours.len(), candle.len());
        let differing = ours
            .iter()
            .zip(&candle)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "{format:?}: {differing} values differ");
    }
}

/// With power-of-two weight scales and integer activations whose blocks each reach 127 (so
/// every activation scale is exactly 1), no step of any kernel rounds: each must equal the
/// exact product of the file's values, bit for bit.
#[test]
fn every_kernel_is_exact_where_the_arithmetic_is() {
    let mut rng = StdRng::seed_from_u64(11);
    for (format, rows) in FORMATS
        .into_iter()
        .flat_map(|format| [(format, 1), (format, 6)])
    {
        let (n, k) = (101, width(format, 2));
        let (bytes, packed) = random_matrix(format, n, k, Scales::PowersOfTwo, &mut rng);
        let mut x: Vec<f32> = (0..rows * k)
            .map(|_| rng.random_range(-127i32..=127) as f32)
            .collect();
        for block in x.chunks_exact_mut(BLOCK) {
            block[rng.random_range(0..BLOCK)] = 127.0;
        }
        let exact = exact_matmul(&candle_values(format, &bytes, n, k), n, k, &x, rows);
        for isa in Isa::available() {
            let ours = packed.matmul_with(isa, &x, rows).unwrap();
            for (i, (&a, &b)) in ours.iter().zip(&exact).enumerate() {
                assert_eq!(f64::from(a), b, "{format:?} on {isa}: output {i}");
            }
        }
    }
}

/// The tolerance between kernels that sum in different orders: a few f32 roundings of the
/// sum of the terms' magnitudes.
fn tolerance(weights: &[f32], n: usize, k: usize, x: &[f32], rows: usize) -> Vec<f64> {
    let magnitudes: Vec<f32> = weights.iter().map(|w| w.abs()).collect();
    let absolute: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    exact_matmul(&magnitudes, n, k, &absolute, rows)
        .into_iter()
        .map(|m| 1e-5 * m + 1e-6)
        .collect()
}

fn assert_close(format: BlockFormat, isa: Isa, ours: &[f32], reference: &[f32], tolerance: &[f64]) {
    for (i, ((&a, &b), &t)) in ours.iter().zip(reference).zip(tolerance).enumerate() {
        let gap = (f64::from(a) - f64::from(b)).abs();
        assert!(
            gap <= t,
            "{format:?} on {isa}: output {i} is {a}, the reference {b} (gap {gap}, tolerance {t})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every SIMD path against the scalar reference on random blocks, with the matrix's
    /// height, width and the number of activation rows drawn across the kernels' boundaries.
    #[test]
    fn every_kernel_matches_the_reference(
        seed in any::<u64>(),
        format in prop::sample::select(FORMATS.to_vec()),
        n in 1usize..140,
        units in 1usize..7,
        rows in 1usize..10,
        zero_block in any::<bool>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let k = width(format, units);
        let (bytes, packed) = random_matrix(format, n, k, Scales::Random, &mut rng);
        let mut x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        if zero_block {
            // An all-zero block has scale 0: nothing may divide by it.
            x[..BLOCK].fill(0.0);
        }
        let reference = packed.matmul_with(Isa::Scalar, &x, rows).unwrap();
        let values = candle_values(format, &bytes, n, k);
        let tolerance = tolerance(&values, n, k, &x, rows);
        for isa in Isa::available() {
            let ours = packed.matmul_with(isa, &x, rows).unwrap();
            assert_close(format, isa, &ours, &reference, &tolerance);
        }
    }
}

/// The tolerance above is tight enough to matter: changing a single weight by one step of
/// its block (what a misplaced nibble or fifth bit does) moves the result past it.
#[test]
fn one_wrong_weight_is_caught() {
    let mut rng = StdRng::seed_from_u64(3);
    for format in FORMATS {
        let (n, k, rows) = (4, width(format, 1), 2);
        let mut bytes = random_blocks(
            format,
            n * k / format.stored_values(),
            Scales::Random,
            &mut rng,
        );
        // A first block with a scale large enough to matter (Q4_K's: a 6-bit factor of it
        // too), and the byte holding its first or last value's low bits.
        let (scale_at, factor_at, changed) = match format {
            BlockFormat::Q4K => (0, Some(4), 16),
            _ => (0, None, format.stored_bytes() - 1),
        };
        bytes[scale_at..scale_at + 2].copy_from_slice(&f16_bytes(0.05));
        if let Some(at) = factor_at {
            bytes[at] = 33;
        }
        let packed = PackedMatrix::from_ggml(format, &bytes, n, k).unwrap();
        let x: Vec<f32> = (0..rows * k)
            .map(|_| rng.random_range(0.5f32..4.0))
            .collect();
        let good = packed.matmul_with(Isa::Scalar, &x, rows).unwrap();
        let tolerance = tolerance(&candle_values(format, &bytes, n, k), n, k, &x, rows);
        bytes[changed] ^= 0x01;
        let broken = PackedMatrix::from_ggml(format, &bytes, n, k).unwrap();
        for isa in Isa::available() {
            let ours = broken.matmul_with(isa, &x, rows).unwrap();
            let caught = ours
                .iter()
                .zip(&good)
                .zip(&tolerance)
                .any(|((&a, &b), &t)| (f64::from(a) - f64::from(b)).abs() > t);
            assert!(
                caught,
                "{format:?} on {isa}: a changed weight went unnoticed"
            );
        }
    }
}

#[test]
fn shapes_the_kernels_cannot_read_are_refused() {
    let bytes = vec![0u8; 2 * BlockFormat::Q4_1.stored_bytes()];
    let error = PackedMatrix::from_ggml(BlockFormat::Q4_1, &bytes, 2, BLOCK).unwrap_err();
    assert!(error.to_string().contains("whole pairs"), "{error}");
    let error = PackedMatrix::from_ggml(BlockFormat::Q4_1, &bytes, 2, PAIR).unwrap_err();
    assert!(
        error.to_string().contains("expected 80 bytes, got 40"),
        "{error}"
    );
    let packed = PackedMatrix::from_ggml(BlockFormat::Q4_1, &bytes, 1, PAIR).unwrap();
    let error = packed.matmul(&[0.0; PAIR + 1], 1).unwrap_err();
    assert!(
        error.to_string().contains("given 65 values for 1 rows"),
        "{error}"
    );
}

/// One pass over several matrices (a layer's q/k/v) gives each matrix's own product, bit
/// for bit, whichever rows of which matrix each worker took.
#[test]
fn matrices_sharing_an_input_give_what_each_gives_alone() {
    let mut rng = StdRng::seed_from_u64(5);
    let (k, rows) = (256, 3);
    let matrices: Vec<PackedMatrix> = [
        (BlockFormat::Q5_0, 40),
        (BlockFormat::Q4K, 7),
        (BlockFormat::Q4_1, 33),
        (BlockFormat::Q8_0, 1),
    ]
    .into_iter()
    .map(|(format, n)| random_matrix(format, n, k, Scales::Random, &mut rng).1)
    .collect();
    let shared: Vec<&PackedMatrix> = matrices.iter().collect();
    let x: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-4.0f32..4.0))
        .collect();
    for isa in Isa::available() {
        let together = matmul_shared_with(isa, &shared, &x, rows).unwrap();
        assert_eq!(together.len(), matrices.len());
        for (matrix, out) in matrices.iter().zip(&together) {
            assert_eq!(out, &matrix.matmul_with(isa, &x, rows).unwrap(), "{isa}");
        }
    }
    let narrow = random_matrix(BlockFormat::Q8_0, 2, PAIR, Scales::Random, &mut rng).1;
    let error = matmul_shared_with(Isa::Scalar, &[&matrices[0], &narrow], &x, rows).unwrap_err();
    assert!(error.to_string().contains("as wide: 256 and 64"), "{error}");
}

/// A row's outputs are the same bits whatever batch it is in: a batch's activation rows go
/// through the kernels in groups (of up to four with AVX2, eight with AVX-512), one alone,
/// and a sequence must not decode differently for the company it keeps.
#[test]
fn a_rows_outputs_do_not_depend_on_its_batch() {
    let mut rng = StdRng::seed_from_u64(17);
    for format in FORMATS {
        // Nine rows: groups of four (AVX2) or of eight (AVX-512) and one left over.
        let (n, k, rows) = (199, width(format, 5), 9);
        let packed = random_matrix(format, n, k, Scales::Random, &mut rng).1;
        let x: Vec<f32> = (0..rows * k)
            .map(|_| rng.random_range(-4.0f32..4.0))
            .collect();
        for isa in Isa::available() {
            let batch = packed.matmul_with(isa, &x, rows).unwrap();
            for (r, in_batch) in batch.chunks_exact(n).enumerate() {
                let alone = packed.matmul_with(isa, &x[r * k..(r + 1) * k], 1).unwrap();
                for (o, (a, b)) in alone.iter().zip(in_batch).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{format:?} on {isa}: row {r}, output {o}"
                    );
                }
            }
        }
    }
}

/// Every kernel quantises activations to the scalar path's bits, ties included: `round`
/// takes halves away from zero, where the SIMD instructions' nearest rounding takes them
/// to even. Per block, and per super-block (one scale for its eight blocks).
#[test]
fn every_kernel_quantises_activations_as_the_reference_does() {
    let mut rng = StdRng::seed_from_u64(23);
    let (rows, k) = (3, 2 * SUPER_BLOCK_BLOCKS * BLOCK);
    let mut x: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-6.0f32..6.0))
        .collect();
    // A block whose largest magnitude is 127 has d = 1, so each value is its own quant
    // before rounding: halves of both signs, and values a little either side of them.
    let ties = [
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        126.5,
        -126.5,
        0.49999997,
        -0.50000006,
    ];
    x[BLOCK..2 * BLOCK].fill(0.0);
    x[BLOCK] = 127.0;
    x[BLOCK + 1..BLOCK + 1 + ties.len()].copy_from_slice(&ties);
    // An all-zero block (scale 0) and one of tiny values.
    x[2 * BLOCK..3 * BLOCK].fill(0.0);
    for v in &mut x[3 * BLOCK..4 * BLOCK] {
        *v = rng.random_range(-1e-30f32..1e-30);
    }
    for group in [ScaleGroup::Block, ScaleGroup::SuperBlock] {
        let reference = Activations::quantize(Kernel::Scalar, &x, rows, k, group);
        assert_eq!(
            reference.quants[BLOCK + 1..BLOCK + 9],
            [1, -1, 2, -2, 3, -3, 127, -127]
        );
        for isa in Isa::available() {
            let ours = Activations::quantize(Kernel::for_isa(isa), &x, rows, k, group);
            assert_eq!(ours.quants, reference.quants, "{isa}, {group:?}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&ours.scales),
                bits(&reference.scales),
                "{isa}, {group:?}"
            );
            assert_eq!(bits(&ours.sums), bits(&reference.sums), "{isa}, {group:?}");
        }
    }
}

/// Activations for Q4_K weights share one scale per super-block, set by its largest
/// magnitude: what lets the AVX2 kernel sum a super-block in integers. A block of small
/// values then takes its super-block's scale, not its own.
#[test]
fn super_block_activations_share_the_largest_magnitudes_scale() {
    let mut rng = StdRng::seed_from_u64(29);
    let values = SUPER_BLOCK_BLOCKS * BLOCK;
    let (rows, k) = (2, 3 * values);
    let mut x: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-0.5f32..0.5))
        .collect();
    for group in x.chunks_exact_mut(values) {
        group[rng.random_range(0..values)] = rng.random_range(1.0f32..9.0);
    }
    for isa in Isa::available() {
        let kernel = Kernel::for_isa(isa);
        let shared = Activations::quantize(kernel, &x, rows, k, ScaleGroup::SuperBlock);
        let own = Activations::quantize(kernel, &x, rows, k, ScaleGroup::Block);
        for (g, group) in x.chunks_exact(values).enumerate() {
            let largest = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let blocks = g * SUPER_BLOCK_BLOCKS..(g + 1) * SUPER_BLOCK_BLOCKS;
            for b in blocks.clone() {
                assert_eq!(shared.scales[b], largest / 127.0, "{isa}: block {b}");
            }
            // Only the block holding the largest value has it as its own scale.
            let own_equal = blocks
                .filter(|&b| own.scales[b] == shared.scales[b])
                .count();
            assert_eq!(own_equal, 1, "{isa}: super-block {g}");
        }
    }
}
