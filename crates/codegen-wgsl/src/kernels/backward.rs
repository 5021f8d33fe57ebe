//! Kernels of a training step's loss and backward ops (`gerbil_ir::TrainOp`),
//! in f32: the mean cross-entropy and its gradient, the activations'
//! derivatives, a matmul's input and weight gradients, column sums, the
//! rows a cache write wrote, the norm's backward, the embedding's, and
//! attention's (with the log-sum-exp it rebuilds the probabilities from).
//! (RoPE's backward is [`super::rope::backward`].) Each is checked against
//! `gerbil_interp::gradient` on random inputs. Most are the plainest
//! kernel that is right — a thread per output element, or a workgroup per
//! row where a row is reduced; the matmul gradients are tiled products
//! (64 × 64 output tiles staged through workgroup memory), having been
//! measured as the slowest (`tests/benches/training_kernels.rs`).
//!
//! The surprise: some ops are several dispatches that hand values on
//! through the dispatch scratch, each declaring the same scratch bindings
//! in the same order so every one binds them at the same offsets:
//! [`rms_norm_grad`] keeps each row's `1/rms` and the column sums' chunks
//! for the weight gradient, [`attention_lse`] the scores, [`attention_grad`] the
//! probabilities (a tiled product per head instead of a thread per row,
//! 55× faster on an H200).

use super::elementwise::{entry, flat};
use super::rowwise::{per_row, reduce_into, row_main, WG};
use super::{
    f32_lit, input, output, prelude, split_groups, tree_reduce, Bindings, KernelSource, Rows,
};
use gerbil_ir::{Attention, DType, Embedding, RmsNorm, UnaryOp};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// The most negative finite f32: the start of a row's maximum.
const LOWEST: &str = "-3.4028235e38f";

/// The `max` reduction of every lane's `s` into `let NAME`, as
/// [`reduce_into`] does the sum.
fn max_into(name: &str) -> String {
    format!(
        "  red[lane] = s;\n  workgroupBarrier();\n{}\
         \x20 let {name} = red[0];\n  workgroupBarrier();\n",
        tree_reduce(WG, "lane", "0u", "max")
    )
}

/// A row's maximum `m` and `total = Σ exp(x − m)` over `H` values of
/// `x[row + i]`.
fn softmax_stats() -> String {
    format!(
        "  s = {LOWEST};\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ s = max(s, x[row + i]); }}\n{max}\
         \x20 s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ s = s + exp(x[row + i] - m); }}\n{sum}",
        max = max_into("m"),
        sum = reduce_into("total"),
    )
}

fn header(consts: &str) -> String {
    let mut w = prelude();
    let _ = writeln!(w, "{consts}const WG: u32 = {WG}u;");
    w
}

/// `loss[0]`: the mean over the step's rows (at most `max_rows`) of
/// `logsumexp(x[r]) − x[r][target[r]]`, `vocab` columns. A workgroup per
/// row writes its row's loss to the dispatch's scratch; the last to finish
/// (a counter) sums them in row order, so the sum never depends on the
/// scheduler, and leaves the counter at zero. The host checks the targets
/// (the interpreter refuses one past the vocabulary); a target past it
/// reads the last column rather than memory out of bounds, here and in
/// [`cross_entropy_grad`].
pub fn cross_entropy(vocab: u32, max_rows: u32) -> KernelSource {
    let mut w = header(&format!("const H: u32 = {vocab}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids(&mut w, input(1), "targets");
    b.activation(&mut w, output(0), "loss");
    b.scratch(&mut w, "rows", 4 * u64::from(max_rows.max(1)));
    b.counters(&mut w, "count", 1);
    w.push_str("var<workgroup> last: u32;\n");
    w.push_str(&row_main(&format!(
        "{stats}\
         \x20 if (lane == 0u) {{ rows[wid.x] = m + log(total) - x[row + min(targets[wid.x], H - 1u)]; }}\n\
         \x20 storageBarrier();\n\
         \x20 if (lane == 0u) {{ last = select(0u, 1u, atomicAdd(&count[0], 1u) == params.t - 1u); }}\n\
         \x20 if (workgroupUniformLoad(&last) == 0u) {{ return; }}\n\
         \x20 storageBarrier();\n\
         \x20 if (lane == 0u) {{\n\
         \x20   var sum = 0.0f;\n\
         \x20   for (var r = 0u; r < params.t; r = r + 1u) {{ sum = sum + rows[r]; }}\n\
         \x20   loss[0] = sum / f32(params.t);\n\
         \x20   atomicStore(&count[0], 0u);\n  }}\n",
        stats = softmax_stats(),
    )));
    per_row(
        format!("cross_entropy_v{vocab}_t{max_rows}"),
        w,
        Rows::Tokens,
        b.finish(),
    )
}

/// `dx[r] = (softmax(x[r]) − onehot(target[r])) / T`, a workgroup per row.
pub fn cross_entropy_grad(vocab: u32) -> KernelSource {
    let mut w = header(&format!("const H: u32 = {vocab}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids(&mut w, input(1), "targets");
    b.activation(&mut w, output(0), "dx");
    w.push_str(&row_main(&format!(
        "{stats}\
         \x20 let hot = min(targets[row / H], H - 1u);\n\
         \x20 let scale = 1.0f / (total * f32(params.t));\n\
         \x20 let inv_rows = 1.0f / f32(params.t);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{\n\
         \x20   dx[row + i] = exp(x[row + i] - m) * scale - select(0.0f, inv_rows, i == hot);\n  }}\n",
        stats = softmax_stats(),
    )));
    per_row(
        format!("cross_entropy_grad_v{vocab}"),
        w,
        Rows::Tokens,
        b.finish(),
    )
}

/// WGSL for the derivative of `op` at `v`, with the forward's clamps.
fn derivative(op: UnaryOp, v: &str) -> String {
    let tanh = |arg: String| format!("tanh(clamp({arg}, -15.0f, 15.0f))");
    match op {
        UnaryOp::Silu => {
            format!(
                "(1.0f / (1.0f + exp(-{v}))) * (1.0f + {v} * (1.0f - 1.0f / (1.0f + exp(-{v}))))"
            )
        }
        UnaryOp::GeluTanh => {
            let th = tanh(format!(
                "0.7978845608028654f * ({v} + 0.044715f * {v} * {v} * {v})"
            ));
            format!(
                "(0.5f * (1.0f + {th}) + 0.5f * {v} * (1.0f - {th} * {th}) * 0.7978845608028654f \
                 * (1.0f + 0.134145f * {v} * {v}))"
            )
        }
        UnaryOp::Gelu => {
            // Φ(v) by Abramowitz and Stegun 7.1.26, as the forward's erf.
            let z = format!("(abs({v}) * 0.7071067811865476f)");
            let t = format!("(1.0f / (1.0f + 0.3275911f * {z}))");
            let poly = format!(
                "(((((1.061405429f * {t} - 1.453152027f) * {t} + 1.421413741f) * {t} - 0.284496736f) * {t} + 0.254829592f) * {t})"
            );
            format!(
                "(0.5f * (1.0f + sign({v}) * (1.0f - {poly} * exp(-{z} * {z}))) \
                 + {v} * 0.3989422804014327f * exp(-0.5f * {v} * {v}))"
            )
        }
        UnaryOp::Softcap(c) => {
            let th = tanh(format!("{v} / {}", f32_lit(c)));
            format!("(1.0f - {th} * {th})")
        }
        UnaryOp::Scale(s) => f32_lit(s),
    }
}

/// `dx = dy · f′(x)` of a unary op over `rows` of `width` columns, a
/// thread per element.
pub fn unary_grad(op: UnaryOp, rows: Rows, width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, input(1), "dy");
    b.activation(&mut w, output(0), "dx");
    w.push_str(&entry(
        rows,
        width,
        &format!(
            "  let v = x[i];\n  dx[i] = dy[i] * {};\n",
            derivative(op, "v")
        ),
    ));
    let tag = match op {
        UnaryOp::Softcap(c) => format!("softcap{}", c.to_bits()),
        UnaryOp::Scale(s) => format!("scale{}", s.to_bits()),
        other => gerbil_ir::Op::Unary(other).mnemonic().to_string(),
    };
    flat(
        format!("{tag}_grad_r{}_w{width}", rows.tag()),
        w,
        rows,
        width,
        b.finish(),
    )
}

/// A thread per element of a constant `count` elements: its workgroups,
/// split over x and y under the per-axis limit, and the WGSL of its index.
fn constant_grid(count: u64) -> ([WorkgroupCount; 3], String) {
    let groups = u32::try_from(count.div_ceil(u64::from(WG))).unwrap_or(u32::MAX);
    let (gx, gy) = split_groups(groups);
    (
        [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            WorkgroupCount::fixed(1),
        ],
        format!("gid.x + gid.y * {}u", gx * WG),
    )
}

/// `y[c] = Σ_r x[r, c]` over the step's rows, `width` columns.
pub fn sum_rows(width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    let (workgroups, index) = constant_grid(u64::from(width));
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let c = {index};\n  if (c >= W) {{ return; }}\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var r = 0u; r < params.t; r = r + 1u) {{ s = s + x[r * W + c]; }}\n\
         \x20 y[c] = s;\n}}\n",
    );
    KernelSource {
        name: format!("sum_rows_w{width}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups,
        workgroup_bytes: 0,
    }
}

/// `y[t] = cache[P + t]` for the step's rows, `width` columns: the gradient
/// of what `cache_write` wrote, taken from the cache's gradient.
pub fn cache_rows(width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "cache");
    b.activation(&mut w, output(0), "y");
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * W) { return; }\n\
         \x20 y[i] = cache[params.p * W + i];\n}\n",
    );
    flat(
        format!("cache_rows_w{width}"),
        w,
        Rows::Tokens,
        width,
        b.finish(),
    )
}

/// Side of the tiles of [`tiled_product`]: a workgroup makes a 64 × 64
/// tile of the output, each of its 256 threads a 4 × 4 block.
const TILE: u32 = 64;
/// The depth of the tiles staged in workgroup memory per step.
const DEPTH: u32 = 16;

/// One side of a [`tiled_product`]: its element as a WGSL expression of
/// the indices, and whether consecutive `i` (for `a`) are consecutive in
/// memory, so the staging reads them side by side.
struct Operand<'a> {
    load: &'a str,
    rows_first: bool,
}

/// The WGSL entry of `out[i, j] = Σ_l a(i, l) · b(l, j)` over `i < m`,
/// `j < NC` and `l < depth` (`m`, `depth` WGSL expressions; `NC` declared
/// by the caller), `a.load` an expression of `i` and `l`, `b` one of `l`
/// and `j`, consecutive in `j`; `store` is the statement that takes each
/// sum, `VALUE` in it, at `i`, `j`. Every expression may also read `z`,
/// the workgroup's z (a batch of products in one dispatch), and `i0`, the
/// tile's first row. The tiles of `a` and `b` are staged through workgroup
/// memory, 8 KiB.
fn tiled_product(a: Operand, b: &str, store: &str, m: &str, depth: &str) -> String {
    masked_product(a, b, store, m, depth, Skips::default())
}

/// What a [`masked_product`] skips: WGSL conditions.
#[derive(Clone, Copy, Default)]
struct Skips<'a> {
    /// Of `i0` and `j0`, a tile's first row and column: the tile's product
    /// is zero (its `store` runs with `VALUE` = 0).
    tile: Option<&'a str>,
    /// Of `i0` and `l0`, a tile's first row and a step's first depth: the
    /// step adds nothing to the tile.
    step: Option<&'a str>,
}

/// [`tiled_product`], skipping the work `skips` says is zero: attention's
/// tiles of keys no row of the tile sees, and the steps of its cache
/// gradients' depth over queries that see no key of the tile.
fn masked_product(a: Operand, b: &str, store: &str, m: &str, depth: &str, skips: Skips) -> String {
    let masked = skips.tile;
    let step_skip = skips.step.map_or(String::new(), |c| {
        format!("\x20   if ({c}) {{ continue; }}\n")
    });
    let skip = masked.map_or(String::new(), |cond| {
        let zeros = each_output("  ", m, &store.replace("VALUE", "0.0f"));
        format!("\x20 if ({cond}) {{\n{zeros}\x20   return;\n  }}\n")
    });
    let stores = each_output("", m, &store.replace("VALUE", "acc[r][c]"));
    let a_load = a.load;
    let (a_i, a_l) = if a.rows_first {
        ("e % TILE", "e / TILE")
    } else {
        ("e / DEPTH", "e % DEPTH")
    };
    format!(
        "const TILE: u32 = {TILE}u;\nconst DEPTH: u32 = {DEPTH}u;\n\
         var<workgroup> at: array<f32, {staged}>;\n\
         var<workgroup> bt: array<f32, {staged}>;\n\
         @compute @workgroup_size(256, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  let tx = lane % 16u;\n  let ty = lane / 16u;\n  let z = wid.z;\n\
         \x20 let i0 = wid.y * TILE;\n  let j0 = wid.x * TILE;\n{skip}\
         \x20 var acc: array<vec4<f32>, 4>;\n\
         \x20 for (var l0 = 0u; l0 < {depth}; l0 = l0 + DEPTH) {{\n{step_skip}\
         \x20   for (var part = 0u; part < 4u; part = part + 1u) {{\n\
         \x20     let e = lane + part * 256u;\n\
         \x20     let ai = {a_i};\n      let al = {a_l};\n\
         \x20     var av = 0.0f;\n\
         \x20     if (i0 + ai < {m} && l0 + al < {depth}) {{ let i = i0 + ai; let l = l0 + al; av = {a_load}; }}\n\
         \x20     at[al * TILE + ai] = av;\n\
         \x20     let bj = e % TILE;\n      let bl = e / TILE;\n\
         \x20     var bv = 0.0f;\n\
         \x20     if (j0 + bj < NC && l0 + bl < {depth}) {{ let l = l0 + bl; let j = j0 + bj; bv = {b}; }}\n\
         \x20     bt[bl * TILE + bj] = bv;\n    }}\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var l = 0u; l < DEPTH; l = l + 1u) {{\n\
         \x20     let av = vec4<f32>(at[l * TILE + ty * 4u], at[l * TILE + ty * 4u + 1u], at[l * TILE + ty * 4u + 2u], at[l * TILE + ty * 4u + 3u]);\n\
         \x20     let bv = vec4<f32>(bt[l * TILE + tx * 4u], bt[l * TILE + tx * 4u + 1u], bt[l * TILE + tx * 4u + 2u], bt[l * TILE + tx * 4u + 3u]);\n\
         \x20     for (var r = 0u; r < 4u; r = r + 1u) {{ acc[r] = acc[r] + av[r] * bv; }}\n    }}\n\
         \x20   workgroupBarrier();\n  }}\n{stores}}}\n",
        staged = TILE * DEPTH,
    )
}

/// The loop of a [`tiled_product`] thread over its 4 × 4 outputs `(i, j)`
/// that runs `stmt` on those inside `m` rows and `NC` columns, each line
/// indented by `pad` more.
fn each_output(pad: &str, m: &str, stmt: &str) -> String {
    format!(
        "{pad}  for (var r = 0u; r < 4u; r = r + 1u) {{\n\
         {pad}    let i = i0 + ty * 4u + r;\n\
         {pad}    for (var c = 0u; c < 4u; c = c + 1u) {{\n\
         {pad}      let j = j0 + tx * 4u + c;\n\
         {pad}      if (i < {m} && j < NC) {{ {stmt} }}\n\
         {pad}    }}\n\
         {pad}  }}\n"
    )
}

/// A tiled product's launch: `cols` output columns across x, `rows` output
/// rows across y, in tiles of 64.
fn tiled_launch(name: String, wgsl: String, b: Bindings, rows: Rows, cols: u32) -> KernelSource {
    batched_launch(name, wgsl, b, rows, cols, 1)
}

/// [`tiled_launch`] of `batch` products, one per workgroup z.
fn batched_launch(
    name: String,
    wgsl: String,
    b: Bindings,
    rows: Rows,
    cols: u32,
    batch: u32,
) -> KernelSource {
    KernelSource {
        name,
        wgsl,
        workgroup_size: [256, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(cols.div_ceil(TILE)),
            rows.count(1, TILE),
            WorkgroupCount::fixed(batch),
        ],
        workgroup_bytes: 2 * TILE * DEPTH * 4,
    }
}

/// Pieces a matmul gradient of `tiles` output tiles cuts its `depth` into:
/// 1 where the tiles fill the GPU, or where there are 32 or more of them
/// over a depth under 4,096; else enough for some 512 workgroups (at most
/// 16, each piece at least 256 deep, or 64 under a depth of 4,096). Two
/// cases: the LM head's input gradient (72 tiles at SmolLM2's shape over a
/// depth of 49,152), and a LoRA factor's products, whose rank-wide side
/// makes a handful of tiles over a whole projection's or step's depth.
fn depth_pieces(tiles: u32, depth: u32) -> u32 {
    if tiles >= 256 || (depth < 4096 && tiles >= 32) {
        return 1;
    }
    let least = if depth >= 4096 { 256 } else { 64 };
    512u32.div_ceil(tiles).min(depth / least).clamp(1, 16)
}

/// How a product cut into pieces lays out its output: `rows` × `cols`,
/// each piece's partials `stride` rows after the last's in the scratch.
pub(super) struct Pieces {
    rows: Rows,
    cols: u32,
    pub(super) pieces: u32,
    stride: u32,
    pub(super) part_bytes: u64,
}

impl Pieces {
    pub(super) fn new(rows: Rows, cols: u32, pieces: u32, stride: u32) -> Pieces {
        let part_bytes = 4 * u64::from(pieces) * u64::from(stride) * u64::from(cols);
        Pieces {
            rows,
            cols,
            pieces,
            stride,
            part_bytes,
        }
    }

    /// The two dispatches: `wgsl` (each piece a workgroup z, its partials
    /// into the scratch) named `KIND_pieces_TAG`, then the sum into `out`.
    fn dispatches(
        &self,
        kind: &str,
        tag: &str,
        wgsl: String,
        b: Bindings,
        out: &str,
    ) -> Vec<KernelSource> {
        let name = format!("{kind}_pieces_{tag}");
        let product = batched_launch(name, wgsl, b, self.rows, self.cols, self.pieces);
        let sum = sum_pieces(format!("{kind}_sum_{tag}"), out, self);
        vec![product, sum]
    }
}

/// The second dispatch of a product cut into pieces: a thread per output
/// of `out` sums the pieces' partials in the scratch.
pub(super) fn sum_pieces(name: String, out: &str, p: &Pieces) -> KernelSource {
    let count = match p.rows {
        Rows::Fixed(n) => format!("{n}u * NC"),
        _ => "params.t * NC".to_string(),
    };
    let stride = "TMAX * NC";
    let mut w = header(&format!(
        "const NC: u32 = {}u;\nconst PIECES: u32 = {}u;\nconst TMAX: u32 = {}u;\n",
        p.cols, p.pieces, p.stride
    ));
    let mut b = Bindings::new();
    b.activation(&mut w, output(0), out);
    b.scratch(&mut w, "part", p.part_bytes);
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= {count}) {{ return; }}\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var p = 0u; p < PIECES; p = p + 1u) {{ s = s + part[p * {stride} + i]; }}\n\
         \x20 {out}[i] = s;\n}}\n",
    );
    flat(name, w, p.rows, p.cols, b.finish())
}

/// `dx = dy · w` for `dy` `[T, n]` and the weight `[n, k]` stored as
/// `wdtype`, in steps of at most `max_rows`: a matmul's input gradient, in
/// 64 × 64 tiles. A deep product with few tiles ([`depth_pieces`]) is two
/// dispatches: each piece of the depth a workgroup z, writing its partial
/// product to the scratch, then a thread per output summing the pieces.
pub fn matmul_grad_x(n: u32, k: u32, wdtype: DType, max_rows: u32) -> Vec<KernelSource> {
    let pieces = depth_pieces(max_rows.div_ceil(TILE) * k.div_ceil(TILE), n);
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const N: u32 = {n}u;\nconst NC: u32 = {k}u;\nconst PIECES: u32 = {pieces}u;\n\
         const CHUNK: u32 = {}u;\nconst TMAX: u32 = {max_rows}u;",
        n.div_ceil(pieces)
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    b.weight(&mut w, input(1), "w", wdtype);
    if pieces == 1 {
        b.activation(&mut w, output(0), "dx");
        let dy = Operand {
            load: "dy[i * N + l]",
            rows_first: false,
        };
        w.push_str(&tiled_product(
            dy,
            "load_w(l * NC + j)",
            "dx[i * NC + j] = VALUE;",
            "params.t",
            "N",
        ));
        let name = format!("matmul_grad_x_{wdtype}_n{n}_k{k}");
        return vec![tiled_launch(name, w, b, Rows::Tokens, k)];
    }
    let layout = Pieces::new(Rows::Tokens, k, pieces, max_rows);
    b.scratch(&mut w, "part", layout.part_bytes);
    let dy = Operand {
        load: "dy[i * N + z * CHUNK + l]",
        rows_first: false,
    };
    w.push_str(&tiled_product(
        dy,
        "load_w((z * CHUNK + l) * NC + j)",
        "part[(z * TMAX + i) * NC + j] = VALUE;",
        "params.t",
        "min(CHUNK, N - min(z * CHUNK, N))",
    ));
    let tag = format!("{wdtype}_n{n}_k{k}_p{pieces}_t{max_rows}");
    layout.dispatches("matmul_grad_x", &tag, w, b, "dx")
}

/// `dw = dyᵀ · x` for `dy` `[T, n]` and `x` `[T, k]` in steps of at most
/// `max_rows`: a matmul's weight gradient `[n, k]`, in 64 × 64 tiles over
/// the step's rows. A product of few tiles ([`depth_pieces`]: a LoRA
/// factor's, rank-wide) cuts the rows into pieces, a workgroup z each
/// writing its partial product to the scratch, and sums them in a second
/// dispatch.
pub fn matmul_grad_w(n: u32, k: u32, max_rows: u32) -> Vec<KernelSource> {
    let pieces = depth_pieces(n.div_ceil(TILE) * k.div_ceil(TILE), max_rows);
    let mut w = prelude();
    let _ = writeln!(w, "const N: u32 = {n}u;\nconst NC: u32 = {k}u;");
    if pieces > 1 {
        let _ = writeln!(w, "const CHUNK: u32 = {}u;", max_rows.div_ceil(pieces));
    }
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    b.activation(&mut w, input(1), "x");
    if pieces == 1 {
        b.activation(&mut w, output(0), "dw");
        let dy_t = Operand {
            load: "dy[l * N + i]",
            rows_first: true,
        };
        w.push_str(&tiled_product(
            dy_t,
            "x[l * NC + j]",
            "dw[i * NC + j] = VALUE;",
            "N",
            "params.t",
        ));
        return vec![tiled_launch(
            format!("matmul_grad_w_n{n}_k{k}"),
            w,
            b,
            Rows::Fixed(n),
            k,
        )];
    }
    let layout = Pieces::new(Rows::Fixed(n), k, pieces, n);
    b.scratch(&mut w, "part", layout.part_bytes);
    let dy_t = Operand {
        load: "dy[(z * CHUNK + l) * N + i]",
        rows_first: true,
    };
    w.push_str(&tiled_product(
        dy_t,
        "x[(z * CHUNK + l) * NC + j]",
        "part[(z * N + i) * NC + j] = VALUE;",
        "N",
        "min(CHUNK, params.t - min(z * CHUNK, params.t))",
    ));
    let tag = format!("n{n}_k{k}_p{pieces}_t{max_rows}");
    layout.dispatches("matmul_grad_w", &tag, w, b, "dw")
}

/// The backward of `rms_norm` over rows of `width` in `n.groups` slices,
/// the weight stored as `wdtype`, in steps of at most `max_rows`: `(x, w,
/// dy) -> (dx, dw)`, as three dispatches. The first takes a workgroup per
/// slice of a row: `dx`, and the slice's `1/rms` into the scratch. The
/// second sums `dy · x · (1/rms)` over chunks of the slices, a workgroup
/// per 64 columns and chunk (consecutive threads read consecutive
/// columns), into the scratch; the third sums each column's chunks, in
/// order. The weight gradient sums over every row, which no row's
/// workgroup can do alone; with the `1/rms` kept, it reads every row once.
/// (A thread per column down all the rows, in one dispatch, took an H200
/// 150 µs at SmolLM2's 2,048 × 576: three workgroups.)
pub fn rms_norm_grad(width: u32, n: &RmsNorm, wdtype: DType, max_rows: u32) -> Vec<KernelSource> {
    let g = width / n.groups.max(1);
    let consts = format!(
        "const W: u32 = {width}u;\nconst G: u32 = {g}u;\nconst GROUPS: u32 = {}u;\n\
         const EPS: f32 = {};\nconst OFFSET: f32 = {};\n",
        n.groups,
        f32_lit(n.eps),
        f32_lit(n.weight_offset),
    );
    let rrms_bytes = 4 * u64::from(max_rows) * u64::from(n.groups.max(1));
    let tag = format!(
        "{wdtype}_w{width}_g{}_o{}_t{max_rows}",
        n.groups,
        n.weight_offset.to_bits()
    );
    let mut w = header(&consts);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "w", wdtype);
    b.activation(&mut w, input(2), "dy");
    b.activation(&mut w, output(0), "dx");
    b.scratch(&mut w, "rrms", rrms_bytes);
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  var s = 0.0f;\n\
         \x20 let slot = wid.y * GROUPS + wid.x;\n  let base = slot * G;\n\
         \x20 for (var i = lane; i < G; i = i + WG) {{ let v = x[base + i]; s = s + v * v; }}\n{squares}\
         \x20 let inv = 1.0f / sqrt(sq / f32(G) + EPS);\n\
         \x20 if (lane == 0u) {{ rrms[slot] = inv; }}\n\
         \x20 s = 0.0f;\n\
         \x20 for (var i = lane; i < G; i = i + WG) {{ s = s + dy[base + i] * (load_w(i) + OFFSET) * x[base + i]; }}\n{dots}\
         \x20 let k = inv * inv * inv * gx / f32(G);\n\
         \x20 for (var i = lane; i < G; i = i + WG) {{\n\
         \x20   dx[base + i] = inv * dy[base + i] * (load_w(i) + OFFSET) - x[base + i] * k;\n  }}\n}}\n",
        squares = reduce_into("sq"),
        dots = reduce_into("gx"),
    );
    let rows = KernelSource {
        name: format!("rms_norm_grad_rows_{tag}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(n.groups),
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    };
    // The weight gradient's column sums: each workgroup 64 columns of a
    // chunk of the slices (4 lanes of rows a column), into the scratch;
    // then a thread per column sums the chunks in order.
    let column_blocks = g.div_ceil(64);
    let slices = max_rows * n.groups.max(1);
    let chunks = 512u32
        .div_ceil(column_blocks)
        .min(slices.div_ceil(64))
        .max(1);
    let part_bytes = 4 * u64::from(chunks) * u64::from(g);
    let consts = format!("{consts}const CHUNKS: u32 = {chunks}u;\n");
    let mut w = header(&consts);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, input(2), "dy");
    b.scratch(&mut w, "rrms", rrms_bytes);
    b.scratch(&mut w, "part", part_bytes);
    w.push_str(
        "var<workgroup> lanes: array<f32, 256>;\n\
         @compute @workgroup_size(256, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {\n\
         \x20 let c = wid.x * 64u + lid.x % 64u;\n  let lane = lid.x / 64u;\n\
         \x20 let total = params.t * GROUPS;\n  let per = (total + CHUNKS - 1u) / CHUNKS;\n\
         \x20 let end = min(total, (wid.y + 1u) * per);\n\
         \x20 var acc = 0.0f;\n\
         \x20 if (c < G) {\n\
         \x20   for (var sl = wid.y * per + lane; sl < end; sl = sl + 4u) {\n\
         \x20     let at = sl * G + c;\n      acc = acc + dy[at] * x[at] * rrms[sl];\n    }\n  }\n\
         \x20 lanes[lid.x] = acc;\n  workgroupBarrier();\n\
         \x20 if (lane == 0u && c < G) {\n\
         \x20   part[wid.y * G + c] = ((lanes[lid.x] + lanes[lid.x + 64u]) + lanes[lid.x + 128u]) + lanes[lid.x + 192u];\n  }\n}\n",
    );
    let partials = KernelSource {
        name: format!("rms_norm_grad_weight_part_{tag}"),
        wgsl: w,
        workgroup_size: [256, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(column_blocks),
            WorkgroupCount::fixed(chunks),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 256 * 4,
    };
    let mut w = header(&consts);
    let mut b = Bindings::new();
    b.activation(&mut w, output(1), "dw");
    b.scratch(&mut w, "rrms", rrms_bytes);
    b.scratch(&mut w, "part", part_bytes);
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let c = gid.x;\n  if (c >= G) { return; }\n\
         \x20 var acc = 0.0f;\n\
         \x20 for (var k = 0u; k < CHUNKS; k = k + 1u) { acc = acc + part[k * G + c]; }\n\
         \x20 dw[c] = acc;\n}\n",
    );
    let columns = KernelSource {
        name: format!("rms_norm_grad_weight_{tag}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(g.div_ceil(WG)),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    };
    vec![rows, partials, columns]
}

/// Ids of a step an [`embedding_grad`] workgroup lists at a time.
const ID_TILE: u32 = 1024;

/// The backward of `embedding` with respect to its table of `vocab` rows
/// of `width`: `(ids, dy) -> dt`. A workgroup per table row walks the
/// step's ids in tiles of [`ID_TILE`]: it lists the tokens of the tile
/// that read its row, sorts them (so the sum's order, and its rounding,
/// never depend on the scheduler) and adds their `dy` rows into its
/// columns; then it writes the row, times the scale (zeros for a row no
/// token reads, and always for the padding row). An id past the table
/// counts for row 0, the row the forward read. Deterministic, and no
/// atomics on floats.
pub fn embedding_grad(vocab: u32, width: u32, e: &Embedding) -> KernelSource {
    let (gx, gy) = split_groups(vocab);
    let mut w = header(&format!(
        "const V: u32 = {vocab}u;\nconst W: u32 = {width}u;\nconst TILE: u32 = {ID_TILE}u;\n\
         const CPL: u32 = {}u;\nconst GX: u32 = {gx}u;\nconst SCALE: f32 = {};\nconst PAD: u32 = {}u;\n",
        width.div_ceil(WG),
        f32_lit(e.scale.unwrap_or(1.0)),
        e.padding.unwrap_or(u32::MAX),
    ));
    let mut b = Bindings::new();
    b.ids(&mut w, input(0), "ids");
    b.activation(&mut w, input(1), "dy");
    b.activation(&mut w, output(0), "dt");
    w.push_str(
        "var<workgroup> found: array<u32, TILE>;\n\
         var<workgroup> count: atomic<u32>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {\n\
         \x20 let v = wid.x + wid.y * GX;\n  if (v >= V) { return; }\n\
         \x20 let lane = lid.x;\n\
         \x20 var acc: array<f32, CPL>;\n\
         \x20 for (var ci = 0u; ci < CPL; ci = ci + 1u) { acc[ci] = 0.0f; }\n\
         \x20 for (var base = 0u; base < params.t; base = base + TILE) {\n\
         \x20   if (lane == 0u) { atomicStore(&count, 0u); }\n    workgroupBarrier();\n\
         \x20   for (var t = base + lane; t < min(params.t, base + TILE); t = t + WG) {\n\
         \x20     var id = ids[t];\n      if (id >= V) { id = 0u; }\n\
         \x20     if (id == v) { found[atomicAdd(&count, 1u)] = t; }\n    }\n\
         \x20   workgroupBarrier();\n\
         \x20   let n = atomicLoad(&count);\n\
         \x20   if (lane == 0u) {\n\
         \x20     for (var i = 1u; i < n; i = i + 1u) {\n\
         \x20       let key = found[i];\n        var j = i;\n\
         \x20       while (j > 0u && found[j - 1u] > key) { found[j] = found[j - 1u]; j = j - 1u; }\n\
         \x20       found[j] = key;\n      }\n    }\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var ci = 0u; ci < CPL; ci = ci + 1u) {\n\
         \x20     let c = lane + ci * WG;\n\
         \x20     if (c < W) { for (var k = 0u; k < n; k = k + 1u) { acc[ci] = acc[ci] + dy[found[k] * W + c]; } }\n    }\n\
         \x20   workgroupBarrier();\n  }\n\
         \x20 for (var ci = 0u; ci < CPL; ci = ci + 1u) {\n\
         \x20   let c = lane + ci * WG;\n\
         \x20   if (c < W) { dt[v * W + c] = select(acc[ci] * SCALE, 0.0f, v == PAD); }\n  }\n}\n",
    );
    KernelSource {
        name: format!(
            "embedding_grad_v{vocab}_w{width}_s{}_p{}",
            e.scale.unwrap_or(1.0).to_bits(),
            e.padding.map_or("none".to_string(), |p| p.to_string())
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 4 * ID_TILE + 4,
    }
}

/// The constants of attention `a` over `seqs` sequences packed end to end,
/// each with a cache of `lmax` rows (and steps of at most `max_rows` rows
/// a sequence), and its helpers: `fn seq_rows()`, a sequence's rows
/// (`T / SEQS`), and `fn keys(t) -> vec2<u32>`: the first and last cache
/// row of its sequence that query row `t` of a sequence sees (causal or
/// not, within the window), as the interpreter's `keys_seen`; from it,
/// `fn tile_masked(i0, j0)`, whether no row of a 64-row tile from `i0`
/// sees a key of the 64 from `j0`, and `fn step_unseen(first, i0)`, whether
/// the 16 query rows of a cache gradient's depth step from `first` (of the
/// group's rows) see none of the 64 keys from `i0`. (`keys` grows with
/// `t`, so the tile's first and last rows decide.)
fn attention_consts(a: &Attention, lmax: u32, max_rows: u32, seqs: u32) -> String {
    let mut w = header(&format!(
        "const NH: u32 = {}u;\nconst NKV: u32 = {}u;\nconst HD: u32 = {}u;\n\
         const GROUP: u32 = {}u;\nconst SCALE: f32 = {};\nconst LMAX: u32 = {lmax}u;\n\
         const TMAX: u32 = {max_rows}u;\nconst SEQS: u32 = {seqs}u;\n",
        a.n_heads,
        a.n_kv_heads,
        a.head_dim,
        a.n_heads / a.n_kv_heads.max(1),
        f32_lit(a.scale),
    ));
    let last = if a.causal {
        "me"
    } else {
        "params.p + seq_rows() - 1u"
    };
    let range = match a.window {
        Some(win) => format!(
            "vec2<u32>(select(0u, me + 1u - {win}u, me + 1u >= {win}u), min({last}, me + {win}u - 1u))"
        ),
        None => format!("vec2<u32>(0u, {last})"),
    };
    let _ = writeln!(
        w,
        "fn seq_rows() -> u32 {{ return params.t / SEQS; }}\n\
         fn keys(t: u32) -> vec2<u32> {{\n  let me = params.p + t;\n  return {range};\n}}\n\
         fn tile_masked(i0: u32, j0: u32) -> bool {{\n\
         \x20 return keys(i0 + {tile_last}u).y < j0 || keys(i0).x > j0 + {tile_last}u;\n}}\n\
         fn step_unseen(first: u32, i0: u32) -> bool {{\n\
         \x20 let r = first % seq_rows();\n\
         \x20 if (r + {depth}u > seq_rows()) {{ return false; }}\n\
         \x20 return keys(r + {depth}u - 1u).y < i0 || keys(r).x > i0 + {tile_last}u;\n}}\n\
         const SPLITS: u32 = {splits}u;\n\
         fn chunk() -> u32 {{ return (GROUP * seq_rows() + SPLITS - 1u) / SPLITS; }}",
        splits = cache_splits(a, lmax, max_rows, seqs),
        tile_last = TILE - 1,
        depth = DEPTH,
    );
    w
}

/// The helpers of a product whose workgroup z is `z_per_seq` products for
/// each of the packed sequences: `fn zs(z)`, z's own product within its
/// sequence, `fn row0(z)`, its sequence's first row, and `fn key0(z)`,
/// its sequence's first cache row.
fn per_sequence(w: &mut String, z_per_seq: u32) {
    let _ = writeln!(
        w,
        "const ZS: u32 = {z_per_seq}u;\n\
         fn zs(z: u32) -> u32 {{ return z % ZS; }}\n\
         fn row0(z: u32) -> u32 {{ return z / ZS * seq_rows(); }}\n\
         fn key0(z: u32) -> u32 {{ return z / ZS * LMAX; }}"
    );
}

/// A product's launch over `seqs` packed sequences: each sequence's
/// `rows` (its rows, or `Rows::Fixed` cache rows) by `cols`, `batch`
/// products a sequence, one per workgroup z.
fn packed_launch(
    name: String,
    wgsl: String,
    b: Bindings,
    (rows, cols): (Rows, u32),
    batch: u32,
    seqs: u32,
) -> KernelSource {
    let mut k = batched_launch(name, wgsl, b, rows, cols, batch * seqs);
    if rows == Rows::Tokens {
        k.workgroups[1] = WorkgroupCount::per_token(1, 0, TILE * seqs);
    }
    k
}

fn attention_tag(a: &Attention, lmax: u32, max_rows: u32, seqs: u32) -> String {
    format!(
        "h{}_kv{}_d{}{}{}_l{lmax}_t{max_rows}{}",
        a.n_heads,
        a.n_kv_heads,
        a.head_dim,
        a.window.map_or(String::new(), |w| format!("_w{w}")),
        if a.causal { "" } else { "_bi" },
        if seqs > 1 {
            format!("_s{seqs}")
        } else {
            String::new()
        }
    )
}

/// `lse[t, h]`: the log-sum-exp of row `t`'s scaled scores against the keys
/// it sees, for head `h`, over `seqs` sequences packed end to end (a
/// training step's batch: `T / seqs` rows each, at most `max_rows`, and
/// caches of `lmax` rows each, a sequence's from `lmax` times its index):
/// `(q, k_cache) -> lse`, as two dispatches through the scratch: the
/// scores of every sequence's heads as [`masked_product`]s (the lowest
/// finite f32 for keys a row does not see, a tile no row sees skipping its
/// product), then a workgroup per row and head takes their maximum and the
/// sum of their exponentials. The step's `T` must be `seqs` times each
/// sequence's rows, and a sequence's caches `lmax` rows from `lmax` times
/// its index: a training pass's (`T` = `seqs · lmax`).
pub fn attention_lse(a: &Attention, lmax: u32, max_rows: u32, seqs: u32) -> Vec<KernelSource> {
    let tag = attention_tag(a, lmax, max_rows, seqs);
    let scores_bytes =
        4 * u64::from(seqs) * u64::from(max_rows) * u64::from(a.n_heads) * u64::from(lmax);
    let mut w = attention_consts(a, lmax, max_rows, seqs);
    w.push_str("const NC: u32 = LMAX;\n");
    per_sequence(&mut w, a.n_heads);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "q");
    b.activation(&mut w, input(1), "k");
    b.scratch(&mut w, "scores", scores_bytes);
    w.push_str(&masked_product(
        Operand {
            load: "q[((row0(z) + i) * NH + zs(z)) * HD + l]",
            rows_first: false,
        },
        "k[((key0(z) + j) * NKV + zs(z) / GROUP) * HD + l]",
        &format!(
            "let kr = keys(i); scores[(z * TMAX + i) * LMAX + j] = select({LOWEST}, VALUE * SCALE, j >= kr.x && j <= kr.y);"
        ),
        "seq_rows()",
        "HD",
        Skips {
            tile: Some(MASKED),
            step: None,
        },
    ));
    let scores = packed_launch(
        format!("attention_lse_scores_{tag}"),
        w,
        b,
        (Rows::Tokens, lmax),
        a.n_heads,
        seqs,
    );
    let mut w = attention_consts(a, lmax, max_rows, seqs);
    w.push_str("const H: u32 = LMAX;\nvar<workgroup> red: array<f32, WG>;\n");
    let mut b = Bindings::new();
    b.activation(&mut w, output(0), "lse");
    b.scratch(&mut w, "x", scores_bytes);
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n\
         \x20 let seq = wid.x / seq_rows();\n\
         \x20 let row = ((seq * NH + wid.y) * TMAX + wid.x % seq_rows()) * H;\n  var s = 0.0f;\n{stats}\
         \x20 if (lane == 0u) {{ lse[wid.x * NH + wid.y] = m + log(total); }}\n}}\n",
        stats = softmax_stats(),
    );
    let reduce = KernelSource {
        name: format!("attention_lse_rows_{tag}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(a.n_heads),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    };
    vec![scores, reduce]
}

/// The condition of attention's score tiles that no row of the tile sees
/// (`attention_consts`' `tile_masked`).
const MASKED: &str = "tile_masked(i0, j0)";

/// Operands of a kernel: each port's index and binding name.
type Ports<'a> = &'a [(u32, &'a str)];

/// The scratch of [`attention_grad`]'s dispatches, declared in the same
/// order by each so every one binds it at the same offsets: `delta[t·NH +
/// h]` (each row's and head's `dy · out`), then `probs[((s·NH + h)·TMAX +
/// t)·LMAX + j]` (sequence `s`'s probabilities, which the fifth dispatch
/// turns into the scores' gradients in place), then the cache gradients'
/// pieces.
fn attention_scratch(
    b: &mut Bindings,
    w: &mut String,
    a: &Attention,
    (lmax, max_rows, seqs): (u32, u32, u32),
) {
    let rows = u64::from(seqs) * u64::from(max_rows) * u64::from(a.n_heads);
    b.scratch(w, "delta", 4 * rows);
    b.scratch(w, "probs", 4 * rows * u64::from(lmax));
    let cache = u64::from(lmax) * u64::from(a.n_kv_heads) * u64::from(a.head_dim);
    let pieces = u64::from(seqs) * u64::from(cache_splits(a, lmax, max_rows, seqs));
    b.scratch(w, "part", 4 * pieces * cache);
}

/// Pieces the depth (the group's rows, `GROUP · max_rows` at most) of the
/// cache gradients' products is cut into, each a z of its own, so that
/// those products, whose outputs are only `lmax × head_dim` per KV head and
/// sequence, fill the GPU with some 512 workgroups (at most 16 pieces, each
/// at least a tile deep: a tiny model's 32 rows in 16 pieces of 2 took
/// lavapipe 6–7 ms a product, most of a training step's time).
fn cache_splits(a: &Attention, lmax: u32, max_rows: u32, seqs: u32) -> u32 {
    let tiles = lmax.div_ceil(TILE) * a.head_dim.div_ceil(TILE) * a.n_kv_heads.max(1) * seqs;
    let depth = a.n_heads / a.n_kv_heads.max(1) * max_rows;
    512u32.div_ceil(tiles).min(depth / TILE).clamp(1, 16)
}

/// Attention's backward over `seqs` sequences packed end to end (as
/// [`attention_lse`]'s), each with caches of `lmax` rows and at most
/// `max_rows` rows: `(q, k_cache, v_cache, dy, out, lse) -> (dq, dk_cache,
/// dv_cache)`, as eight dispatches run in order, which pass the
/// probabilities on through the scratch ([`attention_scratch`]):
///
/// 1. `delta`: `D = dy · out` per row and head;
/// 2. `probs`: `P = exp(scale · q·k − lse)` for the keys each row sees, 0
///    for the rest (a tiled product per sequence and head);
/// 3. `dv = Σ Pᵀ · dy` over each KV head's group of heads, in pieces of
///    the depth ([`cache_splits`]), 4. then the pieces' sum;
/// 5. `ds = scale · P · (dy · v − D)`, in place of `P`;
/// 6. `dq = ds · k`;
/// 7. `dk = Σ dsᵀ · q` over the group, in pieces, 8. then their sum.
///
/// Each product is [`masked_product`]'s 64 × 64 tiles, a dispatch's z
/// taking the sequences and heads (or KV heads and pieces). The cache
/// gradients have every row, 0 where no query looks. `T`, the rows and
/// the caches are laid out as [`attention_lse`]'s.
pub fn attention_grad(a: &Attention, lmax: u32, max_rows: u32, seqs: u32) -> Vec<KernelSource> {
    let tag = attention_tag(a, lmax, max_rows, seqs);
    let shape = (lmax, max_rows, seqs);
    let start = |inputs: &[(u32, &str)], outputs: &[(u32, &str)], nc: &str, zs: u32| {
        let mut w = attention_consts(a, lmax, max_rows, seqs);
        let _ = writeln!(w, "const NC: u32 = {nc};");
        per_sequence(&mut w, zs);
        let mut b = Bindings::new();
        for &(i, name) in inputs {
            b.activation(&mut w, input(i), name);
        }
        for &(i, name) in outputs {
            b.activation(&mut w, output(i), name);
        }
        attention_scratch(&mut b, &mut w, a, shape);
        (w, b)
    };
    let splits = cache_splits(a, lmax, max_rows, seqs);
    let (heads, kv_heads, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
    // The probabilities' rows of sequence and head `z`, at `i`, `j`.
    let probs_at = "(z * TMAX + i) * LMAX + j";
    // The cache gradients' products: z is a sequence's KV head `g` and
    // piece `zs(z) % SPLITS` of the depth `l < GROUP · T`, whose `lp`-th
    // step is the group's member `lp / T` at row `lp % T` (T a sequence's
    // rows).
    let (g, lp) = ("(zs(z) / SPLITS)", "((zs(z) % SPLITS) * chunk() + l)");
    let head = format!("({g} * GROUP + {lp} / seq_rows())");
    let member = format!("(row0(z) + {lp} % seq_rows()) * NH + {head}");
    let of_member =
        format!("probs[((z / ZS * NH + {head}) * TMAX + {lp} % seq_rows()) * LMAX + i]");
    let depth =
        "min(chunk(), GROUP * seq_rows() - min((zs(z) % SPLITS) * chunk(), GROUP * seq_rows()))";
    let part_at =
        format!("((z / ZS * SPLITS + zs(z) % SPLITS) * LMAX + i) * NKV * HD + {g} * HD + j");

    // The sum of the pieces of a cache gradient, a thread per value.
    let pieces_sum = |name: &str, out: (u32, &str)| {
        let (mut w, b) = start(&[], &[out], "1u", 1);
        let per_seq = lmax * kv_heads * hd;
        let values = u64::from(seqs) * u64::from(per_seq);
        let (workgroups, index) = constant_grid(values);
        let _ = write!(
            w,
            "@compute @workgroup_size(WG, 1, 1)\n\
             fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
             \x20 let i = {index};\n  if (i >= {values}u) {{ return; }}\n\
             \x20 let first = i / {per_seq}u * SPLITS * {per_seq}u + i % {per_seq}u;\n\
             \x20 var s = 0.0f;\n\
             \x20 for (var p = 0u; p < SPLITS; p = p + 1u) {{ s = s + part[first + p * {per_seq}u]; }}\n\
             \x20 {dst}[i] = s;\n}}\n",
            dst = out.1,
        );
        KernelSource {
            name: format!("attention_grad_{name}_{tag}"),
            wgsl: w,
            workgroup_size: [WG, 1, 1],
            bindings: b.finish(),
            workgroups,
            workgroup_bytes: 0,
        }
    };

    let (mut w, b) = start(&[(3, "dy"), (4, "o")], &[], "1u", 1);
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * NH) { return; }\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var d = 0u; d < HD; d = d + 1u) { s = s + dy[i * HD + d] * o[i * HD + d]; }\n\
         \x20 delta[i] = s;\n}\n",
    );
    let delta = flat(
        format!("attention_grad_delta_{tag}"),
        w,
        Rows::Tokens,
        heads,
        b.finish(),
    );

    // A tiled product per sequence and head (or KV head and piece, `batch`
    // of them a sequence): its kernel binding `ports`, `NC` = `nc`, `rows`
    // × `cols` outputs a sequence, skipping the tiles `masked` says no row
    // sees.
    let product = |name: &str,
                   ports: (Ports, Ports),
                   nc: &str,
                   (a_load, rows_first): (&str, bool),
                   (b_load, store): (&str, &str),
                   (m, depth, skips): (&str, &str, Skips),
                   (rows, cols, batch): (Rows, u32, u32)| {
        let (mut w, b) = start(ports.0, ports.1, nc, batch);
        let a = Operand {
            load: a_load,
            rows_first,
        };
        w.push_str(&masked_product(a, b_load, store, m, depth, skips));
        packed_launch(
            format!("attention_grad_{name}_{tag}"),
            w,
            b,
            (rows, cols),
            batch,
            seqs,
        )
    };
    let q_at = "q[((row0(z) + i) * NH + zs(z)) * HD + l]";
    let dq_depth = format!("min(LMAX, keys(i0 + {}u).y + 1u)", TILE - 1);
    let probs = product(
        "probs",
        (&[(0, "q"), (1, "k"), (5, "lse")], &[]),
        "LMAX",
        (q_at, false),
        (
            "k[((key0(z) + j) * NKV + zs(z) / GROUP) * HD + l]",
            &format!(
                "let kr = keys(i); probs[{probs_at}] = select(0.0f, exp(VALUE * SCALE - lse[(row0(z) + i) * NH + zs(z)]), j >= kr.x && j <= kr.y);"
            ),
        ),
        ("seq_rows()", "HD", Skips {
            tile: Some(MASKED),
            step: None,
        }),
        (Rows::Tokens, lmax, heads),
    );
    // Over the group's members: the probabilities (or scores' gradients)
    // of each, a piece of the depth per z, into the pieces' scratch.
    let unseen = Skips {
        tile: None,
        step: Some("step_unseen((zs(z) % SPLITS) * chunk() + l0, i0)"),
    };
    let over_group = ("LMAX", depth, unseen);
    let store = format!("part[{part_at}] = VALUE;");
    let dv = product(
        "dv",
        (&[(3, "dy")], &[]),
        "HD",
        (&of_member, true),
        (&format!("dy[({member}) * HD + j]"), &store),
        over_group,
        (Rows::Fixed(lmax), hd, kv_heads * splits),
    );
    let dv_sum = pieces_sum("dv_sum", (2, "dv"));
    let ds = product(
        "ds",
        (&[(2, "v"), (3, "dy")], &[]),
        "LMAX",
        ("dy[((row0(z) + i) * NH + zs(z)) * HD + l]", false),
        (
            "v[((key0(z) + j) * NKV + zs(z) / GROUP) * HD + l]",
            &format!(
                "let idx = {probs_at}; probs[idx] = SCALE * probs[idx] * (VALUE - delta[(row0(z) + i) * NH + zs(z)]);"
            ),
        ),
        ("seq_rows()", "HD", Skips {
            tile: Some(MASKED),
            step: None,
        }),
        (Rows::Tokens, lmax, heads),
    );
    let dq = product(
        "dq",
        (&[(1, "k")], &[(0, "dq")]),
        "HD",
        ("probs[(z * TMAX + i) * LMAX + l]", false),
        (
            "k[((key0(z) + l) * NKV + zs(z) / GROUP) * HD + j]",
            "dq[((row0(z) + i) * NH + zs(z)) * HD + j] = VALUE;",
        ),
        // No key past the last the tile's rows see.
        ("seq_rows()", &dq_depth, Skips::default()),
        (Rows::Tokens, hd, heads),
    );
    let dk = product(
        "dk",
        (&[(0, "q")], &[]),
        "HD",
        (&of_member, true),
        (&format!("q[({member}) * HD + j]"), &store),
        over_group,
        (Rows::Fixed(lmax), hd, kv_heads * splits),
    );
    let dk_sum = pieces_sum("dk_sum", (1, "dk"));
    vec![delta, probs, dv, dv_sum, ds, dq, dk, dk_sum]
}
