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
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(self, DType::U32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
        })
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

    /// Size in bytes given `T` and `Lmax`, or `None` if it overflows `u64`.
    pub fn checked_size_bytes(&self, t: u64, lmax: u64) -> Option<u64> {
        self.checked_numel(t, lmax)?
            .checked_mul(self.dtype.size_bytes())
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
