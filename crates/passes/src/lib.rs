//! gerbil's compiler passes.
//!
//! A [`PassManager`] runs named graph-to-graph passes in order, verifies the
//! graph after each one (`gerbil_ir::verify`), can skip passes by name
//! (`gerbilc compile --disable-pass NAME`) and hands the graph to a callback
//! after each pass so the CLI can dump it (`--dump-ir after=NAME`).
//!
//! Passes that only make the plan faster or smaller are optional. Buffer
//! placement is not a graph pass: it needs the schedule, so it lives in
//! codegen (`gerbil_codegen_wgsl::planner`, reported as the `plan-buffers`
//! stage).

pub mod autodiff;
pub mod dce;
pub mod fuse_gate_up;
pub mod fuse_glu;
pub mod fuse_last_row_matmul;
pub mod fuse_matmul_act;
pub mod fuse_matmul_bias;
pub mod fuse_matmul_residual;
pub mod fuse_norm_add;
pub mod fuse_norm_matmul;
pub mod fuse_qkv;
pub mod fuse_qkv_rope;
pub mod fuse_residual_norm;
pub mod lora;
pub mod manager;
pub mod master_weights;
mod rewrite;
pub mod slice_last_row;

pub use manager::{default_pipeline, training_passes, Pass, PassError, PassManager, PassReport};
