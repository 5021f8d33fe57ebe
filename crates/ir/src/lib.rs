//! gerbil's graph IR.
//!
//! A [`Graph`] is a petgraph `StableGraph` of typed [`Op`]s. Every node produces
//! one or more tensor values ([`TensorType`]: dtype plus a shape of [`Dim`]s that
//! may be symbolic: `T` tokens in this step, `Lmax` context capacity). Edges carry
//! values from an output port of one node to an input port of another.
//!
//! One graph serves both prefill and decode: `T` is bound per step by the runtime.
//! The [`verify`](mod@verify) module re-infers every type and is run after lowering and after
//! every pass; the [`print`](mod@print) module renders the deterministic text form
//! (`.gir`) used for `--dump-ir`, `gerbilc opt` and pass file tests, and
//! [`parse()`] reads it back.
//!
//! This crate knows nothing about HuggingFace, WGSL or wgpu.

pub mod dot;
pub mod graph;
pub mod op;
pub mod parse;
pub mod print;
pub mod rope_table;
pub mod train;
pub mod types;
pub mod verify;

pub use graph::{
    gradient_of, gradient_output, layer_prefix, without_layers, Edge, Graph, Node, NodeId,
    ValueRef, EMBEDDING, LOGITS, LOSS, NEXT_TOKEN,
};
pub use op::{
    Attention, BinaryOp, Embedding, Input, LayerNorm, MatMul, MatMulGlu, MatMulPorts, NormPrologue,
    Op, Pooling, QkNorm, QkvRope, RmsNorm, Rope, UnaryOp, Weight, WeightSource,
};
pub use parse::{parse, ParseError};
pub use train::TrainOp;
pub use types::{DType, Dim, Sym, TensorType, QUANTIZED};
pub use verify::{verify, VerifyError};
