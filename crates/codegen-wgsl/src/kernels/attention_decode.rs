//! `attention` for a decode step (`T = 1`): split-K over the keys
//! (flash-decoding) in one dispatch, the heads of a GQA group sharing their
//! K/V loads, built for latency.
//!
//! The keys `lo..=pos` are cut into at most [`splits`] equal splits of at
//! least [`MIN_KEYS`] keys; one workgroup runs per (KV head, split). It
//! scores its keys in passes of `KP` keys: `TPK` lanes share a key, each
//! multiplying `DPT` dimensions of the K row (coalesced across the lanes)
//! by every query head of the group, with the query kept in registers; the
//! lanes' partial dots meet in workgroup memory. Each head's maximum is
//! taken once per split, the probabilities once per (head, key); the values
//! are accumulated by `DL` dimension lanes × `KG` key groups, each V row
//! read once for the group, `U` rows loaded back to back before they are
//! used. Those loads are emitted as straight-line WGSL (vec4 accumulators,
//! clamped indices and masked weights instead of branches), because the
//! driver did not unroll the same code written as constant-bound loops over
//! local arrays: the loads issue together, and the kernel's latency is a few
//! memory round trips, not one per key or per dimension.
//!
//! A step whose keys fit one split (at most `MIN_KEYS` of them, or a
//! kernel of one split) writes `y` directly. Otherwise each workgroup writes
//! one partial `(m, l, acc[HD])` per (head, split) to the dispatch scratch
//! and bumps its KV head's counter; the workgroup that finds itself last
//! combines the partials, each thread owning one output (the splits'
//! maximum first, then their rescaled sums, 8 splits per iteration), writes
//! `y` and puts the counter back to zero for the next dispatch. Every sum
//! adds one product at a time, so the driver has one way to fuse it and
//! the checked and unchecked modules agree to the bit. The split
//! count is a compile-time constant: enough workgroups to fill a large GPU
//! ([`TARGET_WORKGROUPS`]) yet no split longer than `CAP` keys at the
//! largest context (so one split's scores fit workgroup memory), and, where
//! head_dim × group is large, few enough that the combine stays short.
//! The surprise: the hand-off between workgroups relies on
//! `storageBarrier()`, which naga emits as a device-scope acquire-release
//! barrier, around the counter's `atomicAdd`; and a split past the keys in
//! use returns at once without touching the counter, so "last" means last of
//! the splits this step uses. The dispatch's split count carries
//! [`KeySplits`], so the runtime launches only the splits the step's keys
//! fill (in a batch step, its deepest row's): on a CPU driver each launch of
//! a workgroup with barriers costs tens of microseconds, work or none.
//!
//! [`kernel_with_rope`] also does the `qkv_rope` dispatch's work in a
//! decode step: it reads the fused q|k|v row, normalizes (per-head norms: a
//! segment of lanes sums each head's squares first) and rotates the group's
//! queries once into the reduction region (or, where they do not fit, each
//! dimension as a score lane loads it), and the split that holds the step's
//! own key rotates that key, stores it and the value in the caches, and
//! makes them visible to its own threads with a `storageBarrier()` before
//! scoring. In a decode step no other workgroup reads that cache row, so
//! nothing waits across workgroups; the schedule then skips the `qkv_rope`
//! dispatch (`crate::fusion`). A batch step is not fused: a prompt's tokens
//! can be several of its rows, each reading keys another row's workgroups
//! store.

use super::attention::AttentionSpec;
use super::qkv_rope::QkvRopeSpec;
use super::{
    f32_lit, input, kv_load, kv_store, kv_tag, output, prelude, tree_reduce, Bindings,
    KernelSource, Positions,
};
use gerbil_ir::DType;
use gerbil_plan::{KeySplits, WorkgroupCount};
use std::fmt::Write;

/// Most threads per workgroup.
const MAX_WG: u32 = 256;
/// Fewest threads per workgroup (very large GQA groups).
const MIN_WG: u32 = 64;
/// f32 slots of the reduction region: the lanes' partial dots (`G × WG`),
/// later the key groups' value sums (`KG × G × HD`): 8 KiB.
const REDUCE_SLOTS: u32 = 2048;
/// Scores one workgroup keeps (`G × CAP`): 4 KiB.
const SCORE_SLOTS: u32 = 1024;
/// Query values a score lane keeps in registers (`G × DPT`).
const Q_REGS: u32 = 64;
/// Value loads a thread issues back to back (`U × PT`).
const V_LOADS: u32 = 16;
/// Partial values (`G × HD × S`) the combining workgroup reads at most,
/// unless the context needs more splits.
const COMBINE_VALUES: u32 = 32768;
/// Workgroups the dispatch aims for at long context (an H100 has 132 SMs).
pub const TARGET_WORKGROUPS: u32 = 128;
/// Fewest keys a split takes before another split is used.
pub const MIN_KEYS: u32 = 32;

/// The kernel's compile-time geometry for one attention shape.
struct Geometry {
    group: u32,
    /// Threads per workgroup.
    wg: u32,
    /// Most keys one split holds (a power of two).
    cap: u32,
    /// Score lanes per key, dimensions per score lane, keys per pass.
    tpk: u32,
    dpt: u32,
    kp: u32,
    /// Value phase: dimension lanes, key groups, dimensions per lane, rows
    /// per batch.
    dl: u32,
    kg: u32,
    pt: u32,
    u: u32,
}

fn pow2_floor(x: u32) -> u32 {
    1 << x.max(1).ilog2()
}

impl Geometry {
    fn new(s: &AttentionSpec) -> Self {
        let group = (s.heads / s.kv_heads.max(1)).max(1);
        let hd = s.head_dim.max(1);
        let wg = pow2_floor(REDUCE_SLOTS / group).clamp(MIN_WG, MAX_WG);
        // Enough lanes per key that each keeps at most Q_REGS query values,
        // yet at least four keys per pass.
        let tpk = (hd * group)
            .div_ceil(Q_REGS)
            .next_power_of_two()
            .min(wg / 4);
        let kp = wg / tpk;
        let cap = pow2_floor(SCORE_SLOTS / group).clamp(kp, MAX_WG);
        // Key groups: as many as the reduction region holds, up to one
        // dimension lane per dimension (but two for head_dim >= WG), and
        // at least a warp-wide row of dimension lanes.
        let kg = pow2_floor(REDUCE_SLOTS / (group * hd))
            .min(pow2_floor(wg / hd.min(wg)).max(2))
            .min(wg / 32);
        let dl = wg / kg;
        let pt = hd.div_ceil(dl);
        Geometry {
            group,
            wg,
            cap,
            tpk,
            dpt: hd.div_ceil(tpk),
            kp,
            dl,
            kg,
            pt,
            u: pow2_floor(V_LOADS / pt).max(4),
        }
    }

    /// f32 slots of the reduction region.
    fn red(&self, hd: u32) -> u32 {
        let values = if self.kg > 1 {
            self.kg * self.group * hd
        } else {
            0
        };
        (self.group * self.wg).max(values)
    }
}

/// The kernel's split count for `s` with a KV cache of `max_context` rows:
/// about [`TARGET_WORKGROUPS`] workgroups, at least enough splits that none
/// holds more than `CAP` keys, no more than [`MIN_KEYS`]-key splits need,
/// and no more than keeps the combine's reads within `COMBINE_VALUES`.
pub fn splits(s: &AttentionSpec, max_context: u32) -> u32 {
    let keys = match s.window {
        0 => max_context,
        w => w.min(max_context),
    }
    .max(1);
    let geo = Geometry::new(s);
    let least = keys.div_ceil(geo.cap);
    let combine = COMBINE_VALUES / (geo.group * s.head_dim.max(1));
    TARGET_WORKGROUPS
        .div_ceil(s.kv_heads.max(1))
        .min(keys.div_ceil(MIN_KEYS.min(geo.cap)))
        .min(combine)
        .max(least)
}

/// Builds the kernel for a KV cache of `max_context` rows.
pub fn kernel(s: AttentionSpec, max_context: u32) -> KernelSource {
    kernel_at(s, max_context, Positions::Step, 1)
}

/// [`kernel`] for rows at `at`: with a row table (a batch step of at most
/// `max_rows` rows, each a query of its own sequence), workgroup row `z`
/// takes row `z`, its position and the first KV-cache row of its sequence
/// from the table, and its partials and counters are its own.
pub fn kernel_at(s: AttentionSpec, max_context: u32, at: Positions, max_rows: u32) -> KernelSource {
    build(s, max_context, at, max_rows, None)
}

/// [`kernel`] fused with the `qkv_rope` before it, as `r` specifies it
/// (its heads and cache type are `s`'s), for a decode step. Bindings: `x`
/// (the fused q|k|v row), `table`, `kc` and `vc` (written), with norms `qn`
/// and `kn`, then `y`. Per-head norms need a group of at most
/// [`MAX_NORMED_GROUP`] heads. Not for batch steps: there a prompt's tokens
/// can be several rows of one sequence, each reading the keys the rows
/// before it write, which other workgroups would store.
pub fn kernel_with_rope(s: AttentionSpec, r: QkvRopeSpec, max_context: u32) -> KernelSource {
    build(s, max_context, Positions::Step, 1, Some(r))
}

/// Largest GQA group whose query heads and key head the fused kernel
/// normalizes (each gets at least one of the smallest workgroup's lanes).
pub const MAX_NORMED_GROUP: u32 = MIN_WG - 1;

fn build(
    s: AttentionSpec,
    max_context: u32,
    at: Positions,
    max_rows: u32,
    rope: Option<QkvRopeSpec>,
) -> KernelSource {
    // Lowering gives a decode step `Step` (an encoder's one-row step is one
    // input at position 0); `Packed` would read the same one key.
    let rows = match at {
        Positions::Step | Positions::Packed => 1,
        Positions::Table => max_rows.max(1),
    };
    let geo = Geometry::new(&s);
    let Geometry {
        group,
        wg,
        cap,
        tpk,
        dpt,
        kp,
        dl,
        kg,
        pt,
        u,
    } = geo;
    let hd = s.head_dim;
    let splits = splits(&s, max_context);
    let red = geo.red(hd);
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const NKV: u32 = {}u;\nconst HD: u32 = {hd}u;\nconst G: u32 = {group}u;\n\
         const SCALE: f32 = {};\nconst WINDOW: u32 = {}u;\nconst WG: u32 = {wg}u;\n\
         const S: u32 = {splits}u;\nconst MINK: u32 = {}u;\nconst CAP: u32 = {cap}u;\n\
         const TPK: u32 = {tpk}u;\nconst KP: u32 = {kp}u;\n\
         const DL: u32 = {dl}u;\nconst KG: u32 = {kg}u;\nconst U: u32 = {u}u;\n\
         const STRIDE: u32 = HD + 2u;\nconst NEG: f32 = -3.0e38f;",
        s.kv_heads,
        f32_lit(s.scale),
        s.window,
        MIN_KEYS.min(cap),
    );
    let mut b = Bindings::new();
    let (queries, own) = match rope {
        None => {
            b.activation(&mut w, input(0), "q");
            b.kv_cache(&mut w, input(1), "kc", s.kv, false);
            b.kv_cache(&mut w, input(2), "vc", s.kv, false);
            (Queries::Plain, String::new())
        }
        Some(r) => {
            declare_rope(&mut w, &mut b, &s, &r);
            let norm = r.norm.is_some();
            let queries = match group * hd <= red {
                true => Queries::Staged,
                false => Queries::RotatedOnLoad { norm },
            };
            let prologue = Prologue {
                kv: s.kv,
                norm,
                wg,
                group,
                staged: queries == Queries::Staged,
            };
            (queries, prologue.wgsl())
        }
    };
    b.activation(&mut w, output(0), "y");
    at.declare(&mut b, &mut w);
    b.scratch(
        &mut w,
        "part",
        u64::from(rows * s.heads * splits * (hd + 2)) * 4,
    );
    b.counters(&mut w, "count", rows * s.kv_heads);
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {red}>;\n\
         var<workgroup> sc: array<f32, {scores}>;\n\
         var<workgroup> ms: array<f32, {group}>;\n\
         {lk}\
         var<workgroup> last: u32;\n\
         // Probability of key j for head g (0 past the split's nk keys).\n\
         fn prob(g: u32, j: u32, nk: u32) -> f32 {{ return select(0.0f, sc[g * CAP + min(j, CAP - 1u)], j < nk); }}\n\
         // Offset of row j's dimension lane in a cache (rows past nk read the last one).\n\
         fn row(k0: u32, j: u32, nk: u32, kvh: u32) -> u32 {{ return ((k0 + min(j, nk - 1u)) * NKV + kvh) * HD; }}\n\
         // Split j's partial maximum (NEG past the splits in use) and offset.\n\
         fn pmax(hb: u32, j: u32, used: u32) -> f32 {{ return select(NEG, part[hb + min(j, used - 1u) * STRIDE], j < used); }}\n\
         fn poff(hb: u32, j: u32, used: u32) -> u32 {{ return hb + min(j, used - 1u) * STRIDE; }}\n\
         fn hsum(v: vec4<f32>) -> f32 {{ return (v.x + v.y) + (v.z + v.w); }}\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let kvh = wid.x;\n  let split = wid.y;\n  let lane = lid.x;\n\
         \x20 let pos = params.p;\n\
         \x20 var lo = 0u;\n  if (WINDOW > 0u && pos + 1u > WINDOW) {{ lo = pos + 1u - WINDOW; }}\n\
         \x20 let n = pos + 1u - lo;\n\
         \x20 let used = min(S, (n + MINK - 1u) / MINK);\n\
         \x20 if (split >= used) {{ return; }}\n\
         \x20 let chunk = (n + used - 1u) / used;\n\
         \x20 let start = split * chunk;\n\
         \x20 var nk = 0u;\n  if (start < n) {{ nk = min(min(chunk, n - start), CAP); }}\n\
         \x20 let k0 = lo + start;\n  let h0 = kvh * G;\n\
         {own}\
         {scores_wgsl}\
         \x20 // Each head's maximum once, then its probabilities in place.\n\
         \x20 if (lane < G) {{\n\
         \x20   var m = vec4<f32>(NEG);\n\
         \x20   for (var j = 0u; j < nk; j = j + 4u) {{\n\
         \x20     let b = lane * CAP + j;\n\
         \x20     m = max(m, vec4<f32>(sc[b], sc[b + 1u], sc[b + 2u], sc[b + 3u]));\n\
         \x20   }}\n\
         \x20   ms[lane] = max(max(m.x, m.y), max(m.z, m.w));\n\
         \x20 }}\n\
         \x20 workgroupBarrier();\n\
         \x20 for (var t = lane; t < G * CAP; t = t + WG) {{\n\
         \x20   if (t % CAP < nk) {{ sc[t] = exp(sc[t] - ms[t / CAP]); }}\n\
         \x20 }}\n\
         \x20 workgroupBarrier();\n\
         {values_wgsl}\
         \x20 if (used == 1u) {{ return; }}\n\
         \x20 storageBarrier();\n\
         \x20 if (lane == 0u) {{ last = select(0u, 1u, atomicAdd(&count[kvh], 1u) == used - 1u); }}\n\
         \x20 if (workgroupUniformLoad(&last) == 0u) {{ return; }}\n\
         \x20 storageBarrier();\n\
         \x20 // Combine: one thread per output; the splits' maximum, then their\n\
         \x20 // rescaled sums, 8 splits per iteration.\n\
         \x20 for (var i = lane; i < G * HD; i = i + WG) {{\n\
         \x20   let hb = (h0 + i / HD) * S * STRIDE;\n    let d = i % HD;\n\
         \x20   var mx = NEG;\n\
         \x20   for (var j = 0u; j < used; j = j + 8u) {{\n\
         \x20     let a = vec4<f32>(pmax(hb, j, used), pmax(hb, j + 1u, used), pmax(hb, j + 2u, used), pmax(hb, j + 3u, used));\n\
         \x20     let b = vec4<f32>(pmax(hb, j + 4u, used), pmax(hb, j + 5u, used), pmax(hb, j + 6u, used), pmax(hb, j + 7u, used));\n\
         \x20     let m = max(a, b);\n      mx = max(mx, max(max(m.x, m.y), max(m.z, m.w)));\n\
         \x20   }}\n\
         \x20   var l = vec4<f32>(0.0f);\n    var o = vec4<f32>(0.0f);\n\
         \x20   for (var j = 0u; j < used; j = j + 8u) {{\n\
         {combine_body}\
         \x20   }}\n\
         \x20   y[h0 * HD + i] = hsum(o) / hsum(l);\n\
         \x20 }}\n\
         \x20 if (lane == 0u) {{ atomicStore(&count[kvh], 0u); }}\n}}\n",
        scores = group * cap,
        lk = if kg > 1 {
            format!("var<workgroup> lk: array<f32, {}>;\n", kg * group)
        } else {
            String::new()
        },
        scores_wgsl = score_passes(group, hd, tpk, dpt, s.kv, queries),
        values_wgsl = values(group, hd, dl, kg, pt, u, s.kv),
        combine_body = combine_body(),
    );
    if at == Positions::Table {
        // Row z's query, output, partials and counter: its heads come after
        // the rows before it, its keys after its sequence's first cache row.
        w = w
            .replace(
                "  let pos = params.p;\n",
                "  let brow = wid.z;\n  let pos = rows[2u * brow + 1u];\n  let seq0 = rows[2u * brow] - pos;\n",
            )
            .replace("  let k0 = lo + start;\n  let h0 = kvh * G;\n", "  let k0 = seq0 + lo + start;\n  let h0 = (brow * NKV + kvh) * G;\n",
            )
            .replace("count[kvh]", "count[brow * NKV + kvh]");
    }
    KernelSource {
        name: format!(
            "attention_decode_h{}_kv{}_d{}_w{}_s{splits}{}{}{}",
            s.heads,
            s.kv_heads,
            hd,
            s.window,
            rope.map(|r| format!(
                "_rope{}{}",
                r.rotary_dim,
                r.norm.map(|n| format!("_norm_{}", n.2)).unwrap_or_default()
            ))
            .unwrap_or_default(),
            kv_tag(s.kv),
            at.tag()
        ),
        wgsl: w,
        workgroup_size: [wg, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(s.kv_heads),
            // Only the splits the step's keys fill: the rest would return at
            // once, but each would still cost a launch (tens of µs on lavapipe).
            WorkgroupCount {
                key_splits: Some(KeySplits {
                    keys_per_split: MIN_KEYS.min(cap),
                    window: s.window,
                }),
                ..WorkgroupCount::fixed(splits)
            },
            match at {
                Positions::Step | Positions::Packed => WorkgroupCount::fixed(1),
                Positions::Table => super::Rows::Tokens.count(1, 1),
            },
        ],
        workgroup_bytes: (red
            + group * cap
            + group
            + if kg > 1 { kg * group } else { 0 }
            + 1
            + if rope.is_some_and(|r| r.norm.is_some()) {
                group + 1
            } else {
                0
            })
            * 4,
    }
}

/// Declares what the fused kernel reads instead of rotated queries: the
/// q|k|v row `x`, the RoPE table, the caches it writes, the norms' weights,
/// with norms `nrm` (each query head's and the key head's inverse RMS), and
/// `rot(b, d, tr, s, k)`: dimension `d` of the head at `x[b..]` normalized
/// by `s` (and the key's or the query's weights, by `k`), then rotated by
/// table row `tr` — `qkv_rope`'s formula (its sums of squares are added in
/// another order, so a normed key may differ in the last bits).
fn declare_rope(w: &mut String, b: &mut Bindings, s: &AttentionSpec, r: &QkvRopeSpec) {
    let _ = writeln!(
        w,
        "const NH: u32 = {}u;\nconst KW: u32 = NKV * HD;\nconst XW: u32 = NH * HD + 2u * KW;\n\
         const ROT: u32 = {}u;\nconst HALF: u32 = {}u;",
        s.heads,
        r.rotary_dim,
        r.rotary_dim / 2,
    );
    b.activation(w, input(0), "x");
    b.read_f32(w, input(1), "table");
    b.kv_cache(w, input(2), "kc", s.kv, true);
    b.kv_cache(w, input(3), "vc", s.kv, true);
    match r.norm {
        Some((eps, offset, dt)) => {
            w.push_str("var<workgroup> nrm: array<f32, G + 1u>;\n");
            let _ = writeln!(
                w,
                "const EPS: f32 = {};\nconst OFFSET: f32 = {};",
                f32_lit(eps),
                f32_lit(offset)
            );
            b.weight(w, input(4), "qn", dt);
            b.weight(w, input(5), "kn", dt);
            w.push_str(
                "fn xv(b: u32, i: u32, s: f32, k: bool) -> f32 { return (x[b + i] * s) * (select(load_qn(i), load_kn(i), k) + OFFSET); }\n",
            );
        }
        None => w.push_str("fn xv(b: u32, i: u32, s: f32, k: bool) -> f32 { return x[b + i]; }\n"),
    }
    w.push_str(
        "fn rot(b: u32, d: u32, tr: u32, s: f32, k: bool) -> f32 {\n\
         \x20 if (d < HALF) { return xv(b, d, s, k) * table[tr + d] - xv(b, d + HALF, s, k) * table[tr + HALF + d]; }\n\
         \x20 if (d < ROT) { let i = d - HALF; return xv(b, d, s, k) * table[tr + i] + xv(b, i, s, k) * table[tr + HALF + i]; }\n\
         \x20 return xv(b, d, s, k);\n}\n",
    );
}

/// Where the score lanes get the group's queries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queries {
    /// From the rotated queries `q` (the unfused kernel).
    Plain,
    /// From `red`, where the fused kernel's prologue rotated them.
    Staged,
    /// Rotated from `x` as they load (normalized by `nrm`, with norms).
    RotatedOnLoad { norm: bool },
}

impl Queries {
    /// WGSL of dimension `d` of the group's query head `g`.
    fn load(self, g: u32, d: &str) -> String {
        match self {
            Queries::Plain => format!("q[(h0 + {g}u) * HD + {d}]"),
            Queries::Staged => format!("red[{g}u * HD + {d}]"),
            Queries::RotatedOnLoad { norm } => {
                let scale = norm_scale(norm, &format!("{g}u"));
                format!("rot(xq + {g}u * HD, {d}, tr, {scale}, false)")
            }
        }
    }
}

/// WGSL of head `h`'s norm scale (`G` for the key head): its inverse RMS
/// with per-head norms, else 1.
fn norm_scale(norm: bool, h: &str) -> String {
    match norm {
        true => format!("nrm[{h}]"),
        false => "1.0f".into(),
    }
}

/// What the fused kernel does before scoring.
#[derive(Clone, Copy)]
struct Prologue {
    kv: DType,
    /// Per-head norms.
    norm: bool,
    wg: u32,
    group: u32,
    /// Whether the group's rotated queries are staged in `red` (where its
    /// `G · head_dim` values fit).
    staged: bool,
}

impl Prologue {
    /// WGSL for `xq`, `xk`, `tr` (where the group's query heads and its key
    /// head start in `x`, and the position's table row); with norms `nrm`,
    /// the workgroup's lanes in `group + 1` segments each summing one head's
    /// squares; the group's rotated queries staged in `red` (if `staged`);
    /// and the step's own key (normalized and rotated) and value stored by
    /// the split holding that key (the last it reads), made visible to the
    /// workgroup's threads.
    fn wgsl(self) -> String {
        let mut w = String::from(
            "  // The group's query heads and its key head in x, the position's table row.\n\
             \x20 let xq = kvh * G * HD;\n  let xk = NH * HD + kvh * HD;\n\
             \x20 let tr = pos * ROT;\n",
        );
        if self.norm {
            debug_assert!(self.group <= MAX_NORMED_GROUP && self.wg >= MIN_WG);
            let seg = pow2_floor(self.wg / (self.group + 1));
            let _ = write!(
                w,
                "  // Each head's inverse RMS: a segment of {seg} lanes per head, the key's last.\n\
                 \x20 let hh = lane / {seg}u;\n  let sl = lane % {seg}u;\n\
                 \x20 var ss = 0.0f;\n\
                 \x20 if (hh <= G) {{\n\
                 \x20   let hb = select(xq + hh * HD, xk, hh == G);\n\
                 \x20   for (var i = sl; i < HD; i = i + {seg}u) {{ let v = x[hb + i]; ss = ss + v * v; }}\n\
                 \x20 }}\n\
                 \x20 red[lane] = ss;\n  workgroupBarrier();\n{}\
                 \x20 if (sl == 0u && hh <= G) {{ nrm[hh] = 1.0f / sqrt(red[lane] / f32(HD) + EPS); }}\n\
                 \x20 workgroupBarrier();\n",
                tree_reduce(seg, "sl", &format!("hh * {seg}u"), "+"),
            );
        }
        if self.staged {
            let _ = writeln!(
                w,
                "  // The group's queries, rotated once.\n\
                 \x20 for (var i = lane; i < G * HD; i = i + WG) {{\n\
                 \x20   red[i] = rot(xq + i - i % HD, i % HD, tr, {}, false);\n  }}",
                norm_scale(self.norm, "i / HD")
            );
        }
        let _ = write!(
            w,
            "  // The step's own key and value, stored by the split that reads them.\n\
             \x20 if (split == (n - 1u) / chunk) {{\n\
             \x20   let dst = pos * KW + kvh * HD;\n\
             \x20   for (var d = lane; d < HD; d = d + WG) {{\n\
             \x20     kc[dst + d] = {k};\n      vc[dst + d] = {v};\n\
             \x20   }}\n  }}\n  storageBarrier();\n  workgroupBarrier();\n",
            k = kv_store(
                self.kv,
                &format!("rot(xk, d, tr, {}, true)", norm_scale(self.norm, "G"))
            ),
            v = kv_store(self.kv, "x[xk + KW + d]"),
        );
        w
    }
}

/// WGSL of the score passes, straight-line so that every load of a pass
/// issues before the first multiply: lane `c` of key `kq` keeps the query's
/// dimensions `c + i·TPK` (`i < DPT`, in vec4 quads, zero past `HD`) in
/// registers, loads the same dimensions of its K row, and leaves one partial
/// dot per head in `red`; then one thread per (head, key) sums the `TPK`
/// partials into `sc`. Queries `staged` in `red` are read out of it before
/// the first pass overwrites it.
fn score_passes(group: u32, hd: u32, tpk: u32, dpt: u32, kv: DType, queries: Queries) -> String {
    let quads = dpt.div_ceil(4);
    // Dimension i of this lane: its index expression, and whether it can
    // fall past HD (then clamped and masked).
    let dim = |i: u32| -> (String, bool) {
        let exact = hd.is_multiple_of(tpk) && i < dpt;
        let e = if i * tpk == 0 {
            "c".to_string()
        } else {
            format!("c + {}u", i * tpk)
        };
        if exact {
            (e, false)
        } else {
            (format!("min({e}, HD - 1u)"), true)
        }
    };
    let mut w = String::from(
        "  // Scores: TPK lanes per key, DPT dimensions each (the query's in\n  \
         // registers), KP keys per pass.\n  let c = lane % TPK;\n  let kq = lane / TPK;\n",
    );
    for g in 0..group {
        for v in 0..quads {
            let parts: Vec<String> = (0..4)
                .map(|r| {
                    let i = 4 * v + r;
                    if i >= dpt {
                        return "0.0f".to_string();
                    }
                    let (e, masked) = dim(i);
                    let load = queries.load(g, &e);
                    if masked {
                        format!("select(0.0f, {load}, c + {}u < HD)", i * tpk)
                    } else {
                        load
                    }
                })
                .collect();
            let _ = writeln!(w, "  let q{g}_{v} = vec4<f32>({});", parts.join(", "));
        }
    }
    if queries == Queries::Staged {
        // The queries came from `red`, which the passes overwrite.
        w.push_str("  workgroupBarrier();\n");
    }
    w.push_str(
        "  for (var p0 = 0u; p0 < nk; p0 = p0 + KP) {\n    let kb = row(k0, p0 + kq, nk, kvh);\n",
    );
    for v in 0..quads {
        let parts: Vec<String> = (0..4)
            .map(|r| kv_load(kv, "kc", &format!("kb + {}", dim(4 * v + r).0)))
            .collect();
        let _ = writeln!(w, "    let kk{v} = vec4<f32>({});", parts.join(", "));
    }
    for g in 0..group {
        let _ = writeln!(w, "    var s{g} = q{g}_0 * kk0;");
        for v in 1..quads {
            let _ = writeln!(w, "    s{g} = s{g} + q{g}_{v} * kk{v};");
        }
        let _ = writeln!(w, "    red[{g}u * WG + c * KP + kq] = hsum(s{g});");
    }
    w.push_str(
        "    workgroupBarrier();\n\
         \x20   for (var t = lane; t < G * KP; t = t + WG) {\n\
         \x20     let g = t / KP;\n      let j = t % KP;\n\
         \x20     var dot = 0.0f;\n\
         \x20     for (var r = 0u; r < TPK; r = r + 1u) { dot = dot + red[g * WG + r * KP + j]; }\n\
         \x20     sc[g * CAP + p0 + j] = select(NEG, dot * SCALE, p0 + j < nk);\n\
         \x20   }\n\
         \x20   workgroupBarrier();\n  }\n",
    );
    w
}

/// WGSL of the value accumulation and the split's output. Lane `dl` of key
/// group `kg` takes keys `kg, kg + KG, …` `U` at a time (all their V loads
/// first, four rows to a vec4 accumulator per head and dimension) and
/// dimensions `dl + e·DL` (`e < PT`). With one key group each thread owns
/// its dimensions; with several, their sums meet in `red` and `lk` first.
/// A single split writes `y = acc / l`; otherwise the partial `(m, l, acc)`
/// goes to the scratch.
fn values(group: u32, hd: u32, dl: u32, kg: u32, pt: u32, u: u32, kv: DType) -> String {
    let live = |e: u32| hd.is_multiple_of(dl) || (e + 1) * dl <= hd;
    let vdim = |e: u32| {
        let base = if e == 0 {
            "dl".to_string()
        } else {
            format!("dl + {}u", e * dl)
        };
        if live(e) {
            base
        } else {
            format!("min({base}, HD - 1u)")
        }
    };
    let mut w = String::from(
        "  // Values: DL dimension lanes x KG key groups, U rows per batch.\n  \
         let dl = lane % DL;\n  let kg = lane / DL;\n",
    );
    for g in 0..group {
        let _ = writeln!(w, "  var l{g} = vec4<f32>(0.0f);");
        for e in 0..pt {
            let _ = writeln!(w, "  var a{g}_{e} = vec4<f32>(0.0f);");
        }
    }
    w.push_str("  for (var j0 = kg; j0 < nk; j0 = j0 + U * KG) {\n");
    let key = |r: u32| {
        if r == 0 {
            "j0".to_string()
        } else {
            format!("j0 + {}u * KG", r)
        }
    };
    for r in 0..u {
        let _ = writeln!(w, "    let r{r} = row(k0, {}, nk, kvh);", key(r));
    }
    for quad in 0..u / 4 {
        for e in 0..pt {
            let parts: Vec<String> = (0..4)
                .map(|x| kv_load(kv, "vc", &format!("r{} + {}", 4 * quad + x, vdim(e))))
                .collect();
            let _ = writeln!(w, "    let v{quad}_{e} = vec4<f32>({});", parts.join(", "));
        }
    }
    for quad in 0..u / 4 {
        for g in 0..group {
            let parts: Vec<String> = (0..4)
                .map(|x| format!("prob({g}u, {}, nk)", key(4 * quad + x)))
                .collect();
            let _ = writeln!(w, "    let p{quad}_{g} = vec4<f32>({});", parts.join(", "));
            let _ = writeln!(w, "    l{g} = l{g} + p{quad}_{g};");
            for e in 0..pt {
                let _ = writeln!(w, "    a{g}_{e} = a{g}_{e} + p{quad}_{g} * v{quad}_{e};");
            }
        }
    }
    w.push_str("  }\n");
    let store = |pad: &str, g: u32, d: &str, o: &str, l: &str| {
        format!(
            "{pad}if (used == 1u) {{ y[(h0 + {g}u) * HD + {d}] = {o} / {l}; }} else {{\n\
             {pad}  let base = ((h0 + {g}u) * S + split) * STRIDE;\n\
             {pad}  part[base + 2u + {d}] = {o};\n\
             {pad}  if ({d} == 0u) {{ part[base] = ms[{g}u]; part[base + 1u] = {l}; }}\n\
             {pad}}}\n"
        )
    };
    if kg == 1 {
        for g in 0..group {
            for e in 0..pt {
                let d = vdim(e).replace("min(", "(").replace(", HD - 1u)", ")");
                let body = store(
                    "  ",
                    g,
                    &format!("({d})"),
                    &format!("hsum(a{g}_{e})"),
                    &format!("hsum(l{g})"),
                );
                if live(e) {
                    w.push_str(&body);
                } else {
                    let _ = write!(
                        w,
                        "  if ({d} < HD) {{\n{}  }}\n",
                        body.replace("\n  ", "\n    ").replacen("  if", "    if", 1)
                    );
                }
            }
        }
        return w;
    }
    for g in 0..group {
        for e in 0..pt {
            let d = if e == 0 {
                "dl".to_string()
            } else {
                format!("dl + {}u", e * dl)
            };
            let keep = format!("red[(kg * G + {g}u) * HD + {d}] = hsum(a{g}_{e});");
            if live(e) {
                let _ = writeln!(w, "  {keep}");
            } else {
                let _ = writeln!(w, "  if ({d} < HD) {{ {keep} }}");
            }
        }
    }
    w.push_str("  if (dl == 0u) {\n");
    for g in 0..group {
        let _ = writeln!(w, "    lk[kg * G + {g}u] = hsum(l{g});");
    }
    w.push_str(
        "  }\n  workgroupBarrier();\n\
         \x20 for (var i = lane; i < G * HD; i = i + WG) {\n\
         \x20   let g = i / HD;\n    let d = i % HD;\n\
         \x20   var o = 0.0f;\n    var l = 0.0f;\n\
         \x20   for (var k = 0u; k < KG; k = k + 1u) { o = o + red[k * G * HD + i]; l = l + lk[k * G + g]; }\n",
    );
    w.push_str(
        &store("    ", 0, "d", "o", "l")
            .replace("(h0 + 0u)", "(h0 + g)")
            .replace("ms[0u]", "ms[g]"),
    );
    w.push_str("  }\n");
    w
}

/// WGSL folding splits `j .. j + 8` into the combine's vec4 sums (weights
/// `exp(m − mx)`, zero past the splits in use).
fn combine_body() -> String {
    let mut w = String::new();
    for h in 0..2 {
        let at = |x: u32| {
            let k = 4 * h + x;
            if k == 0 {
                "j".to_string()
            } else {
                format!("j + {k}u")
            }
        };
        let f: Vec<String> = (0..4)
            .map(|x| format!("exp(pmax(hb, {}, used) - mx)", at(x)))
            .collect();
        let ls: Vec<String> = (0..4)
            .map(|x| format!("part[poff(hb, {}, used) + 1u]", at(x)))
            .collect();
        let os: Vec<String> = (0..4)
            .map(|x| format!("part[poff(hb, {}, used) + 2u + d]", at(x)))
            .collect();
        let _ = writeln!(w, "      let f{h} = vec4<f32>({});", f.join(", "));
        let _ = writeln!(w, "      l = l + vec4<f32>({}) * f{h};", ls.join(", "));
        let _ = writeln!(w, "      o = o + vec4<f32>({}) * f{h};", os.join(", "));
    }
    w
}
