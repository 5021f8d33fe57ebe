//! The fused multi-tensor optimizer step: every trained tensor laid end to
//! end in one buffer of weights, one of gradients and one per AdamW moment,
//! so a step over all of them is two dispatches, whatever their number.
//! A binding holds at most 2 GiB − 4 on the H100 (536,870,911 f32s), so
//! a model past that keeps its weights in several such buffers, *banks*
//! (`crate::training`): each bank gets its own two dispatches, and every
//! update reduces the partials of all banks, so the clipping norm is the
//! global one. Lengths are `u32`, and the strided loops cannot wrap.
//!
//! [`grad_norm_partials`] sums the squared gradients, each workgroup a
//! strided share into one partial; [`adamw_update`] has every workgroup sum
//! those partials again (a few hundred values: cheaper than a third
//! dispatch), takes the global norm and the clipping factor
//! `min(1, max_norm / (norm + 1e-6))`, and, when the norm is finite, steps
//! every weight as `torch.optim.AdamW` does (decoupled weight decay, bias
//! correction), gradients scaled by the factor. It zeroes every gradient in
//! the same pass, so the next batch accumulates from zero, and workgroup 0
//! writes the report `[norm, factor, applied]` (`applied` 0 when the norm
//! was not finite and the step was skipped). The step's scalars come in a
//! small buffer ([`AdamwSettings`]) the host writes each step, bias
//! corrections computed there in f64. [`adamw_update_8bit`] is the same
//! step over moments stored in a byte each (a quarter of the bytes).
//!
//! The surprise: the finiteness test is on the bits of the sum of squares
//! (an all-ones exponent is an infinity or a NaN), not `x != x`, which a
//! shader compiler may fold away under fast-math assumptions.

use super::{input, output, prelude, tree_reduce, Bindings, KernelSource};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

const WG: u32 = 256;

/// Workgroups of [`grad_norm_partials`], and partials [`adamw_update`]
/// reduces: enough to fill a large GPU, few enough to sum in every
/// workgroup of the update.
pub const PARTIALS: u32 = 512;

/// The scalars of one step, in the order of the settings buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamwSettings {
    /// The learning rate of this step.
    pub lr: f32,
    /// `β₁`.
    pub beta1: f32,
    /// `β₂`.
    pub beta2: f32,
    /// `ε`.
    pub eps: f32,
    /// Decoupled weight decay `λ`.
    pub weight_decay: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub root_correction: f32,
    /// The clipping norm; infinite for no clipping (a factor of 1), and 0
    /// zeroes the gradients, as in PyTorch.
    pub max_norm: f32,
}

impl AdamwSettings {
    /// The settings of step `t` (from 1) of AdamW with these
    /// hyper-parameters, bias corrections computed in f64. `t` counts the
    /// steps applied: a step the update skipped (its report's `applied` is
    /// 0) does not count, so the host reads the report back before it makes
    /// the next step's settings.
    pub fn at_step(
        t: u64,
        lr: f64,
        (beta1, beta2): (f64, f64),
        eps: f64,
        weight_decay: f64,
        max_norm: Option<f64>,
    ) -> Self {
        let t = t.min(i32::MAX as u64) as i32;
        AdamwSettings {
            lr: lr as f32,
            beta1: beta1 as f32,
            beta2: beta2 as f32,
            eps: eps as f32,
            weight_decay: weight_decay as f32,
            step_size: (lr / (1.0 - beta1.powi(t))) as f32,
            root_correction: (1.0 - beta2.powi(t)).sqrt() as f32,
            max_norm: max_norm.unwrap_or(f64::INFINITY) as f32,
        }
    }

    /// The settings buffer's contents.
    pub fn to_array(self) -> [f32; 8] {
        [
            self.lr,
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
            self.step_size,
            self.root_correction,
            self.max_norm,
        ]
    }
}

fn header(len: u32, ranges: u32) -> String {
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const N: u32 = {len}u;\nconst WG: u32 = {WG}u;\nconst PARTIALS: u32 = {PARTIALS}u;\n\
         const RANGES: u32 = {ranges}u;\n\
         var<workgroup> red: array<f32, WG>;"
    );
    w
}

/// [`PARTIALS`] workgroups of `WG` threads, a reduction's memory each.
fn launch(name: String, wgsl: String, b: Bindings) -> KernelSource {
    KernelSource {
        name,
        wgsl,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(PARTIALS),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}

/// `partials[g]`: the sum of `grads[i]²` over `i ≡ g·WG + lane (mod
/// PARTIALS·WG)`, for the `len` gradients. Bindings: `grads`, `partials`.
pub fn grad_norm_partials(len: u32) -> KernelSource {
    let mut w = header(len, 1);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "grads");
    b.activation(&mut w, output(0), "partials");
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  var s = 0.0f;\n\
         \x20 for (var i = wid.x * WG + lane; i < N; i = i + PARTIALS * WG) {{ let g = grads[i]; s = s + g * g; }}\n\
         \x20 red[lane] = s;\n  workgroupBarrier();\n{reduce}\
         \x20 if (lane == 0u) {{ partials[wid.x] = red[0]; }}\n}}\n",
        reduce = tree_reduce(WG, "lane", "0u", "+"),
    );
    launch(format!("grad_norm_partials_n{len}"), w, b)
}

/// The start of both updates' `main`: the global norm from every range's
/// partials (uniform, so a skipped step may return early), the step's
/// scalars and clipping factor, and workgroup 0's report; then a step whose
/// norm is not finite zeroes the gradients and returns.
fn update_prologue() -> String {
    format!(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  var s = 0.0f;\n\
         \x20 for (var i = lane; i < PARTIALS * RANGES; i = i + WG) {{ s = s + partials[i]; }}\n\
         \x20 red[lane] = s;\n  workgroupBarrier();\n{reduce}\
         \x20 let total = workgroupUniformLoad(&red[0]);\n\
         \x20 let finite = (bitcast<u32>(total) & 0x7f800000u) != 0x7f800000u;\n\
         \x20 let norm = sqrt(total);\n\
         \x20 let lr = settings[0]; let b1 = settings[1]; let b2 = settings[2]; let eps = settings[3];\n\
         \x20 let decay = 1.0f - lr * settings[4]; let step_size = settings[5]; let root = settings[6];\n\
         \x20 let factor = min(1.0f, settings[7] / (norm + 1e-6f));\n\
         \x20 if (wid.x == 0u && lane == 0u) {{\n\
         \x20   report[0] = norm; report[1] = factor; report[2] = select(0.0f, 1.0f, finite);\n  }}\n\
         \x20 if (!finite) {{\n\
         \x20   for (var i = wid.x * WG + lane; i < N; i = i + PARTIALS * WG) {{ grads[i] = 0.0f; }}\n\
         \x20   return;\n  }}\n",
        reduce = tree_reduce(WG, "lane", "0u", "+"),
    )
}

/// WGSL `f16_bits(x)`: the f16 nearest `x` (ties to even, subnormals
/// included), saturated at ±65504, as a `u32` of 16 bits. Integer work,
/// not `pack2x16float`, which naga admits only with a capability some
/// devices lack.
const F16_BITS: &str = "fn f16_bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let sign = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7e00u; }
  if (a >= 0x477ff000u) { return sign | 0x7bffu; }
  if (a < 0x33000001u) { return sign; }
  var r: u32;
  var rest: u32;
  var half: u32;
  if (a < 0x38800000u) {
    let s = 126u - (a >> 23u);
    let m = (a & 0x7fffffu) | 0x800000u;
    r = m >> s;
    rest = m & ((1u << s) - 1u);
    half = 1u << (s - 1u);
  } else {
    r = (((a >> 23u) - 112u) << 10u) | ((a & 0x7fffffu) >> 13u);
    rest = a & 0x1fffu;
    half = 0x1000u;
  }
  if (rest > half || (rest == half && (r & 1u) == 1u)) { r = r + 1u; }
  return sign | r;
}
";

/// The f16 pair of `a` and `b` (WGSL expressions), packed (`a` low).
fn f16_pair(a: &str, b: &str) -> String {
    format!("(f16_bits({a}) | (f16_bits({b}) << 16u))")
}

/// One AdamW step over `len` weights, one of `ranges` banks of the
/// trained weights (see the module docs), after [`grad_norm_partials`] of
/// every bank: it reduces all `ranges · PARTIALS` partials, so the clipping
/// norm is the global one. Each thread takes pairs of weights.
/// Bindings: `settings` ([`AdamwSettings::to_array`]), `partials`, then
/// `weights`, `grads` (zeroed), `m`, `v` and `report` (`[norm, factor,
/// applied]`), all written; with `mirror`, also `mirror`: the updated
/// weights as f16 pairs, saturated at ±65504 (the forward's copy in mixed
/// precision), left as they were by a skipped step.
pub fn adamw_update(len: u32, ranges: u32, mirror: bool) -> KernelSource {
    let mut w = header(len, ranges);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "settings");
    b.activation(&mut w, input(1), "partials");
    b.activation(&mut w, output(0), "weights");
    b.activation(&mut w, output(1), "grads");
    b.activation(&mut w, output(2), "m");
    b.activation(&mut w, output(3), "v");
    b.activation(&mut w, output(4), "report");
    if mirror {
        b.ids_out(&mut w, output(5), "mirror");
        w.push_str(F16_BITS);
    }
    w.push_str(&update_prologue());
    let _ = write!(
        w,
        "  for (var p = wid.x * WG + lane; p * 2u < N; p = p + PARTIALS * WG) {{\n\
         \x20   var pair = vec2<f32>(0.0f);\n\
         \x20   for (var e = 0u; e < 2u; e = e + 1u) {{\n\
         \x20     let i = 2u * p + e;\n\
         \x20     if (i >= N) {{ break; }}\n\
         \x20     let g = grads[i] * factor;\n\
         \x20     let m1 = b1 * m[i] + (1.0f - b1) * g;\n\
         \x20     let v1 = b2 * v[i] + (1.0f - b2) * g * g;\n\
         \x20     m[i] = m1; v[i] = v1;\n\
         \x20     let w1 = weights[i] * decay - step_size * m1 / (sqrt(v1) / root + eps);\n\
         \x20     weights[i] = w1;\n      pair[e] = w1;\n\
         \x20     grads[i] = 0.0f;\n    }}\n\
         {store}  }}\n}}\n",
        store = if mirror {
            format!("    mirror[p] = {};\n", f16_pair("pair.x", "pair.y"))
        } else {
            String::new()
        },
    );
    let tag = if mirror { "_mirror" } else { "" };
    launch(format!("adamw_update_n{len}_r{ranges}{tag}"), w, b)
}

/// `acc[i] += grads[i] · SCALE` over `len` gradients: one pass's gradients
/// added into a batch's of `batch` passes (`SCALE` = 1 / `batch`, so the
/// batch's is their mean). A thread per gradient, strided
/// over at most 65,535 workgroups. Bindings: `grads`, then `acc`.
pub fn accumulate(len: u32, batch: u32) -> KernelSource {
    let mut w = prelude();
    let groups = len.div_ceil(WG).clamp(1, 65_535);
    let _ = writeln!(
        w,
        "const N: u32 = {len}u;\nconst WG: u32 = {WG}u;\nconst STRIDE: u32 = {stride}u;\n\
         const SCALE: f32 = {scale};",
        stride = groups * WG,
        scale = super::f32_lit(1.0 / batch.max(1) as f32),
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "grads");
    b.activation(&mut w, output(0), "acc");
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 for (var i = gid.x; i < N; i = i + STRIDE) { acc[i] = acc[i] + grads[i] * SCALE; }\n}\n",
    );
    KernelSource {
        name: format!("accumulate_n{len}_b{batch}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(groups),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}

/// Moments per block of the 8-bit state: the block shares one scale per
/// moment (`gerbil_interp::optimizer::STATE_BLOCK`).
pub const STATE_BLOCK: u32 = WG;

/// Bytes of the 8-bit state of `len` weights: a byte per moment and two
/// f32 scales per block, 25.4% of the f32 state's eight bytes per weight.
pub fn eight_bit_state_bytes(len: u32) -> u64 {
    2 * u64::from(len).next_multiple_of(4) + 8 * u64::from(len.div_ceil(STATE_BLOCK))
}

/// [`adamw_update`] with 8-bit moments. Bindings: `settings`, `partials`,
/// then `weights`, `grads` (zeroed), `mq` and `vq` (four bytes per word:
/// `m` as a signed byte of its block's `max|m|`, `√v` as an unsigned byte
/// of its block's `max √v`), `scales` (per block: m's, then v's) and
/// `report` (and, with `mirror`, `mirror`, as [`adamw_update`]'s). A
/// workgroup takes a block of [`STATE_BLOCK`] weights at a time: it decodes the moments, steps them and the weights, and encodes
/// them again with the block's new scales (ties to even, as the oracle's
/// `quantize_moments`). A skipped step leaves every byte and scale as it
/// was and only zeroes the gradients.
pub fn adamw_update_8bit(len: u32, ranges: u32, mirror: bool) -> KernelSource {
    let mut w = header(len, ranges);
    let _ = writeln!(
        w,
        "const BLOCKS: u32 = {}u;\nvar<workgroup> packed: array<u32, WG>;\n\
         var<workgroup> updated: array<f32, WG>;",
        len.div_ceil(STATE_BLOCK)
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "settings");
    b.activation(&mut w, input(1), "partials");
    b.activation(&mut w, output(0), "weights");
    b.activation(&mut w, output(1), "grads");
    b.ids_out(&mut w, output(2), "mq");
    b.ids_out(&mut w, output(3), "vq");
    b.activation(&mut w, output(4), "scales");
    b.activation(&mut w, output(5), "report");
    if mirror {
        b.ids_out(&mut w, output(6), "mirror");
        w.push_str(F16_BITS);
    }
    let reduce_max = tree_reduce(WG, "lane", "0u", "max");
    w.push_str(&update_prologue());
    let store = if mirror {
        format!(
            "    let pair = blk * (WG / 2u) + lane;\n\
             \x20   if (lane < WG / 2u && pair * 2u < N) {{\n\
             \x20     mirror[pair] = {};\n    }}\n",
            f16_pair("updated[2u * lane]", "updated[2u * lane + 1u]")
        )
    } else {
        String::new()
    };
    let _ = write!(
        w,
        "  for (var blk = wid.x; blk < BLOCKS; blk = blk + PARTIALS) {{\n\
         \x20   let i = blk * WG + lane;\n    let live = i < N;\n\
         \x20   var m = 0.0f;\n    var v = 0.0f;\n    var w1 = 0.0f;\n\
         \x20   if (live) {{\n\
         \x20     let shift = 8u * (i % 4u);\n\
         \x20     let mb = (mq[i / 4u] >> shift) & 0xffu;\n\
         \x20     let vb = (vq[i / 4u] >> shift) & 0xffu;\n\
         \x20     let r = f32(vb) * scales[2u * blk + 1u] / 255.0f;\n\
         \x20     let g = grads[i] * factor;\n\
         \x20     m = b1 * (f32(bitcast<i32>(mb << 24u) >> 24u) * scales[2u * blk] / 127.0f) + (1.0f - b1) * g;\n\
         \x20     v = b2 * r * r + (1.0f - b2) * g * g;\n\
         \x20     w1 = weights[i] * decay - step_size * m / (sqrt(v) / root + eps);\n\
         \x20     weights[i] = w1;\n\
         \x20     grads[i] = 0.0f;\n    }}\n\
         \x20   updated[lane] = w1;\n\
         \x20   red[lane] = abs(m);\n    workgroupBarrier();\n{reduce_max}\
         \x20   let ms = red[0];\n    workgroupBarrier();\n\
         \x20   red[lane] = sqrt(v);\n    workgroupBarrier();\n{reduce_max}\
         \x20   let vs = red[0];\n    workgroupBarrier();\n\
         \x20   var qm = 0i;\n    var qv = 0u;\n\
         \x20   if (ms > 0.0f) {{ qm = i32(round(m / ms * 127.0f)); }}\n\
         \x20   if (vs > 0.0f) {{ qv = u32(round(sqrt(v) / vs * 255.0f)); }}\n\
         \x20   packed[lane] = (bitcast<u32>(qm) & 0xffu) | (qv << 8u);\n\
         \x20   workgroupBarrier();\n\
         \x20   let word = blk * (WG / 4u) + lane;\n\
         \x20   if (lane < WG / 4u && word * 4u < N) {{\n\
         \x20     var wm = 0u;\n      var wv = 0u;\n\
         \x20     for (var k = 0u; k < 4u; k = k + 1u) {{\n\
         \x20       let p = packed[lane * 4u + k];\n\
         \x20       wm = wm | ((p & 0xffu) << (8u * k));\n        wv = wv | (((p >> 8u) & 0xffu) << (8u * k));\n      }}\n\
         \x20     mq[word] = wm;\n      vq[word] = wv;\n    }}\n\
         {store}\
         \x20   if (lane == 0u) {{ scales[2u * blk] = ms; scales[2u * blk + 1u] = vs; }}\n\
         \x20   workgroupBarrier();\n  }}\n}}\n",
    );
    let tag = if mirror { "_mirror" } else { "" };
    launch(format!("adamw_update_8bit_n{len}_r{ranges}{tag}"), w, b)
}
