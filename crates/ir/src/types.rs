//! Tensor types: element dtypes and shapes with symbolic dimensions.
//!
//! Sizes are products of dimensions that come from a checkpoint and from
//! flags (`T`, `Lmax`), so they never wrap: [`TensorType::checked_size_bytes`]
//! says `None` on overflow, and [`TensorType::size_bytes`] saturates at
//! `u64::MAX`, a size every buffer limit refuses with a clear error.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// Unsigned 32-bit integer (token ids).
    U32,
    /// ggml `Q8_0`: blocks of 32 int8 values and an f16 scale.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// ggml `Q4_0`: blocks of 32 4-bit values (offset 8) and an f16 scale.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// ggml `Q4_1`: blocks of 32 4-bit values, an f16 scale and an f16 minimum.
    #[serde(rename = "q4_1")]
    Q4_1,
    /// ggml `Q5_0`: blocks of 32 5-bit values (offset 16) and an f16 scale.
    #[serde(rename = "q5_0")]
    Q5_0,
    /// ggml `Q5_1`: blocks of 32 5-bit values, an f16 scale and an f16 minimum.
    #[serde(rename = "q5_1")]
    Q5_1,
    /// ggml `Q4_K`: super-blocks of 256 4-bit values in 8 sub-blocks with
    /// 6-bit scales and minimums.
    #[serde(rename = "q4_k")]
    Q4K,
    /// ggml `Q5_K`: as [`DType::Q4K`] with 5-bit values.
    #[serde(rename = "q5_k")]
    Q5K,
    /// ggml `Q6_K`: super-blocks of 256 6-bit values in 16 sub-blocks with
    /// 8-bit scales.
    #[serde(rename = "q6_k")]
    Q6K,
}

/// The dtypes of ggml's block quantizations, in [`DType::name`] order of
/// the documentation.
pub const QUANTIZED: [DType; 8] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

impl DType {
    /// Values per block and bytes per block in ggml's layout: one value of
    /// its own size for the plain types.
    pub fn block(self) -> (u64, u64) {
        match self {
            DType::F32 | DType::U32 => (1, 4),
            DType::F16 | DType::BF16 => (1, 2),
            DType::Q8_0 => (32, 34),
            DType::Q4_0 => (32, 18),
            DType::Q4_1 => (32, 20),
            DType::Q5_0 => (32, 22),
            DType::Q5_1 => (32, 24),
            DType::Q4K => (256, 144),
            DType::Q5K => (256, 176),
            DType::Q6K => (256, 210),
        }
    }

    /// Whether this is one of ggml's block quantizations.
    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// Byte offsets of the f16 scales (and minimums) within one of its
    /// blocks: the only fields of a block that can hold a NaN or an infinity.
    pub fn block_f16_fields(self) -> &'static [u64] {
        match self {
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q6K => &[208],
            DType::F32 | DType::U32 | DType::F16 | DType::BF16 => &[],
        }
    }

    /// Size of one element in bytes, for the plain types; a quantized
    /// type's size is per block ([`DType::bytes_for`]), and this is its
    /// block's bytes.
    pub fn size_bytes(self) -> u64 {
        self.block().1
    }

    /// Bytes of `values` values in ggml's layout, or `None` if `values` is
    /// not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, values: u64) -> Option<u64> {
        let (per, bytes) = self.block();
        values
            .is_multiple_of(per)
            .then(|| (values / per).checked_mul(bytes))
            .flatten()
    }

    /// Whether this is a floating-point type (quantized types decode to
    /// floats).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::U32)
    }

    /// Every dtype's name as [`fmt::Display`] writes it and the IR text
    /// parses it.
    pub const NAMES: [&'static str; 12] = [
        "f32", "f16", "bf16", "u32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
    ];

    /// The dtype called `name` (see [`DType::NAMES`]).
    pub fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "u32" => DType::U32,
            _ => return QUANTIZED.into_iter().find(|d| d.name() == name),
        })
    }

    /// Its name, e.g. `bf16` or `q4_k`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A symbolic dimension, bound when the plan is compiled or executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Sym {
    /// Tokens processed in this step (prompt chunk length in prefill, 1 in decode).
    T,
    /// Context capacity of the KV cache, fixed when the plan is compiled.
    Lmax,
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sym::T => "T",
            Sym::Lmax => "Lmax",
        })
    }
}

/// One dimension of a shape: a constant or a symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    /// A size known at compile time.
    Const(u64),
    /// A size bound later.
    Sym(Sym),
}

impl Dim {
    /// The constant value, if this dimension is constant.
    pub fn as_const(self) -> Option<u64> {
        match self {
            Dim::Const(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }

    /// The value of this dimension given the values of `T` and `Lmax`.
    pub fn resolve(self, t: u64, lmax: u64) -> u64 {
        match self {
            Dim::Const(n) => n,
            Dim::Sym(Sym::T) => t,
            Dim::Sym(Sym::Lmax) => lmax,
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Self {
        Dim::Const(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(n) => write!(f, "{n}"),
            Dim::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// The type of a tensor value: dtype and shape (row-major).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<Dim>,
}

impl TensorType {
    /// A type from a dtype and dimensions.
    pub fn new(dtype: DType, shape: impl IntoIterator<Item = Dim>) -> Self {
        TensorType {
            dtype,
            shape: shape.into_iter().collect(),
        }
    }

    /// An f32 activation of shape `[T, width]`.
    pub fn rows(width: u64) -> Self {
        TensorType::new(DType::F32, [Dim::Sym(Sym::T), Dim::Const(width)])
    }

    /// A tensor with constant dimensions.
    pub fn fixed(dtype: DType, dims: &[u64]) -> Self {
        TensorType::new(dtype, dims.iter().map(|&d| Dim::Const(d)))
    }

    /// The innermost dimension if it is constant.
    pub fn last_const(&self) -> Option<u64> {
        self.shape.last().and_then(|d| d.as_const())
    }

    /// Number of elements given `T` and `Lmax`, or `None` if it overflows
    /// `u64`.
    pub fn checked_numel(&self, t: u64, lmax: u64) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(d.resolve(t, lmax)))
    }

    /// Size in bytes given `T` and `Lmax` in ggml's layout, or `None` if
    /// it overflows `u64` or a quantized tensor is not a whole number of
    /// blocks.
    pub fn checked_size_bytes(&self, t: u64, lmax: u64) -> Option<u64> {
        self.dtype.bytes_for(self.checked_numel(t, lmax)?)
    }

    /// Number of elements given `T` and `Lmax`, saturating at `u64::MAX`
    /// (which every size limit then refuses) instead of wrapping.
    pub fn numel(&self, t: u64, lmax: u64) -> u64 {
        self.checked_numel(t, lmax).unwrap_or(u64::MAX)
    }

    /// Size in bytes given `T` and `Lmax`, saturating at `u64::MAX` like
    /// [`TensorType::numel`].
    pub fn size_bytes(&self, t: u64, lmax: u64) -> u64 {
        self.checked_size_bytes(t, lmax).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_overflow_saturate_instead_of_wrapping() {
        let kv = TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(64)]);
        assert_eq!(kv.checked_size_bytes(1, 16), Some(16 * 64 * 4));
        assert_eq!(kv.size_bytes(1, 16), 16 * 64 * 4);
        // 2^58 · 64 · 4 = 2^66 bytes: no u64 holds it.
        assert_eq!(kv.checked_size_bytes(1, 1 << 58), None);
        assert_eq!(kv.size_bytes(1, 1 << 58), u64::MAX);
        assert_eq!(kv.numel(1, u64::MAX), u64::MAX);
    }
}
