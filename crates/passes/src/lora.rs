//! `lora`: gives chosen projections a low-rank update that trains while
//! the rest of the model stays frozen (LoRA).
//!
//! Pattern: a `matmul(x, W[, bias])` whose weight is a whole checkpoint
//! tensor named in [`Lora::adapted`]. Rewrite: the same matmul plus
//! `scale(matmul(matmul(x, A), B))` — `A` (`[r, in]`) and `B` (`[out, r]`)
//! weights of source [`WeightSource::Adapter`], named as PEFT names them
//! (`gerbil_frontend_hf::adapter::factor_names` makes the names; this
//! pass takes them as given) — so every reader of the projection reads
//! `x·Wᵀ + s·(x·Aᵀ)·Bᵀ`. `autodiff` then trains the adapter weights alone.
//! Part of the training pipeline when `gerbil-train --lora` runs, before
//! `master-weights`; it is not in [`crate::default_pipeline`] (inference
//! takes an adapter merged into the weights, at no cost per token).
//!
//! The surprise: a projection gerbil reads as rows of a fused tensor (Phi-3's
//! `qkv_proj`) is not a whole-tensor matmul, so naming it is an error that
//! says so rather than an adapter that silently covers nothing.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, remove_if_dead};
use gerbil_ir::{
    BinaryOp, DType, Dim, Graph, Op, TensorType, UnaryOp, ValueRef, Weight, WeightSource,
};
use std::collections::BTreeMap;

/// The adapter to add; see the module docs.
pub struct Lora {
    /// Each adapted checkpoint tensor with the names of its `A` and `B`.
    pub adapted: BTreeMap<String, (String, String)>,
    /// The rank `r`.
    pub rank: u32,
    /// The update's factor, `alpha / r`.
    pub scale: f32,
}

const NAME: &str = "lora";

fn refuse(reason: String) -> PassError {
    PassError::Rewrite {
        pass: NAME.into(),
        reason,
    }
}

impl Lora {
    /// The checkpoint tensor a plain matmul multiplies by, when it is one
    /// this adapter covers.
    fn target(&self, graph: &Graph, w: ValueRef) -> Option<String> {
        let Op::Weight(Weight {
            source: WeightSource::Checkpoint { tensor },
            ..
        }) = &graph.node(w.node).op
        else {
            return None;
        };
        self.adapted.contains_key(tensor).then(|| tensor.clone())
    }
}

impl Pass for Lora {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "add a trained low-rank update B·A beside chosen projections (LoRA)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph
            .topo_order()
            .ok_or_else(|| refuse("the graph has a cycle".into()))?;
        // Each tensor's factors, made once even when several matmuls read it.
        let mut factors: BTreeMap<String, (ValueRef, ValueRef)> = BTreeMap::new();
        let mut rewrites = 0;
        for id in order {
            let node = graph.node(id).clone();
            let Op::MatMul(m) = &node.op else { continue };
            let ins = graph.inputs(id);
            let Some(tensor) = self.target(graph, ins[1]) else {
                continue;
            };
            if m.norm.is_some() || m.residual || m.last_row || m.act.is_some() {
                return Err(refuse(format!(
                    "`{}` is a fused matmul; run lora on the graph as lowered",
                    node.label
                )));
            }
            let wty = graph.value_type(ins[1]).clone();
            let (Some(out), Some(inp)) = (wty.shape[0].as_const(), wty.shape[1].as_const()) else {
                return Err(refuse(format!("`{tensor}` has no constant shape")));
            };
            let r = u64::from(self.rank);
            let (a, b) = match factors.get(&tensor) {
                Some(&pair) => pair,
                None => {
                    let (a_name, b_name) = &self.adapted[&tensor];
                    let mut factor = |name: &str, shape: [u64; 2]| {
                        let ty = TensorType::new(DType::F32, shape.map(Dim::Const));
                        let source = WeightSource::Adapter {
                            tensor: name.to_string(),
                        };
                        let op = Op::Weight(Weight { source, ty });
                        graph.add(op, &[], name).map_err(add_err(NAME))
                    };
                    let pair = (factor(a_name, [r, inp])?, factor(b_name, [out, r])?);
                    factors.insert(tensor.clone(), pair);
                    pair
                }
            };
            let label = |what: &str| format!("{}.lora{what}", node.label);
            let base = graph
                .add(node.op.clone(), &ins, node.label.clone())
                .map_err(add_err(NAME))?;
            let plain = Op::MatMul(gerbil_ir::MatMul {
                has_bias: false,
                norm: None,
                last_row: false,
                residual: false,
                act: None,
            });
            let down = graph
                .add(plain.clone(), &[ins[0], a], label("_a"))
                .map_err(add_err(NAME))?;
            let mut up = graph
                .add(plain, &[down, b], label("_b"))
                .map_err(add_err(NAME))?;
            if self.scale != 1.0 {
                let op = Op::Unary(UnaryOp::Scale(self.scale));
                up = graph
                    .add(op, &[up], label("_scale"))
                    .map_err(add_err(NAME))?;
            }
            let sum = graph
                .add(Op::Binary(BinaryOp::Add), &[base, up], label(""))
                .map_err(add_err(NAME))?;
            graph.replace_all_uses(ValueRef::of(id), sum);
            remove_if_dead(graph, id);
            rewrites += 1;
        }
        if let Some(missed) = self.adapted.keys().find(|t| !factors.contains_key(*t)) {
            return Err(refuse(format!(
                "`{missed}` is not a projection the model multiplies by as a whole tensor (a \
                 fused projection gerbil reads in rows, like Phi-3's qkv_proj, cannot take an \
                 adapter); choose other --lora-targets"
            )));
        }
        Ok(rewrites)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> Graph {
        let text = "graph g\n  %ids = input.token_ids : u32[T]\n  \
                    %e = weight \"e\" : f32[16,8]\n  \
                    %q = weight \"l.q_proj.weight\" : f32[6,8]\n  \
                    %x = embedding(%e, %ids) : f32[T,8]\n  \
                    %y = matmul(%x, %q) : f32[T,6]\n  \
                    %z = matmul(%x, %q) : f32[T,6]\n  \
                    %s = add(%y, %z) : f32[T,6]\n  output hidden = %s\n";
        gerbil_ir::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn lora(tensor: &str, scale: f32) -> Lora {
        let adapted = [(tensor.to_string(), ("A".to_string(), "B".to_string()))].into();
        Lora {
            adapted,
            rank: 2,
            scale,
        }
    }

    #[test]
    fn each_reader_of_the_projection_reads_the_update_over_one_pair_of_factors() {
        let mut g = graph();
        let n = lora("l.q_proj.weight", 0.5)
            .run(&mut g)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n, 2);
        gerbil_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{e}"));
        let text = gerbil_ir::print::print(&g);
        assert_eq!(
            text.matches("adapter(\"A\") : f32[2,8]").count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.matches("adapter(\"B\") : f32[6,2]").count(),
            1,
            "{text}"
        );
        assert_eq!(text.matches("scale{by=0.5}").count(), 2, "{text}");
        // `s` adds the two updated projections.
        let s = g.outputs[0].1;
        for v in g.inputs(s.node) {
            assert_eq!(g.node(v.node).op, Op::Binary(BinaryOp::Add), "{text}");
        }
    }

    #[test]
    fn a_target_no_whole_matmul_reads_is_refused() {
        let mut g = graph();
        let err = lora("l.qkv_proj.weight", 1.0)
            .run(&mut g)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("`l.qkv_proj.weight` is not a projection"),
            "{err}"
        );
        assert!(err.contains("--lora-targets"), "{err}");
    }
}
