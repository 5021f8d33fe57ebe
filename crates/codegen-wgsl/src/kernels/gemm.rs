//! `gemm`: the prompt-step (prefill) form of [`matmul`](super::matmul),
//! `y[r, n] = Σ_k x[r, k] · w[n, k] (+ b[n])` over `T` rows, as a
//! register-tiled GEMM on plain f32 arithmetic (no tensor cores), with every
//! option of [`MatMulSpec`] but `last_row`: bias, gated epilogue, weight row
//! shards, RMSNorm prologue, residual epilogue. The lowering picks it for
//! prefill matmuls over `T` rows, with a [`GemmTile`] from
//! [`GemmTile::choose`]; `matmul` keeps fixed row counts and the last-row read.
//!
//! A workgroup of `(BM/TM)·(BN/TN)` threads computes a `BM × BN` block of
//! outputs, each thread a `TM × TN` block held in registers as `vec4`s. The
//! K loop walks tiles of `BK`: every thread loads its share of the `BM × BK`
//! slice of `x` and the `BN × BK` slice of `w` in chunks of up to 8 elements
//! (the [`gemv`](super::gemv) loaders: 16-byte loads of packed bf16/f16 or
//! f32 where `K` allows), widens them to f32 and stores them transposed
//! (`k`-major) in workgroup memory, so the inner loop reads a thread's `TM`
//! rows and `TN` columns as `vec4`s and does `TM·TN` multiply-adds per
//! `(TM+TN)/4` loads. The next tile's global loads are issued into registers
//! before the current tile is multiplied, hiding their latency. A thread's
//! rows and columns are groups of 4 spaced `4·BM/TM` (`4·BN/TN`) apart, so
//! neighbouring threads read neighbouring `vec4`s. Every load and store is
//! checked against the true `T`, `N` and `K`: rows, columns and chunks past
//! them read as zero and are never written.
//!
//! The surprising things. A gated tile loads gate rows `n0..n0+BN/2` into
//! its first half and the matching up rows `N+n0..` into its second, so a
//! thread's first column groups hold gate sums and its last the up sums of
//! the same outputs, and the epilogue never leaves registers. And the RMSNorm
//! prologue costs no extra pass: each workgroup walks the whole `K` of its
//! rows anyway, so the sums of squares are accumulated from the chunks a
//! thread stages (each thread always stages the same rows), reduced through
//! the then idle `x` tile after the loop, and applied to the sums as each
//! row's `1 / sqrt(Σx²/K + eps)`. A [`GemmSplit`] shares each block's `K`
//! among workgroups when a tile leaves the GPU's SMs idle at mid-size
//! prompts: each stores its partial sums, and the last to finish adds them
//! and applies the epilogue (norm included: its sums of squares are split
//! too).

use super::gemv::{bind_operands, shard_loader};
use super::linear::{chunk_type, elems_per_load, name_parts, store};
use super::matmul::MatMulSpec;
use super::{prelude, split_groups, KernelSource};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// The blocking of a [`kernel`]: `BM × BN` outputs per workgroup (with a
/// gated epilogue, `BN` weight rows: `BN/2` outputs), `TM × TN` per thread,
/// `BK` of `K` per tile. `TM`, `TN` are multiples of 4, `BK` of 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTile {
    /// Output rows per workgroup.
    pub bm: u32,
    /// Weight rows per workgroup.
    pub bn: u32,
    /// `K` per tile.
    pub bk: u32,
    /// Output rows per thread.
    pub tm: u32,
    /// Weight rows per thread.
    pub tn: u32,
}

/// Rows a prompt step is assumed to have when choosing a tile (the prefill
/// chunk of a long prompt).
const REF_ROWS: u32 = 512;
/// Workgroups a dispatch should have at [`REF_ROWS`]: two per SM of a
/// 132-SM GPU, the most that fit at 256 threads and ~128 registers each.
const TARGET_GROUPS: u32 = 264;

impl GemmTile {
    /// The tiles [`GemmTile::choose`] picks from, largest first.
    pub const CANDIDATES: [GemmTile; 5] = [
        GemmTile::new(128, 128, 16, 8, 8),
        GemmTile::new(64, 128, 16, 4, 8),
        GemmTile::new(128, 64, 16, 8, 4),
        GemmTile::new(64, 64, 32, 4, 4),
        GemmTile::new(32, 64, 16, 4, 8),
    ];

    /// Tiles for steps of at most 16 rows only (the batch steps of a plan
    /// compiled with a small `--max-batch`), which a 32-row tile would
    /// compute mostly empty: that waste is free on a memory-bound GPU but
    /// is the whole cost on a CPU adapter (lavapipe, SwiftShader), where a
    /// one-row step of SmolLM2 through 32-row tiles took 8 s.
    pub const SHORT: [GemmTile; 2] = [
        GemmTile::new(16, 64, 16, 4, 8),
        GemmTile::new(8, 64, 16, 4, 8),
    ];

    /// A tile of `bm × bn` with `bk` and `tm × tn` per thread.
    pub const fn new(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> Self {
        GemmTile { bm, bn, bk, tm, tn }
    }

    /// Threads per workgroup.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Bytes of workgroup memory: both tiles in f32.
    pub fn workgroup_bytes(&self) -> u32 {
        (self.bm + self.bn) * self.bk * 4
    }

    /// Output columns per workgroup.
    pub fn out_cols(&self, glu: bool) -> u32 {
        if glu {
            self.bn / 2
        } else {
            self.bn
        }
    }

    /// Whether the tile is well formed and, with `glu`, can pair gate and up
    /// columns (an even number of column groups per thread).
    pub fn supports(&self, glu: bool) -> bool {
        let groups = self.tn / 4;
        self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && self.bk.is_multiple_of(8)
            && self.bk * self.bn >= self.bm
            && (!glu || groups.is_multiple_of(2))
    }

    /// The tile for `n` outputs (a gated matmul's `n`, not its `2n` weight
    /// rows) of steps of at most `max_rows` rows, within
    /// `max_workgroup_bytes`: among the tiles no taller than such a step
    /// needs (`max_rows` rounded up to a power of two, at least 8), the
    /// largest candidate that still gives [`TARGET_GROUPS`] workgroups at
    /// [`REF_ROWS`] rows (large tiles reuse each load more; small ones fill
    /// the GPU when `n` is small), else the smallest that fits. Plans with
    /// steps of 128 rows or more (every default) choose among all
    /// [`CANDIDATES`](Self::CANDIDATES); one whose steps hold at most 32 rows
    /// runs 32-row blocks, not 128-row ones three quarters empty; and steps
    /// of at most 16 or 8 rows run the [`SHORT`](Self::SHORT) tile of their
    /// height.
    pub fn choose(n: u32, glu: bool, max_rows: u32, max_workgroup_bytes: u32) -> GemmTile {
        let tallest = max_rows
            .max(1)
            .checked_next_power_of_two()
            .map_or(u32::MAX, |r| r.max(8));
        let shortest = tallest.min(32);
        let fitting: Vec<GemmTile> = Self::CANDIDATES
            .into_iter()
            .chain(Self::SHORT)
            .filter(|t| {
                t.supports(glu)
                    && t.workgroup_bytes() <= max_workgroup_bytes
                    && (shortest..=tallest).contains(&t.bm)
            })
            .collect();
        let groups = |t: &GemmTile| REF_ROWS.div_ceil(t.bm) * n.div_ceil(t.out_cols(glu));
        fitting
            .iter()
            .find(|t| groups(t) >= TARGET_GROUPS)
            .or(fitting.last())
            .copied()
            .unwrap_or(Self::CANDIDATES[Self::CANDIDATES.len() - 1])
    }

    /// Kernel-name tag, e.g. `128x128x16_8x8`.
    pub fn tag(&self) -> String {
        format!(
            "{}x{}x{}_{}x{}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )
    }
}

/// Rows a step is assumed to have when choosing a [`GemmSplit`]: a prompt
/// just past the short ones ([`SHORT_PROMPT`](crate::lower::SHORT_PROMPT)),
/// where the tiles chosen for [`REF_ROWS`] leave most SMs idle.
const SPLIT_REF_ROWS: u32 = 128;
/// Most workgroups sharing one block's `K`.
const MAX_SPLITS: u32 = 8;
/// Fewest `K` tiles a split walks: shorter walks spend more on the partial
/// sums than they gain.
const MIN_SPLIT_TILES: u32 = 8;
/// Most bytes of partial sums a split kernel keeps (one scratch region,
/// shared by every dispatch of a step; below WebGPU's 128 MiB binding).
const MAX_PARTIAL_BYTES: u64 = 64 << 20;

/// How a [`kernel_split`] shares each block's `K` among workgroups: with
/// `splits` > 1, in steps of up to `max_rows` rows each walks its share of
/// the `K` tiles and stores its partial sums (and a norm's partial sums of
/// squares), and the last of a block's workgroups to finish adds them up and
/// applies the epilogue; longer steps, which fill the GPU without a split,
/// run unsplit in the same kernel (the first split's workgroups walk all of
/// `K`, the others return at once), so the partial sums never hold more
/// than `max_rows` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSplit {
    /// Workgroups per block (1: no split).
    pub splits: u32,
    /// The most rows of a step that runs split (sizes the partial sums).
    pub max_rows: u32,
}

impl GemmSplit {
    /// No split: each workgroup walks the whole of `K`.
    pub const NONE: GemmSplit = GemmSplit {
        splits: 1,
        max_rows: 0,
    };

    /// The split of `tile` for `n` outputs (gated: `n` pairs) over `k`, for
    /// steps of at most `max_rows` rows: doubled while a step of
    /// [`SPLIT_REF_ROWS`] rows has fewer than [`TARGET_GROUPS`] workgroups,
    /// up to [`MAX_SPLITS`], each split walking at least
    /// [`MIN_SPLIT_TILES`] tiles of `K`; split for steps of up to
    /// `max_rows` rows, or half as many (down to [`SPLIT_REF_ROWS`]) until
    /// the partial sums fit [`MAX_PARTIAL_BYTES`] and the variant's
    /// `max_binding` bytes.
    pub fn choose(
        tile: &GemmTile,
        n: u32,
        k: u32,
        glu: bool,
        max_rows: u32,
        max_binding: u64,
    ) -> GemmSplit {
        let kt = k.div_ceil(tile.bk);
        let rows = SPLIT_REF_ROWS.min(max_rows.max(1));
        let groups = rows.div_ceil(tile.bm) * n.div_ceil(tile.out_cols(glu));
        let bytes = MAX_PARTIAL_BYTES.min(max_binding);
        // The most rows (max_rows halved) whose partial sums fit.
        let candidate = |splits| {
            let mut g = GemmSplit {
                splits,
                max_rows: max_rows.max(1),
            };
            while g.partial_bytes(tile, n, glu) > bytes {
                if g.max_rows <= SPLIT_REF_ROWS {
                    return None;
                }
                g.max_rows = (g.max_rows / 2).max(SPLIT_REF_ROWS);
            }
            Some(g)
        };
        let mut split = GemmSplit::NONE;
        while groups * split.splits < TARGET_GROUPS
            && 2 * split.splits <= MAX_SPLITS
            && kt / (2 * split.splits) >= MIN_SPLIT_TILES
        {
            match candidate(2 * split.splits) {
                Some(g) => split = g,
                None => break,
            }
        }
        split
    }

    /// Rows of partial sums: `max_rows` rounded up to whole blocks.
    fn rows(&self, tile: &GemmTile) -> u32 {
        self.max_rows.max(1).div_ceil(tile.bm) * tile.bm
    }

    /// Bytes of the partial sums (gated: the gate and up sums) and of the
    /// partial sums of squares.
    fn partial_bytes(&self, tile: &GemmTile, n: u32, glu: bool) -> u64 {
        let cols = u64::from(n) * if glu { 2 } else { 1 };
        4 * u64::from(self.splits) * u64::from(self.rows(tile)) * (cols + 1)
    }

    /// Kernel-name tag: empty unsplit, else `_s{splits}`.
    pub fn tag(&self) -> String {
        if self.splits > 1 {
            format!("_s{}", self.splits)
        } else {
            String::new()
        }
    }
}

/// Element `j` of a chunk `v` of `e` elements as [`chunk_type`] holds it
/// (8-element chunks: even elements in column 0, odd ones in column 1).
fn elem(e: u32, v: &str, j: u32) -> String {
    match e {
        1 => v.to_string(),
        8 => format!("{v}[{}][{}]", j % 2, j / 2),
        _ => format!("{v}[{j}]"),
    }
}

/// `Σ v²` over a chunk `v` of `e` elements.
fn sum_of_squares(e: u32, v: &str) -> String {
    match e {
        1 => format!("{v} * {v}"),
        8 => format!("dot({v}[0], {v}[0]) + dot({v}[1], {v}[1])"),
        _ => format!("dot({v}, {v})"),
    }
}

const LANE: [&str; 4] = ["x", "y", "z", "w"];

/// Builds the kernel for `s` (rows `T`, or fixed; not `last_row`, which
/// [`matmul`](super::matmul) serves) with `tile`, which must
/// [support](GemmTile::supports) the spec's epilogue.
pub fn kernel(s: &MatMulSpec, tile: GemmTile) -> KernelSource {
    kernel_split(s, tile, GemmSplit::NONE)
}

/// [`kernel`] with each block's `K` shared among `split.splits`
/// workgroups (`ceil(KT / splits)` tiles each, the last ones possibly
/// fewer or none).
pub fn kernel_split(s: &MatMulSpec, tile: GemmTile, split: GemmSplit) -> KernelSource {
    let glu = s.glu.is_some();
    let norm = s.norm.is_some();
    debug_assert!(tile.supports(glu) && !s.last_row);
    let splits = split.splits.max(1);
    let is_split = splits > 1;
    let GemmTile { bm, bn, bk, tm, tn } = tile;
    let e = elems_per_load(s.wdtype, s.k);
    let kc = s.k / e;
    let ct = bk / e;
    let threads = tile.threads();
    let no = tile.out_cols(glu);
    let nb = s.n.div_ceil(no);
    let (gx, gy) = split_groups(nb * splits);
    let (a_chunks, b_chunks) = (bm * ct, bn * ct);
    let (la, lb) = (a_chunks.div_ceil(threads), b_chunks.div_ceil(threads));
    // Row (column) groups of 4 per thread and their spacing in vec4s.
    let (gm, gn) = (tm / 4, tn / 4);
    let (sm, sn) = (bm / tm, bn / tn);

    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KC: u32 = {kc}u;\n\
         const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst BK: u32 = {bk}u;\n\
         const CT: u32 = {ct}u;\nconst KT: u32 = {kt}u;\nconst NO: u32 = {no}u;\n\
         const TX: u32 = {tx}u;\nconst THREADS: u32 = {threads}u;\nconst GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
        kt = s.k.div_ceil(bk),
        tx = bn / tn,
    );
    let (mut b, shards) = bind_operands(s, e, &mut w);
    shard_loader(&mut w, &shards, e);
    let _ = writeln!(
        w,
        "var<workgroup> As: array<vec4<f32>, {}>;\nvar<workgroup> Bs: array<vec4<f32>, {}>;",
        bk * bm / 4,
        bk * bn / 4
    );
    // Split kernels: the partial sums of split `q`, row `m`, column `c` at
    // `(q · MR + m) · NP + c` (gated: the up sums `N` columns on), then the
    // partial sums of squares at `SSQ + q · MR + m`; a counter per block.
    let mr = split.rows(&tile);
    if is_split {
        let np = if glu { 2 * s.n } else { s.n };
        let _ = writeln!(
            w,
            "const SPLITS: u32 = {splits}u;\nconst KTS: u32 = {kts}u;\nconst NB: u32 = {nb}u;\n\
             const MR: u32 = {mr}u;\nconst NP: u32 = {np}u;\nconst SSQ: u32 = {ssq}u;",
            kts = s.k.div_ceil(bk).div_ceil(splits),
            ssq = splits * mr * np,
        );
        b.scratch(&mut w, "part", split.partial_bytes(&tile, s.n, glu));
        b.counters(&mut w, "count", mr / bm * nb);
    }
    let c = chunk_type(e);
    let mut body = String::new();
    if is_split {
        // A step of more rows than the partial sums hold runs unsplit: the
        // first split's workgroups walk the whole of `K`, the others leave.
        body += "  if (sk >= SPLITS) { return; }\n  let whole = rows > MR;\n  \
                 if (whole && sk > 0u) { return; }\n";
    }
    // Each load slot's fixed place in the tiles: row (`ra`, `rb`) and chunk
    // (`ca`, `cb`), whether it is in range, and its registers.
    for i in 0..la {
        let _ = writeln!(
            body,
            "  let ia{i} = tid + {o}u;\n  let ra{i} = ia{i} % BM;\n  let ca{i} = ia{i} / BM;\n\
             \x20 let va{i} = ia{i} < BM * CT && m0 + ra{i} < rows;\n  var xa{i}: {c};",
            o = i * threads
        );
        if norm {
            let _ = writeln!(body, "  var ga{i}: {c};\n  var ssq{i} = 0.0f;");
        }
    }
    for i in 0..lb {
        let _ = writeln!(
            body,
            "  let ib{i} = tid + {o}u;\n  let rb{i} = ib{i} % BN;\n  let cb{i} = ib{i} / BN;",
            o = i * threads
        );
        if glu {
            // The first half of the tile holds gate rows, the second the up rows.
            let _ = writeln!(
                body,
                "  let ob{i} = n0 + rb{i} % (BN / 2u);\n  let wr{i} = select(ob{i}, ob{i} + N, rb{i} >= BN / 2u);"
            );
        } else {
            let _ = writeln!(body, "  let ob{i} = n0 + rb{i};\n  let wr{i} = ob{i};");
        }
        let _ = writeln!(
            body,
            "  let vb{i} = ib{i} < BN * CT && ob{i} < N;\n  var wb{i}: {c};"
        );
    }
    for r in 0..tm {
        for g in 0..gn {
            let _ = writeln!(body, "  var acc{r}_{g} = vec4<f32>();");
        }
    }
    // Loads of tile `t` into the slots' registers.
    let load = |t: &str| {
        let mut l = String::new();
        for i in 0..la {
            let gamma = if norm {
                format!(" ga{i} = gamma_chunk(kc);")
            } else {
                String::new()
            };
            let _ = writeln!(
                l,
                "    {{ let kc = {t} * CT + ca{i}; if (va{i} && kc < KC) {{ xa{i} = x_chunk((m0 + ra{i}) * KC + kc);{gamma} }} else {{ xa{i} = {c}(); }} }}"
            );
        }
        for i in 0..lb {
            let _ = writeln!(
                l,
                "    {{ let kc = {t} * CT + cb{i}; if (vb{i} && kc < KC) {{ wb{i} = wrow(wr{i}, kc); }} else {{ wb{i} = {c}(); }} }}"
            );
        }
        l
    };
    // Stores of the slots' registers into the tiles, transposed.
    let mut stage = String::new();
    for i in 0..la {
        let guard = !a_chunks.is_multiple_of(threads);
        if guard {
            let _ = writeln!(stage, "    if (ia{i} < BM * CT) {{");
        }
        if norm {
            let _ = writeln!(
                stage,
                "    ssq{i} = ssq{i} + {};",
                sum_of_squares(e, &format!("xa{i}"))
            );
        }
        for j in 0..e {
            let v = if norm {
                format!(
                    "{} * ({} + OFFSET)",
                    elem(e, &format!("xa{i}"), j),
                    elem(e, &format!("ga{i}"), j)
                )
            } else {
                elem(e, &format!("xa{i}"), j)
            };
            let _ = writeln!(
                stage,
                "    As[(ca{i} * {e}u + {j}u) * (BM / 4u) + ra{i} / 4u][ra{i} % 4u] = {v};"
            );
        }
        if guard {
            stage += "    }\n";
        }
    }
    for i in 0..lb {
        let guard = !b_chunks.is_multiple_of(threads);
        if guard {
            let _ = writeln!(stage, "    if (ib{i} < BN * CT) {{");
        }
        for j in 0..e {
            let _ = writeln!(
                stage,
                "    Bs[(cb{i} * {e}u + {j}u) * (BN / 4u) + rb{i} / 4u][rb{i} % 4u] = {};",
                elem(e, &format!("wb{i}"), j)
            );
        }
        if guard {
            stage += "    }\n";
        }
    }
    // The multiply-adds of one `k` of the tile.
    let mut fma = String::new();
    for gi in 0..gm {
        let _ = writeln!(
            fma,
            "      let a{gi} = As[kk * (BM / 4u) + ty + {}u];",
            gi * sm
        );
    }
    for gj in 0..gn {
        let _ = writeln!(
            fma,
            "      let b{gj} = Bs[kk * (BN / 4u) + tx + {}u];",
            gj * sn
        );
    }
    for gi in 0..gm {
        for i in 0..4 {
            for gj in 0..gn {
                let r = gi * 4 + i;
                let _ = writeln!(
                    fma,
                    "      acc{r}_{gj} = acc{r}_{gj} + a{gi}.{} * b{gj};",
                    LANE[i as usize]
                );
            }
        }
    }
    // The K tiles this workgroup walks: all of them, or its split's.
    let (t0, t1) = if is_split {
        body += "  let t0 = select(sk * KTS, 0u, whole);\n  let t1 = select(min(KT, t0 + KTS), KT, whole);\n";
        ("t0", "t1")
    } else {
        ("0u", "KT")
    };
    let _ = write!(
        body,
        "{load0}  for (var t = {t0}; t < {t1}; t = t + 1u) {{\n{stage}    workgroupBarrier();\n\
         \x20   if (t + 1u < {t1}) {{\n{load1}    }}\n\
         \x20   for (var kk = 0u; kk < BK; kk = kk + 1u) {{\n{fma}    }}\n\
         \x20   workgroupBarrier();\n  }}\n",
        load0 = load(t0),
        load1 = load("(t + 1u)"),
    );
    if norm {
        // Each slot's Σx² goes to `As[ia]` (= chunk · BM + row); the rows'
        // inverse RMS then to `Bs[row]`.
        for i in 0..la {
            let guard = if a_chunks.is_multiple_of(threads) {
                String::new()
            } else {
                format!("if (ia{i} < BM * CT) ")
            };
            let _ = writeln!(body, "  {guard}{{ As[ia{i} / 4u][ia{i} % 4u] = ssq{i}; }}");
        }
        // Each row's inverse RMS, or (split) its partial sum of squares.
        let row_sum = if is_split {
            "if (whole) { Bs[r / 4u][r % 4u] = 1.0f / sqrt(sq / f32(K) + EPS); } \
             else { part[SSQ + sk * MR + m0 + r] = sq; }"
        } else {
            "Bs[r / 4u][r % 4u] = 1.0f / sqrt(sq / f32(K) + EPS);"
        };
        let _ = write!(
            body,
            "  workgroupBarrier();\n\
             \x20 for (var r = tid; r < BM; r = r + THREADS) {{\n\
             \x20   var sq = 0.0f;\n\
             \x20   for (var c = 0u; c < CT; c = c + 1u) {{ let f = c * BM + r; sq = sq + As[f / 4u][f % 4u]; }}\n\
             \x20   {row_sum}\n\
             \x20 }}\n  workgroupBarrier();\n"
        );
        for gi in 0..gm {
            let _ = writeln!(body, "  let inv{gi} = Bs[ty + {}u];", gi * sm);
        }
    }
    // The epilogue: output column groups (gated: the gate groups, whose up
    // sums are `gn / 2` groups further); split, the partial sums go out
    // instead and the last workgroup applies it.
    let out_groups = if glu { gn / 2 } else { gn };
    let mut direct = String::new();
    for gi in 0..gm {
        for i in 0..4 {
            let r = gi * 4 + i;
            let lane = LANE[i as usize];
            let scale = if norm {
                format!(" * inv{gi}.{lane}")
            } else {
                String::new()
            };
            let _ = writeln!(
                direct,
                "  {{\n    let row = m0 + ty * 4u + {}u;\n    if (row < rows) {{",
                gi * 4 * sm + i
            );
            for gj in 0..out_groups {
                for c4 in 0..4 {
                    let cl = LANE[c4 as usize];
                    let store = store(
                        s,
                        "row",
                        &format!("acc{r}_{gj}.{cl}{scale}"),
                        &format!("acc{r}_{}.{cl}{scale}", gj + gn / 2),
                    );
                    let _ = writeln!(
                        direct,
                        "      {{ let n = n0 + tx * 4u + {}u; if (n < N) {{ {store} }} }}",
                        gj * 4 * sn + c4
                    );
                }
            }
            direct += "    }\n  }\n";
        }
    }
    if is_split {
        // A step longer than the partial sums hold runs unsplit.
        body += "  if (whole) {\n";
        body += &direct;
        body += "  } else {\n";
        split_epilogue(&mut body, s, (gm, gn, sm, sn), out_groups);
        body += "  }\n";
    } else {
        body += &direct;
    }
    let blocks = if is_split {
        "  let gid = wid.x + wid.y * GX;\n  let sk = gid / NB;\n  let n0 = (gid % NB) * NO;\n"
    } else {
        "  let n0 = (wid.x + wid.y * GX) * NO;\n"
    };
    let _ = write!(
        w,
        "@compute @workgroup_size({threads}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let tx = tid % TX;\n  let ty = tid / TX;\n\
         \x20 let m0 = wid.z * BM;\n{blocks}\
         \x20 let rows = {rows};\n{body}}}\n",
        rows = s.rows.wgsl(),
    );
    let (glu_tag, options) = name_parts(s, shards.len());
    KernelSource {
        name: format!(
            "gemm{glu_tag}_{}_r{}_k{}_n{}_{}{}{options}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
            tile.tag(),
            split.tag(),
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            s.rows.count(1, bm),
        ],
        workgroup_bytes: tile.workgroup_bytes(),
    }
}

/// A split kernel's end: each thread stores its raw sums (gated: gate and
/// up) to the partial sums; the last of the block's workgroups to arrive
/// adds every split's, scales them by the row's inverse RMS (from the added
/// sums of squares) and applies the epilogue, then zeroes the counter. The
/// workgroup learns whether it is last through `As[0]`, unused by then: a
/// flag of its own would take a 16 KiB tile past WebGPU's workgroup memory.
/// `(gm, gn, sm, sn)`: the thread's row and column groups of 4 and their
/// spacing.
fn split_epilogue(
    body: &mut String,
    s: &MatMulSpec,
    (gm, gn, sm, sn): (u32, u32, u32, u32),
    out_groups: u32,
) {
    let glu = s.glu.is_some();
    for gi in 0..gm {
        for i in 0..4 {
            let r = gi * 4 + i;
            let _ = writeln!(
                body,
                "  {{\n    let row = m0 + ty * 4u + {}u;\n    if (row < rows) {{\n      \
                 let o = (sk * MR + row) * NP;",
                gi * 4 * sm + i
            );
            for gj in 0..out_groups {
                for c4 in 0..4 {
                    let cl = LANE[c4 as usize];
                    let up = if glu {
                        format!(" part[o + N + n] = acc{r}_{}.{cl};", gj + gn / 2)
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        body,
                        "      {{ let n = n0 + tx * 4u + {}u; if (n < N) {{ part[o + n] = acc{r}_{gj}.{cl};{up} }} }}",
                        gj * 4 * sn + c4
                    );
                }
            }
            *body += "    }\n  }\n";
        }
    }
    let norm = s.norm.is_some();
    let (su, su_add) = if glu {
        ("      var su = 0.0f;\n", "        su = su + part[o + N];\n")
    } else {
        ("", "")
    };
    let (ss, ss_add, ri) = if norm {
        (
            "      var ss = 0.0f;\n",
            "        ss = ss + part[SSQ + q * MR + row];\n",
            "      let ri = 1.0f / sqrt(ss / f32(K) + EPS);\n",
        )
    } else {
        ("", "", "")
    };
    let scale = if norm { " * ri" } else { "" };
    let _ = write!(
        body,
        "  storageBarrier();\n  let blk = wid.z * NB + gid % NB;\n  \
         if (tid == 0u) {{ As[0].x = select(0.0f, 1.0f, atomicAdd(&count[blk], 1u) == SPLITS - 1u); }}\n  \
         if (workgroupUniformLoad(&As[0]).x == 0.0f) {{ return; }}\n  storageBarrier();\n  \
         for (var e = tid; e < BM * NO; e = e + THREADS) {{\n    \
         let row = m0 + e / NO;\n    let n = n0 + e % NO;\n    \
         if (row < rows && n < N) {{\n      var sv = 0.0f;\n{su}{ss}      \
         for (var q = 0u; q < SPLITS; q = q + 1u) {{\n        let o = (q * MR + row) * NP + n;\n        \
         sv = sv + part[o];\n{su_add}{ss_add}      }}\n{ri}      {}\n    }}\n  }}\n  \
         if (tid == 0u) {{ atomicStore(&count[blk], 0u); }}\n",
        store(s, "row", &format!("sv{scale}"), &format!("su{scale}")),
    );
}

#[cfg(test)]
mod tests {
    use super::{GemmSplit, GemmTile, MAX_PARTIAL_BYTES, MAX_SPLITS, MIN_SPLIT_TILES};

    /// Splits go to matmuls with few blocks at a mid-size prompt, never
    /// past the limits: the Llama-3.2-1B shape's o_proj, down_proj and
    /// q/k/v split for its whole 1,024-row steps, its gate/up (8192 gated
    /// outputs) for shorter steps only (the partial sums of more rows would
    /// pass the byte bound), and a narrow `K` does not.
    #[test]
    fn few_blocks_split_k_within_the_limits() {
        let bytes = 16 << 10;
        let binding = 128 << 20;
        for (n, k, glu) in [
            (2048, 2048, false),
            (2048, 8192, false),
            (3072, 2048, false),
        ] {
            let tile = GemmTile::choose(n, glu, 1024, bytes);
            let split = GemmSplit::choose(&tile, n, k, glu, 1024, binding);
            assert!(split.splits > 1, "{n} {k}: {tile:?} {split:?}");
        }
        for (n, k, glu) in [
            (2048, 2048, false),
            (2048, 8192, false),
            (3072, 2048, false),
        ] {
            let tile = GemmTile::choose(n, glu, 1024, bytes);
            assert_eq!(
                GemmSplit::choose(&tile, n, k, glu, 1024, binding).max_rows,
                1024
            );
        }
        let gate_up = GemmTile::choose(8192, true, 1024, bytes);
        let split = GemmSplit::choose(&gate_up, 8192, 2048, true, 1024, binding);
        assert!(split.splits > 1 && split.max_rows < 1024, "{split:?}");
        let narrow = GemmTile::choose(2048, false, 1024, bytes);
        assert_eq!(
            GemmSplit::choose(&narrow, 2048, 64, false, 1024, binding).splits,
            1
        );
        for n in [64, 576, 2048, 8192, 49_152] {
            for k in [64, 576, 2048, 8192] {
                for glu in [false, true] {
                    for rows in [1, 16, 128, 1024, 4096] {
                        let tile = GemmTile::choose(n, glu, rows, bytes);
                        let split = GemmSplit::choose(&tile, n, k, glu, rows, binding);
                        let s = split.splits;
                        assert!(s.is_power_of_two() && s <= MAX_SPLITS, "{split:?}");
                        if s > 1 {
                            assert!(k.div_ceil(tile.bk) / s >= MIN_SPLIT_TILES);
                            assert!(split.partial_bytes(&tile, n, glu) <= MAX_PARTIAL_BYTES);
                            assert!(split.max_rows <= rows.max(1));
                        }
                    }
                }
            }
        }
    }

    /// Steps of 128 rows or more choose among every candidate, as every
    /// default plan did before the row bound; shorter steps never get a
    /// block taller than they need.
    #[test]
    fn short_steps_choose_short_blocks() {
        let bytes = 16 << 10;
        for n in [64, 576, 1536, 8192, 49_152, 262_144] {
            for glu in [false, true] {
                let any = GemmTile::choose(n, glu, 128, bytes);
                assert_eq!(GemmTile::choose(n, glu, 4096, bytes), any);
                assert_eq!(GemmTile::choose(n, glu, u32::MAX, bytes), any);
                for rows in [0, 1, 7, 8, 9, 16, 17, 30, 32, 33, 64, 100] {
                    let t = GemmTile::choose(n, glu, rows, bytes);
                    let tallest = rows.max(1).next_power_of_two().max(8);
                    assert!(
                        t.bm <= tallest && t.bm >= tallest.min(32) && t.supports(glu),
                        "{n} {glu} {rows}: {t:?}"
                    );
                }
            }
        }
        assert_eq!(GemmTile::choose(262_144, false, 512, bytes).bm, 128);
        assert_eq!(GemmTile::choose(262_144, false, 30, bytes).bm, 32);
        assert_eq!(GemmTile::choose(576, true, 16, bytes).bm, 16);
        assert_eq!(GemmTile::choose(576, true, 1, bytes).bm, 8);
    }
}
