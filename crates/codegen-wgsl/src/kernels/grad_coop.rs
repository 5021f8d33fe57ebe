//! `grad_coop`: a matmul's input and weight gradients on tensor cores
//! (wgpu's experimental cooperative matrices, 16×16×16 f16 × f16 → f32), the
//! kernels of a mixed-precision training step ([`matmul_grad_x`]:
//! `dx = dy · w`; [`matmul_grad_w`]: `dw = dyᵀ · x`).
//!
//! Both are `out[i, j] = Σ_l a(i, l) · b(l, j)` with `a` read from `dy`
//! (row-major for `dx`, transposed for `dw`) and `b` row-major (the weight
//! in its stored dtype, or the saved input). A workgroup of 8 subgroups
//! makes a 64 × 256 block of `out` (each subgroup 2 × 4 accumulators; the
//! forward's block: on an H200 the 1B shape's weight gradients took 18%
//! less time than in 64 × 128 blocks of 4),
//! staging 32-deep tiles of `a` and `b` in workgroup memory as f16; a
//! product too shallow in blocks to fill the GPU cuts its depth into pieces
//! (a workgroup z each, writing partial sums to the scratch) and sums them
//! in a last dispatch, as the f32 kernels of [`super::backward`] do.
//!
//! The surprise is the range: a gradient's values can be far below f16's
//! smallest (the LM head's `dy` at SmolLM2's shape is about 4e-8, f16's
//! smallest subnormal 6e-8), so a first dispatch takes the largest `|a|` of
//! each row of `a` and keeps a power of two that brings it to `[2¹³, 2¹⁴)`;
//! the staging multiplies by it, the epilogue by its reciprocal, both
//! exactly. Scaled, `a` is staged in two f16 parts (the high one keeps its
//! top 11 significant bits, the low one the rest), so every product is two
//! multiply-adds and
//! the sums see about 22 bits of `dy`; `b` is rounded to f16 once. Every
//! dispatch of one gradient declares the scratch in the same order (the
//! pieces' partials first, then the scales), so each binds them at the same
//! offsets. Like [`super::gemm_coop`], the kernel assumes no subgroup size:
//! it runs its subgroup tiles in as many passes as the adapter's subgroups
//! take, and a subgroup without a tile computes a duplicate into a spare
//! slot.

use super::backward::{sum_pieces, Pieces};
use super::gemm_coop::{k_loop, multiplies, subgroup_pass};
use super::rowwise::{per_row, WG};
use super::{enable_f16, input, output, prelude, tree_reduce, Bindings, KernelSource, Rows};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Subgroups along a block's rows and columns.
const WARPS_M: u32 = 2;
const WARPS_N: u32 = 4;
/// Accumulators of one subgroup along the rows and columns.
const FRAGS_M: u32 = 2;
const FRAGS_N: u32 = 4;
/// Depth of one staged tile.
const BK: u32 = 32;
const WARPS: u32 = WARPS_M * WARPS_N;
const THREADS: u32 = 32 * WARPS;
/// Rows and columns of `out` per block.
const BM: u32 = 16 * WARPS_M * FRAGS_M;
const BN: u32 = 16 * WARPS_N * FRAGS_N;
/// Row strides of the staged `a` and `b` tiles, in f16: padded by 8, which
/// spreads a fragment's rows over the memory banks and keeps every row
/// 16-byte aligned.
const A_STRIDE: u32 = BK + 8;
const B_STRIDE: u32 = BN + 8;
/// Workgroups a product aims for: about two per SM of a 132-SM GPU.
const TARGET_GROUPS: u32 = 264;
/// Most pieces of one product's depth.
const MAX_PIECES: u32 = 16;

/// Workgroup memory of the product kernel: the staged tiles (`a` in two
/// parts), one accumulator slot per subgroup and a spare, and the subgroup
/// count.
pub const WORKGROUP_BYTES: u32 =
    2 * (2 * BM * A_STRIDE + BK * B_STRIDE) + 4 * (WARPS + 1) * 256 + 16;

/// Pieces a product of `blocks` blocks cuts its `depth` into: enough for
/// [`TARGET_GROUPS`] workgroups, at most [`MAX_PIECES`], each at least two
/// tiles deep.
fn pieces(blocks: u32, depth: u32) -> u32 {
    TARGET_GROUPS
        .div_ceil(blocks.max(1))
        .min(depth / (2 * BK))
        .clamp(1, MAX_PIECES)
}

/// The depth of each of `pieces` pieces of a fixed `depth`: a whole number
/// of tiles.
fn chunk(depth: u32, pieces: u32) -> u32 {
    depth.div_ceil(pieces).div_ceil(BK) * BK
}

/// One gradient's product: where `a` and `b` come from and how big it is.
struct Product<'a> {
    /// Rows of `out`: the step's (`dx`) or the weight's (`dw`).
    rows: Rows,
    /// The most rows `out` has (the pieces' partials are this tall).
    max_rows: u32,
    /// Columns of `out`.
    cols: u32,
    /// The depth: a weight's rows (`dx`) or the step's (`dw`).
    depth: Rows,
    /// The largest depth.
    max_depth: u32,
    /// Element `(i, l)` of `a` and `(l, j)` of `b`, WGSL of `i`, `l`, `j`.
    a: &'a str,
    b: &'a str,
    /// Whether consecutive `i` of `a` are consecutive in memory (`dyᵀ`).
    a_rows_first: bool,
}

impl Product<'_> {
    fn blocks(&self) -> u32 {
        let rows = match self.rows {
            Rows::Tokens => self.max_rows,
            Rows::Fixed(n) => n,
        };
        rows.div_ceil(BM) * self.cols.div_ceil(BN)
    }

    fn rows_expr(&self) -> String {
        wgsl_count(self.rows)
    }
}

/// A count of `rows` as WGSL: the step's rows or a constant.
fn wgsl_count(rows: Rows) -> String {
    match rows {
        Rows::Tokens => "params.t".into(),
        Rows::Fixed(n) => format!("{n}u"),
    }
}

/// `dx = dy · w` for `dy` `[T, n]` and the weight `[n, k]` stored as
/// `wdtype`, in steps of at most `max_rows`: the row scales, the product
/// and, when its depth is cut into pieces, their sum.
pub fn matmul_grad_x(n: u32, k: u32, wdtype: DType, max_rows: u32) -> Vec<KernelSource> {
    let p = Product {
        rows: Rows::Tokens,
        max_rows,
        cols: k,
        depth: Rows::Fixed(n),
        max_depth: n,
        a: "dy[i * N + l]",
        b: "load_w(l * NC + j)",
        a_rows_first: false,
    };
    let tag = format!("{wdtype}_n{n}_k{k}_t{max_rows}");
    kernels("matmul_grad_x_coop", &tag, n, &p, &|b, w| {
        b.weight(w, input(1), "w", wdtype);
    })
}

/// `dw = dyᵀ · x` for `dy` `[T, n]` and `x` `[T, k]` in steps of at most
/// `max_rows`: the column scales of `dy`, the product over the step's rows
/// and, when they are cut into pieces, their sum.
pub fn matmul_grad_w(n: u32, k: u32, max_rows: u32) -> Vec<KernelSource> {
    let p = Product {
        rows: Rows::Fixed(n),
        max_rows: n,
        cols: k,
        depth: Rows::Tokens,
        max_depth: max_rows,
        a: "dy[l * N + i]",
        b: "x[l * NC + j]",
        a_rows_first: true,
    };
    let tag = format!("n{n}_k{k}_t{max_rows}");
    kernels("matmul_grad_w_coop", &tag, n, &p, &|b, w| {
        b.activation(w, input(1), "x");
    })
}

/// The dispatches of product `p` of `dy` (`[T, n]`), named `KIND_…_TAG`;
/// `bind_b` declares `b`'s binding (input 1).
fn kernels(
    kind: &str,
    tag: &str,
    n: u32,
    p: &Product,
    bind_b: &dyn Fn(&mut Bindings, &mut String),
) -> Vec<KernelSource> {
    // The pieces and each one's depth (WGSL): whole tiles, and for a fixed
    // depth, none left empty.
    let (pieces, chunk) = match p.depth {
        Rows::Fixed(d) => {
            let c = chunk(d, pieces(p.blocks(), d));
            (d.div_ceil(c), format!("{c}u"))
        }
        Rows::Tokens => {
            let n = pieces(p.blocks(), p.max_depth);
            (n, format!("(params.t + {n}u * BK - 1u) / ({n}u * BK) * BK"))
        }
    };
    let layout = (pieces > 1).then(|| Pieces::new(p.rows, p.cols, pieces, p.max_rows));
    // Every dispatch: the partials (when cut), then the scales.
    let scratch = |b: &mut Bindings, w: &mut String| {
        if let Some(l) = &layout {
            b.scratch(w, "part", l.part_bytes);
        }
        b.scratch(w, "scales", 4 * u64::from(p.max_rows));
    };
    let consts = format!("const N: u32 = {n}u;\nconst NC: u32 = {}u;\n", p.cols);
    let mut out = vec![scales(kind, tag, &consts, p, &scratch)];
    let mut w = prelude();
    w.insert_str(0, "enable wgpu_cooperative_matrix;\n");
    enable_f16(&mut w);
    w.push_str(&consts);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    bind_b(&mut b, &mut w);
    let name = match &layout {
        Some(l) => format!("{kind}_pieces_{tag}_p{}", l.pieces),
        None => {
            b.activation(&mut w, output(0), "out");
            format!("{kind}_{tag}")
        }
    };
    scratch(&mut b, &mut w);
    w.push_str(INVERSE_OF);
    w.push_str(&product(p, pieces, &chunk));
    let row_blocks = match p.rows {
        Rows::Tokens => WorkgroupCount::per_token(1, 0, BM),
        Rows::Fixed(rows) => WorkgroupCount::fixed(rows.div_ceil(BM)),
    };
    out.push(KernelSource {
        name,
        wgsl: w,
        workgroup_size: [THREADS, 1, 1],
        bindings: b.finish(),
        workgroups: [
            row_blocks,
            WorkgroupCount::fixed(p.cols.div_ceil(BN)),
            WorkgroupCount::fixed(pieces),
        ],
        workgroup_bytes: WORKGROUP_BYTES,
    });
    if let Some(l) = &layout {
        out.push(sum_pieces(format!("{kind}_sum_{tag}_p{pieces}"), "out", l));
    }
    out
}

/// WGSL of `scale_of(m)`: the power of two that brings `m` (a row's
/// largest `|a|`, finite or not) to `[2¹³, 2¹⁴)`, within `[2⁻¹²⁶, 2¹²⁶]`
/// (`2¹²⁶` for zero, so a row of zeros stays zeros).
const SCALE_OF: &str = "fn scale_of(m: f32) -> f32 {\n\
    \x20 let e = i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127;\n\
    \x20 return bitcast<f32>(u32(clamp(13 - e, -126, 126) + 127) << 23u);\n}\n";

/// WGSL of `inverse_of(s)`: the reciprocal of a [`SCALE_OF`] scale, made
/// from its exponent bits, so that undoing the scale is a multiplication by
/// an exact power of two (a division need not be correctly rounded on every
/// backend).
const INVERSE_OF: &str = "fn inverse_of(s: f32) -> f32 {\n\
    \x20 return bitcast<f32>((254u - (bitcast<u32>(s) >> 23u)) << 23u);\n}\n";

/// Columns of `dy` one workgroup of [`scales`] takes for `dw`.
const COLS: u32 = 32;

/// The first dispatch: each row of `a`'s scale into `scales`. `dx`'s rows
/// of `a` are `dy`'s rows (a workgroup each); `dw`'s are its columns
/// ([`COLS`] a workgroup, 8 threads each, reading down the step's rows).
fn scales(
    kind: &str,
    tag: &str,
    consts: &str,
    p: &Product,
    scratch: &dyn Fn(&mut Bindings, &mut String),
) -> KernelSource {
    let mut w = prelude();
    w.push_str(consts);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    scratch(&mut b, &mut w);
    w.push_str(SCALE_OF);
    let name = format!("{kind}_scales_{tag}");
    if p.a_rows_first {
        // 32 columns a workgroup, 8 threads a column each taking every
        // 8th row: consecutive threads read consecutive columns, and a
        // thread reads an eighth of the step's rows (one thread a column
        // took an H200 6–7 ms a sequence at 512 rows).
        let _ = write!(
            w,
            "var<workgroup> red: array<f32, {WG}>;\n\
             @compute @workgroup_size({WG}, 1, 1)\n\
             fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
             \x20 let c = lid.x % {COLS}u;\n  let g = lid.x / {COLS}u;\n\
             \x20 let j = min(wid.x * {COLS}u + c, N - 1u);\n\
             \x20 var m = 0.0f;\n\
             \x20 for (var t = g; t < params.t; t = t + {groups}u) {{ m = max(m, abs(dy[t * N + j])); }}\n\
             \x20 red[lid.x] = m;\n  workgroupBarrier();\n\
             \x20 if (g == 0u && wid.x * {COLS}u + c < N) {{\n\
             \x20   for (var q = 1u; q < {groups}u; q = q + 1u) {{ m = max(m, red[q * {COLS}u + c]); }}\n\
             \x20   scales[j] = scale_of(m);\n\
             \x20 }}\n}}\n",
            groups = WG / COLS,
        );
        return KernelSource {
            name,
            wgsl: w,
            workgroup_size: [WG, 1, 1],
            bindings: b.finish(),
            workgroups: [
                WorkgroupCount::fixed(p.max_rows.div_ceil(COLS)),
                WorkgroupCount::fixed(1),
                WorkgroupCount::fixed(1),
            ],
            workgroup_bytes: 4 * WG,
        };
    }
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {WG}>;\n\
         @compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let i = wid.x;\n  let lane = lid.x;\n\
         \x20 var m = 0.0f;\n\
         \x20 for (var l = lane; l < N; l = l + {WG}u) {{ m = max(m, abs(dy[i * N + l])); }}\n\
         \x20 red[lane] = m;\n  workgroupBarrier();\n{}\
         \x20 if (lane == 0u) {{ scales[i] = scale_of(red[0]); }}\n}}\n",
        tree_reduce(WG, "lane", "0u", "max")
    );
    per_row(name, w, p.rows, b.finish())
}

/// Each thread's share of a staged tile, loaded as runs of 4 consecutive
/// elements in memory: `a`'s `BM × BK` tile is 2 runs a thread, `b`'s
/// `BK × BN` tile 8.
const A_RUNS: u32 = BM * BK / (4 * THREADS);
const B_RUNS: u32 = BK * BN / (4 * THREADS);

/// WGSL of the tile index `(ii, ll)` of `a`'s element `(r, c)` of a thread
/// (run `r`, element `c` of it): runs along `ll` for `dx` (`dy`'s rows),
/// along `ii` for `dw` (`dy`'s columns). `ai` and `al` are the thread's
/// first element.
fn a_element(rows_first: bool, r: u32, c: u32) -> (String, String) {
    if rows_first {
        (
            format!("ai + {c}u"),
            format!("al + {}u", r * THREADS / (BM / 4)),
        )
    } else {
        (
            format!("ai + {}u", r * THREADS / (BK / 4)),
            format!("al + {c}u"),
        )
    }
}

/// The product's entry point, cut into `pieces` pieces of its depth,
/// each `chunk` deep (a WGSL expression, whole tiles). The
/// K loop stages the registers loaded in the step before, then loads the
/// next tile's while the subgroups multiply this one's.
fn product(p: &Product, pieces: u32, chunk: &str) -> String {
    // Where a thread's runs start: `ai`, `al` (a), `bl`, `bj` (b).
    let a_start = if p.a_rows_first {
        format!(
            "  let ai = (lid % {q}u) * 4u;\n  let al = lid / {q}u;\n",
            q = BM / 4
        )
    } else {
        format!(
            "  let al = (lid % {q}u) * 4u;\n  let ai = lid / {q}u;\n",
            q = BK / 4
        )
    };
    let b_start = format!(
        "  let bj = (lid % {q}u) * 4u;\n  let bl = lid / {q}u;\n",
        q = BN / 4
    );
    let mut regs = String::new();
    let mut scales = String::new();
    let mut load = String::new();
    let mut store = String::new();
    for r in 0..A_RUNS {
        for c in 0..4 {
            let (ii, ll) = a_element(p.a_rows_first, r, c);
            let _ = writeln!(regs, "  var ra{r}_{c} = 0.0f;");
            let _ = writeln!(
                load,
                "      ra{r}_{c} = 0.0f;\n      \
                 {{ let i = i0 + {ii}; let l = k0 + {ll}; if (i < rows && l < l1) {{ ra{r}_{c} = {a}; }} }}",
                a = p.a
            );
            // One scale per row of `a`: a run along rows has four.
            let sc = if p.a_rows_first { c } else { r };
            let _ = writeln!(
                store,
                "      {{ let v = ra{r}_{c} * sa{sc}; let h = bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);\n        \
                 let o = ({ii}) * STRIDE + {ll}; stage[o] = f16(h); stage[SL + o] = f16(v - h); }}"
            );
        }
    }
    let scale_rows = if p.a_rows_first { 4 } else { A_RUNS };
    for q in 0..scale_rows {
        let (ii, _) = if p.a_rows_first {
            a_element(true, 0, q)
        } else {
            a_element(false, q, 0)
        };
        let _ = writeln!(
            scales,
            "  let sa{q} = select(1.0f, scales[min(i0 + {ii}, MR - 1u)], i0 + {ii} < rows);"
        );
    }
    for r in 0..B_RUNS {
        for c in 0..4 {
            let ll = format!("bl + {}u", r * THREADS / (BN / 4));
            let _ = writeln!(regs, "  var rb{r}_{c} = 0.0f;");
            let _ = writeln!(
                load,
                "      rb{r}_{c} = 0.0f;\n      \
                 {{ let l = k0 + {ll}; let j = j0 + bj + {c}u; if (l < l1 && j < NC) {{ rb{r}_{c} = {b}; }} }}",
                b = p.b
            );
            let _ = writeln!(
                store,
                "      stage[SB + ({ll}) * BSTRIDE + bj + {c}u] = f16(rb{r}_{c});"
            );
        }
    }
    let mma = multiplies(BK, FRAGS_M, FRAGS_N, &|ks, j| {
        format!(
            "      let ob{ks}_{j} = SB + {k16}u * BSTRIDE + wn * {fn16}u + {j16}u;\n      \
             let fb{ks}_{j} = coopLoadT<coop_mat16x16<f16, B>>(&stage[ob{ks}_{j}], BSTRIDE);",
            fn16 = FRAGS_N * 16,
            j16 = j * 16,
            k16 = ks * 16,
        )
    });
    let mut accs = String::new();
    let mut epilogue = String::new();
    let out = if pieces > 1 {
        "part[(z * MR + i) * NC + j]"
    } else {
        "out[i * NC + j]"
    };
    for i in 0..FRAGS_M {
        for j in 0..FRAGS_N {
            let _ = writeln!(
                accs,
                "    var acc{i}_{j} = coopLoad<coop_mat16x16<f32, C>>(&cs[zero], 16u);"
            );
            let _ = write!(
                epilogue,
                "    coopStoreT(acc{i}_{j}, &cs[cb], 16u);\n    workgroupBarrier();\n    \
                 if (owns) {{\n      \
                 let ib = i0 + wm * {fm16}u + {i16}u;\n      \
                 let jb = j0 + wn * {fn16}u + {j16}u;\n      \
                 for (var e = sgl; e < 256u; e = e + sgs) {{\n        \
                 let i = ib + e / 16u;\n        let j = jb + e % 16u;\n        \
                 if (i < rows && j < NC) {{ {out} = cs[cb + e] * inverse_of(scales[i]); }}\n      \
                 }}\n    }}\n    workgroupBarrier();\n",
                fm16 = FRAGS_M * 16,
                i16 = i * 16,
                fn16 = FRAGS_N * 16,
                j16 = j * 16,
            );
        }
    }
    format!(
        "const BM: u32 = {BM}u;\nconst BN: u32 = {BN}u;\nconst BK: u32 = {BK}u;\n\
         const STRIDE: u32 = {A_STRIDE}u;\nconst BSTRIDE: u32 = {B_STRIDE}u;\n\
         const SL: u32 = {sl}u;\nconst SB: u32 = {sb}u;\nconst WARPS: u32 = {WARPS}u;\n\
         const MR: u32 = {mr}u;\n\
         var<workgroup> stage: array<f16, {st}>;\n\
         var<workgroup> cs: array<f32, {cs}>;\n\
         var<workgroup> groups_sh: array<u32, 4>;\n\
         @compute @workgroup_size({THREADS}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,\n\
         \x20       @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) sgl: u32,\n\
         \x20       @builtin(subgroup_size) sgs: u32, @builtin(num_subgroups) nsg: u32) {{\n\
         \x20 if (lid == 0u) {{ groups_sh[0] = nsg; }}\n\
         \x20 let groups = workgroupUniformLoad(&groups_sh[0]);\n\
         \x20 let rows = {rows};\n  let depth = {depth};\n\
         \x20 let i0 = wid.x * BM;\n  let j0 = wid.y * BN;\n  let z = wid.z;\n\
         \x20 let chunk = {chunk};\n\
         \x20 let l0 = min(z * chunk, depth);\n  let l1 = min(l0 + chunk, depth);\n\
         \x20 let kts = (l1 - l0 + BK - 1u) / BK;\n\
         {a_start}{b_start}{scales}{regs}\
         {pass}{accs}\
         \x20   var k0 = l0;\n\
         {load}\
         {k_loop}{epilogue}\
         \x20 }}\n}}\n",
        sl = BM * A_STRIDE,
        sb = 2 * BM * A_STRIDE,
        mr = p.max_rows,
        st = 2 * BM * A_STRIDE + BK * B_STRIDE,
        cs = (WARPS + 1) * 256,
        rows = p.rows_expr(),
        pass = subgroup_pass(WARPS_N, THREADS),
        k_loop = k_loop("kts", &load, &store, &mma),
        depth = wgsl_count(p.depth),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A product is cut into 1 to 16 pieces, each at least two tiles
        /// deep when cut, and into enough for the workgroups it aims for
        /// unless one of those bounds stops it.
        #[test]
        fn pieces_fill_the_gpu_within_their_bounds(blocks in 1u32..5000, depth in 1u32..200_000) {
            let p = pieces(blocks, depth);
            prop_assert!((1..=MAX_PIECES).contains(&p));
            if p > 1 {
                prop_assert!(depth / p >= 2 * BK);
            }
            prop_assert!(
                blocks * p >= TARGET_GROUPS || p == MAX_PIECES || p == (depth / (2 * BK)).max(1)
            );
            // Rounded to whole tiles, a fixed depth's pieces cover it, and
            // as many as start before its end run.
            let c = chunk(depth, p);
            let used = depth.div_ceil(c);
            prop_assert!(c.is_multiple_of(BK) && used * c >= depth && (used - 1) * c < depth && used <= p);
        }
    }

    /// Every kernel validates with the capabilities of the variant that
    /// runs it, both gradients, pieced or not.
    #[test]
    fn every_kernel_validates_with_cooperative_matrices() {
        use gerbil_plan::Feature::{CooperativeMatrix, ShaderF16, Subgroups};
        let kernels = [
            matmul_grad_x(8, 70, DType::F32, 310),
            matmul_grad_x(49_152, 576, DType::BF16, 512),
            matmul_grad_w(576, 576, 512),
            matmul_grad_w(49_152, 576, 512),
        ];
        for k in kernels.iter().flatten() {
            crate::validate_with(&k.name, &k.wgsl, &[ShaderF16, Subgroups, CooperativeMatrix])
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
