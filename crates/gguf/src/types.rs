//! ggml's tensor types: how many values a block holds, how many bytes it
//! takes, and how to turn blocks back into f32 ([`TensorType::dequantize`]).
//!
//! ```
//! use gerbil_gguf::TensorType;
//! let q8 = TensorType::from_id(8).unwrap();
//! assert_eq!((q8.name(), q8.block_len(), q8.block_bytes()), ("Q8_0", 32, 34));
//! // One block: scale 0.5 (f16), then 32 signed bytes.
//! let mut block = half::f16::from_f32(0.5).to_le_bytes().to_vec();
//! block.extend((0..32).map(|i| (i as i8 - 16) as u8));
//! let mut out = vec![0.0; 32];
//! q8.dequantize(&block, &mut out).unwrap();
//! assert_eq!(out[0], -8.0);
//! ```
//!
//! Every type ggml defines is known by id, name and block geometry, so a
//! file's layout can be checked whatever it holds; [`TensorType::dequantize`]
//! decodes the types gerbil supports ([`TensorType::SUPPORTED`]) and names the
//! others. The arithmetic is ggml's own, operation for operation in f32
//! (`(d · scale) · q − dmin · min` for the K types), so the values equal
//! llama.cpp's and gguf-py's bit for bit — transformers loads a GGUF through
//! gguf-py, and the tests compare against it.

use half::f16;

/// One of ggml's tensor types, by its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorType(u32);

/// (id, name, values per block, bytes per block) of every ggml type with a
/// fixed layout; ids 4 and 5 (the retired Q4_2 and Q4_3) are absent.
const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl TensorType {
    /// 32-bit float.
    pub const F32: TensorType = TensorType(0);
    /// IEEE half.
    pub const F16: TensorType = TensorType(1);
    /// bfloat16.
    pub const BF16: TensorType = TensorType(30);
    /// 32 values: an f16 scale and 4-bit values offset by 8.
    pub const Q4_0: TensorType = TensorType(2);
    /// 32 values: f16 scale and minimum, 4-bit values.
    pub const Q4_1: TensorType = TensorType(3);
    /// 32 values: an f16 scale and 5-bit values offset by 16.
    pub const Q5_0: TensorType = TensorType(6);
    /// 32 values: f16 scale and minimum, 5-bit values.
    pub const Q5_1: TensorType = TensorType(7);
    /// 32 values: an f16 scale and signed bytes.
    pub const Q8_0: TensorType = TensorType(8);
    /// 256 values in 8 groups: 6-bit scales and minimums, 4-bit values.
    pub const Q4_K: TensorType = TensorType(12);
    /// 256 values in 8 groups: 6-bit scales and minimums, 5-bit values.
    pub const Q5_K: TensorType = TensorType(13);
    /// 256 values in 16 groups: signed 8-bit scales, 6-bit values offset by 32.
    pub const Q6_K: TensorType = TensorType(14);

    /// The types [`Self::dequantize`] decodes.
    pub const SUPPORTED: [TensorType; 11] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// The type with ggml id `id`, if ggml defines one with a fixed layout.
    pub fn from_id(id: u32) -> Option<TensorType> {
        TABLE.iter().any(|e| e.0 == id).then_some(TensorType(id))
    }

    /// The type called `name` (ggml's spelling, any case).
    pub fn from_name(name: &str) -> Option<TensorType> {
        TABLE
            .iter()
            .find(|e| e.1.eq_ignore_ascii_case(name))
            .map(|e| TensorType(e.0))
    }

    fn entry(self) -> &'static (u32, &'static str, u64, u64) {
        // Values exist only through `from_id`, `from_name` and the constants.
        TABLE
            .iter()
            .find(|e| e.0 == self.0)
            .unwrap_or_else(|| unreachable!("tensor type {} is not in the table", self.0))
    }

    /// ggml's id.
    pub fn id(self) -> u32 {
        self.0
    }

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Values per block (1 for plain types).
    pub fn block_len(self) -> u64 {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.entry().3
    }

    /// Whether [`Self::dequantize`] decodes this type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Bytes of `values` values, or `None` when `values` is not a whole
    /// number of blocks (or the product overflows).
    pub fn bytes_for(self, values: u64) -> Option<u64> {
        let len = self.block_len();
        values
            .is_multiple_of(len)
            .then(|| (values / len).checked_mul(self.block_bytes()))
            .flatten()
    }

    /// Decodes `data` (whole blocks of this type) into `out`, which must
    /// hold `data.len() / block_bytes × block_len` values. Fails, naming the
    /// type, for a type gerbil does not decode or a length mismatch.
    pub fn dequantize(self, data: &[u8], out: &mut [f32]) -> Result<(), String> {
        let (len, bytes) = (self.block_len() as usize, self.block_bytes() as usize);
        if !data.len().is_multiple_of(bytes) || data.len() / bytes * len != out.len() {
            return Err(format!(
                "{}: {} bytes do not decode to {} values ({len} values per {bytes}-byte block)",
                self.name(),
                data.len(),
                out.len()
            ));
        }
        let decode: fn(&[u8], &mut [f32]) = match self {
            Self::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Self::F16 => |b, o| o[0] = f16::from_le_bytes([b[0], b[1]]).to_f32(),
            Self::BF16 => {
                |b, o| o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
            }
            Self::Q8_0 => q8_0,
            Self::Q4_0 => q4_0,
            Self::Q4_1 => q4_1,
            Self::Q5_0 => q5_0,
            Self::Q5_1 => q5_1,
            Self::Q4_K => q4_k,
            Self::Q5_K => q5_k,
            Self::Q6_K => q6_k,
            other => {
                return Err(format!(
                    "tensor type {} is not supported; gerbil reads {}",
                    other.name(),
                    supported_names()
                ))
            }
        };
        for (block, values) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(len)) {
            decode(block, values);
        }
        Ok(())
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The supported types' names, comma-separated.
pub fn supported_names() -> String {
    let names: Vec<&str> = TensorType::SUPPORTED.iter().map(|t| t.name()).collect();
    names.join(", ")
}

/// The f16 at `b[at..at + 2]`, widened.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// The 32 four-bit values of a 16-byte run: low nibbles first, then high.
fn nibbles(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let lo = qs.iter().map(|q| q & 0x0f);
    lo.chain(qs.iter().map(|q| q >> 4))
}

fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, q) in out.iter_mut().zip(nibbles(&b[2..18])) {
        *o = d * f32::from(q as i8 - 8);
    }
}

fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (o, q) in out.iter_mut().zip(nibbles(&b[4..20])) {
        *o = d * f32::from(q) + m;
    }
}

/// The 32 five-bit values of a 5-bit block: `qh` holds bit 4 of value `j` in
/// its bit `j`, `qs` the low four bits as nibbles.
fn five_bits<'a>(qh: &[u8], qs: &'a [u8]) -> impl Iterator<Item = u8> + 'a {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibbles(qs)
        .enumerate()
        .map(move |(j, lo)| lo | (((qh >> j) & 1) as u8) << 4)
}

fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, q) in out.iter_mut().zip(five_bits(&b[2..6], &b[6..22])) {
        *o = d * f32::from(q as i8 - 16);
    }
}

fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (o, q) in out.iter_mut().zip(five_bits(&b[4..8], &b[8..24])) {
        *o = d * f32::from(q) + m;
    }
}

/// The eight 6-bit (scale, min) pairs packed in the 12 bytes of a Q4_K or
/// Q5_K block.
fn k_scales(s: &[u8]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| {
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        }
    })
}

fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = k_scales(&b[4..16]);
    let qs = &b[16..144];
    for (j, (sc, m)) in scales.into_iter().enumerate() {
        let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
        let run = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let shift = 4 * (j % 2);
        for (o, q) in out[32 * j..32 * j + 32].iter_mut().zip(run) {
            *o = scale * f32::from((q >> shift) & 0x0f) - min;
        }
    }
}

fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = k_scales(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (j, (sc, m)) in scales.into_iter().enumerate() {
        let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
        let run = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let shift = 4 * (j % 2);
        for ((o, q), h) in out[32 * j..32 * j + 32].iter_mut().zip(run).zip(qh) {
            let v = ((q >> shift) & 0x0f) | (((h >> j) & 1) << 4);
            *o = scale * f32::from(v) - min;
        }
    }
}

fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    // Two halves of 128 values; in each, four runs of 32: the low nibbles of
    // `ql[0..32]` and `ql[32..64]`, then their high nibbles, with two high
    // bits from successive bit pairs of `qh`.
    for half in 0..2 {
        let (ql, qh) = (
            &ql[64 * half..64 * half + 64],
            &qh[32 * half..32 * half + 32],
        );
        for run in 0..4 {
            let lows = &ql[32 * (run % 2)..32 * (run % 2) + 32];
            let shift = 4 * (run / 2);
            for l in 0..32 {
                let i = 128 * half + 32 * run + l;
                let q = ((lows[l] >> shift) & 0x0f) | (((qh[l] >> (2 * run)) & 3) << 4);
                let scale = d * f32::from(scales[i / 16] as i8);
                out[i] = scale * f32::from(q as i8 - 32);
            }
        }
    }
}
