//! Fusions a schedule makes that the IR does not express: two nodes run as
//! one dispatch in some phases only.
//!
//! [`RopeAttention`] finds each `qkv_rope` whose outputs only its attention
//! reads. In a decode step of a GPU variant the attention kernel rotates
//! the queries and stores the new key and value itself
//! ([`kernel_with_rope`](crate::kernels::attention_decode::kernel_with_rope)),
//! so the schedule skips the `qkv_rope` dispatch: one dependent dispatch and
//! one round trip of the queries fewer per layer and token. Prefill keeps
//! both (its flash attention reads keys the whole step writes first), so
//! does a batch step (a prompt's tokens can be several of its rows, each
//! reading keys the rows before it write), and so does the CPU variant (its
//! attention is another template).
//!
//! The surprise: the fused dispatch reads the `qkv_rope`'s input, so that
//! value must outlive the node that reads it in the graph. The binder asks
//! [`RopeAttention::extra_reads`] and keeps it alive through the attention,
//! in every phase, since one arena layout serves them all: SmolLM2's arena
//! at 1,024-token chunks grew from 11.0 to 13.4 MB (Gemma 3 270M's went
//! from 18.4 to 17.3 MB: the planner found another packing).

use crate::kernels::attention_decode::MAX_NORMED_GROUP;
use crate::lower::Phase;
use crate::variant::VariantSpec;
use gerbil_ir::{Graph, NodeId, Op, ValueRef};
use gerbil_plan::Feature;
use std::collections::{HashMap, HashSet};

/// The `qkv_rope` → attention pairs a decode step runs as one dispatch.
#[derive(Debug, Default)]
pub(crate) struct RopeAttention {
    /// Attention node → the `qkv_rope` node it absorbs.
    by_attention: HashMap<NodeId, NodeId>,
    /// The absorbed `qkv_rope` nodes.
    absorbed: HashSet<NodeId>,
}

impl RopeAttention {
    /// The pairs in `steps` (compute nodes in schedule order): a `qkv_rope`
    /// directly followed by a causal attention that reads its three outputs,
    /// which nothing else reads (with per-head norms, for GQA groups of at
    /// most [`MAX_NORMED_GROUP`] heads).
    pub fn find(graph: &Graph, steps: &[NodeId]) -> Self {
        let mut by_attention = HashMap::new();
        for pair in steps.windows(2) {
            let (rope, attn) = (pair[0], pair[1]);
            let (Op::QkvRope(r), Op::Attention(a)) = (&graph.node(rope).op, &graph.node(attn).op)
            else {
                continue;
            };
            let same_heads =
                (r.n_heads, r.n_kv_heads, r.head_dim) == (a.n_heads, a.n_kv_heads, a.head_dim);
            let outputs: Vec<ValueRef> = (0..3).map(|port| ValueRef { node: rope, port }).collect();
            let only_attention = outputs.iter().all(|&v| {
                !graph.is_output(v) && graph.users(v).iter().all(|&(user, _)| user == attn)
            });
            let group = a.n_heads / a.n_kv_heads.max(1);
            if (r.qk_norm.is_none() || group <= MAX_NORMED_GROUP)
                && a.causal
                && same_heads
                && graph.inputs(attn)[..3] == outputs[..]
                && only_attention
            {
                by_attention.insert(attn, rope);
            }
        }
        let absorbed = by_attention.values().copied().collect();
        RopeAttention {
            by_attention,
            absorbed,
        }
    }

    /// Whether `phase` of `variant` fuses the pairs.
    pub fn applies(phase: Phase, variant: &VariantSpec) -> bool {
        phase == Phase::Decode && !variant.features.contains(&Feature::Cpu)
    }

    /// The `qkv_rope` node attention node `attn` absorbs, if any.
    pub fn rope_of(&self, attn: NodeId) -> Option<NodeId> {
        self.by_attention.get(&attn).copied()
    }

    /// Whether `id` is a `qkv_rope` some attention absorbs.
    pub fn is_absorbed(&self, id: NodeId) -> bool {
        self.absorbed.contains(&id)
    }

    /// Values node `id` reads in a fused dispatch beyond its own inputs:
    /// an attention reads its `qkv_rope`'s q|k|v rows.
    pub fn extra_reads(&self, graph: &Graph, id: NodeId) -> Vec<ValueRef> {
        self.rope_of(id)
            .map(|rope| vec![graph.inputs(rope)[0]])
            .unwrap_or_default()
    }
}
