//! `gemm_coop`: the prefill matmul of a [`MatMulSpec`] with `T` rows on
//! tensor cores, through wgpu's experimental cooperative matrices
//! (`enable wgpu_cooperative_matrix;`, 16×16×16 f16 × f16 → f32); also a
//! batch step's matmul of dense weights wide enough to fill the GPU, in
//! blocks one accumulator (16 rows) tall ([`CoopGemm::choose_batch`]).
//!
//! A workgroup computes a `BM × BN` block of `y` (`BM` tokens by `BN`
//! staged weight rows) with a grid of subgroups, each owning `FM × FN`
//! accumulators (`coop_mat16x16<f32, C>`); [`CoopGemm::choose`] picks the
//! block shape per matmul within the variant's workgroup memory (from 64 × 64
//! blocks of 4 subgroups with 2 × 2 accumulators, 20 KiB, to 64 × 256 of 8
//! with 2 × 4, 39 KiB, and 128 × 128 of 8 with 4 × 2, 40 KiB, all with
//! 32-wide K tiles: larger blocks re-read `x`
//! and the weights less, smaller ones fill the GPU when `N` is small; the
//! 16-row batch blocks stage 64-wide K tiles, which halve the barriers),
//! splitting K across
//! workgroups where the blocks are too few. The K loop goes `BK` at a time:
//! every thread loads its share of the next `x` and weight tiles into
//! registers while the subgroups multiply the current tiles from workgroup
//! memory, then converts them to f16 as it stores them: bf16, f16 and f32
//! weights are widened and rounded here, never at compile time, so every
//! variant binds the plan's one copy of the weights; `x` (f32 in memory) is
//! staged as two f16 tiles, its high part and the rest, and every product
//! is two multiply-adds, so the sums see 21–22 bits of `x` instead of 11
//! (one rounding of `x` a GEMM was the variant's error: the Llama-3.2-1B
//! shape's logits went from 6.2e-2 to 2.8e-2 from transformers', for about
//! a quarter of its prefill speed on an H200).
//! Out-of-range rows (`params.t`, `N`) and columns (`K`) stage as zero. With
//! a norm prologue the staging multiplies `x[m, k]` by `gamma[k] + offset` and
//! sums `x[m, k]²` in f32 from the f32 values; the epilogue scales the sums by
//! each row's inverse RMS. With a gated epilogue every 16 staged rows are 8
//! gate rows `n..n+8` and their 8 up rows `N + n..`, so each accumulator
//! holds both sums of its 8 columns. The epilogue stores one accumulator at
//! a time to workgroup memory, and the subgroup's threads add the bias,
//! apply the activation and residual, and write `y`.
//!
//! The surprise: the kernel must not assume a subgroup size. It is laid out
//! for subgroups of 32 (NVIDIA), but reads `num_subgroups` (made
//! workgroup-uniform through `workgroupUniformLoad`, as naga requires of the
//! loop around barriers and cooperative operations) and runs the subgroup
//! tiles in as many passes as it takes; a subgroup without a tile in a pass
//! computes a duplicate and stores it into a spare slot. Also: naga 30
//! panics when a `coopStore` pointer has an inline index expression, so every
//! offset is a `let` first; bindings may not be called `A`, `B` or `C` (the
//! cooperative roles); the staged tiles share one array declared first,
//! so fragment loads stay 16-byte aligned; and every workgroup variable is an
//! array of a multiple of 16 bytes — with a lone 4-byte `u32` beside them,
//! NVIDIA's driver (580) put every `coopStoreT` into workgroup memory one
//! element before where the kernel's own loads looked for it.

use super::linear::{self, bind_after_weight, bind_weight, name_parts, row_loader, WeightRead};
use super::matmul::MatMulSpec;
use super::{enable_f16, input, prelude, split_groups, Bindings, KernelSource};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Row stride of the staged tiles, in f16, for `bk` columns of K: plus 8 of
/// padding, which spreads the rows of a fragment over the memory banks and
/// keeps each row 16-byte aligned.
const fn stride(bk: u32) -> u32 {
    bk + 8
}

/// The block shape of one kernel: a `warps_m × warps_n` grid of subgroups
/// (of 32 threads on the GPUs it is laid out for), each with
/// `frags_m × frags_n` accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    /// Subgroups along the block's rows (tokens).
    pub warps_m: u32,
    /// Subgroups along the block's staged weight rows.
    pub warps_n: u32,
    /// Accumulators of one subgroup along the rows.
    pub frags_m: u32,
    /// Accumulators of one subgroup along the weight rows.
    pub frags_n: u32,
    /// K per staged tile (32 or 64).
    pub bk: u32,
}

/// Rows (`T`) at which [`CoopGemm::choose`] counts workgroups: a 512-token
/// prompt step.
const REF_ROWS: u32 = 512;
/// Workgroups [`CoopGemm::choose`] wants at [`REF_ROWS`]: about two per SM
/// of a 132-SM GPU, so that one block's barriers overlap another's work.
const TARGET_GROUPS: u32 = 256;
/// Most K splits of one matmul.
const MAX_SPLITS: u32 = 8;
/// Fewest K tiles per split: shorter ones spend more on the partial sums
/// than they gain in workgroups.
const MIN_SPLIT_TILES: u32 = 16;
/// Fewest K tiles per split of a batch step's matmul.
const MIN_BATCH_SPLIT_TILES: u32 = 4;

impl CoopTile {
    /// The tiles codegen picks from, largest block first. 64 × 256 before
    /// 128 × 128 (the same 8 accumulators a subgroup): with `x` in two
    /// parts, fewer of its rows a block make fewer fragment loads (H200,
    /// Llama-3.2-1B shape: pp512 24.1k → 27.3k tok/s; SmolLM2 unchanged).
    pub const CANDIDATES: [CoopTile; 5] = [
        CoopTile::new(2, 4, 2, 4, 32),
        CoopTile::new(2, 4, 4, 2, 32),
        CoopTile::new(2, 2, 4, 4, 32),
        CoopTile::new(2, 2, 2, 4, 32),
        CoopTile::new(2, 2, 2, 2, 32),
    ];

    /// The tiles of batch steps ([`CoopGemm::choose_batch`]): one 16-row
    /// accumulator tall, as a step's rows are at most a few sequences'.
    pub const BATCH: [CoopTile; 3] = [
        CoopTile::new(1, 4, 1, 2, 64),
        CoopTile::new(1, 4, 1, 1, 64),
        CoopTile::new(1, 4, 1, 1, 32),
    ];

    /// A tile of `warps_m × warps_n` subgroups with `frags_m × frags_n`
    /// accumulators each, staging `bk` columns of K at a time.
    pub const fn new(warps_m: u32, warps_n: u32, frags_m: u32, frags_n: u32, bk: u32) -> Self {
        CoopTile {
            warps_m,
            warps_n,
            frags_m,
            frags_n,
            bk,
        }
    }

    /// Threads staging one row of `x` (4 columns each).
    fn lanes(self) -> u32 {
        self.bk / 4
    }

    /// f32 slots of the accumulator area: one 16 × 16 slot per subgroup
    /// and a spare, and room for the norm's per-lane partial sums.
    fn slots(self) -> u32 {
        ((self.warps() + 1) * 256).max(self.bm() * self.lanes())
    }

    fn warps(self) -> u32 {
        self.warps_m * self.warps_n
    }

    /// Threads per workgroup.
    pub fn threads(self) -> u32 {
        32 * self.warps()
    }

    /// Tokens per block.
    pub fn bm(self) -> u32 {
        16 * self.warps_m * self.frags_m
    }

    /// Staged weight rows per block.
    pub fn bn(self) -> u32 {
        16 * self.warps_n * self.frags_n
    }

    /// Workgroup memory of its kernel with the norm prologue (the most any
    /// of its kernels uses): staged tiles, accumulator slots, the norm's
    /// inverse RMS and the subgroup count.
    pub fn workgroup_bytes(self) -> u32 {
        2 * (2 * self.bm() + self.bn()) * stride(self.bk) + 4 * self.slots() + 4 * self.bm() + 32
    }

    /// Kernel-name tag, e.g. `128x128w8` (`16x128k64w4` for 64-wide K tiles).
    pub fn tag(self) -> String {
        let k = if self.bk == 32 {
            String::new()
        } else {
            format!("k{}", self.bk)
        };
        format!("{}x{}{k}w{}", self.bm(), self.bn(), self.warps())
    }
}

/// How one matmul runs on tensor cores: the block shape, the number of
/// splits of its K range, and the largest `T` of a step (which sizes the
/// partial sums of split kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopGemm {
    /// Block shape.
    pub tile: CoopTile,
    /// Workgroups sharing one block's K range (1: no split). Divides the
    /// K tiles.
    pub splits: u32,
    /// Largest `T` the kernel runs at.
    pub max_rows: u32,
}

impl CoopGemm {
    /// For `n` outputs (a gated matmul's `n`) of a `k`-wide matmul: the
    /// largest tile within `max_workgroup_bytes` that gives
    /// [`TARGET_GROUPS`] workgroups at [`REF_ROWS`] rows, splitting K into
    /// up to [`MAX_SPLITS`] parts of at least [`MIN_SPLIT_TILES`] tiles
    /// where the blocks alone are too few; else the tile giving the most
    /// workgroups, unsplit.
    pub fn choose(n: u32, k: u32, glu: bool, max_rows: u32, max_workgroup_bytes: u32) -> Self {
        let shape = Shape {
            n,
            k,
            glu,
            max_rows,
        };
        let tiles = &CoopTile::CANDIDATES;
        shape
            .filling(tiles, REF_ROWS, MIN_SPLIT_TILES, max_workgroup_bytes)
            .unwrap_or_else(|| shape.most_groups(tiles, REF_ROWS, max_workgroup_bytes))
    }

    /// As [`choose`](Self::choose) for a batch step of at most `max_rows`
    /// rows: the first [`CoopTile::BATCH`] tile that gives
    /// [`TARGET_GROUPS`] workgroups for one block of 16 rows, splitting K down to
    /// [`MIN_BATCH_SPLIT_TILES`] tiles a split (a batch step's few rows make
    /// each tile cheap). `None` where none does: such a matmul is too
    /// narrow for tensor cores to pay in a batch step, and its caller keeps
    /// [`gemv_batch`](super::gemv_batch) (an H200, 16-row steps: the
    /// Llama-3.2-1B shape's matmuls, 256–384 workgroups and 1,002 for the LM
    /// head, took 3.4 ms of GPU time on tensor cores against 7.5; SmolLM2's
    /// 576–1,536-wide layers, 48–120 workgroups, 3.8 against 2.3, while its
    /// LM head, 384 workgroups, took 0.09 against 0.29).
    pub fn choose_batch(
        n: u32,
        k: u32,
        glu: bool,
        max_rows: u32,
        max_workgroup_bytes: u32,
    ) -> Option<Self> {
        let shape = Shape {
            n,
            k,
            glu,
            max_rows,
        };
        // Counted at one block of rows whatever the plan's most: the
        // choice was measured on 16-row steps, and a step of fewer rows
        // launches no more blocks than that.
        let rows = max_rows.clamp(1, 16);
        shape.filling(
            &CoopTile::BATCH,
            rows,
            MIN_BATCH_SPLIT_TILES,
            max_workgroup_bytes,
        )
    }
}

/// The matmul [`CoopGemm`] picks a tile for.
#[derive(Clone, Copy)]
struct Shape {
    n: u32,
    k: u32,
    glu: bool,
    max_rows: u32,
}

impl Shape {
    /// Output columns of one block of `t` (a gated block stages both halves).
    fn outputs(&self, t: &CoopTile) -> u32 {
        if self.glu {
            t.bn() / 2
        } else {
            t.bn()
        }
    }

    /// Workgroups of `t` unsplit at `ref_rows` rows.
    fn groups(&self, t: &CoopTile, ref_rows: u32) -> u32 {
        ref_rows.div_ceil(t.bm()) * self.n.div_ceil(self.outputs(t))
    }

    /// The first of `candidates` within `max_workgroup_bytes` that gives
    /// [`TARGET_GROUPS`] workgroups at `ref_rows` rows, splitting K into up
    /// to [`MAX_SPLITS`] parts of at least `min_split_tiles` tiles where the
    /// blocks alone are too few.
    fn filling(
        &self,
        candidates: &[CoopTile],
        ref_rows: u32,
        min_split_tiles: u32,
        max_workgroup_bytes: u32,
    ) -> Option<CoopGemm> {
        // The partial sums of `s` splits, in bytes (at most 1 GiB).
        let partials = |t: &CoopTile, s: u32| {
            u64::from(s)
                * u64::from(self.max_rows.max(1).div_ceil(t.bm()) * t.bm())
                * u64::from(self.n.div_ceil(self.outputs(t)) * t.bn())
                * 4
        };
        let split = |t: &CoopTile| {
            let kt = self.k.div_ceil(t.bk);
            (1..=MAX_SPLITS).find(|&s| {
                self.groups(t, ref_rows) * s >= TARGET_GROUPS
                    && kt.is_multiple_of(s)
                    && (s == 1 || (kt / s >= min_split_tiles && partials(t, s) <= 1 << 30))
            })
        };
        candidates
            .iter()
            .filter(|t| t.workgroup_bytes() <= max_workgroup_bytes)
            .find_map(|t| split(t).map(|splits| self.gemm(*t, splits)))
    }

    /// The tile of `candidates` within `max_workgroup_bytes` giving the
    /// most workgroups at `ref_rows` rows, unsplit (the last candidate when
    /// none fits).
    fn most_groups(
        &self,
        candidates: &[CoopTile],
        ref_rows: u32,
        max_workgroup_bytes: u32,
    ) -> CoopGemm {
        let tile = candidates
            .iter()
            .filter(|t| t.workgroup_bytes() <= max_workgroup_bytes)
            .max_by_key(|t| self.groups(t, ref_rows))
            .unwrap_or(&candidates[candidates.len() - 1]);
        self.gemm(*tile, 1)
    }

    fn gemm(&self, tile: CoopTile, splits: u32) -> CoopGemm {
        CoopGemm {
            tile,
            splits,
            max_rows: self.max_rows,
        }
    }
}

/// The WGSL that opens one pass over a cooperative kernel's `WARPS`
/// subgroup tiles (of `warps_n` along the columns) in a workgroup of
/// `threads`: the tile this subgroup computes (`wm`, `wn`; `owns` false for
/// one past the last, which computes a duplicate of it), its accumulator
/// slot `cb` (the spare one for a duplicate), and the zeros at `zero` that
/// the accumulators start from. The caller declares `cs` and the
/// subgroup builtins, and closes the loop.
pub(super) fn subgroup_pass(warps_n: u32, threads: u32) -> String {
    format!(
        "  for (var base = 0u; base < WARPS; base = base + groups) {{\n\
         \x20   let tile = base + sg;\n\
         \x20   let owns = tile < WARPS;\n\
         \x20   let wt = min(tile, WARPS - 1u);\n\
         \x20   let wm = wt / {warps_n}u;\n    let wn = wt % {warps_n}u;\n\
         \x20   let cb = min(sg, WARPS) * 256u;\n\
         \x20   let zero = WARPS * 256u;\n\
         \x20   for (var e = lid; e < 256u; e = e + {threads}u) {{ cs[zero + e] = 0.0f; }}\n\
         \x20   workgroupBarrier();\n"
    )
}

/// The WGSL of a cooperative kernel's K loop over `tiles` staged tiles
/// (a WGSL expression), each step storing the registers `load` filled into
/// the workgroup's tiles (`store`), loading the next tile's registers while
/// the subgroups multiply this one's (`mma`). The caller loads the first
/// tile's registers at `k0` before it.
pub(super) fn k_loop(tiles: &str, load: &str, store: &str, mma: &str) -> String {
    format!(
        "    for (var kt = 0u; kt < {tiles}; kt = kt + 1u) {{\n\
         {store}\
         \x20     workgroupBarrier();\n\
         \x20     k0 = k0 + BK;\n\
         \x20     if (kt + 1u < {tiles}) {{\n{load}      }}\n\
         {mma}\
         \x20     workgroupBarrier();\n\
         \x20   }}\n"
    )
}

/// The WGSL multiplying one staged tile `bk` deep: for each 16 of its
/// depth (`ks`), each subgroup loads its `frags_m` fragments of `a` from the
/// staged tile (row-major at `STRIDE`, the high parts and at `SL` the low
/// ones) and its `frags_n` of `b` (`b_fragment(ks, j)`: the WGSL declaring
/// `fb{ks}_{j}`), and adds both parts' products into each accumulator.
pub(super) fn multiplies(
    bk: u32,
    frags_m: u32,
    frags_n: u32,
    b_fragment: &dyn Fn(u32, u32) -> String,
) -> String {
    let mut mma = String::new();
    for ks in 0..bk / 16 {
        for i in 0..frags_m {
            let _ = writeln!(
                mma,
                "      let oa{ks}_{i} = (wm * {fm16}u + {i16}u) * STRIDE + {k16}u;\n      \
                 let fa{ks}_{i} = coopLoadT<coop_mat16x16<f16, A>>(&stage[oa{ks}_{i}], STRIDE);\n      \
                 let ol{ks}_{i} = SL + oa{ks}_{i};\n      \
                 let fl{ks}_{i} = coopLoadT<coop_mat16x16<f16, A>>(&stage[ol{ks}_{i}], STRIDE);",
                fm16 = frags_m * 16,
                i16 = i * 16,
                k16 = ks * 16,
            );
        }
        for j in 0..frags_n {
            let _ = writeln!(mma, "{}", b_fragment(ks, j));
        }
        for i in 0..frags_m {
            for j in 0..frags_n {
                let _ = writeln!(
                    mma,
                    "      acc{i}_{j} = coopMultiplyAdd(fl{ks}_{i}, fb{ks}_{j}, acc{i}_{j});\n      \
                     acc{i}_{j} = coopMultiplyAdd(fa{ks}_{i}, fb{ks}_{j}, acc{i}_{j});"
                );
            }
        }
    }
    mma
}

/// Builds the kernel. `s.rows` must be [`super::Rows::Tokens`] (lowering
/// picks this template only for prefill and batch-step matmuls over the
/// step's tokens).
pub fn kernel(s: MatMulSpec, g: CoopGemm) -> KernelSource {
    let glu = s.glu.is_some();
    let t = g.tile;
    let (kw, st_row, lanes) = (t.bk, stride(t.bk), t.lanes());
    let splits = g.splits;
    let split = splits > 1;
    let (bm, bn, threads, warps) = (t.bm(), t.bn(), t.threads(), t.warps());
    // Output columns per block and per accumulator (gated: 8 gate and 8 up
    // rows per accumulator).
    let (bno, cols) = if glu { (bn / 2, 8) } else { (bn, 16) };
    let packed = s.wdtype != DType::F32 && s.k.is_multiple_of(2);
    let k_tail = !s.k.is_multiple_of(kw);
    let n_tail = !s.n.is_multiple_of(bno);
    let nb = s.n.div_ceil(bno);
    let (gy, gz) = split_groups(nb * splits);
    // Split kernels: each block's partial sums (`MR` rows of `NSP` staged
    // columns per split), then each row's partial sum of squares.
    let mr = g.max_rows.max(1).div_ceil(bm) * bm;
    let nsp = nb * bn;

    let mut w = prelude();
    w.insert_str(0, "enable wgpu_cooperative_matrix;\n");
    enable_f16(&mut w);
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KT: u32 = {kt}u;\n\
         const BM: u32 = {bm}u;\nconst BNO: u32 = {bno}u;\nconst BK: u32 = {kw}u;\n\
         const STRIDE: u32 = {st_row}u;\nconst SL: u32 = {sl}u;\nconst SB: u32 = {sb}u;\n\
         const WARPS: u32 = {warps}u;\n\
         const GY: u32 = {gy}u;\nconst NB: u32 = {nb}u;\nconst KTS: u32 = {kts}u;\n\
         const SPLITS: u32 = {splits}u;\nconst MR: u32 = {mr}u;\nconst NSP: u32 = {nsp}u;",
        k = s.k,
        n = s.n,
        kt = s.k.div_ceil(kw),
        kts = s.k.div_ceil(kw) / splits,
        sl = bm * st_row,
        sb = 2 * bm * st_row,
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    let shards = bind_weight(&s, &mut b, &mut w, WeightRead::Elements);
    bind_after_weight(&s, &mut b, &mut w, |b, w, port, gdtype| {
        b.weight(w, port, "gamma", gdtype)
    });
    if packed {
        row_loader(&mut w, "wpair", "", "vec2<f32>", &shards, |shard, local| {
            format!("pair_{}({local} * (K / 2u) + i)", shard.name)
        });
    } else {
        row_loader(&mut w, "wload", "", "f32", &shards, |shard, local| {
            format!("load_{}({local} * K + i)", shard.name)
        });
    }
    let norm = s.norm.is_some();
    if split {
        let ssq = if norm { splits * mr } else { 0 };
        let words = u64::from(splits * mr) * u64::from(nsp) + u64::from(ssq);
        b.scratch(&mut w, "part", 4 * words);
        b.counters(&mut w, "count", mr / bm * nb);
        let _ = writeln!(w, "const SSQ: u32 = {}u;", splits * mr * nsp);
    }
    // `stage`: the x tiles (`BM` rows of high parts, then at `SL` as many of
    // low parts) then the weight tile (`BN` rows, at `SB`), one array
    // declared first so all start 16-byte aligned; `cs`: one
    // accumulator slot per subgroup plus a spare, which holds the zeros the
    // accumulators start from (loaded, not `coop_mat16x16<f32, C>()`: naga
    // writes that as `OpConstantNull`, which not every driver may take for a
    // cooperative matrix) and, after the K loop, the norm's partial sums
    // (`BM × 8`) and the stores of subgroups without a tile.
    let cs = t.slots();
    let _ = writeln!(
        w,
        "var<workgroup> stage: array<f16, {st}>;\nvar<workgroup> cs: array<f32, {cs}>;",
        st = (2 * bm + bn) * st_row,
    );
    let mut wg_bytes = 2 * (2 * bm + bn) * st_row + 4 * cs + 16;
    if norm && !split {
        let _ = writeln!(w, "var<workgroup> rinv: array<f32, {bm}>;");
        wg_bytes += 4 * bm;
    }
    w += "var<workgroup> groups_sh: array<u32, 4>;\n";
    if split {
        w += "var<workgroup> last_sh: array<u32, 4>;\n";
        wg_bytes += 16;
    }

    // Staging of `x`: thread `lid` loads 4 consecutive k (`ak`) of rows
    // `ar + a_step·j`, `lanes` threads per row.
    let a_step = threads / lanes;
    let a_rows = bm / a_step;
    // Staging of the weight: packed pairs (`BK / 2` per row of the tile) or
    // single elements (`BK` per row), rows `br + b_step·j`.
    let b_per_row = if packed { kw / 2 } else { kw };
    let b_step = threads / b_per_row;
    let b_reps = bn / b_step;

    let mut body = String::new();
    let _ = writeln!(
        body,
        "  let ak = (lid % {lanes}u) * 4u;\n  let ar = lid / {lanes}u;"
    );
    for j in 0..a_rows {
        let _ = writeln!(
            body,
            "  let am{j} = m0 + ar + {}u;\n  let aok{j} = am{j} < rows;",
            a_step * j
        );
    }
    let _ = writeln!(
        body,
        "  let bk = lid % {b_per_row}u;\n  let br = lid / {b_per_row}u;"
    );
    for j in 0..b_reps {
        let lr = format!("(br + {}u)", b_step * j);
        if glu {
            // Staged row `lr`: accumulator `lr / 16`, gate rows in its first
            // 8 columns and their up rows in the last 8.
            let _ = writeln!(
                body,
                "  let bn{j} = n0 + {lr} / 16u * 8u + {lr} % 8u;\n  \
                 let bw{j} = select(bn{j}, N + bn{j}, {lr} % 16u >= 8u);\n  \
                 let bok{j} = bn{j} < N;"
            );
        } else {
            let _ = writeln!(body, "  let bw{j} = n0 + {lr};\n  let bok{j} = bw{j} < N;");
        }
    }
    // The register loads of the tile at `k0`.
    let mut load = String::new();
    for j in 0..a_rows {
        let zero: String = (0..4).map(|c| format!(" ra{j}_{c} = 0.0f;")).collect();
        let _ = writeln!(load, "     {zero}\n      if (aok{j}) {{");
        for c in 0..4 {
            let get = format!("ra{j}_{c} = x[am{j} * K + k0 + ak + {c}u];");
            if k_tail {
                let _ = writeln!(load, "        if (k0 + ak + {c}u < K) {{ {get} }}");
            } else {
                let _ = writeln!(load, "        {get}");
            }
        }
        let _ = writeln!(load, "      }}");
    }
    for j in 0..b_reps {
        let (zero, get, kcheck) = if packed {
            (
                "vec2<f32>(0.0f)",
                format!("wpair(bw{j}, k0 / 2u + bk)"),
                " && k0 / 2u + bk < K / 2u",
            )
        } else {
            ("0.0f", format!("wload(bw{j}, k0 + bk)"), " && k0 + bk < K")
        };
        let kcheck = if k_tail { kcheck } else { "" };
        let _ = writeln!(
            load,
            "      rb{j} = {zero};\n      if (bok{j}{kcheck}) {{ rb{j} = {get}; }}"
        );
    }
    // The stores of the registers into the staged tiles, as f16.
    let mut store = String::new();
    if norm {
        for c in 0..4 {
            let _ = writeln!(
                store,
                "      let g{c} = load_gamma(min(k0 + ak + {c}u, K - 1u)) + OFFSET;"
            );
        }
    }
    for j in 0..a_rows {
        let _ = writeln!(
            store,
            "      let ia{j} = (ar + {}u) * STRIDE + ak;",
            a_step * j
        );
        for c in 0..4 {
            let v = if norm {
                let _ = writeln!(store, "      ssq{j} = ssq{j} + ra{j}_{c} * ra{j}_{c};");
                format!("ra{j}_{c} * g{c}")
            } else {
                format!("ra{j}_{c}")
            };
            // The high part keeps f32's top 10 fraction bits (exact in
            // f16), the low part the rest; the mask is not `f32(f16(v))`,
            // which NVIDIA's compiler folds to `v` (a low part of 0).
            let _ = writeln!(
                store,
                "      let va{j}_{c} = {v};\n      \
                 let ha{j}_{c} = bitcast<f32>(bitcast<u32>(va{j}_{c}) & 0xffffe000u);\n      \
                 stage[ia{j} + {c}u] = f16(ha{j}_{c});\n      \
                 stage[SL + ia{j} + {c}u] = f16(va{j}_{c} - ha{j}_{c});"
            );
        }
    }
    for j in 0..b_reps {
        let lr = format!("(br + {}u)", b_step * j);
        if packed {
            let _ = writeln!(
                store,
                "      let ib{j} = SB + {lr} * STRIDE + 2u * bk;\n      \
                 stage[ib{j}] = f16(rb{j}.x);\n      stage[ib{j} + 1u] = f16(rb{j}.y);"
            );
        } else {
            let _ = writeln!(
                store,
                "      let ib{j} = SB + {lr} * STRIDE + bk;\n      stage[ib{j}] = f16(rb{j});"
            );
        }
    }
    // The multiplies of one staged tile.
    let mma = multiplies(kw, t.frags_m, t.frags_n, &|ks, j| {
        format!(
            "      let ob{ks}_{j} = SB + (wn * {fn16}u + {j16}u) * STRIDE + {k16}u;\n      \
             let fb{ks}_{j} = coopLoad<coop_mat16x16<f16, B>>(&stage[ob{ks}_{j}], STRIDE);",
            fn16 = t.frags_n * 16,
            j16 = j * 16,
            k16 = ks * 16,
        )
    });
    // The epilogue of one output `(m, n)` from its sum `v` (gated: and the
    // up projection's sum `u`), as WGSL expressions.
    let write_y = |v: &str, u: &str| format!("            {}\n", linear::store(&s, "m", v, u));
    // Unsplit: the epilogue of element `e` of a stored accumulator, row
    // `e / cols`, column `e % cols` (gated: its gate at column `c`, its up
    // at `c + 8`). Split: the element's partial sum, all 16 columns.
    let scale = if norm { " * rinv[m - m0]" } else { "" };
    let value = write_y(
        &format!("cs[cb + r * 16u + c]{scale}"),
        &format!("cs[cb + r * 16u + c + 8u]{scale}"),
    );
    let n_check = if n_tail { " && n < N" } else { "" };
    let mut epilogue = String::new();
    for i in 0..t.frags_m {
        for j in 0..t.frags_n {
            if split {
                let _ = write!(
                    epilogue,
                    "    coopStoreT(acc{i}_{j}, &cs[cb], 16u);\n    workgroupBarrier();\n    \
                     if (owns) {{\n      let mb = m0 + wm * {fm16}u + {i16}u;\n      \
                     let nsb = (gid % NB) * {bn}u + (wn * {fnn}u + {j}u) * 16u;\n      \
                     for (var e = sgl; e < 256u; e = e + sgs) {{\n        \
                     let m = mb + e / 16u;\n        \
                     if (m < rows) {{ part[(sk * MR + m) * NSP + nsb + e % 16u] = cs[cb + e]; }}\n      \
                     }}\n    }}\n    workgroupBarrier();\n",
                    fm16 = t.frags_m * 16,
                    i16 = i * 16,
                    fnn = t.frags_n,
                );
                continue;
            }
            let _ = write!(
                epilogue,
                "    coopStoreT(acc{i}_{j}, &cs[cb], 16u);\n    workgroupBarrier();\n    \
                 if (owns) {{\n      let mb = m0 + wm * {fm16}u + {i16}u;\n      \
                 let nb = n0 + (wn * {fnn}u + {j}u) * {cols}u;\n      \
                 for (var e = sgl; e < {elems}u; e = e + sgs) {{\n        \
                 let r = e / {cols}u;\n        let c = e % {cols}u;\n        \
                 let m = mb + r;\n        let n = nb + c;\n        \
                 if (m < rows{n_check}) {{\n{value}        }}\n      }}\n    }}\n    \
                 workgroupBarrier();\n",
                fm16 = t.frags_m * 16,
                i16 = i * 16,
                fnn = t.frags_n,
                elems = 16 * cols,
            );
        }
    }
    let mut regs = String::new();
    for j in 0..a_rows {
        let line: String = (0..4).map(|c| format!(" var ra{j}_{c}: f32;")).collect();
        let _ = writeln!(regs, " {line}");
    }
    let rb_ty = if packed { "vec2<f32>" } else { "f32" };
    let line: String = (0..b_reps)
        .map(|j| format!(" var rb{j}: {rb_ty};"))
        .collect();
    let _ = writeln!(regs, " {line}");
    let mut accs = String::new();
    for i in 0..t.frags_m {
        for j in 0..t.frags_n {
            let _ = writeln!(
                accs,
                "    var acc{i}_{j} = coopLoad<coop_mat16x16<f32, C>>(&cs[zero], 16u);"
            );
        }
    }
    let (ssq_init, norm_phase) = if norm {
        let init: String = (0..a_rows)
            .map(|j| format!("    var ssq{j} = 0.0f;\n"))
            .collect();
        let mut phase = String::new();
        for j in 0..a_rows {
            let _ = writeln!(
                phase,
                "    cs[(ar + {}u) * {lanes}u + lid % {lanes}u] = ssq{j};",
                a_step * j
            );
        }
        // Split: each row's partial sum of squares goes to the scratch for
        // the combining workgroup; else its inverse RMS.
        let row_sum = if split {
            "part[SSQ + sk * MR + m0 + lid] = sum;"
        } else {
            "rinv[lid] = 1.0f / sqrt(sum / f32(K) + EPS);"
        };
        let _ = write!(
            phase,
            "    workgroupBarrier();\n    if (lid < BM) {{\n      var sum = 0.0f;\n      \
             for (var q = 0u; q < {lanes}u; q = q + 1u) {{ sum = sum + cs[lid * {lanes}u + q]; }}\n      \
             {row_sum}\n    }}\n    workgroupBarrier();\n"
        );
        (init, phase)
    } else {
        (String::new(), String::new())
    };
    // Split kernels: the last of a block's workgroups adds the partial sums
    // and applies the epilogue.
    let combine = if split {
        let ns = if glu { "(n / 8u) * 16u + n % 8u" } else { "n" };
        let (su_init, su_add) = if glu {
            ("    var su = 0.0f;\n", "        su = su + part[o + 8u];\n")
        } else {
            ("", "")
        };
        let (ss_init, ss_add, ri) = if norm {
            (
                "    var ss = 0.0f;\n",
                "        ss = ss + part[SSQ + q * MR + m];\n",
                "      let ri = 1.0f / sqrt(ss / f32(K) + EPS);\n",
            )
        } else {
            ("", "", "")
        };
        let scale = if norm { " * ri" } else { "" };
        format!(
            "  storageBarrier();\n  let blk = wid.x * NB + gid % NB;\n  \
             if (lid == 0u) {{ last_sh[0] = select(0u, 1u, atomicAdd(&count[blk], 1u) == SPLITS - 1u); }}\n  \
             if (workgroupUniformLoad(&last_sh[0]) == 0u) {{ return; }}\n  storageBarrier();\n  \
             for (var e = lid; e < BM * BNO; e = e + {threads}u) {{\n    \
             let m = m0 + e / BNO;\n    let n = n0 + e % BNO;\n    \
             if (m < rows && n < N) {{\n      let ns = {ns};\n      var sv = 0.0f;\n  {su_init}  {ss_init}      \
             for (var q = 0u; q < SPLITS; q = q + 1u) {{\n        let o = (q * MR + m) * NSP + ns;\n        \
             sv = sv + part[o];\n{su_add}{ss_add}      }}\n{ri}{}    }}\n  }}\n  \
             if (lid == 0u) {{ atomicStore(&count[blk], 0u); }}\n",
            write_y(&format!("sv{scale}"), &format!("su{scale}")),
        )
    } else {
        String::new()
    };
    let _ = write!(
        w,
        "@compute @workgroup_size({threads}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,\n\
         \x20       @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) sgl: u32,\n\
         \x20       @builtin(subgroup_size) sgs: u32, @builtin(num_subgroups) nsg: u32) {{\n\
         \x20 if (lid == 0u) {{ groups_sh[0] = nsg; }}\n\
         \x20 let groups = workgroupUniformLoad(&groups_sh[0]);\n\
         \x20 let rows = params.t;\n\
         \x20 let m0 = wid.x * BM;\n\
         \x20 let gid = wid.y + wid.z * GY;\n\
         \x20 let sk = gid / NB;\n\
         \x20 let n0 = (gid % NB) * BNO;\n\
         {body}{regs}\
         {pass}{accs}{ssq_init}\
         \x20   var k0 = sk * KTS * BK;\n\
         {load}\
         {k_loop}{norm_phase}{epilogue}\
         \x20 }}\n{combine}}}\n",
        pass = subgroup_pass(t.warps_n, threads),
        k_loop = k_loop("KTS", &load, &store, &mma),
    );
    let (glu_tag, options) = name_parts(&s, shards.len());
    KernelSource {
        name: format!(
            "gemm_coop{glu_tag}_{}_rT_k{}_n{}_{}{options}",
            s.wdtype,
            s.k,
            s.n,
            t.tag()
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::per_token(1, 0, bm),
            WorkgroupCount::fixed(gy),
            WorkgroupCount::fixed(gz),
        ],
        workgroup_bytes: wg_bytes,
    }
}
