//! `attention_cpu`: every attention of the `cpu` variant ([`kernel_at`]) —
//! prefill, decode and batch steps alike — scheduled for a CPU adapter
//! (lavapipe, SwiftShader, a browser's fallback adapter) rather than a GPU.
//!
//! One thread per (query row, query head) walks the keys its row may see
//! (causal, from the sliding window's start) one at a time with an online
//! softmax: the score `q·k`, the running maximum `m` and sum `l` rescaled by
//! `exp(m_old − m_new)`, and the `P·V` accumulator in registers. The query,
//! the accumulator and every K and V row move in `vec4`s, unrolled over the
//! head width in straight-line WGSL. No workgroup memory, no barrier, no
//! partials to combine: the output is written once.
//!
//! The surprise is what a CPU driver charges for (as in
//! [`matmul_cpu`](super::matmul_cpu)): the GPU kernels' barriers switch every
//! invocation of a workgroup, their workgroup memory is zeroed at every
//! launch where the API demands it (a browser always does), and a workgroup
//! launched for a split without keys still costs its start. SmolLM2's decode
//! attention took 112 ms a step on SwiftShader through
//! [`attention_decode`](super::attention_decode), 269 ms with workgroup
//! memory zeroed as a page's WebGPU does.

use super::attention::{load4_fn, AttentionSpec};
use super::{f32_lit, input, kv_tag, output, prelude, Bindings, KernelSource, Positions, Rows};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads per workgroup: one SIMD batch of SwiftShader's (4 lanes), so
/// that a decode step's few heads spread over the CPU's cores.
const THREADS: u32 = 4;

/// The binding of a head-row tensor and its `load4` reader: `array<vec4<…>>`
/// where the head width is a multiple of 4 (one load a `vec4`), else scalar.
fn bind_rows(w: &mut String, b: &mut Bindings, s: &AttentionSpec, port: u32, name: &str) {
    let f16 = s.kv == DType::F16;
    if s.head_dim.is_multiple_of(4) {
        let elem = if f16 { "vec4<f16>" } else { "vec4<f32>" };
        b.vectors(w, input(port), name, s.kv, false, elem);
        if f16 {
            super::enable_f16(w);
        }
        let _ = writeln!(
            w,
            "fn load_{name}(base: u32, d4: u32) -> vec4<f32> {{ return vec4<f32>({name}[(base >> 2u) + d4]); }}"
        );
    } else {
        b.kv_cache(w, input(port), name, s.kv, false);
        w.push_str(&load4_fn(&format!("load_{name}"), s.head_dim, |i| {
            super::kv_load(s.kv, name, i)
        }));
    }
}

/// The loop over a row's keys around `body` (which reads `j`); see
/// [`kernel_at`] for why a packed step of one sequence gets its own.
fn key_loops(s: &AttentionSpec, body: &str) -> String {
    if s.causal || s.window > 0 {
        return format!("  for (var j = lo; j <= pos; j = j + 1u) {{\n{body}  }}\n");
    }
    format!(
        "  if (seq_len(0u) == params.t) {{\n\
         \x20   for (var j = 0u; j < params.t; j = j + 1u) {{\n{body}    }}\n\
         \x20 }} else {{\n\
         \x20   for (var j = seq_start(row); j < seq_end(row); j = j + 1u) {{\n{body}    }}\n\
         \x20 }}\n"
    )
}

/// Builds the kernel for rows at `at`: a prefill or decode step's rows at
/// `P + t` ([`Positions::Step`]), a batch step's rows, each a query of its
/// own sequence ([`Positions::Table`]), or an encoder step's packed inputs
/// ([`Positions::Packed`]; [`AttentionSpec::packed`] then reads each row's
/// keys from the segment table).
pub fn kernel_at(s: AttentionSpec, at: Positions) -> KernelSource {
    let hd4 = s.head_dim.div_ceil(4);
    let vec_rows = s.head_dim.is_multiple_of(4);
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const NH: u32 = {}u;\nconst NKV: u32 = {}u;\nconst HD: u32 = {}u;\nconst GROUP: u32 = {}u;\n\
         const SCALE: f32 = {};\nconst WINDOW: u32 = {}u;\nconst NEG: f32 = -3.0e38f;",
        s.heads,
        s.kv_heads,
        s.head_dim,
        s.heads / s.kv_heads.max(1),
        f32_lit(s.scale),
        s.window,
    );
    let mut b = Bindings::new();
    if vec_rows {
        b.vectors(&mut w, input(0), "q", DType::F32, true, "vec4<f32>");
        w.push_str("fn load_q(base: u32, d4: u32) -> vec4<f32> { return q[(base >> 2u) + d4]; }\n");
    } else {
        b.activation(&mut w, input(0), "q");
        w.push_str(&load4_fn("load_q", s.head_dim, |i| format!("q[{i}]")));
    }
    bind_rows(&mut w, &mut b, &s, 1, "kc");
    bind_rows(&mut w, &mut b, &s, 2, "vc");
    if vec_rows {
        b.vectors(&mut w, output(0), "y", DType::F32, true, "vec4<f32>");
        w.push_str("fn store_y(base: u32, d4: u32, v: vec4<f32>) { y[(base >> 2u) + d4] = v; }\n");
    } else {
        b.activation(&mut w, output(0), "y");
        w.push_str(
            "fn store_y(base: u32, d4: u32, v: vec4<f32>) {\n\
             \x20 for (var e = 0u; e < 4u; e = e + 1u) {\n\
             \x20   let d = d4 * 4u + e;\n    if (d < HD) { y[base + d] = v[e]; }\n  }\n}\n",
        );
    }
    at.declare(&mut b, &mut w);
    // The keys row `row` sees (cache rows `seq0 + j`): causally up to its
    // position (within the window), or its whole sequence in a packed
    // encoder step. A step of one sequence gets a loop whose bounds every
    // thread shares: lavapipe ran MiniLM's 256-token input 6x slower with
    // bounds read from the segment table, even when they were the same.
    let range = if !s.segmented() {
        format!(
            "\x20 let pos = {pos};\n  let seq0 = {cache_row} - pos;\n\
             \x20 var lo = 0u;\n  if (WINDOW > 0u && pos + 1u > WINDOW) {{ lo = pos + 1u - WINDOW; }}\n",
            pos = at.pos("row"),
            cache_row = at.cache_row("row"),
        )
    } else {
        super::Segments::declare(&mut b, &mut w);
        let mut range = "  let seq0 = 0u;\n".to_string();
        if s.causal || s.window > 0 {
            let _ = write!(
                range,
                "  let lo = {};\n  let pos = {};\n",
                s.first_key("row"),
                s.last_key("row")
            );
        }
        range
    };
    let unrolled = |f: &dyn Fn(u32) -> String| (0..hd4).map(f).collect::<String>();
    let _ = write!(
        w,
        "@compute @workgroup_size({THREADS}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let row = gid.x / NH;\n  let h = gid.x % NH;\n\
         \x20 if (row >= params.t) {{ return; }}\n\
         {range}\
         \x20 let kvh = h / GROUP;\n  let qb = (row * NH + h) * HD;\n\
         {q_loads}\
         \x20 var m = NEG;\n  var l = 0.0f;\n\
         {acc_init}\
         {loops}\
         \x20 let inv = 1.0f / l;\n{stores}}}\n",
        loops = key_loops(
            &s,
            &format!(
                "    let kb = ((seq0 + j) * NKV + kvh) * HD;\n\
             \x20   var s = 0.0f;\n{score}\
             \x20   s = s * SCALE;\n\
             \x20   let mn = max(m, s);\n    let alpha = exp(m - mn);\n    let p = exp(s - mn);\n\
             \x20   l = l * alpha + p;\n    m = mn;\n{values}",
                score = unrolled(&|d| format!("    s = s + dot(q{d}, load_kc(kb, {d}u));\n")),
                values =
                    unrolled(&|d| format!("    a{d} = a{d} * alpha + p * load_vc(kb, {d}u);\n")),
            )
        ),
        q_loads = unrolled(&|d| format!("  let q{d} = load_q(qb, {d}u);\n")),
        acc_init = unrolled(&|d| format!("  var a{d} = vec4<f32>(0.0f);\n")),
        stores = unrolled(&|d| format!("  store_y(qb, {d}u, a{d} * inv);\n")),
    );
    KernelSource {
        name: format!(
            "attention_cpu_h{}_kv{}_d{}_w{}{}{}{}",
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.window,
            kv_tag(s.kv),
            at.tag(),
            s.tag()
        ),
        wgsl: w,
        workgroup_size: [THREADS, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(s.heads, THREADS),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
