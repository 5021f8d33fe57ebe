//! Measured tile choices for the prefill GEMM: what `gerbilc tune` finds and
//! `gerbilc compile --tuning` bakes into a plan.
//!
//! A [`GemmShape`] is what a tile's speed depends on — `K`, `N`, whether the
//! epilogue is gated and the weight dtype; the other options (bias, norm
//! prologue, residual) cost the same under every tile. [`GemmTiles`] maps
//! shapes to the tile measured fastest for them; [`gemm_shapes`] lists the
//! shapes a graph's prompt steps run, so a tuner knows what to measure. A
//! shape without an entry, or with a tile the target cannot run (too much
//! workgroup memory, or an odd column split under a gated epilogue), gets
//! [`GemmTile::choose`]'s pick: a plan compiled without tuning data still
//! runs well, and a tuning file from another target cannot break one.

use crate::kernels::gemm::GemmTile;
use gerbil_ir::{DType, Dim, Graph, NodeId, Op};
use std::collections::HashMap;

/// What a prefill GEMM's best tile depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Inner dimension.
    pub k: u32,
    /// Output columns (a gated matmul's `N`, half its weight rows).
    pub n: u32,
    /// Gated (GLU) epilogue.
    pub glu: bool,
    /// Weight dtype.
    pub wdtype: DType,
}

/// Tiles measured fastest, by shape.
pub type GemmTiles = HashMap<GemmShape, GemmTile>;

/// The shape of compute node `id` when it runs as a prefill GEMM: a matmul
/// over the step's `T` rows that is not a last-row read.
pub fn gemm_shape(graph: &Graph, id: NodeId) -> Option<GemmShape> {
    let node = graph.node(id);
    let glu = match &node.op {
        Op::MatMul(m) if !m.last_row => false,
        Op::MatMulGlu(_) => true,
        _ => return None,
    };
    let out = &node.outputs[0];
    if matches!(out.shape.first(), Some(Dim::Const(_))) {
        return None;
    }
    let ins = graph.inputs(id);
    Some(GemmShape {
        k: graph.value_type(ins[0]).last_const()? as u32,
        n: out.last_const()? as u32,
        glu,
        wdtype: graph.value_type(ins[1]).dtype,
    })
}

/// Every distinct prefill GEMM shape of `graph`, in graph order.
pub fn gemm_shapes(graph: &Graph) -> Vec<GemmShape> {
    let mut shapes = Vec::new();
    for id in graph.topo_order().unwrap_or_default() {
        match gemm_shape(graph, id) {
            Some(s) if !shapes.contains(&s) => shapes.push(s),
            _ => {}
        }
    }
    shapes
}

/// The tile for `shape` in steps of at most `max_rows` rows within
/// `max_workgroup_bytes`: the tuned one when `tiles` has one the target can
/// run, else [`GemmTile::choose`]'s.
pub fn tile_for(
    tiles: &GemmTiles,
    shape: GemmShape,
    max_rows: u32,
    max_workgroup_bytes: u32,
) -> GemmTile {
    tiles
        .get(&shape)
        .copied()
        .filter(|t| t.supports(shape.glu) && t.workgroup_bytes() <= max_workgroup_bytes)
        .unwrap_or_else(|| GemmTile::choose(shape.n, shape.glu, max_rows, max_workgroup_bytes))
}
