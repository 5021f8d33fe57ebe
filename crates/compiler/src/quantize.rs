//! `--quantize`: which weights a [`Quantization`] scheme stores in which
//! ggml block type, and the quantization of a float tensor into it.
//!
//! [`retype`] runs on the lowered graph, before the passes: every float
//! matrix read as a matmul weight or an embedding table, whose rows are
//! whole blocks, gets the scheme's block type, and the LM head — the matrix
//! a matmul reads with as many rows as the embedding table, so a tied
//! embedding too — gets the scheme's output type. Tensors already quantized
//! (a GGUF's) keep their blocks. Nothing is quantized here: the graph only
//! says what each weight buffer holds, and [`quantize_tensor`] makes the
//! blocks when the plan's weights are materialized, one tensor at a time.
//!
//! The surprise is the LM head. llama.cpp gives it Q6_K where its width is a
//! whole number of 256-value super-blocks and Q8_0 otherwise, whatever the
//! scheme; gerbil has no Q6_K quantizer yet, so it is Q8_0 here for every
//! 4- and 5-bit scheme: the LM head decides most of what quantization costs
//! in quality, and it is one matrix of many.

use gerbil_frontend_hf::TensorView;
use gerbil_gguf::TensorType;
use gerbil_ir::{DType, Graph, Op, ValueRef};

/// A quantization scheme `gerbilc compile --quantize` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantization {
    /// Every matrix Q8_0.
    Q8_0,
    /// Matrices Q4_0, the LM head Q8_0.
    Q4_0,
    /// Matrices Q4_1, the LM head Q8_0.
    Q4_1,
    /// Matrices Q5_0, the LM head Q8_0.
    Q5_0,
    /// Matrices Q5_1, the LM head Q8_0.
    Q5_1,
}

impl Quantization {
    /// Every scheme's name, as `--quantize` takes it.
    pub const NAMES: [&'static str; 5] = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"];

    /// The scheme called `name` (any case).
    pub fn named(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q5_0" => Self::Q5_0,
            "q5_1" => Self::Q5_1,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        self.matrices().name()
    }

    /// The block type of its matrices.
    pub fn matrices(self) -> DType {
        match self {
            Self::Q8_0 => DType::Q8_0,
            Self::Q4_0 => DType::Q4_0,
            Self::Q4_1 => DType::Q4_1,
            Self::Q5_0 => DType::Q5_0,
            Self::Q5_1 => DType::Q5_1,
        }
    }

    /// The block type of its LM head (see the module documentation).
    pub fn output(self) -> DType {
        DType::Q8_0
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
    let mut changed = Vec::new();
    for id in graph.g.node_indices() {
        let Op::Weight(w) = &graph.node(id).op else {
            continue;
        };
        let (per, _) = scheme.matrices().block();
        let dims: Vec<Option<u64>> = w.ty.shape.iter().map(|d| d.as_const()).collect();
        let [Some(rows), Some(k)] = dims[..] else {
            continue;
        };
        if !w.ty.dtype.is_float() || w.ty.dtype.is_quantized() || !k.is_multiple_of(per) {
            continue;
        }
        let users = graph.users(ValueRef::of(id));
        let read_as = |port, is: fn(&Op) -> bool| {
            users
                .iter()
                .any(|&(u, p)| p == port && is(&graph.node(u).op))
        };
        let matmul = read_as(1, |op| matches!(op, Op::MatMul(_)));
        let table = read_as(0, |op| matches!(op, Op::Embedding(_)));
        let only_those = users.iter().all(|&(u, p)| {
            matches!(
                (&graph.node(u).op, p),
                (Op::MatMul(_), 1) | (Op::Embedding(_), 0)
            )
        });
        if users.is_empty() || !only_those {
            continue;
        }
        let dtype = if matmul && Some(rows) == vocab {
            scheme.output()
        } else if matmul || table {
            scheme.matrices()
        } else {
            continue;
        };
        changed.push((id, dtype));
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
        assert!(quantize_tensor(&view, DType::Q4K)
            .unwrap_err()
            .contains("does not quantize to q4_k"));
        let blocks = TensorView {
            dtype: DType::Q8_0,
            ..view.clone()
        };
        assert!(quantize_tensor(&blocks, DType::Q4_0).is_err());
    }
}
