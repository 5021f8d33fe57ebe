//! Cooperative-matrix emulation: a tensor-core kernel (`gemm_coop`,
//! `grad_coop`) with its matrix operations replaced by WGSL loops over the
//! same workgroup-memory layouts, so lavapipe, which has no cooperative
//! matrices, runs everything else of the kernel as generated — staging,
//! bounds, the subgroup passes, the epilogues — against a reference.
//!
//! Use [`emulate_coop`] on a kernel's source and run the result like any
//! kernel. The surprise: the emulation only queues the multiply-adds and
//! runs them in one flush after the K loop's last one (see
//! [`coop_emulation`]); inlining each took lavapipe seconds to compile.

use gerbil_codegen_wgsl::kernels::KernelSource;

/// WGSL emulating the cooperative-matrix operations of a `gemm_coop` or
/// `grad_coop` kernel that holds `accumulators` accumulators and has `products`
/// multiply-adds in its K loop, with the same memory layouts as the real
/// ones (`coopLoadT`: row-major, `coopLoad`: column-major, `coopStoreT`:
/// row-major): an A or B operand is where it lies in `stage` (element
/// `(r, c)` at `o + r·rs + c·cs`); an accumulator is shared by the lanes of
/// a subgroup as a real one is, each lane holding elements `lane + q·size`
/// (`q < 32`, so subgroups of at least 8, as lavapipe's). An accumulator
/// value is a handle, the slot of its 32 elements in a private array
/// (handed out in turn); a multiply-add only queues its operands, and
/// `emu_flush` (called once, after the K loop's last multiply-add, before
/// the barrier that lets `stage` be overwritten) runs the queue. The loops
/// step by the subgroup size (the inner one by a step computed at run
/// time), which keeps lavapipe's compiler from unrolling them.
/// What lavapipe takes seconds to compile is private arrays indexed at run
/// time and code repeated at every call: with accumulators passed as
/// `array<f32, 32>` values and every multiply-add inlined, a kernel took it
/// 7–9 s, and 1–2 s with arrays sized to the kernel and the one flush (as
/// long as the kernel without any emulation).
/// Products of f16 values are exact in f32, so only the order of the f32
/// sums differs from the hardware.
fn coop_emulation(accumulators: usize, products: usize) -> String {
    format!(
        "
struct EmuFrag {{ o: u32, rs: u32, cs: u32 }}
var<private> emu_lane: u32;
var<private> emu_size: u32;
var<private> emu_next: u32;
var<private> emu_slots: array<f32, {slots}>;
var<private> emu_qa: array<EmuFrag, {products}>;
var<private> emu_qb: array<EmuFrag, {products}>;
var<private> emu_qh: array<u32, {products}>;
var<private> emu_qn: u32;
fn emu_rows(o: u32, s: u32) -> EmuFrag {{ return EmuFrag(o, s, 1u); }}
fn emu_cols(o: u32, s: u32) -> EmuFrag {{ return EmuFrag(o, 1u, s); }}
fn emu_acc(o: u32) -> u32 {{
  let h = emu_next;
  emu_next = (emu_next + 1u) % {accumulators}u;
  var q = h * 32u;
  for (var e = emu_lane; e < 256u; e += emu_size) {{
    emu_slots[q] = cs[o + (e % 16u) * 16u + e / 16u];
    q++;
  }}
  return h;
}}
fn emu_mma(a: EmuFrag, b: EmuFrag, h: u32) -> u32 {{
  emu_qa[emu_qn] = a;
  emu_qb[emu_qn] = b;
  emu_qh[emu_qn] = h;
  emu_qn++;
  return h;
}}
fn emu_flush() {{
  for (var t = 0u; t < emu_qn; t++) {{
    let a = emu_qa[t];
    let b = emu_qb[t];
    var q = emu_qh[t] * 32u;
    for (var e = emu_lane; e < 256u; e += emu_size) {{
      let i = e / 16u;
      let j = e % 16u;
      var sum = emu_slots[q];
      for (var k = 0u; k < 16u; k += emu_size / emu_size) {{
        sum = sum + f32(stage[a.o + i * a.rs + k * a.cs]) * f32(stage[b.o + k * b.rs + j * b.cs]);
      }}
      emu_slots[q] = sum;
      q++;
    }}
  }}
  emu_qn = 0u;
}}
fn emu_store(h: u32, o: u32) {{
  var q = h * 32u;
  for (var e = emu_lane; e < 256u; e += emu_size) {{
    cs[o + e] = emu_slots[q];
    q++;
  }}
}}
",
        slots = accumulators * 32
    )
}

/// `src` with its cooperative-matrix operations replaced by
/// [`coop_emulation`], so lavapipe (which has no cooperative matrices) runs
/// the rest of the kernel as generated: staging, bounds, the subgroup
/// layout, norm, gated and residual epilogues, shards.
pub fn emulate_coop(src: &KernelSource) -> KernelSource {
    let mut lines = Vec::new();
    for line in src.wgsl.lines() {
        lines.push(
            line.replace("enable wgpu_cooperative_matrix;", "")
                .replace("coopLoadT<coop_mat16x16<f16, A>>(&stage[", "emu_rows(")
                .replace("coopLoad<coop_mat16x16<f16, B>>(&stage[", "emu_cols(")
                .replace("coopLoadT<coop_mat16x16<f16, B>>(&stage[", "emu_rows(")
                .replace("coopLoad<coop_mat16x16<f32, C>>(&cs[", "emu_acc(")
                .replace("coopMultiplyAdd(", "emu_mma(")
                .replace("coopStoreT(", "emu_store(")
                .replace(", &cs[", ", ")
                .replace("], STRIDE)", ", STRIDE)")
                .replace("], BSTRIDE)", ", BSTRIDE)")
                .replace("], 16u)", ")")
                .replace(
                    "if (lid == 0u) { groups_sh[0] = nsg; }",
                    "emu_lane = sgl;\n  emu_size = sgs;\n  if (lid == 0u) { groups_sh[0] = nsg; }",
                ),
        );
    }
    let products = lines.iter().filter(|l| l.contains("emu_mma(")).count();
    let accumulators = lines.iter().filter(|l| l.contains("= emu_acc(")).count();
    let last = lines.iter().rposition(|l| l.contains("emu_mma("));
    let next = last.and_then(|i| lines.get(i + 1));
    assert!(
        next.is_some_and(|l| l.trim() == "workgroupBarrier();") && accumulators > 0,
        "{}: the K loop's multiply-adds do not end before a barrier",
        src.name
    );
    lines.insert(last.unwrap() + 1, "      emu_flush();".to_string());
    let mut wgsl = lines.join("\n");
    assert!(
        !wgsl.contains("coop") && wgsl.contains("emu_lane = sgl;"),
        "{}: an operation left unemulated",
        src.name
    );
    wgsl.push_str(&coop_emulation(accumulators, products));
    KernelSource {
        name: format!("{}_emulated", src.name),
        wgsl,
        ..src.clone()
    }
}
