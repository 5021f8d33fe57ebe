//! `attention`: causal (optionally sliding-window) grouped-query attention of
//! a prompt step's queries against the KV cache — tiled flash attention.
//!
//! A workgroup owns a block of `BQ` query rows of `HG` query heads that share
//! one KV head (the rows of a GQA group reuse every K/V tile it loads), and
//! walks the keys those rows may see — from the block's first window start to
//! its last row's position, so tiles masked for every row are never visited —
//! in tiles of `BK` keys staged in workgroup memory (f32, whatever the cache
//! stores). Thread `(i, lane)` of the `BQ × LANES` threads owns query row `i`
//! of the block for all `HG` heads: it scores keys `lane, lane + LANES, …` of
//! the tile (the heads are the four lanes of a `vec4`, so one K load feeds
//! `HG` dot products; where a row has more threads than the tile has keys,
//! as at head width 256, `SPLIT` threads share each key's dot product and
//! their partial sums are added where the scores are read), then reads the tile's scores of its rows to update the
//! running maximum `m` and sum `l` (f32, rescaled by `exp(m_old − m_new)`),
//! and accumulates `P·V` for the dimension vectors `lane, lane + LANES, …` in
//! registers; the output is written once. [`tiles`] picks `HG`, `LANES`,
//! `BQ` and `BK` so `Q`, one K/V tile and the tile's probabilities fit the
//! variant's workgroup memory: [`MAX_WORKGROUP_BYTES`] (WebGPU's default)
//! for most, and three times that in `tensor-f16` where the default's key
//! tiles are shorter than a row's threads: Gemma 3's 256-wide heads get
//! 4 rows × 16-key tiles instead of 2 × 4. The surprising parts: K and V take turns in one
//! tile buffer (five barriers per tile instead of twice the memory), the
//! buffer's rows are padded by one `vec4` so the lanes reading different keys
//! at the same dimension hit different banks, and masked keys get a finite
//! sentinel score and an explicit zero probability, so a row whose first
//! tiles are all masked neither divides by zero nor makes a NaN.
//!
//! An encoder's prefill step packs whole inputs end to end
//! ([`AttentionSpec::packed`]): each row's keys come from the segment table
//! — up to itself (causal, decoder-based embedders) or its input's whole
//! length, within `|row − key| < window` on both sides when there is a
//! window (bidirectional: BERT, EmbeddingGemma) — and a block walks from its
//! first row's first key to its last row's last, masking per row.

use super::{f32_lit, input, kv_load, kv_tag, output, prelude, Bindings, KernelSource, Rows};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// WebGPU's default workgroup memory limit, which every target meets: what
/// the tiles of a variant without a larger limit may use.
pub const MAX_WORKGROUP_BYTES: u32 = 16 << 10;
/// Most threads per workgroup (WebGPU's default limit).
const MAX_THREADS: u32 = 256;

/// Specialization of an attention kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Score multiplier.
    pub scale: f32,
    /// Sliding window, 0 for none.
    pub window: u32,
    /// How the KV cache is stored (f32, or f16 in an f16 variant).
    pub kv: DType,
    /// Whether row `t` sees keys up to its own position only; else each
    /// row sees every key of its own sequence (within the window on both
    /// sides, `|row - key| < window`, as Gemma 3's bidirectional layers do).
    /// A decode step's one row sees the same keys either way.
    pub causal: bool,
    /// Whether the step packs whole sequences end to end (an encoder's
    /// prefill step, a training pass): each row's sequence is read from the segment table
    /// (see [`super::Segments`]). Bidirectional attention is always packed.
    pub packed: bool,
}

impl AttentionSpec {
    /// What a kernel's name gets: nothing, `_packed` for causal attention
    /// in a packed step, or `_bi` for bidirectional.
    pub(super) fn tag(&self) -> &'static str {
        match (self.causal, self.packed) {
            (true, false) => "",
            (true, true) => "_packed",
            (false, _) => "_bi",
        }
    }

    /// Whether the kernel reads the segment table.
    pub(super) fn segmented(&self) -> bool {
        self.packed || !self.causal
    }

    /// WGSL for the first key row `t` sees in a packed step: its sequence's
    /// first row, or the window's start when that is later.
    pub(super) fn first_key(&self, t: &str) -> String {
        if self.window > 0 {
            format!("max(seq_start({t}), select(0u, ({t}) + 1u - WINDOW, ({t}) + 1u > WINDOW))")
        } else {
            format!("seq_start({t})")
        }
    }

    /// WGSL for the last key row `t` sees in a packed step: itself
    /// (causal), or its sequence's last row, or the window's end when that
    /// is sooner.
    pub(super) fn last_key(&self, t: &str) -> String {
        match (self.causal, self.window) {
            (true, _) => format!("({t})"),
            (false, 0) => format!("seq_end({t}) - 1u"),
            (false, _) => format!("min(seq_end({t}) - 1u, ({t}) + WINDOW - 1u)"),
        }
    }
}

/// The block shape of a flash-attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// Query heads per workgroup (they share a KV head; at most 4, the lanes of a `vec4`).
    pub hg: u32,
    /// Threads per query row.
    pub lanes: u32,
    /// Query rows per workgroup.
    pub bq: u32,
    /// Keys per tile.
    pub bk: u32,
}

impl Tiles {
    /// `vec4`s per head row.
    fn hd4(head_dim: u32) -> u32 {
        head_dim.div_ceil(4)
    }

    /// Workgroup memory: `Q` (`BQ·HG` rows), one K/V tile (`BK` rows padded
    /// by a `vec4`) and the tile's scores (`BQ·BK·SPLIT` `vec4`s, one lane
    /// per head).
    pub fn workgroup_bytes(&self, head_dim: u32) -> u32 {
        let hd4 = Tiles::hd4(head_dim);
        16 * (self.bq * self.hg * hd4 + self.bk * (hd4 + 1) + self.bq * self.bk * self.split())
    }

    /// Threads sharing one key's dot product when a row has more threads
    /// than the tile has keys (wide heads, short tiles).
    pub fn split(&self) -> u32 {
        (self.lanes / self.bk).max(1)
    }
}

/// The block shape for `s`: one thread per dimension `vec4` up to 64, then
/// the first of the widest head group (a divisor of the GQA ratio, at most
/// 4), the most query rows and the longest key tile within
/// [`MAX_WORKGROUP_BYTES`] of workgroup memory — or, where that leaves a
/// tile shorter than a row's threads (`SPLIT` > 1, as for Gemma 3's
/// 256-wide heads), within `max_bytes`. On an H200 the larger tiles made Gemma 3's 256-wide
/// heads' prefill attention 1.7× as fast, but 64-wide heads' 32-key tiles
/// were slower than their 16-key ones (SmolLM2's pp4096 −20%). Heads too
/// wide for any block (over ~760 at WebGPU's default limit) get the
/// smallest one, and dispatch names the kernel that exceeds the limit.
pub fn tiles(s: &AttentionSpec, max_bytes: u32) -> Tiles {
    let default = tiles_within(s, MAX_WORKGROUP_BYTES);
    if default.split() > 1 && max_bytes > MAX_WORKGROUP_BYTES {
        tiles_within(s, max_bytes)
    } else {
        default
    }
}

/// [`tiles`]' search within `max_bytes`.
fn tiles_within(s: &AttentionSpec, max_bytes: u32) -> Tiles {
    let group = (s.heads / s.kv_heads.max(1)).max(1);
    let lanes = Tiles::hd4(s.head_dim).next_power_of_two().min(64);
    let smallest = Tiles {
        hg: 1,
        lanes,
        bq: 1,
        bk: 4,
    };
    (1..=4u32)
        .rev()
        .filter(|hg| group.is_multiple_of(*hg))
        .flat_map(|hg| [8, 4, 2, 1].map(|bq| (hg, bq)))
        .filter(|(_, bq)| bq * lanes <= MAX_THREADS)
        .flat_map(|(hg, bq)| [32, 16, 8, 4].map(|bk| Tiles { hg, lanes, bq, bk }))
        .find(|t| t.workgroup_bytes(s.head_dim) <= max_bytes)
        .unwrap_or(smallest)
}

/// WGSL `fn NAME(base: u32, d4: u32) -> vec4<f32>`: elements `4·d4 … 4·d4 + 3`
/// of the head row at `base`, zero past `HD`, each read through `load(index)`.
pub(super) fn load4_fn(name: &str, head_dim: u32, load: impl Fn(&str) -> String) -> String {
    if head_dim.is_multiple_of(4) {
        let e: Vec<String> = (0..4)
            .map(|k| load(&format!("base + d4 * 4u + {k}u")))
            .collect();
        format!(
            "fn {name}(base: u32, d4: u32) -> vec4<f32> {{\n  return vec4<f32>({});\n}}\n",
            e.join(", ")
        )
    } else {
        format!(
            "fn {name}(base: u32, d4: u32) -> vec4<f32> {{\n  var v = vec4<f32>(0.0);\n\
             \x20 for (var e = 0u; e < 4u; e = e + 1u) {{\n\
             \x20   let d = d4 * 4u + e;\n    if (d < HD) {{ v[e] = {}; }}\n  }}\n  return v;\n}}\n",
            load("base + d")
        )
    }
}

/// Builds the kernel, its tiles within `max_bytes` of workgroup memory
/// ([`tiles`]). (A batch step's rows, each a query of its own
/// sequence, run [`attention_decode`](super::attention_decode)'s kernel
/// with a row table instead; the `cpu` variant runs
/// [`attention_cpu`](super::attention_cpu) everywhere.)
pub fn kernel(s: AttentionSpec, max_bytes: u32) -> KernelSource {
    let t = tiles(&s, max_bytes);
    let hd4 = Tiles::hd4(s.head_dim);
    let threads = t.bq * t.lanes;
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const NH: u32 = {}u;\nconst NKV: u32 = {}u;\nconst HD: u32 = {}u;\nconst GROUP: u32 = {}u;\n\
         const SCALE: f32 = {};\nconst WINDOW: u32 = {}u;\nconst HG: u32 = {}u;\nconst HD4: u32 = {hd4}u;\n\
         const KS: u32 = {}u;\nconst LANES: u32 = {}u;\nconst BQ: u32 = {}u;\nconst BK: u32 = {}u;\n\
         const SPLIT: u32 = {}u;\nconst KM: u32 = {}u;\nconst DM4: u32 = {}u;\nconst NT: u32 = {threads}u;\nconst NEG: f32 = -3.0e38f;",
        s.heads,
        s.kv_heads,
        s.head_dim,
        s.heads / s.kv_heads,
        f32_lit(s.scale),
        s.window,
        t.hg,
        hd4 + 1,
        t.lanes,
        t.bq,
        t.bk,
        t.split(),
        (t.bk * t.split()).div_ceil(t.lanes),
        hd4.div_ceil(t.lanes),
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "q");
    b.kv_cache(&mut w, input(1), "kc", s.kv, false);
    b.kv_cache(&mut w, input(2), "vc", s.kv, false);
    b.activation(&mut w, output(0), "y");
    if s.segmented() {
        super::Segments::declare(&mut b, &mut w);
    }
    w.push_str(&load4_fn("load_q4", s.head_dim, |i| format!("q[{i}]")));
    w.push_str(&load4_fn("load_k4", s.head_dim, |i| kv_load(s.kv, "kc", i)));
    w.push_str(&load4_fn("load_v4", s.head_dim, |i| kv_load(s.kv, "vc", i)));
    // The rows' positions and the keys the block may see (`lo..=hi`), and
    // the keys row `row` sees (`row_lo..=pos`): causally up to its position
    // (within the window), or its whole sequence in a packed encoder step.
    let positions = if s.segmented() {
        format!(
            "\x20 let row = t0 + i;\n  let rr = min(row, params.t - 1u);\n\
             \x20 let row_lo = {};\n  let pos = {};\n\
             \x20 let lo = {};\n  let hi = {};\n",
            s.first_key("rr"),
            s.last_key("rr"),
            s.first_key("t0"),
            s.last_key("min(t0 + BQ, params.t) - 1u"),
        )
    } else {
        "\x20 let row = t0 + i;\n  let pos = params.p + row;\n\
         \x20 let hi = params.p + min(t0 + BQ, params.t) - 1u;\n\
         \x20 var lo = 0u;\n  if (WINDOW > 0u && params.p + t0 + 1u > WINDOW) { lo = params.p + t0 + 1u - WINDOW; }\n\
         \x20 var row_lo = 0u;\n  if (WINDOW > 0u && pos + 1u > WINDOW) { row_lo = pos + 1u - WINDOW; }\n"
            .to_string()
    };
    let key = "c + jj";
    let tile_load = |f: &str| {
        format!(
            "    for (var e = lid.x; e < BK * HD4; e = e + NT) {{\n\
             \x20     let jj = e / HD4;\n      let d4 = e - jj * HD4;\n      var v = vec4<f32>(0.0);\n\
             \x20     if (c + jj <= hi) {{ v = {f}((({key}) * NKV + kvh) * HD, d4); }}\n\
             \x20     kvs[jj * KS + d4] = v;\n    }}\n"
        )
    };
    let _ = write!(
        w,
        "var<workgroup> qs: array<vec4<f32>, {q_len}>;\n\
         var<workgroup> kvs: array<vec4<f32>, {kv_len}>;\n\
         var<workgroup> ps: array<vec4<f32>, {p_len}>;\n\
         fn visible(j: u32, pos: u32, row_lo: u32) -> bool {{ return j <= pos && j >= row_lo; }}\n\
         fn score(i: u32, jj: u32, j: u32, pos: u32, row_lo: u32) -> vec4<f32> {{\n\
         \x20 var sc = vec4<f32>(0.0);\n\
         \x20 for (var s = 0u; s < SPLIT; s = s + 1u) {{ sc = sc + ps[(i * BK + jj) * SPLIT + s]; }}\n\
         \x20 return select(vec4<f32>(NEG), sc, visible(j, pos, row_lo));\n}}\n\
         @compute @workgroup_size(NT, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x % LANES;\n  let i = lid.x / LANES;\n\
         \x20 let h0 = wid.x * HG;\n  let kvh = h0 / GROUP;\n  let t0 = wid.y * BQ;\n\
         {positions}\
         \x20 for (var e = lid.x; e < BQ * HG * HD4; e = e + NT) {{\n\
         \x20   let d4 = e % HD4;\n    let r = e / HD4;\n    var v = vec4<f32>(0.0);\n\
         \x20   if (t0 + r / HG < params.t) {{ v = load_q4(((t0 + r / HG) * NH + h0 + r % HG) * HD, d4); }}\n\
         \x20   qs[e] = v;\n  }}\n\
         \x20 var m = vec4<f32>(NEG);\n  var l = vec4<f32>(0.0);\n\
         \x20 var acc: array<vec4<f32>, {acc_len}>;\n\
         \x20 for (var c = lo; c <= hi; c = c + BK) {{\n{k_load}\
         \x20   workgroupBarrier();\n\
         \x20   for (var mm = 0u; mm < KM; mm = mm + 1u) {{\n\
         \x20     let u = lane + mm * LANES;\n\
         \x20     if (u < BK * SPLIT) {{\n\
         \x20       let jj = u / SPLIT;\n        var sc = vec4<f32>(0.0);\n\
         \x20       for (var d4 = u % SPLIT; d4 < HD4; d4 = d4 + SPLIT) {{\n\
         \x20         let k = kvs[jj * KS + d4];\n\
         \x20         for (var hh = 0u; hh < HG; hh = hh + 1u) {{ sc[hh] = sc[hh] + dot(qs[(i * HG + hh) * HD4 + d4], k); }}\n\
         \x20       }}\n\
         \x20       ps[i * BK * SPLIT + u] = sc * SCALE;\n      }}\n    }}\n\
         \x20   workgroupBarrier();\n\
         \x20   var mx = m;\n\
         \x20   for (var jj = 0u; jj < BK; jj = jj + 1u) {{ mx = max(mx, score(i, jj, c + jj, pos, row_lo)); }}\n\
         \x20   let alpha = exp(m - mx);\n    m = mx;\n{v_load}\
         \x20   workgroupBarrier();\n\
         \x20   for (var mm = 0u; mm < KM; mm = mm + 1u) {{\n\
         \x20     let u = lane + mm * LANES;\n\
         \x20     if (u < BK * SPLIT && u % SPLIT == 0u) {{\n\
         \x20       let jj = u / SPLIT;\n        let j = c + jj;\n\
         \x20       ps[i * BK * SPLIT + u] = select(vec4<f32>(0.0), exp(score(i, jj, j, pos, row_lo) - m), visible(j, pos, row_lo));\n\
         \x20     }}\n    }}\n\
         \x20   workgroupBarrier();\n\
         \x20   l = l * alpha;\n\
         \x20   for (var e = 0u; e < HG * DM4; e = e + 1u) {{ acc[e] = acc[e] * alpha[e / DM4]; }}\n\
         \x20   for (var jj = 0u; jj < BK; jj = jj + 1u) {{\n\
         \x20     let p = ps[(i * BK + jj) * SPLIT];\n      l = l + p;\n\
         \x20     for (var e = 0u; e < DM4; e = e + 1u) {{\n\
         \x20       let d4 = lane + e * LANES;\n\
         \x20       if (d4 < HD4) {{\n\
         \x20         let v = kvs[jj * KS + d4];\n\
         \x20         for (var hh = 0u; hh < HG; hh = hh + 1u) {{ acc[hh * DM4 + e] = acc[hh * DM4 + e] + p[hh] * v; }}\n\
         \x20       }}\n      }}\n    }}\n\
         \x20   workgroupBarrier();\n  }}\n\
         \x20 if (row < params.t) {{\n\
         \x20   for (var hh = 0u; hh < HG; hh = hh + 1u) {{\n\
         \x20     let base = (row * NH + h0 + hh) * HD;\n\
         \x20     for (var e = 0u; e < DM4; e = e + 1u) {{\n\
         \x20       let o = acc[hh * DM4 + e] / l[hh];\n\
         \x20       for (var k = 0u; k < 4u; k = k + 1u) {{\n\
         \x20         let d = (lane + e * LANES) * 4u + k;\n\
         \x20         if (d < HD) {{ y[base + d] = o[k]; }}\n\
         \x20       }}\n      }}\n    }}\n  }}\n}}\n",
        q_len = t.bq * t.hg * hd4,
        kv_len = t.bk * (hd4 + 1),
        p_len = t.bq * t.bk * t.split(),
        acc_len = t.hg * hd4.div_ceil(t.lanes),
        k_load = tile_load("load_k4"),
        v_load = tile_load("load_v4"),
    );
    KernelSource {
        name: format!(
            "attention_h{}_kv{}_d{}_w{}{}{}{}",
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.window,
            kv_tag(s.kv),
            s.tag(),
            if t == tiles(&s, MAX_WORKGROUP_BYTES) {
                String::new()
            } else {
                format!("_q{}k{}", t.bq, t.bk)
            },
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(s.heads / t.hg),
            Rows::Tokens.count(1, t.bq),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: t.workgroup_bytes(s.head_dim),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(heads: u32, kv_heads: u32, head_dim: u32) -> AttentionSpec {
        AttentionSpec {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0,
            window: 0,
            kv: DType::F32,
            causal: true,
            packed: false,
        }
    }

    #[test]
    fn tiles_of_the_real_shapes() {
        // SmolLM2 and Llama-3.2-1B: 8 rows × 16-key tiles, 128 threads.
        for (heads, kv, hg) in [(9, 3, 3), (32, 8, 4)] {
            let t = tiles(&spec(heads, kv, 64), MAX_WORKGROUP_BYTES);
            assert_eq!((t.hg, t.lanes, t.bq, t.bk, t.split()), (hg, 16, 8, 16, 1));
            // The same with tensor-f16's 48 KiB (32-key tiles were slower).
            assert_eq!(tiles(&spec(heads, kv, 64), 48 << 10), t);
        }
        // Gemma 3 270M: 2 rows × 4-key tiles, 16 threads per key; with
        // 48 KiB 4 rows × 16 keys, 4 threads per key.
        let t = tiles(&spec(4, 1, 256), MAX_WORKGROUP_BYTES);
        assert_eq!((t.hg, t.lanes, t.bq, t.bk, t.split()), (4, 64, 2, 4, 16));
        let t = tiles(&spec(4, 1, 256), 48 << 10);
        assert_eq!((t.hg, t.lanes, t.bq, t.bk, t.split()), (4, 64, 4, 16, 4));
    }

    #[test]
    fn tiles_fit_the_limits() {
        for (head_dim, max) in (1..=512).flat_map(|d| [(d, MAX_WORKGROUP_BYTES), (d, 48 << 10)]) {
            for group in 1..=16 {
                let t = tiles(&spec(group * 2, 2, head_dim), max);
                assert!(
                    t.workgroup_bytes(head_dim) <= max,
                    "{head_dim} {group} {max}"
                );
                assert!(t.bq * t.lanes <= MAX_THREADS);
                assert_eq!((group * 2) % t.hg, 0);
                assert!(t.hg <= 4 && group % t.hg == 0);
            }
        }
    }
}
