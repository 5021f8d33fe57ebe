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
//! and every third layer between (Q6_K), and a fused `qkv_proj` (Q5_K). A
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
    pub const NAMES: [&'static str; 6] = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"];

    /// The scheme called `name` (any case).
    pub fn named(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q5_0" => Self::Q5_0,
            "q5_1" => Self::Q5_1,
            "q4_k_m" => Self::Q4KM,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4KM => "q4_k_m",
            other => other.base().name(),
        }
    }

    /// The block type of its ordinary matrices.
    pub fn base(self) -> DType {
        match self {
            Self::Q8_0 => DType::Q8_0,
            Self::Q4_0 => DType::Q4_0,
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
        WeightSource::Concat { .. } | WeightSource::RopeTable { .. } => None,
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

/// The blocks of `dtype` (a type [`TensorType::quantize`] writes) of the
/// float tensor `view`, or why not.
pub fn quantize_tensor(view: &TensorView<'_>, dtype: DType) -> Result<Vec<u8>, String> {
    let ty = TensorType::from_name(dtype.name())
        .filter(|t| TensorType::QUANTIZABLE.contains(t))
        .ok_or_else(|| format!("gerbil does not quantize to {dtype}"))?;
    let source = TensorType::from_name(view.dtype.name())
        .filter(|_| view.dtype.is_float() && !view.dtype.is_quantized())
        .ok_or_else(|| format!("a {} tensor cannot be quantized", view.dtype))?;
    let values = view.data.len() as u64 / view.dtype.size_bytes();
    let mut floats = vec![0f32; values as usize];
    source.dequantize(view.data, &mut floats)?;
    ty.quantize(&floats)
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
        let lookup = Op::Embedding(Embedding { scale: None });
        let x = g.add(lookup, &[table, ids], "embedding").unwrap();
        let mm = |bias| {
            Op::MatMul(MatMul {
                has_bias: bias,
                norm: None,
                last_row: false,
                residual: false,
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
            data: &values,
        };
        assert_eq!(quantize_tensor(&view, DType::Q8_0).unwrap().len(), 68);
        assert_eq!(quantize_tensor(&view, DType::Q4_1).unwrap().len(), 40);
        let blocks = TensorView {
            dtype: DType::Q8_0,
            ..view.clone()
        };
        assert!(quantize_tensor(&blocks, DType::Q4_0).is_err());
    }
}
