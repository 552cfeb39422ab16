//! Weight matrix times a few activation rows (decoding), on the file's own 4-, 5- and 8-bit
//! blocks; and attention over the KV cache (`attention.rs`).
//!
//! candle reads Q4_1 and Q5_0 blocks with scalar code, so `fast` used to re-quantise them to
//! Q8_0 for its AVX2 kernel: 34 bytes read per 32 weights instead of 20-22, and values a
//! rounding away from the file's. These kernels read Q4_1, Q5_0, Q8_0 and Q4_K as stored,
//! the way llama.cpp does: each activation row is quantised to 8 bits once per call (a
//! scale per 32 values, or per 256 for Q4_K's, see below), and every weight row's blocks are
//! dotted with every activation row while they are in registers, so a batch of B rows reads
//! each weight once.
//!
//! Weights are repacked at load for the kernels' unit of two blocks (64 weights): the 4-bit
//! parts of two blocks share 32 bytes (block A in the low nibbles, block B in the high, each
//! in element order; Q4_K stores them so already), so one 256-bit load split by nibble gives
//! 64 weights in order, and a Q5_0 pair's fifth bits are one 64-bit mask. Scales are
//! widened to f32 at load, except Q4_K's: a super-block keeps its two factors (as f32) and
//! its eight blocks' 6-bit scales and minimums (a byte each), 4.75 bits a weight where f32
//! per block would be 6, and the kernel multiplies them out eight blocks at a time in
//! registers. Decoding a large model reads every weight once a token, so these bytes are
//! its time.
//!
//! Every block format is then `value = scale * q + offset` per block of 32, `q` unsigned
//! (4- or 5-bit) or, for Q8_0, signed with no offset. A dot product is `sum over blocks of
//! scale_w * scale_a * (q_w . q_a)` plus `sum over blocks of offset_w * (scale_a * sum
//! q_a)`: integer dot products with one multiply per block, then one multiply-add per block
//! for the offsets, both in the kernel while the row's accumulators are in registers.
//!
//! Q4_K's block scales are 6-bit integers of one super-block factor, so where the
//! activations also share one scale per super-block (llama.cpp's Q8_K), a super-block's
//! eight block products sum in integers, each times its 6-bit scale, and take one float
//! multiply-add instead of eight: [`ScaleGroup`]. The activation values then round to a
//! scale set by 256 values instead of 32, as llama.cpp's do for these weights.
//! [`Isa`] picks the kernels at run time; the scalar path is the reference the SIMD paths
//! are tested against.

mod attention;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use half::f16;

use crate::error::{LmError, Result};

pub use attention::{AttentionPass, AttentionSplit, KvRows, decodes};

/// Weights (and activation values) per block, as in GGML.
pub const BLOCK: usize = 32;
/// The kernels' unit: two blocks.
pub const PAIR: usize = 2 * BLOCK;
/// Names the kernels to use instead of the best the CPU has: `scalar`, `avx2` or `avx512`.
pub const KERNELS_ENV: &str = "HASTEN_LM_KERNELS";

/// The GGML block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// 4-bit `q`, a scale and a minimum per block of 32: `value = d * q + m`.
    Q4_1,
    /// 5-bit `q` centred on 16: `value = d * (q - 16)`.
    Q5_0,
    /// 8-bit signed `q`: `value = d * q`.
    Q8_0,
    /// Super-blocks of 256: 4-bit `q` and, per 32, a 6-bit scale and minimum applied to the
    /// super-block's two f16 factors: `value = (d * sc) * q - (dmin * m)`.
    Q4K,
}

impl BlockFormat {
    /// Bytes of one stored block in a GGUF file.
    pub fn stored_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
        }
    }

    /// Values of one stored block.
    pub fn stored_values(self) -> usize {
        match self {
            Self::Q4K => 256,
            _ => BLOCK,
        }
    }

    fn layout(self) -> Layout {
        match self {
            Self::Q4_1 | Self::Q4K => Layout::Nibbles,
            Self::Q5_0 => Layout::NibblesAndFifthBits,
            Self::Q8_0 => Layout::Bytes,
        }
    }
}

/// How many activation values share one scale: what each weight format's kernels need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleGroup {
    /// A scale per block of 32.
    Block,
    /// A scale per Q4_K super-block of 256 (repeated for each of its blocks, so that every
    /// kernel may still read one per block).
    SuperBlock,
}

impl ScaleGroup {
    fn blocks(self) -> usize {
        match self {
            Self::Block => 1,
            Self::SuperBlock => SUPER_BLOCK_BLOCKS,
        }
    }
}

/// How the kernels find a weight's quant: every block format is repacked into one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Unsigned 4-bit, 32 bytes per pair of blocks (see the module's notes).
    Nibbles,
    /// Unsigned 5-bit: [`Layout::Nibbles`] and a 64-bit word of fifth bits per pair.
    NibblesAndFifthBits,
    /// Signed 8-bit, one byte a value.
    Bytes,
}

impl Layout {
    /// 64-bit words of high bits per pair of blocks.
    fn high_words(self) -> usize {
        match self {
            Self::NibblesAndFifthBits => 1,
            Self::Nibbles | Self::Bytes => 0,
        }
    }
}

/// The instruction sets the kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 and FMA: 256-bit multiply-adds of unsigned by signed bytes.
    Avx2,
    /// AVX-512 F/BW/VL with VNNI: 512-bit dot products of bytes in one instruction.
    Avx512,
}

impl Isa {
    /// Every instruction set this CPU runs, the reference first.
    pub fn available() -> Vec<Isa> {
        let mut isas = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::Avx2::detect().is_some() {
                isas.push(Isa::Avx2);
            }
            if x86::Avx512::detect().is_some() {
                isas.push(Isa::Avx512);
            }
        }
        isas
    }

    /// What [`PackedMatrix::matmul`] runs: the best available, unless [`KERNELS_ENV`] names
    /// another this CPU has. Decided once per process.
    pub fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let available = Isa::available();
            let best = *available.last().unwrap_or(&Isa::Scalar);
            let Ok(asked) = std::env::var(KERNELS_ENV) else {
                return best;
            };
            match available.iter().find(|isa| isa.to_string() == asked) {
                Some(&isa) => isa,
                None => {
                    tracing::warn!(
                        asked,
                        using = %best,
                        "{KERNELS_ENV} names kernels this CPU cannot run (scalar, avx2 or avx512)"
                    );
                    best
                }
            }
        })
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        })
    }
}

/// A weight matrix of `n` rows of `k` values, repacked for the kernels.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: BlockFormat,
    n: usize,
    k: usize,
    /// One per block of 32, row after row (none for Q4_K, whose factors are `super_blocks`).
    scales: Vec<f32>,
    /// One per block of 32 (the coefficient of the activation block's sum) where the layout
    /// has them (not Q4_K).
    offsets: Vec<f32>,
    /// Q4_K's factors, one per super-block of 256, row after row.
    super_blocks: Vec<SuperBlockFactors>,
    /// Nibble layouts: 32 bytes per pair of blocks; bytes: one (`i8`) a value.
    quants: Vec<u8>,
    /// High bits, [`Layout::high_words`] per pair: value `e` of a pair at bit `e`.
    high: Vec<u64>,
}

/// [`PackedMatrix`]'s buffers' lengths per weight row.
#[derive(Debug, Clone, Copy)]
struct RowLengths {
    scales: usize,
    offsets: usize,
    super_blocks: usize,
    quants: usize,
    high: usize,
}

/// A Q4_K super-block's factors: block `j`'s scale is `d * scales[j]` and its offset
/// `-(dmin * mins[j])`, the file's own arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub(crate) struct SuperBlockFactors {
    pub d: f32,
    pub dmin: f32,
    pub scales: [u8; 8],
    pub mins: [u8; 8],
}

/// Blocks of 32 per Q4_K super-block.
pub(crate) const SUPER_BLOCK_BLOCKS: usize = 8;

/// One weight row as the kernels read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightRow<'a> {
    pub layout: Layout,
    /// One per block, except where the row's factors are `super_blocks`.
    pub scales: &'a [f32],
    /// One per block where the format has them and keeps them per block, else empty.
    pub offsets: &'a [f32],
    /// Q4_K's factors, one per eight blocks, else empty.
    pub super_blocks: &'a [SuperBlockFactors],
    pub quants: &'a [u8],
    pub high: &'a [u64],
}

impl WeightRow<'_> {
    /// Block `b`'s scale.
    pub fn scale(&self, b: usize) -> f32 {
        match self.super_blocks.get(b / SUPER_BLOCK_BLOCKS) {
            Some(f) => f.d * f32::from(f.scales[b % SUPER_BLOCK_BLOCKS]),
            None => self.scales[b],
        }
    }

    /// Block `b`'s offset (0 where the format has none).
    pub fn offset(&self, b: usize) -> f32 {
        match self.super_blocks.get(b / SUPER_BLOCK_BLOCKS) {
            Some(f) => -(f.dmin * f32::from(f.mins[b % SUPER_BLOCK_BLOCKS])),
            None => self.offsets.get(b).copied().unwrap_or(0.0),
        }
    }
}

/// One activation row, quantised.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActivationRow<'a> {
    pub scale_group: ScaleGroup,
    /// One per block.
    pub scales: &'a [f32],
    /// `scale * sum q` per block: what a weight block's offset multiplies.
    pub sums: &'a [f32],
    pub quants: &'a [i8],
}

impl PackedMatrix {
    /// Whether rows of `k` values of `format` can be packed: the kernels read whole pairs of
    /// blocks, and a file whole stored blocks.
    pub fn supports(format: BlockFormat, k: usize) -> bool {
        k > 0 && k.is_multiple_of(PAIR) && k.is_multiple_of(format.stored_values())
    }

    /// Repacks `n` rows of `k` values stored as GGML blocks (`bytes` as in a GGUF file).
    pub fn from_ggml(format: BlockFormat, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        if !Self::supports(format, k) {
            return Err(LmError::InvalidInput(format!(
                "{format:?} rows of {k} values cannot be packed: rows must hold whole pairs of \
                 {BLOCK}-value blocks and whole {}-value stored blocks",
                format.stored_values()
            )));
        }
        let stored = n * k / format.stored_values();
        let expected = stored * format.stored_bytes();
        if bytes.len() != expected {
            return Err(LmError::InvalidInput(format!(
                "{format:?} matrix of {n} x {k}: expected {expected} bytes, got {}",
                bytes.len()
            )));
        }
        let blocks = n * k / BLOCK;
        let layout = format.layout();
        // Q4_K keeps its factors per super-block, every other format per block.
        let (per_block, super_blocks) = match format {
            BlockFormat::Q4K => (0, stored),
            _ => (blocks, 0),
        };
        let mut packed = Self {
            format,
            n,
            k,
            scales: Vec::with_capacity(per_block),
            offsets: Vec::with_capacity(if layout == Layout::Bytes {
                0
            } else {
                per_block
            }),
            super_blocks: Vec::with_capacity(super_blocks),
            quants: Vec::with_capacity(match layout {
                Layout::Bytes => n * k,
                _ => n * k / 2,
            }),
            high: Vec::with_capacity(blocks / 2 * layout.high_words()),
        };
        match format {
            BlockFormat::Q4K => {
                for block in bytes.chunks_exact(format.stored_bytes()) {
                    packed.push_q4k(block);
                }
            }
            _ => {
                for pair in bytes.chunks_exact(2 * format.stored_bytes()) {
                    let (a, b) = pair.split_at(format.stored_bytes());
                    packed.push_pair(a, b);
                }
            }
        }
        Ok(packed)
    }

    fn push_pair(&mut self, a: &[u8], b: &[u8]) {
        match self.format {
            BlockFormat::Q8_0 => {
                for block in [a, b] {
                    self.scales.push(f16_at(block, 0));
                    self.quants.extend_from_slice(&block[2..]);
                }
            }
            BlockFormat::Q4_1 => {
                for block in [a, b] {
                    self.scales.push(f16_at(block, 0));
                    self.offsets.push(f16_at(block, 2));
                }
                self.push_nibbles(&a[4..], &b[4..]);
            }
            BlockFormat::Q5_0 => {
                let fifth_bits =
                    |block: &[u8]| u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                for block in [a, b] {
                    let d = f16_at(block, 0);
                    self.scales.push(d);
                    self.offsets.push(-16.0 * d);
                }
                self.high
                    .push(u64::from(fifth_bits(a)) | (u64::from(fifth_bits(b)) << 32));
                self.push_nibbles(&a[6..], &b[6..]);
            }
            BlockFormat::Q4K => {}
        }
    }

    /// A pair's 4-bit parts: GGML keeps value `j` of a block in the low nibble of byte `j`
    /// and value `j + 16` in its high nibble; here byte `j` holds value `j` of block A (low)
    /// and of block B (high), for `j` in 0..32.
    fn push_nibbles(&mut self, a: &[u8], b: &[u8]) {
        let value = |qs: &[u8], j: usize| {
            if j < BLOCK / 2 {
                qs[j] & 0x0f
            } else {
                qs[j - BLOCK / 2] >> 4
            }
        };
        self.quants
            .extend((0..BLOCK).map(|j| value(a, j) | (value(b, j) << 4)));
    }

    /// A Q4_K super-block: its 4-bit parts are already laid out as four pairs (each 32
    /// bytes hold 32 values of one block in the low nibbles and the next block's in the
    /// high); each block's scale and minimum are 6-bit factors of the two f16 ones, kept
    /// unpacked to a byte each.
    fn push_q4k(&mut self, block: &[u8]) {
        let mut factors = SuperBlockFactors {
            d: f16_at(block, 0),
            dmin: f16_at(block, 2),
            scales: [0; 8],
            mins: [0; 8],
        };
        for j in 0..SUPER_BLOCK_BLOCKS {
            (factors.scales[j], factors.mins[j]) = q4k_factors(j, &block[4..16]);
        }
        self.super_blocks.push(factors);
        self.quants.extend_from_slice(&block[16..]);
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// The activations' scale group this matrix's kernels read.
    fn scale_group(&self) -> ScaleGroup {
        match self.format {
            BlockFormat::Q4K => ScaleGroup::SuperBlock,
            _ => ScaleGroup::Block,
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Values per row (the input width).
    pub fn columns(&self) -> usize {
        self.k
    }

    /// Each buffer's length per row: every buffer holds `n` rows of one length (0 where the
    /// format has no such part). Worked out once per pass, not per row: five divisions a
    /// row cost ~3% of a 1.5B model's decoding.
    fn row_lengths(&self) -> RowLengths {
        let each = |buffer_len: usize| buffer_len / self.n;
        RowLengths {
            scales: each(self.scales.len()),
            offsets: each(self.offsets.len()),
            super_blocks: each(self.super_blocks.len()),
            quants: each(self.quants.len()),
            high: each(self.high.len()),
        }
    }

    fn row(&self, lengths: RowLengths, o: usize) -> WeightRow<'_> {
        let row_of = |each: usize| o * each..(o + 1) * each;
        WeightRow {
            layout: self.format.layout(),
            scales: &self.scales[row_of(lengths.scales)],
            offsets: &self.offsets[row_of(lengths.offsets)],
            super_blocks: &self.super_blocks[row_of(lengths.super_blocks)],
            quants: &self.quants[row_of(lengths.quants)],
            high: &self.high[row_of(lengths.high)],
        }
    }

    /// The weights as values (what the file's blocks decode to), row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut values = Vec::with_capacity(self.n * self.k);
        let lengths = self.row_lengths();
        for o in 0..self.n {
            let row = self.row(lengths, o);
            for e in 0..self.k {
                let block = e / BLOCK;
                let q = scalar::weight_quant(&row, e);
                let d = row.scale(block);
                // Each in the file's own arithmetic, so that the values are bit for bit its.
                values.push(match self.format {
                    // Q4_K's `d1 * q - m1`: adding the negated minimum is the same rounding.
                    BlockFormat::Q4_1 | BlockFormat::Q4K => q as f32 * d + row.offset(block),
                    BlockFormat::Q5_0 => (q - 16) as f32 * d,
                    BlockFormat::Q8_0 => q as f32 * d,
                });
            }
        }
        values
    }

    /// `x` (`rows` rows of `k` values, row-major) times the transposed weights: `rows` rows
    /// of `n` values.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        self.matmul_with(Isa::selected(), x, rows)
    }

    /// [`matmul`](Self::matmul) on the named kernels (the scalar ones when the CPU lacks them).
    pub fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let mut out = matmul_shared_with(isa, &[self], x, rows)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Weight rows `weight_rows`, each dotted with every activation row, into
    /// `out[r * n + o]`.
    fn dot_rows(
        &self,
        kernel: Kernel,
        activations: &Activations,
        weight_rows: Range<usize>,
        out: &[AtomicU32],
    ) {
        let rows = activations.rows;
        let activation_rows: Vec<ActivationRow<'_>> =
            (0..rows).map(|r| activations.row(r)).collect();
        let mut values = vec![0.0f32; rows];
        let lengths = self.row_lengths();
        for o in weight_rows {
            kernel.dots(self.row(lengths, o), &activation_rows, &mut values);
            for (r, value) in values.iter().enumerate() {
                out[r * self.n + o].store(value.to_bits(), Ordering::Relaxed);
            }
        }
    }
}

/// Matrices of one width applied to one input (a layer's query, key and value projections,
/// or its gate and up): the input is quantised once, and the rows of all of them share one
/// pass of the worker pool instead of one pass (and one wait for the slowest worker) each.
pub fn matmul_shared(matrices: &[&PackedMatrix], x: &[f32], rows: usize) -> Result<Vec<Vec<f32>>> {
    matmul_shared_with(Isa::selected(), matrices, x, rows)
}

/// [`matmul_shared`] on the named kernels.
pub fn matmul_shared_with(
    isa: Isa,
    matrices: &[&PackedMatrix],
    x: &[f32],
    rows: usize,
) -> Result<Vec<Vec<f32>>> {
    let Some(k) = matrices.first().map(|m| m.k) else {
        return Ok(Vec::new());
    };
    if let Some(other) = matrices.iter().find(|m| m.k != k) {
        return Err(LmError::InvalidInput(format!(
            "matrices sharing an input must be as wide: {k} and {} columns",
            other.k
        )));
    }
    if x.len() != rows * k {
        return Err(LmError::InvalidInput(format!(
            "matrix of {k} columns given {} values for {rows} rows",
            x.len()
        )));
    }
    let kernel = Kernel::for_isa(isa);
    // Each scale group the matrices read, quantised once (`k` is whole super-blocks where a
    // matrix is Q4_K: `PackedMatrix::supports`).
    let quantized = |group: ScaleGroup| {
        (matrices.iter().any(|m| m.scale_group() == group))
            .then(|| Activations::quantize(kernel, x, rows, k, group))
    };
    let (per_block, per_super_block) = (
        quantized(ScaleGroup::Block),
        quantized(ScaleGroup::SuperBlock),
    );
    // Each output value is written once, by whichever worker takes its weight row; as
    // atomics the workers share the buffers without locks (a relaxed store is a plain one).
    let outs: Vec<Vec<AtomicU32>> = matrices
        .iter()
        .map(|m| (0..rows * m.n).map(|_| AtomicU32::new(0)).collect())
        .collect();
    // The matrices' rows numbered one after another: matrix i's start at `starts[i]`.
    let starts: Vec<usize> = matrices
        .iter()
        .scan(0, |next, m| {
            let start = *next;
            *next += m.n;
            Some(start)
        })
        .collect();
    let total: usize = matrices.iter().map(|m| m.n).sum();
    // candle's own pool: its workers spin between candle's operations and these, where
    // rayon's would be put to sleep and woken for every matrix.
    candle_core::utils::barrier_pool().execute_chunked(total, |taken| {
        for ((matrix, &start), out) in matrices.iter().zip(&starts).zip(&outs) {
            let first = taken.start.max(start);
            let end = taken.end.min(start + matrix.n);
            let activations = match matrix.scale_group() {
                ScaleGroup::Block => per_block.as_ref(),
                ScaleGroup::SuperBlock => per_super_block.as_ref(),
            };
            if let Some(activations) = activations.filter(|_| first < end) {
                matrix.dot_rows(kernel, activations, first - start..end - start, out);
            }
        }
    });
    Ok(outs
        .into_iter()
        .map(|out| {
            out.into_iter()
                .map(|value| f32::from_bits(value.into_inner()))
                .collect()
        })
        .collect())
}

/// The kernels of one [`Isa`], resolved once per call.
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(x86::Avx512),
}

impl Kernel {
    /// `isa`'s kernels, or the scalar ones where the CPU lacks it.
    fn for_isa(isa: Isa) -> Self {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::Avx512::detect().map_or(Self::Scalar, Self::Avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::Avx2::detect().map_or(Self::Scalar, Self::Avx2),
            _ => Self::Scalar,
        }
    }

    /// The largest magnitude in a block of activations.
    fn largest_magnitude(self, block: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512(avx512) => avx512.largest_magnitude(block),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.largest_magnitude(block),
            Self::Scalar => scalar::largest_magnitude(block),
        }
    }

    /// One block of activations quantised with scale `d` (see [`Activations`]): its quants
    /// into `out`, and the sum of its quants.
    fn quantize_block(self, block: &[f32], d: f32, out: &mut [i8]) -> i32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512(avx512) => avx512.quantize_block(block, d, out),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.quantize_block(block, d, out),
            Self::Scalar => scalar::quantize_block(block, d, out),
        }
    }

    /// `out[i]`: the weight row's dot product with activation row `i`.
    fn dots(self, weights: WeightRow<'_>, rows: &[ActivationRow<'_>], out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512(avx512) => avx512.dots(weights, rows, out),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.dots(weights, rows, out),
            Self::Scalar => {
                for (row, value) in rows.iter().zip(out) {
                    *value = scalar::dot(weights, *row);
                }
            }
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Block `j`'s 6-bit scale and minimum from a Q4_K super-block's 12 bytes of them: blocks
/// 0-3 in the low six bits of bytes 0-3 and 4-7; blocks 4-7 split between the nibbles of
/// bytes 8-11 and the top two bits of bytes 0-7.
fn q4k_factors(j: usize, bytes: &[u8]) -> (u8, u8) {
    if j < 4 {
        (bytes[j] & 63, bytes[j + 4] & 63)
    } else {
        (
            (bytes[j + 4] & 0x0f) | ((bytes[j - 4] >> 6) << 4),
            (bytes[j + 4] >> 4) | ((bytes[j] >> 6) << 4),
        )
    }
}

/// Eight running sums, so that the compiler may vectorise (one sum would fix the order).
/// Activation rows quantised to 8 bits: per scale group (see [`ScaleGroup`]) a scale
/// `d = max |x| / 127`, the values `round(x / d)`, and per block of 32 `d * sum q` (what a
/// weight block's offset multiplies).
#[derive(Debug, Clone)]
pub struct Activations {
    rows: usize,
    k: usize,
    scale_group: ScaleGroup,
    scales: Vec<f32>,
    sums: Vec<f32>,
    quants: Vec<i8>,
}

impl Activations {
    /// `x` holds `rows` rows of `k` values, `k` a multiple of the group's values; every
    /// kernel gives the same bits.
    fn quantize(kernel: Kernel, x: &[f32], rows: usize, k: usize, group: ScaleGroup) -> Self {
        let blocks = x.len() / BLOCK;
        let mut quantized = Self {
            rows,
            k,
            scale_group: group,
            scales: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks),
            quants: vec![0; blocks * BLOCK],
        };
        let values = group.blocks() * BLOCK;
        for (group, quants) in x
            .chunks_exact(values)
            .zip(quantized.quants.chunks_exact_mut(values))
        {
            let largest = (group.chunks_exact(BLOCK))
                .map(|block| kernel.largest_magnitude(block))
                .fold(0.0f32, f32::max);
            let d = largest / 127.0;
            for (block, quants) in group
                .chunks_exact(BLOCK)
                .zip(quants.chunks_exact_mut(BLOCK))
            {
                let sum = kernel.quantize_block(block, d, quants);
                quantized.scales.push(d);
                quantized.sums.push(d * sum as f32);
            }
        }
        quantized
    }

    fn row(&self, r: usize) -> ActivationRow<'_> {
        let blocks = self.k / BLOCK;
        ActivationRow {
            scale_group: self.scale_group,
            scales: &self.scales[r * blocks..(r + 1) * blocks],
            sums: &self.sums[r * blocks..(r + 1) * blocks],
            quants: &self.quants[r * self.k..(r + 1) * self.k],
        }
    }
}
