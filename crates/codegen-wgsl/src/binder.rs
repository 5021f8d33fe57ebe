//! The binder: activations placed in arenas, and the slice behind every
//! operand of every node.
//!
//! [`Layout::plan`] hands the graph's steps to the liveness planner
//! ([`crate::planner`]) with the [`Sources`] as the values placed already,
//! and declares one buffer per arena. [`Layout::slice`] then answers, for a
//! node's [`Port`] in a variant of some precision, which bytes it binds;
//! [`Layout::bytes`] answers how many bytes the IR says that operand has,
//! worked out from its type alone, so the dispatch assembler can refuse a
//! planner bug instead of binding a wrong size.
//!
//! The surprise: the same IR value can bind different buffers in different
//! variants — a KV cache (or a value written into one in place) binds the
//! cache's f16 twin in an f16 variant, and a sharded weight binds its whole
//! buffer in a desktop variant that has one.

use crate::fusion::RopeAttention;
use crate::planner::{self, BufferPlan, Home, Step};
use crate::sources::{Own, Sources};
use crate::CodegenError;
use gerbil_ir::{Graph, NodeId, ValueRef};
use gerbil_plan::{
    BufferKind, BufferSlice, Port, Precision, SAMPLING_PARAMS_BYTES, STEP_PARAMS_BYTES,
};

/// Every value's home: the sources' buffers and the planned arenas.
pub(crate) struct Layout<'g, 'o> {
    graph: &'g Graph,
    /// The sources, with the arenas appended to their buffer table.
    pub sources: Sources<'o>,
    plan: BufferPlan<ValueRef>,
    arenas: Vec<u32>,
}

impl<'g, 'o> Layout<'g, 'o> {
    /// Plans the activations of `steps` (compute nodes in schedule order)
    /// around `sources`, declaring the arenas; a value a `fused` dispatch
    /// reads lives until that dispatch.
    pub fn plan(
        graph: &'g Graph,
        steps: &[NodeId],
        mut sources: Sources<'o>,
        fused: &RopeAttention,
    ) -> Result<Self, CodegenError> {
        let plan_steps: Vec<Step<ValueRef>> = steps
            .iter()
            .map(|&id| {
                let node = graph.node(id);
                let ins = graph.inputs(id);
                Step {
                    defines: (0..node.outputs.len() as u32)
                        .map(|port| {
                            let alias = node.op.aliased_input(port).map(|i| ins[i]);
                            (ValueRef { node: id, port }, alias)
                        })
                        .collect(),
                    reads: ins
                        .into_iter()
                        .chain(fused.extra_reads(graph, id))
                        .collect(),
                }
            })
            .collect();
        let b = &sources.buffers;
        let limits = &b.opts().target.limits;
        let plan = planner::plan(
            &plan_steps,
            |v| b.own.contains_key(&v),
            |v| b.value_bytes(graph.value_type(v)),
            limits.binding_align,
            limits.max_storage_binding,
        )
        .map_err(|e| CodegenError::Limit {
            what: format!("activation `{}`", graph.node(e.value.node).label),
            needed: e.size,
            limit: e.max,
            limit_name: "max_storage_buffer_binding_size",
            hint: "use a smaller --max-tokens-per-step",
        })?;
        let arenas = plan
            .arena_sizes
            .iter()
            .map(|&size| sources.buffers.push(size, BufferKind::Arena))
            .collect();
        Ok(Layout {
            graph,
            sources,
            plan,
            arenas,
        })
    }

    /// Sum of every activation's size, as if each had a buffer of its own.
    pub fn naive_bytes(&self) -> u64 {
        self.plan.naive_bytes
    }

    /// The KV cache a value is (or aliases), in `precision`'s buffer: only
    /// f16 variants bind caches of their own.
    fn cache(&self, v: ValueRef, precision: Precision) -> Option<BufferSlice> {
        let root = match self.plan.homes.get(&v) {
            Some(&Home::External(root)) => root,
            _ => v,
        };
        match precision {
            Precision::F16 => self
                .sources
                .f16_caches
                .get(&root)
                .map(|&i| self.sources.buffers.whole(i)),
            Precision::F32 => None,
        }
    }

    /// The slices of value `v` (several for a sharded weight, unless a
    /// `wide` variant binds it whole).
    fn slices(&self, v: ValueRef, precision: Precision, wide: bool) -> Vec<BufferSlice> {
        if let Some(c) = self.cache(v, precision) {
            return vec![c];
        }
        let b = &self.sources.buffers;
        let own = |r: ValueRef| match (b.own.get(&r), b.wide.get(&r)) {
            (Some(Own::Shards(_)), Some(&whole)) if wide => vec![b.whole(whole)],
            (Some(Own::Whole(i)), _) => vec![b.whole(*i)],
            (Some(Own::Shards(list)), _) => list.iter().map(|&i| b.whole(i)).collect(),
            (None, _) => Vec::new(),
        };
        match self.plan.homes.get(&v) {
            Some(&Home::Arena { arena, offset, .. }) => vec![BufferSlice {
                buffer: self.arenas[arena],
                offset,
                size: b.value_bytes(self.graph.value_type(v)),
            }],
            Some(&Home::External(root)) => own(root),
            None => own(v),
        }
    }

    /// The slice node `id` binds at `port` in a variant of `precision`
    /// (`wide`: one that binds weights whole, `VariantSpec::wide`), if it
    /// has that operand (scratch is the assembler's, not an operand).
    pub fn slice(
        &self,
        id: NodeId,
        port: Port,
        precision: Precision,
        wide: bool,
    ) -> Option<BufferSlice> {
        let whole = |i: Option<u32>| i.map(|i| self.sources.buffers.whole(i));
        match port {
            Port::Params => whole(Some(self.sources.step_params)),
            Port::Sampling => whole(self.sources.sampling_params),
            Port::Rows => whole(self.sources.step_rows),
            Port::Input { index, shard } => {
                let v = *self.graph.inputs(id).get(index as usize)?;
                self.slices(v, precision, wide).get(shard as usize).copied()
            }
            Port::Output { index } => self
                .slices(
                    ValueRef {
                        node: id,
                        port: index,
                    },
                    precision,
                    wide,
                )
                .first()
                .copied(),
            Port::Scratch | Port::Counters => None,
        }
    }

    /// The bytes the operand of node `id` at `port` has (at the largest
    /// step) by its IR type, independently of where the planner put it.
    pub fn bytes(&self, id: NodeId, port: Port, precision: Precision, wide: bool) -> Option<u64> {
        let b = &self.sources.buffers;
        match port {
            Port::Params => Some(STEP_PARAMS_BYTES),
            Port::Sampling => Some(SAMPLING_PARAMS_BYTES),
            Port::Rows => self
                .sources
                .step_rows
                .map(|i| self.sources.buffers.decls[i as usize].size),
            Port::Input { index, shard } => {
                let v = *self.graph.inputs(id).get(index as usize)?;
                match self.cache(v, precision) {
                    Some(c) => Some(c.size),
                    None => {
                        let rows = b
                            .shard_rows
                            .get(&v)
                            .filter(|_| !wide || !b.wide.contains_key(&v));
                        b.operand_bytes(self.graph.value_type(v), rows, shard)
                    }
                }
            }
            Port::Output { index } => {
                let v = ValueRef {
                    node: id,
                    port: index,
                };
                let outputs = &self.graph.node(id).outputs;
                match self.cache(v, precision) {
                    Some(c) => Some(c.size),
                    None => outputs.get(index as usize).map(|ty| b.value_bytes(ty)),
                }
            }
            Port::Scratch | Port::Counters => None,
        }
    }
}
