//! A CPU interpreter of a `gerbil_ir::Graph`, in f64, built on the op
//! references of [`crate::reference`]: the GPU-free oracle of the
//! pass-equivalence and model tests, and of a plan's self-test.
//!
//! [`Interpreter::new`] materializes every weight from its `WeightSource`
//! through [`Weights`] (the compiler's own materialization in practice, so a
//! RoPE table is the very table a plan holds) and decodes it to f64 once;
//! [`Interpreter::streaming`] instead materializes each weight when a step
//! reaches it and drops it after its last use, so a step holds one weight
//! and the live activations, not the model in f64 (eight times its bf16
//! bytes). Either zeroes one `[max_context, width]` buffer per KV cache.
//! [`Interpreter::step`] runs one step of `T` tokens at positions `P..P+T`,
//! like one runtime step, and returns every graph output; the caches keep
//! their rows across steps, so a prompt may run in chunks followed by
//! one-token decode steps. [`Interpreter::reset`] starts over at position 0.
//!
//! The surprise: in-place writes (`cache_write`, `qkv_rope`'s caches) produce
//! a new value in the graph, and the interpreter stores it back into the
//! cache it aliases (`Op::aliased_input`, followed to the `kv_cache` source),
//! which is what sharing the buffer does on the GPU.

use crate::gradient as grad;
use crate::reference as r;
use gerbil_ir::{
    BinaryOp, DType, Graph, Input, NodeId, Op, TensorType, TrainOp, ValueRef, WeightSource,
};
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

/// Where the interpreter gets a weight's bytes.
pub trait Weights {
    /// The bytes of `source` stored as `dtype` (ggml blocks for a quantized
    /// one, in ggml's order) with `rows` leading rows (a table of `Lmax`
    /// rows is made for the interpreter's context).
    fn weight_bytes(
        &self,
        source: &WeightSource,
        dtype: DType,
        rows: u64,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>;
}

/// Why the interpreter could not run a graph.
#[derive(Debug)]
pub enum InterpretError {
    /// The graph has a cycle, so it has no evaluation order.
    Cycle,
    /// A weight's bytes could not be materialized.
    Weight {
        /// The weight node's label.
        label: String,
        /// Why not.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A weight of a dtype that is not a float.
    WeightDType {
        /// The weight node's label.
        label: String,
        /// Its dtype.
        dtype: DType,
    },
    /// A step with no tokens.
    EmptyStep,
    /// A training graph (one with `input.target_ids`) run without targets,
    /// or a number of targets that is not the number of tokens.
    Targets {
        /// Tokens of the step.
        tokens: usize,
        /// Targets given (`None`: [`Interpreter::step`], which has none).
        targets: Option<usize>,
    },
    /// A target that is no column of the logits.
    TargetOutOfRange {
        /// The target.
        target: u32,
        /// Columns of the logits.
        vocab: usize,
    },
    /// The step would write past the KV caches.
    ContextFull {
        /// Tokens already cached.
        position: usize,
        /// Tokens of this step.
        tokens: usize,
        /// The caches' capacity.
        max_context: usize,
    },
}

impl fmt::Display for InterpretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InterpretError::Cycle => f.write_str("the graph has a cycle; run the verifier on it"),
            InterpretError::Weight { label, source } => {
                write!(f, "weight `{label}` cannot be materialized: {source}")
            }
            InterpretError::WeightDType { label, dtype } => {
                write!(
                    f,
                    "weight `{label}` is {dtype}; weights must be f32, f16 or bf16"
                )
            }
            InterpretError::EmptyStep => f.write_str("a step needs at least one token"),
            InterpretError::Targets { targets: None, .. } => f.write_str(
                "the graph reads next-token targets (a training graph); run it with train_step",
            ),
            InterpretError::Targets {
                tokens,
                targets: Some(targets),
            } => write!(
                f,
                "{targets} targets for {tokens} tokens; a training step takes one target per token"
            ),
            InterpretError::TargetOutOfRange { target, vocab } => write!(
                f,
                "target {target} is past the vocabulary of {vocab}; targets are token ids of \
                 the model's tokenizer"
            ),
            InterpretError::ContextFull {
                position,
                tokens,
                max_context,
            } => write!(
                f,
                "{tokens} tokens at position {position} exceed the context of {max_context}; \
                 interpret with a larger max_context or call reset"
            ),
        }
    }
}

impl std::error::Error for InterpretError {}

/// A row-major f64 matrix: one value of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Columns.
    pub width: usize,
    /// `rows · width` values.
    pub data: Vec<f64>,
}

impl Tensor {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// The last row (what the runtime reads back as a step's logits); empty
    /// when there is none.
    pub fn last_row(&self) -> &[f64] {
        match self.rows() {
            0 => &[],
            n => self.row(n - 1),
        }
    }
}

/// Runs a graph step by step on the CPU; see the module docs.
pub struct Interpreter<'g> {
    graph: &'g Graph,
    order: Vec<NodeId>,
    /// Every weight decoded, or none ([`Interpreter::streaming`]: each is
    /// made from `source` when a step needs it).
    weights: HashMap<NodeId, Rc<Vec<f64>>>,
    source: Option<&'g dyn Weights>,
    caches: HashMap<NodeId, Rc<Vec<f64>>>,
    /// The position in `order` of each value's last reader; graph outputs
    /// and cache writes live to the end of the step.
    last_use: HashMap<ValueRef, usize>,
    /// Each value written into a KV cache in place, and that cache.
    cache_writes: Vec<(ValueRef, NodeId)>,
    max_context: usize,
    position: usize,
}

/// The width (last, constant dimension) of a value's type.
fn width(ty: &TensorType) -> usize {
    ty.last_const().unwrap_or(1) as usize
}

/// Little-endian values of `dtype` (ggml blocks for a quantized one),
/// widened exactly to f64.
fn decode(bytes: &[u8], dtype: DType) -> Option<Vec<f64>> {
    use rayon::prelude::*;
    let pairs = || {
        bytes
            .par_chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    Some(match dtype {
        DType::F32 => bytes
            .par_chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        DType::BF16 => pairs().map(|b| half::bf16::from_bits(b).to_f64()).collect(),
        DType::F16 => pairs().map(|b| half::f16::from_bits(b).to_f64()).collect(),
        DType::U32 => return None,
        _ => {
            let ty = gerbil_gguf::TensorType::from_name(dtype.name())?;
            let values = bytes.len() as u64 / dtype.block().1 * dtype.block().0;
            let mut out = vec![0f32; values as usize];
            ty.dequantize(bytes, &mut out).ok()?;
            out.into_iter().map(f64::from).collect()
        }
    })
}

impl<'g> Interpreter<'g> {
    /// Prepares `graph` with every weight from `weights`, decoded once, and
    /// KV caches of `max_context` rows (also the RoPE tables' row count).
    pub fn new(
        graph: &'g Graph,
        weights: &dyn Weights,
        max_context: usize,
    ) -> Result<Self, InterpretError> {
        let mut it = Self::prepare(graph, None, max_context)?;
        for &id in &it.order {
            let node = graph.node(id);
            if let Op::Weight(w) = &node.op {
                let values = weight_values(&node.label, w, Some(weights), max_context)?;
                it.weights.insert(id, Rc::new(values));
            }
        }
        Ok(it)
    }

    /// As [`Interpreter::new`], but each weight is made from `weights` when a
    /// step reaches it and dropped after its last reader: for one step of a
    /// large model (a plan's self-test), at the cost of making every weight
    /// again in each step.
    pub fn streaming(
        graph: &'g Graph,
        weights: &'g dyn Weights,
        max_context: usize,
    ) -> Result<Self, InterpretError> {
        Self::prepare(graph, Some(weights), max_context)
    }

    fn prepare(
        graph: &'g Graph,
        source: Option<&'g dyn Weights>,
        max_context: usize,
    ) -> Result<Self, InterpretError> {
        let order = graph.topo_order().ok_or(InterpretError::Cycle)?;
        let mut caches = HashMap::new();
        let mut last_use = HashMap::new();
        for (i, &id) in order.iter().enumerate() {
            if let Op::KvCache { width, .. } = graph.node(id).op {
                caches.insert(id, Rc::new(vec![0.0; max_context * width as usize]));
            }
            for v in graph.inputs(id) {
                last_use.insert(v, i);
            }
        }
        let cache_writes: Vec<(ValueRef, NodeId)> = order
            .iter()
            .flat_map(|&id| {
                (0..graph.node(id).outputs.len() as u32)
                    .map(move |port| ValueRef { node: id, port })
            })
            .filter_map(|v| aliased_cache(graph, v).map(|cache| (v, cache)))
            .collect();
        // Outputs are read at the end, and cache writes are kept.
        for v in graph
            .outputs
            .iter()
            .map(|(_, v)| *v)
            .chain(cache_writes.iter().map(|w| w.0))
        {
            last_use.insert(v, usize::MAX);
        }
        Ok(Interpreter {
            graph,
            order,
            weights: HashMap::new(),
            source,
            caches,
            last_use,
            cache_writes,
            max_context,
            position: 0,
        })
    }

    /// Tokens cached so far (`P` of the next step).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Forgets the cached tokens: the next step runs at position 0.
    pub fn reset(&mut self) {
        self.position = 0;
        for cache in self.caches.values_mut() {
            *cache = Rc::new(vec![0.0; cache.len()]);
        }
    }

    /// Runs one step of `tokens` at positions `P..P+T` and returns the graph's
    /// outputs, in the graph's order.
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<Tensor>, InterpretError> {
        self.run(tokens, None)
    }

    /// Runs a training graph (the `autodiff` pass's) on one sequence:
    /// `tokens` at positions `0..T` with next-token `targets`, one per
    /// token, and returns its outputs (the loss, then the gradients). The
    /// caches start and end empty, so steps are independent.
    pub fn train_step(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<Vec<Tensor>, InterpretError> {
        if targets.len() != tokens.len() {
            return Err(InterpretError::Targets {
                tokens: tokens.len(),
                targets: Some(targets.len()),
            });
        }
        let g = self.graph;
        let vocab = self.order.iter().find_map(|&id| match g.node(id).op {
            Op::Train(TrainOp::CrossEntropy | TrainOp::CrossEntropyGrad) => {
                Some(width(g.value_type(g.inputs(id)[0])))
            }
            _ => None,
        });
        if let Some((vocab, &target)) =
            vocab.and_then(|v| targets.iter().find(|&&t| t as usize >= v).map(|t| (v, t)))
        {
            return Err(InterpretError::TargetOutOfRange { target, vocab });
        }
        self.reset();
        let out = self.run(tokens, Some(targets));
        self.reset();
        out
    }

    /// The values of the weight labelled `label`, to change in place (a
    /// finite-difference check, an optimizer step); `None` when no weight
    /// has that label or the interpreter is [`Interpreter::streaming`].
    pub fn weight_mut(&mut self, label: &str) -> Option<&mut Vec<f64>> {
        let g = self.graph;
        let id = self
            .order
            .iter()
            .copied()
            .find(|&id| matches!(g.node(id).op, Op::Weight(_)) && g.node(id).label == label)?;
        self.weights.get_mut(&id).map(Rc::make_mut)
    }

    fn run(
        &mut self,
        tokens: &[u32],
        targets: Option<&[u32]>,
    ) -> Result<Vec<Tensor>, InterpretError> {
        let (p, t) = (self.position, tokens.len());
        if t == 0 {
            return Err(InterpretError::EmptyStep);
        }
        if p + t > self.max_context {
            return Err(InterpretError::ContextFull {
                position: p,
                tokens: t,
                max_context: self.max_context,
            });
        }
        let g = self.graph;
        let mut values: HashMap<ValueRef, Rc<Vec<f64>>> = HashMap::new();
        for (i, &id) in self.order.iter().enumerate() {
            let node = g.node(id);
            let inputs = g.inputs(id);
            let ins: Vec<&[f64]> = inputs.iter().map(|v| values[v].as_slice()).collect();
            let tys: Vec<&TensorType> = inputs.iter().map(|v| g.value_type(*v)).collect();
            let outs: Vec<Rc<Vec<f64>>> = match &node.op {
                Op::Input(input) => {
                    let ids = match (input, targets) {
                        (Input::TokenIds, _) => tokens,
                        (Input::TargetIds, Some(targets)) => targets,
                        (Input::TargetIds, None) => {
                            return Err(InterpretError::Targets {
                                tokens: t,
                                targets: None,
                            })
                        }
                    };
                    vec![Rc::new(ids.iter().map(|&i| f64::from(i)).collect())]
                }
                Op::Weight(w) => vec![match (self.weights.get(&id), self.source) {
                    (Some(values), _) => values.clone(),
                    (None, source) => {
                        Rc::new(weight_values(&node.label, w, source, self.max_context)?)
                    }
                }],
                Op::KvCache { .. } => vec![self.caches[&id].clone()],
                op => eval(op, &ins, &tys, p, t)
                    .into_iter()
                    .map(Rc::new)
                    .collect(),
            };
            for (port, out) in outs.into_iter().enumerate() {
                values.insert(
                    ValueRef {
                        node: id,
                        port: port as u32,
                    },
                    out,
                );
            }
            // Values no later node reads are dropped (weights too, when
            // streaming).
            for v in inputs {
                if self.last_use.get(&v) == Some(&i) {
                    values.remove(&v);
                }
            }
        }
        // In-place outputs become the new contents of the caches they alias.
        for (v, cache) in &self.cache_writes {
            self.caches.insert(*cache, values[v].clone());
        }
        self.position += t;
        Ok(g.outputs
            .iter()
            .map(|(_, v)| Tensor {
                width: width(g.value_type(*v)),
                data: values[v].to_vec(),
            })
            .collect())
    }
}

/// The KV cache that value `v` of `graph` is written into in place, if any.
fn aliased_cache(graph: &Graph, v: ValueRef) -> Option<NodeId> {
    let input = graph.node(v.node).op.aliased_input(v.port)?;
    let src = *graph.inputs(v.node).get(input)?;
    match graph.node(src.node).op {
        Op::KvCache { .. } => Some(src.node),
        _ => aliased_cache(graph, src),
    }
}

/// Token ids carried as f64 (exact for every u32).
fn ids(v: &[f64]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

/// One compute op on its inputs (types in `tys`), in a step of `t` tokens
/// at position offset `p`.
fn eval(op: &Op, ins: &[&[f64]], tys: &[&TensorType], p: usize, t: usize) -> Vec<Vec<f64>> {
    match op {
        Op::Train(train) => eval_train(train, ins, tys, p, t),
        Op::Embedding(e) => vec![r::embedding(ins[0], width(tys[0]), &ids(ins[1]), e)],
        Op::RmsNorm(n) => vec![r::rms_norm(ins[0], ins[1], n)],
        Op::MatMul(m) => {
            let ports = m.ports();
            let last;
            let x = if m.last_row {
                last = r::slice_last_row(ins[0], width(tys[0]));
                &last
            } else {
                ins[0]
            };
            vec![r::fused_matmul(
                x,
                width(tys[0]),
                ins[1],
                ports.bias.map(|i| ins[i]),
                m.norm.zip(ports.norm).map(|(n, i)| (ins[i], n)),
                m.act,
                ports.residual.map(|i| ins[i]),
            )]
        }
        Op::Rope(spec) => vec![r::rope(ins[0], ins[1], spec, p)],
        Op::CacheWrite => vec![r::cache_write(ins[0], ins[1], width(tys[0]), p)],
        Op::Attention(a) => vec![r::attention(ins[0], ins[1], ins[2], a, p)],
        Op::Unary(u) => vec![r::unary(*u, ins[0])],
        Op::Binary(b) => vec![r::binary(*b, ins[0], ins[1])],
        Op::SliceLastRow => vec![r::slice_last_row(ins[0], width(tys[0]))],
        Op::SampleToken => vec![vec![f64::from(r::argmax(&r::slice_last_row(
            ins[0],
            width(tys[0]),
        )))]],
        Op::AddBias => vec![r::add_bias(ins[0], ins[1])],
        Op::SliceCols { start, len } => vec![r::slice_cols(
            ins[0],
            width(tys[0]),
            *start as usize,
            *len as usize,
        )],
        Op::AddRmsNorm(n) => {
            let (sum, normed) = r::add_rms_norm(ins[0], ins[1], ins[2], n);
            vec![sum, normed]
        }
        Op::RmsNormAdd(n) => vec![r::binary(
            BinaryOp::Add,
            ins[2],
            &r::rms_norm(ins[0], ins[1], n),
        )],
        Op::AddRmsNormLastRow(n) => {
            let (sum, normed) = r::add_rms_norm_last_row(ins[0], ins[1], ins[2], n);
            vec![sum, normed]
        }
        Op::EmbeddingRmsNorm(e, n) => {
            let (x, normed) = r::embedding_rms_norm(ins[0], &ids(ins[1]), e, ins[2], n);
            vec![x, normed]
        }
        Op::MatMulGlu(m) => {
            let ports = m.ports();
            vec![r::fused_matmul_glu(
                ins[0],
                width(tys[0]),
                ins[1],
                ports.bias.map(|i| ins[i]),
                m.norm.zip(ports.norm).map(|(n, i)| (ins[i], n)),
                m.act,
            )]
        }
        Op::QkvRope(q) => {
            let norms = q.qk_norm.map(|_| (ins[4], ins[5]));
            let out = r::qkv_rope(ins[0], ins[1], ins[2], ins[3], q, norms, p);
            vec![out.q, out.k_cache, out.v_cache]
        }
        Op::LayerNorm(n) => vec![r::layer_norm(ins[0], ins[1], ins[2], n.eps)],
        Op::AddPositions => vec![r::add_positions(ins[0], ins[1], width(tys[0]), p)],
        Op::Pool(k) => vec![r::pool(ins[0], width(tys[0]), *k)],
        Op::L2Normalize => vec![r::l2_normalize(ins[0], width(tys[0]))],
        Op::Input(_) | Op::Weight(_) | Op::KvCache { .. } => {
            unreachable!("sources are read from the interpreter's state")
        }
    }
}

/// One training op, as [`eval`].
fn eval_train(
    op: &TrainOp,
    ins: &[&[f64]],
    tys: &[&TensorType],
    p: usize,
    t: usize,
) -> Vec<Vec<f64>> {
    match op {
        TrainOp::CrossEntropy => {
            vec![vec![
                grad::cross_entropy(ins[0], width(tys[0]), &ids(ins[1])).0,
            ]]
        }
        TrainOp::CrossEntropyGrad => {
            vec![grad::cross_entropy(ins[0], width(tys[0]), &ids(ins[1])).1]
        }
        TrainOp::MatMulGradX => vec![grad::matmul_dx(ins[0], width(tys[0]), ins[1])],
        TrainOp::MatMulGradW => vec![grad::matmul_dw(ins[0], width(tys[0]), ins[1])],
        TrainOp::SumRows => vec![grad::sum_rows(ins[0], width(tys[0]))],
        TrainOp::RmsNormGrad(n) => {
            let (dx, dw) = grad::rms_norm(ins[0], ins[1], n, ins[2]);
            vec![dx, dw]
        }
        TrainOp::RopeGrad(spec) => vec![grad::rope(ins[0], ins[1], spec, p)],
        TrainOp::CacheRows => {
            let w = width(tys[0]);
            vec![ins[0][p * w..(p + t) * w].to_vec()]
        }
        TrainOp::AttentionLse(a) => vec![grad::attention_lse(ins[0], ins[1], a, p)],
        TrainOp::AttentionGrad(a) => {
            let (dq, dk, dv) = grad::attention(ins[0], ins[1], ins[2], a, p, ins[3]);
            vec![dq, dk, dv]
        }
        TrainOp::UnaryGrad(u) => vec![grad::unary(*u, ins[0], ins[1])],
        TrainOp::EmbeddingGrad { embedding, rows } => vec![grad::embedding(
            &ids(ins[0]),
            width(tys[1]),
            *rows as usize,
            embedding,
            ins[1],
        )],
    }
}

/// The f64 values of weight `w` (called `label`), made by `weights` with
/// the rows its type gives at `max_context`.
fn weight_values(
    label: &str,
    w: &gerbil_ir::Weight,
    weights: Option<&dyn Weights>,
    max_context: usize,
) -> Result<Vec<f64>, InterpretError> {
    let failed = |source| InterpretError::Weight {
        label: label.to_string(),
        source,
    };
    let weights = weights.ok_or_else(|| failed("no source of weights was given".into()))?;
    let rows =
        w.ty.shape
            .first()
            .map_or(1, |d| d.resolve(0, max_context as u64));
    let bytes = weights
        .weight_bytes(&w.source, w.ty.dtype, rows)
        .map_err(failed)?;
    decode(&bytes, w.ty.dtype).ok_or_else(|| InterpretError::WeightDType {
        label: label.to_string(),
        dtype: w.ty.dtype,
    })
}
