//! `master-weights`: every f16 and bf16 weight becomes f32, the master copy
//! a training step reads and the optimizer steps.
//!
//! Pattern: a weight stored as a 16-bit float. Rewrite: the same weight
//! typed f32 (materializing widens it exactly: every f16 and bf16 value is
//! an f32). Quantized weights keep their blocks: they do not train. Part of
//! [`crate::training_passes`], before `autodiff`; an inference plan never
//! runs it (it would double the bytes every decode step reads).
//!
//! The surprise: in a graph with LoRA factors (the `lora` pass's
//! `WeightSource::Adapter` weights, f32 already) it changes nothing. The
//! checkpoint's weights are frozen there, and the kernels read 16-bit
//! weights exactly as they are, so keeping them halves their memory and
//! computes the same numbers.

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
        if crate::rewrite::has_adapters(graph) {
            return Ok(0);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dtypes(text: &str) -> (usize, Vec<DType>) {
        let mut g = gerbil_ir::parse(text).unwrap_or_else(|e| panic!("{e}"));
        let changed = MasterWeights.run(&mut g).unwrap_or_else(|e| panic!("{e}"));
        let mut types: Vec<DType> =
            g.g.node_weights()
                .filter_map(|n| match &n.op {
                    Op::Weight(w) => Some(w.ty.dtype),
                    _ => None,
                })
                .collect();
        types.sort_by_key(|d| d.to_string());
        (changed, types)
    }

    #[test]
    fn sixteen_bit_weights_widen_unless_an_adapter_trains_instead() {
        let base = "graph g\n  %w = weight \"w\" : bf16[4,8]\n  %h = weight \"h\" : f16[8]\n";
        let (changed, types) = dtypes(base);
        assert_eq!((changed, types), (2, vec![DType::F32, DType::F32]));
        let lora = format!("{base}  %a = weight adapter(\"a\") : f32[2,8]\n");
        let (changed, types) = dtypes(&lora);
        assert_eq!(changed, 0);
        assert_eq!(types, vec![DType::BF16, DType::F16, DType::F32]);
    }
}
