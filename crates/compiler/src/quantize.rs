//! `--quantize`: which weights a [`Quantization`] scheme stores in which
//! ggml block type, and the quantization of a float tensor into it.
//!
//! [`retype`] runs on the lowered graph, before the passes: every float
//! matrix read as a matmul weight or an embedding table gets the block type
//! the scheme gives its role ([`Quantization::choose`]), llama.cpp's rules
//! (`llama_tensor_get_type` without an importance matrix): the LM head — the
//! matrix a matmul reads with as many rows as the embedding table, so a tied
//! embedding too — Q6_K in every scheme but `q8_0`; in `q4_k_m`, Q4_K but
//! for `v_proj` and `down_proj` in the first and last eighths of the layers
//! and every third layer between (Q6_K), and a fused `qkv_proj` (Q5_K);
//! in `q4f16_1` (MLC's), every matrix Q4_0, quantized by
//! [`Rounding::SymmetricInt4`] instead of ggml's quantizer. A
//! matrix whose rows are not whole blocks of its type falls back as
//! llama.cpp does (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0) and keeps its
//! dtype if even 32-value blocks do not fit. Tensors already quantized (a
//! GGUF's) keep their blocks. Nothing is quantized here: the graph only says
//! what each weight buffer holds, and [`quantize_tensor`] makes the blocks
//! when the plan's weights are materialized, one tensor at a time.
//!
//! The surprise: the retyping decides which fusions happen. `fuse-qkv` and
//! `fuse-gate-up` concatenate only weights of one type, so in `q4_k_m` the
//! layers whose `v_proj` is Q6_K keep separate Q, K and V matmuls.

use gerbil_frontend_hf::TensorView;
use gerbil_gguf::TensorType;
use gerbil_ir::{DType, Graph, Op, ValueRef, WeightSource};

/// A quantization scheme `gerbilc compile --quantize` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantization {
    /// Every matrix Q8_0.
    Q8_0,
    /// Matrices Q4_0, the LM head Q6_K.
    Q4_0,
    /// Matrices Q4_1, the LM head Q6_K.
    Q4_1,
    /// Matrices Q5_0, the LM head Q6_K.
    Q5_0,
    /// Matrices Q5_1, the LM head Q6_K.
    Q5_1,
    /// llama.cpp's Q4_K_M mix (see the module documentation).
    Q4KM,
    /// MLC's `q4f16_1`: every matrix, LM head and embedding included, in
    /// symmetric int4 groups of 32 with an f16 scale ([`Rounding::SymmetricInt4`]),
    /// stored as Q4_0 blocks.
    Q4F16,
}

/// Which quantizer makes a block type's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rounding {
    /// ggml's reference quantizers ([`TensorType::quantize`]), as llama.cpp's.
    #[default]
    Ggml,
    /// MLC's group quantization into Q4_0 blocks: scale `d = max|x| / 7`
    /// (rounded to f16), `q = clamp(round(x / d), −7, 7)` rounding half to
    /// even, stored as the nibble `q + 8` (Q4_0 reads `(nibble − 8) · d`).
    /// Symmetric, so zero stays exactly zero and the level −8 is unused.
    SymmetricInt4,
}

/// What a matrix is, for the rules of a scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The LM head (or the embedding it is tied to).
    Output,
    /// `v_proj` or `down_proj` of a layer llama.cpp gives more bits.
    MoreBits,
    /// A fused `qkv_proj` (Phi-3).
    FusedQkv,
    /// Any other matrix.
    Other,
}

impl Quantization {
    /// Every scheme's name, as `--quantize` takes it.
    pub const NAMES: [&'static str; 7] =
        ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q4f16_1"];

    /// The scheme called `name` (any case).
    pub fn named(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q5_0" => Self::Q5_0,
            "q5_1" => Self::Q5_1,
            "q4_k_m" => Self::Q4KM,
            "q4f16_1" | "q4f16" => Self::Q4F16,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4KM => "q4_k_m",
            Self::Q4F16 => "q4f16_1",
            other => other.base().name(),
        }
    }

    /// The quantizer of its blocks.
    pub fn rounding(self) -> Rounding {
        match self {
            Self::Q4F16 => Rounding::SymmetricInt4,
            _ => Rounding::Ggml,
        }
    }

    /// The block type of its ordinary matrices.
    pub fn base(self) -> DType {
        match self {
            Self::Q8_0 => DType::Q8_0,
            Self::Q4_0 | Self::Q4F16 => DType::Q4_0,
            Self::Q4_1 => DType::Q4_1,
            Self::Q5_0 => DType::Q5_0,
            Self::Q5_1 => DType::Q5_1,
            Self::Q4KM => DType::Q4K,
        }
    }

    /// The block type of a matrix of `role` whose rows hold `k` values, or
    /// `None` when not even 32-value blocks fit (the matrix keeps its dtype).
    pub fn choose(self, role: Role, k: u64) -> Option<DType> {
        let wanted = match (self, role) {
            (Self::Q8_0, _) => DType::Q8_0,
            (Self::Q4F16, _) => DType::Q4_0,
            (_, Role::Output) | (Self::Q4KM, Role::MoreBits) => DType::Q6K,
            (Self::Q4KM, Role::FusedQkv) => DType::Q5K,
            (scheme, _) => scheme.base(),
        };
        let fallback = match wanted {
            DType::Q4K => DType::Q5_0,
            DType::Q5K => DType::Q5_1,
            DType::Q6K => DType::Q8_0,
            other => other,
        };
        [wanted, fallback]
            .into_iter()
            .find(|d| k.is_multiple_of(d.block().0))
    }
}

/// llama.cpp's `use_more_bits`: layer `i` of `n` gets more bits in the first
/// and last eighths and in every third layer between.
fn more_bits(i: u64, n: u64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer index in a checkpoint tensor name (`model.layers.12.…`).
fn layer_of(name: &str) -> Option<u64> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

/// The checkpoint tensor a weight reads (all of it or some of its rows).
fn tensor_of(source: &WeightSource) -> Option<&str> {
    match source {
        WeightSource::Checkpoint { tensor } | WeightSource::Rows { tensor, .. } => Some(tensor),
        WeightSource::Concat { .. }
        | WeightSource::Adapter { .. }
        | WeightSource::RopeTable { .. } => None,
    }
}

/// Retypes the float matrices of `graph` to `scheme`'s block types (see the
/// module documentation); returns how many weights it retyped.
pub fn retype(graph: &mut Graph, scheme: Quantization) -> usize {
    let vocab = graph.g.node_indices().find_map(|id| {
        let Op::Embedding(_) = graph.node(id).op else {
            return None;
        };
        let table = *graph.inputs(id).first()?;
        graph.value_type(table).shape.first()?.as_const()
    });
    let layers = graph
        .g
        .node_weights()
        .filter_map(|n| match &n.op {
            Op::Weight(w) => tensor_of(&w.source).and_then(layer_of),
            _ => None,
        })
        .max()
        .map_or(0, |last| last + 1);
    let mut changed = Vec::new();
    for id in graph.g.node_indices() {
        let Op::Weight(w) = &graph.node(id).op else {
            continue;
        };
        let dims: Vec<Option<u64>> = w.ty.shape.iter().map(|d| d.as_const()).collect();
        let [Some(rows), Some(k)] = dims[..] else {
            continue;
        };
        if !w.ty.dtype.is_float() || w.ty.dtype.is_quantized() {
            continue;
        }
        let users = graph.users(ValueRef::of(id));
        let only_matrices = users.iter().all(|&(u, p)| {
            matches!(
                (&graph.node(u).op, p),
                (Op::MatMul(_), 1) | (Op::Embedding(_), 0)
            )
        });
        if users.is_empty() || !only_matrices {
            continue;
        }
        let matmul = users
            .iter()
            .any(|&(u, _)| matches!(graph.node(u).op, Op::MatMul(_)));
        let tensor = tensor_of(&w.source).unwrap_or("");
        let role = if matmul && Some(rows) == vocab {
            Role::Output
        } else if tensor.contains("qkv_proj") {
            Role::FusedQkv
        } else if (tensor.contains("v_proj") || tensor.contains("down_proj"))
            && layer_of(tensor).is_some_and(|i| more_bits(i, layers))
        {
            Role::MoreBits
        } else {
            Role::Other
        };
        if let Some(dtype) = scheme.choose(role, k) {
            changed.push((id, dtype));
        }
    }
    for &(id, dtype) in &changed {
        let node = &mut graph.g[id];
        if let Op::Weight(w) = &mut node.op {
            w.ty.dtype = dtype;
        }
        node.outputs[0].dtype = dtype;
    }
    changed.len()
}

/// Values converted to f32 and quantized at a time by [`quantize_tensor`]
/// (whole rows of them): 16 MiB of f32, however large the tensor.
const QUANTIZE_CHUNK_VALUES: u64 = 4 << 20;

/// The blocks of `dtype` (a type [`TensorType::quantize`] writes, or Q4_0
/// for [`Rounding::SymmetricInt4`]) of the float tensor `view`, or why not.
/// The tensor is converted to f32 and quantized a few rows at a time (the
/// blocks never cross a row, so the blocks are those of the whole), so a
/// 1 GB bf16 embedding does not take 2 GB of f32 on top of itself.
pub fn quantize_tensor(
    view: &TensorView<'_>,
    dtype: DType,
    rounding: Rounding,
) -> Result<Vec<u8>, String> {
    let ty = TensorType::from_name(dtype.name())
        .filter(|t| TensorType::QUANTIZABLE.contains(t))
        .ok_or_else(|| format!("gerbil does not quantize to {dtype}"))?;
    let source = TensorType::from_name(view.dtype.name())
        .filter(|_| view.dtype.is_float() && !view.dtype.is_quantized())
        .ok_or_else(|| format!("a {} tensor cannot be quantized", view.dtype))?;
    if rounding == Rounding::SymmetricInt4 && ty != TensorType::Q4_0 {
        return Err(format!(
            "symmetric int4 groups are stored as q4_0 blocks, not {dtype}"
        ));
    }
    let chunk_values = quantize_chunk_values(&view.shape, ty.block_len(), QUANTIZE_CHUNK_VALUES);
    quantize_chunks(view, source, ty, rounding, chunk_values)
}

/// [`quantize_tensor`] of `view`, stored as `source`, into `ty`,
/// `chunk_values` values at a time.
fn quantize_chunks(
    view: &TensorView<'_>,
    source: TensorType,
    ty: TensorType,
    rounding: Rounding,
    chunk_values: u64,
) -> Result<Vec<u8>, String> {
    use rayon::prelude::*;
    let elem = view.dtype.size_bytes();
    let mut blocks = Vec::new();
    let mut floats = Vec::new();
    // Blocks are quantized independently: pieces of whole blocks on every
    // core give the same bytes as one pass.
    let piece = (PARALLEL_PIECE_VALUES / ty.block_len()).max(1) * ty.block_len();
    for chunk in view.data.chunks((chunk_values * elem).max(1) as usize) {
        floats.resize(chunk.len() / elem as usize, 0f32);
        source.dequantize(chunk, &mut floats)?;
        let pieces: Vec<Vec<u8>> = floats
            .par_chunks(piece as usize)
            .map(|values| match rounding {
                Rounding::Ggml => ty.quantize(values),
                Rounding::SymmetricInt4 => symmetric_int4(values),
            })
            .collect::<Result<_, _>>()?;
        pieces.iter().for_each(|p| blocks.extend_from_slice(p));
    }
    Ok(blocks)
}

/// Values per piece quantized on one core (whole blocks of them).
const PARALLEL_PIECE_VALUES: u64 = 1 << 16;

/// Values per chunk of [`quantize_tensor`] for a tensor of `shape`: whole
/// rows, about `target` values of them, when a row is whole blocks of
/// `block_len` values; else the whole tensor, so that the error is the
/// whole tensor's.
fn quantize_chunk_values(shape: &[u64], block_len: u64, target: u64) -> u64 {
    let row = shape.last().copied().unwrap_or(1);
    let values = shape.iter().product::<u64>();
    if shape.len() < 2 || row == 0 || !row.is_multiple_of(block_len.max(1)) {
        return values;
    }
    (target / row).max(1) * row
}

/// [`Rounding::SymmetricInt4`]: `values` (whole groups of 32) as Q4_0 blocks.
fn symmetric_int4(values: &[f32]) -> Result<Vec<u8>, String> {
    if !values.len().is_multiple_of(32) {
        return Err(format!(
            "{} values are not whole groups of 32",
            values.len()
        ));
    }
    let mut out = Vec::with_capacity(values.len() / 32 * 18);
    for group in values.chunks_exact(32) {
        let max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(max / 7.0);
        let scale = d.to_f32();
        let nibble = |v: f32| {
            let q = if scale == 0.0 {
                0.0
            } else {
                (v / scale).round_ties_even()
            };
            (q.clamp(-7.0, 7.0) as i8 + 8) as u8
        };
        out.extend(d.to_le_bytes());
        let (lo, hi) = group.split_at(16);
        out.extend(
            lo.iter()
                .zip(hi)
                .map(|(&a, &b)| nibble(a) | (nibble(b) << 4)),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gerbil_ir::op::{Embedding, MatMul, Weight, WeightSource};
    use gerbil_ir::{Input, TensorType as IrType};

    fn weight(g: &mut Graph, name: &str, dims: &[u64]) -> ValueRef {
        let ty = IrType::fixed(DType::BF16, dims);
        let source = WeightSource::Checkpoint {
            tensor: name.into(),
        };
        g.add(Op::Weight(Weight { source, ty }), &[], name).unwrap()
    }

    #[test]
    fn matrices_get_the_scheme_and_the_lm_head_its_output_type() {
        let mut g = Graph::new("q");
        let ids = g.add(Op::Input(Input::TokenIds), &[], "ids").unwrap();
        let table = weight(&mut g, "embed", &[100, 64]);
        let up = weight(&mut g, "up", &[96, 64]);
        let odd = weight(&mut g, "odd", &[64, 40]);
        let norm = weight(&mut g, "norm", &[64]);
        let lookup = Op::Embedding(Embedding {
            scale: None,
            padding: None,
        });
        let x = g.add(lookup, &[table, ids], "embedding").unwrap();
        let mm = |bias| {
            Op::MatMul(MatMul {
                has_bias: bias,
                norm: None,
                last_row: false,
                residual: false,
                act: None,
            })
        };
        g.add(mm(false), &[x, up], "up_proj").unwrap();
        g.add(mm(false), &[x, table], "lm_head").unwrap();
        assert_eq!(retype(&mut g, Quantization::Q4_0), 2);
        let dtype = |v: ValueRef| g.value_type(v).dtype;
        assert_eq!(dtype(up), DType::Q4_0);
        // Tied: the embedding table is the LM head.
        assert_eq!(dtype(table), DType::Q8_0);
        // Unread, a vector, or rows that are no whole blocks: unchanged.
        assert_eq!(dtype(odd), DType::BF16);
        assert_eq!(dtype(norm), DType::BF16);
    }

    #[test]
    fn q4_k_m_follows_llama_cpp_s_rules() {
        let q = Quantization::Q4KM;
        assert_eq!(q.choose(Role::Other, 2048), Some(DType::Q4K));
        assert_eq!(q.choose(Role::MoreBits, 2048), Some(DType::Q6K));
        assert_eq!(q.choose(Role::FusedQkv, 3072), Some(DType::Q5K));
        assert_eq!(q.choose(Role::Output, 2048), Some(DType::Q6K));
        // Rows that are not whole super-blocks fall back as llama.cpp does.
        assert_eq!(q.choose(Role::Other, 576), Some(DType::Q5_0));
        assert_eq!(q.choose(Role::FusedQkv, 576), Some(DType::Q5_1));
        assert_eq!(q.choose(Role::Output, 576), Some(DType::Q8_0));
        assert_eq!(q.choose(Role::Other, 40), None);
        assert_eq!(
            Quantization::Q8_0.choose(Role::Output, 2048),
            Some(DType::Q8_0)
        );
        assert_eq!(
            Quantization::Q4_0.choose(Role::MoreBits, 2048),
            Some(DType::Q4_0)
        );
        // 16 layers: 0 and 1, 14 and 15, and every third from 2 on (4, 7, 10, 13).
        let more: Vec<u64> = (0..16).filter(|&i| more_bits(i, 16)).collect();
        assert_eq!(more, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(layer_of("model.layers.12.mlp.down_proj.weight"), Some(12));
        assert_eq!(Quantization::named("Q4_K_M"), Some(q));
        assert_eq!(q.name(), "q4_k_m");
    }

    #[test]
    fn float_tensors_quantize_and_others_are_refused() {
        let values: Vec<u8> = (0..64)
            .flat_map(|i| half::bf16::from_f32(i as f32 / 10.0).to_le_bytes())
            .collect();
        let view = TensorView {
            dtype: DType::BF16,
            shape: vec![2, 32],
            data: values.as_slice().into(),
        };
        let ggml = Rounding::Ggml;
        assert_eq!(quantize_tensor(&view, DType::Q8_0, ggml).unwrap().len(), 68);
        assert_eq!(quantize_tensor(&view, DType::Q4_1, ggml).unwrap().len(), 40);
        let blocks = TensorView {
            dtype: DType::Q8_0,
            ..view.clone()
        };
        assert!(quantize_tensor(&blocks, DType::Q4_0, ggml).is_err());
        let int4 = Rounding::SymmetricInt4;
        assert!(quantize_tensor(&view, DType::Q8_0, int4).is_err());
    }

    #[test]
    fn quantizing_a_few_rows_at_a_time_gives_the_blocks_of_the_whole() {
        let (rows, cols) = (7u64, 512u64);
        let values: Vec<u8> = (0..rows * cols)
            .flat_map(|i| {
                half::bf16::from_f32(((i * 7919) % 1013) as f32 / 97.0 - 5.0).to_le_bytes()
            })
            .collect();
        let view = TensorView {
            dtype: DType::BF16,
            shape: vec![rows, cols],
            data: values.as_slice().into(),
        };
        for (ty, rounding) in [
            (TensorType::Q4_K, Rounding::Ggml),
            (TensorType::Q6_K, Rounding::Ggml),
            (TensorType::Q4_0, Rounding::SymmetricInt4),
        ] {
            let whole = quantize_chunks(&view, TensorType::BF16, ty, rounding, rows * cols);
            for target in [1, cols, 3 * cols + 5] {
                let chunk = quantize_chunk_values(&view.shape, ty.block_len(), target);
                assert_eq!(chunk % cols, 0, "{ty:?}: whole rows");
                let chunked = quantize_chunks(&view, TensorType::BF16, ty, rounding, chunk);
                assert_eq!(chunked, whole, "{ty:?} by {chunk} values");
            }
        }
        // Rows that are not whole blocks are quantized (and refused) whole.
        assert_eq!(quantize_chunk_values(&[4, 48], 32, 48), 192);
        assert_eq!(quantize_chunk_values(&[4096], 32, 64), 4096);
    }

    #[test]
    fn symmetric_int4_groups_read_back_as_q4_0() {
        // A group with its largest magnitude negative, a tie at ±0.5 levels, and zeros.
        let mut values: Vec<f32> = (0..32).map(|i| (i as f32 - 13.0) * 0.37).collect();
        values[3] = -7.0; // d = 1: x = 2.5 rounds to 2 (ties to even), -7 to -7
        values[4] = 2.5;
        values[5] = 0.0;
        values.extend([0.0; 32]); // an all-zero group: d = 0, every value 0
        let blocks = symmetric_int4(&values).unwrap();
        assert_eq!(blocks.len(), 36);
        let mut back = vec![0f32; 64];
        TensorType::Q4_0.dequantize(&blocks, &mut back).unwrap();
        let d = half::f16::from_le_bytes([blocks[0], blocks[1]]).to_f32();
        assert_eq!(d, 1.0);
        assert_eq!(back[3], -7.0);
        assert_eq!(back[4], 2.0);
        assert_eq!(back[5], 0.0);
        for (b, v) in back.iter().zip(&values) {
            assert!((b - v).abs() <= d / 2.0 + 1e-6, "{b} vs {v}");
        }
        assert!(back[32..].iter().all(|&b| b == 0.0));
        // The spare level −8 is never used: every nibble is 1..=15.
        assert!(blocks[2..18].iter().all(|&b| b & 0x0f != 0 && b >> 4 != 0));
        assert!(symmetric_int4(&values[..31]).is_err());
        let scheme = Quantization::named("Q4F16_1").unwrap();
        assert_eq!(
            (scheme.name(), scheme.rounding()),
            ("q4f16_1", Rounding::SymmetricInt4)
        );
        assert_eq!(scheme.choose(Role::Output, 576), Some(DType::Q4_0));
    }
}
