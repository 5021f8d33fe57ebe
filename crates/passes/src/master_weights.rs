//! `master-weights`: every f16 and bf16 weight becomes f32, the master copy
//! a training step reads and the optimizer steps.
//!
//! Pattern: a weight stored as a 16-bit float. Rewrite: the same weight
//! typed f32 (materializing widens it exactly: every f16 and bf16 value is
//! an f32). Quantized weights keep their blocks: they do not train. Part of
//! [`crate::training_passes`], before `autodiff`; an inference plan never
//! runs it (it would double the bytes every decode step reads).

use crate::manager::{Pass, PassError};
use gerbil_ir::{DType, Graph, Op};

/// Widens 16-bit float weights to f32.
pub struct MasterWeights;

impl Pass for MasterWeights {
    fn name(&self) -> &'static str {
        "master-weights"
    }

    fn description(&self) -> &'static str {
        "type every f16 and bf16 weight f32: the master copy training steps"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let mut changed = 0;
        for id in graph.g.node_indices().collect::<Vec<_>>() {
            let node = &mut graph.g[id];
            let Op::Weight(w) = &mut node.op else {
                continue;
            };
            if matches!(w.ty.dtype, DType::F16 | DType::BF16) {
                w.ty.dtype = DType::F32;
                node.outputs[0].dtype = DType::F32;
                changed += 1;
            }
        }
        Ok(changed)
    }
}
