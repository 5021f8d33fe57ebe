//! Every WGSL template of `gerbil_codegen_wgsl::kernels`, run on the GPU
//! (lavapipe in CI) on deterministic random inputs and compared with the f64
//! reference of its IR op (`gerbil_e2e::reference`) computed from the same
//! inputs (bf16/f16 decoded exactly).
//!
//! Each kernel has one `check_*` function and a table of cases; a test runs
//! every case, then fails listing all the cases that failed. Outputs start as
//! NaN, and activation inputs (bound `read_write`) must come back unchanged.
//! The case's `Debug` form seeds its inputs, so a failure replays exactly.
//! `matmul_random_shapes`, `gemv_random_shapes` and `gemm_random_shapes`
//! add proptests over matmul shapes.

use gerbil_codegen_wgsl::kernels::{
    self,
    gemm::GemmTile,
    gemm_coop::{CoopGemm, CoopTile},
    sample_token::Shape,
    KernelSource, Rows,
};
use gerbil_e2e::kernel_harness::{
    check_close, encode, f32_bytes, poison, run_output, run_outputs, to_f32, u32_bytes, widen, Rng,
    TOL,
};
use gerbil_e2e::{proptest_config, reference};
use gerbil_ir::rope_table::rope_table;
use gerbil_ir::{
    Attention, BinaryOp, DType, Embedding, NormPrologue, QkNorm, QkvRope, RmsNorm, Rope, UnaryOp,
};
use gerbil_runtime::{Sampler, SamplingParams};
use proptest::prelude::*;
use std::fmt::Debug;

/// Runs `check` on every case and panics listing each failure.
fn check_all<C: Debug>(
    cases: impl IntoIterator<Item = C>,
    check: impl Fn(&C) -> Result<(), String>,
) {
    let mut failures = Vec::new();
    let mut total = 0;
    for case in cases {
        total += 1;
        if let Err(e) = check(&case) {
            failures.push(format!("  {case:?}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The inputs' generator of `case`.
fn rng(case: &impl Debug) -> Rng {
    Rng::from_label(&format!("{case:?}"))
}

/// Row count of `rows` at `t` tokens.
fn row_count(rows: Rows, t: u32) -> usize {
    match rows {
        Rows::Tokens => t as usize,
        Rows::Fixed(n) => n as usize,
    }
}

/// Runs `src` and checks binding `out + 1` against `want`.
fn expect(
    src: &KernelSource,
    t: u32,
    p: u32,
    inputs: &[Vec<u8>],
    out: usize,
    want: &[f64],
) -> Result<(), String> {
    let got = run_output(src, t, p, inputs, out)?;
    check_close(&src.name, &got, want, TOL)
}

/// Runs `src` once and checks each binding `outs[i].0 + 1` against `outs[i].1`.
fn expect_all(
    src: &KernelSource,
    t: u32,
    p: u32,
    inputs: &[Vec<u8>],
    outs: &[(usize, &[f64])],
) -> Result<(), String> {
    let idx: Vec<usize> = outs.iter().map(|o| o.0).collect();
    let got = run_outputs(src, t, p, inputs, &idx)?;
    for (g, (o, want)) in got.iter().zip(outs) {
        check_close(&format!("{} binding {}", src.name, o + 1), g, want, TOL)?;
    }
    Ok(())
}

/// Splits a `[rows, width]` tensor's bytes into shards of `shard_rows` rows
/// (the last may be shorter), as codegen does for weights above the binding limit;
/// quantized shards are then laid out as the plan stores them.
fn shard_bytes(bytes: Vec<u8>, rows: usize, shard_rows: Option<u32>, dtype: DType) -> Vec<Vec<u8>> {
    let shards = match shard_rows {
        Some(r) if (r as usize) < rows => {
            let row_bytes = bytes.len() / rows;
            bytes
                .chunks(r as usize * row_bytes)
                .map(<[u8]>::to_vec)
                .collect()
        }
        _ => vec![bytes],
    };
    if !dtype.is_quantized() {
        return shards;
    }
    shards
        .iter()
        .map(|s| kernels::quant::gpu_layout(dtype, s))
        .collect()
}

// ---------------------------------------------------------------- matmul

#[derive(Clone, Copy, Debug)]
struct MatMulCase {
    rows: Rows,
    t: u32,
    k: u32,
    n: u32,
    wdtype: DType,
    bias: bool,
    tt: u32,
    shard_rows: Option<u32>,
    /// Gated epilogue: the weight has `2n` rows.
    glu: Option<UnaryOp>,
    /// RMSNorm prologue: its weight offset and the norm weight's dtype.
    norm: Option<(f32, DType)>,
    /// Residual epilogue.
    residual: bool,
    /// `x` has `t` rows and the one output row (`rows` is `Fixed(1)`) is
    /// computed from its last (`matmul{last_row}`).
    last_row: bool,
    /// Activation epilogue (`matmul{act}`), after the bias.
    act: Option<UnaryOp>,
}

impl MatMulCase {
    /// One row over the step's tokens of a `K × N` matmul of `wdtype`
    /// weights, with no option.
    fn plain(k: u32, n: u32, wdtype: DType) -> MatMulCase {
        MatMulCase {
            rows: Rows::Tokens,
            t: 1,
            k,
            n,
            wdtype,
            bias: false,
            tt: 1,
            shard_rows: None,
            glu: None,
            norm: None,
            residual: false,
            last_row: false,
            act: None,
        }
    }
}

/// The epsilon of the matmul cases' norm prologues.
const MATMUL_NORM_EPS: f32 = 1e-5;

/// The kernel specialization of `c`.
fn matmul_spec(c: &MatMulCase) -> kernels::matmul::MatMulSpec {
    kernels::matmul::MatMulSpec {
        shard_rows: c.shard_rows,
        rows: c.rows,
        k: c.k,
        n: c.n,
        wdtype: c.wdtype,
        bias: c.bias,
        tt: c.tt,
        glu: c.glu,
        norm: c
            .norm
            .map(|(offset, dtype)| (MATMUL_NORM_EPS, offset, dtype)),
        residual: c.residual,
        last_row: c.last_row,
        act: c.act,
    }
}

fn check_matmul(c: &MatMulCase) -> Result<(), String> {
    check_matmul_kernel(c, &kernels::matmul::kernel(matmul_spec(c)))
}

/// Runs `src`, a kernel for case `c` (the matmul or the gemv template), on
/// `c`'s inputs and checks it against the reference.
fn check_matmul_kernel(c: &MatMulCase, src: &KernelSource) -> Result<(), String> {
    check_matmul_kernel_seeing(c, src, None, None)
}

/// What a kernel makes of `x` (and the norm weight) before its products.
type Seen<'a> = &'a dyn Fn(&[f32], &[f64]) -> Vec<f32>;

/// [`check_matmul_kernel`] against the reference on `seen(x, g)`, where
/// given: what the kernel makes of `x` and the norm weight `g` before its
/// products, the norm prologue included (int8 units, for the GEMV's integer
/// dot products); `x` drawn, then adjusted as `adjust` says.
fn check_matmul_kernel_seeing(
    c: &MatMulCase,
    src: &KernelSource,
    seen: Option<Seen>,
    adjust: Option<Adjust>,
) -> Result<(), String> {
    let (m, k, n) = (row_count(c.rows, c.t), c.k as usize, c.n as usize);
    let MatMulInputs {
        inputs,
        x,
        w,
        b,
        g,
        res,
    } = matmul_inputs_adjusted(c, adjust);
    let (mut x, b, res) = match seen {
        Some(seen) => (widen(&seen(&x, &g)), widen(&b), widen(&res)),
        None => (widen(&x), widen(&b), widen(&res)),
    };
    if c.last_row {
        x = reference::slice_last_row(&x, k);
    }
    let bias = c.bias.then_some(b.as_slice());
    let norm = c.norm.filter(|_| seen.is_none()).map(|(weight_offset, _)| {
        let p = NormPrologue {
            eps: MATMUL_NORM_EPS,
            weight_offset,
        };
        (g.as_slice(), p)
    });
    let residual = c.residual.then_some(res.as_slice());
    let want = match c.glu {
        None => reference::fused_matmul(&x, k, &w, bias, norm, c.act, residual),
        Some(act) => {
            let y = reference::fused_matmul_glu(&x, k, &w, bias, norm, act);
            match residual {
                Some(r) => reference::binary(BinaryOp::Add, &y, r),
                None => y,
            }
        }
    };
    debug_assert_eq!(want.len(), m * n);
    let got = run_output(src, c.t, 0, &inputs, inputs.len() - 1)?;
    check_close(&src.name, &got, &want, matmul_tol(c.k))
}

/// The tolerance for a product over `k` terms. f32 sums of `k` unit-range
/// products carry rounding that grows like `k · ε` relative to a typical
/// result (the sum of the terms' magnitudes grows like `k`, the result like
/// `√k`, the rounding like `√k` times the magnitude), so [`TOL`] holds up to
/// 256 terms and grows in proportion beyond: a gated product at `k` = 597
/// (two such sums, after an f32 norm) once missed 1e-4 by 0.2%, while a wrong
/// index or a lost term is off by the size of a term.
fn matmul_tol(k: u32) -> f64 {
    TOL * (f64::from(k) / 256.0).max(1.0)
}

/// The inputs of matmul case `c`, drawn from its generator: `inputs` in
/// binding order (x, weight shards, then bias, gain and residual where `c`
/// has them, the output poisoned) and the values they encode (`w` and `g`
/// as their dtype rounds them).
struct MatMulInputs {
    inputs: Vec<Vec<u8>>,
    x: Vec<f32>,
    w: Vec<f64>,
    b: Vec<f32>,
    g: Vec<f64>,
    res: Vec<f32>,
}

fn matmul_inputs(c: &MatMulCase) -> MatMulInputs {
    matmul_inputs_adjusted(c, None)
}

/// `x` given its norm weight: an adjustment of the drawn inputs.
type Adjust<'a> = &'a dyn Fn(&mut [f32], &[f64]);

/// [`matmul_inputs`], `x` adjusted by `adjust(x, g)` before it is encoded.
fn matmul_inputs_adjusted(c: &MatMulCase, adjust: Option<Adjust>) -> MatMulInputs {
    let (m, k, n) = (row_count(c.rows, c.t), c.k as usize, c.n as usize);
    let wn = if c.glu.is_some() { 2 * n } else { n };
    let mut rng = rng(c);
    let x_rows = if c.last_row { c.t as usize } else { m };
    let mut x = rng.vec(x_rows * k);
    let (w_bytes, w) = encode(&rng.vec(wn * k), c.wdtype);
    let b = rng.vec(wn);
    let (g_bytes, g) = encode(&rng.vec(k), c.norm.map_or(DType::F32, |n| n.1));
    if let Some(adjust) = adjust {
        adjust(&mut x, &g);
    }
    let mut inputs = vec![f32_bytes(&x)];
    inputs.extend(shard_bytes(w_bytes, wn, c.shard_rows, c.wdtype));
    if c.bias {
        inputs.push(f32_bytes(&b));
    }
    if c.norm.is_some() {
        inputs.push(g_bytes);
    }
    let res = rng.vec(m * n);
    if c.residual {
        inputs.push(f32_bytes(&res));
    }
    inputs.push(poison(m * n));
    MatMulInputs {
        inputs,
        x,
        w,
        b,
        g,
        res,
    }
}

/// Every weight dtype × K × N (K odd takes the unpacked path of 16-bit
/// weights); the row layout, rows per workgroup and bias rotate so each dtype
/// also meets every combination of them.
fn matmul_cases() -> Vec<MatMulCase> {
    let launches = [
        (Rows::Tokens, 1),
        (Rows::Tokens, 3),
        (Rows::Tokens, 13),
        (Rows::Fixed(1), 3),
    ];
    let mut cases = Vec::new();
    for wdtype in [DType::F32, DType::BF16, DType::F16] {
        for (ki, k) in [7, 64, 96, 130, 576].into_iter().enumerate() {
            for (ni, n) in [1, 5, 64, 100].into_iter().enumerate() {
                let j = ki + 5 * ni;
                let (rows, t) = launches[j % 4];
                cases.push(MatMulCase {
                    rows,
                    t,
                    k,
                    n,
                    wdtype,
                    bias: (j / 8) % 2 == 1,
                    tt: [1, 8][(j / 4) % 2],
                    shard_rows: None,
                    glu: None,
                    norm: None,
                    residual: false,
                    last_row: false,
                    // The activation epilogue on every weight dtype and
                    // row layout (the GEMV, GEMM and cpu kernels take these
                    // cases too).
                    act: match j % 5 {
                        1 => Some(UnaryOp::Gelu),
                        3 => Some(UnaryOp::Silu),
                        4 => Some(UnaryOp::GeluTanh),
                        _ => None,
                    },
                });
            }
        }
    }
    let case = |rows, t, k, n, wdtype, tt| MatMulCase {
        rows,
        t,
        k,
        n,
        wdtype,
        bias: true,
        tt,
        shard_rows: None,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    };
    cases.extend([
        // What codegen emits for a fixed row count below the prefill TT.
        case(Rows::Fixed(3), 1, 130, 64, DType::BF16, 3),
        // More rows per workgroup than lanes (K short enough for 8 lanes):
        // rows past the lane count were once never written.
        case(Rows::Tokens, 13, 64, 5, DType::F32, 16),
        case(Rows::Tokens, 13, 96, 100, DType::BF16, 12),
        case(Rows::Tokens, 40, 7, 64, DType::F16, 32),
    ]);
    // Weights split into row shards (a multiple of 4 rows each, the last
    // shorter), as for tables above the binding limit.
    for (wdtype, k, n, shard) in [
        (DType::F32, 64, 100, 32),
        (DType::BF16, 7, 13, 4),
        (DType::F16, 130, 64, 8),
        (DType::BF16, 576, 100, 48),
    ] {
        cases.push(MatMulCase {
            shard_rows: Some(shard),
            bias: false,
            ..case(Rows::Tokens, 3, k, n, wdtype, 8)
        });
    }
    // Gated epilogues (fuse-swiglu / fuse-geglu): odd and even K, odd N,
    // every dtype, decode and prefill row counts, with and without bias.
    for (i, (act, wdtype, k, n, t, tt)) in [
        (UnaryOp::Silu, DType::F32, 64, 176, 1, 1),
        (UnaryOp::Silu, DType::BF16, 576, 100, 13, 8),
        (UnaryOp::GeluTanh, DType::BF16, 130, 37, 3, 8),
        (UnaryOp::GeluTanh, DType::F16, 7, 5, 13, 16),
        (UnaryOp::Silu, DType::F16, 96, 1, 1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        cases.push(MatMulCase {
            glu: Some(act),
            bias: i % 2 == 1,
            ..case(Rows::Tokens, t, k, n, wdtype, tt)
        });
    }
    // A gated weight split into shards, gate and up rows in different ones.
    for (wdtype, k, n, shard) in [(DType::F32, 64, 13, 8), (DType::BF16, 130, 100, 48)] {
        cases.push(MatMulCase {
            glu: Some(UnaryOp::Silu),
            shard_rows: Some(shard),
            ..case(Rows::Tokens, 3, k, n, wdtype, 8)
        });
    }
    // Norm prologues (fuse-norm-matmul) and residual epilogues
    // (fuse-matmul-residual): offsets 0 and 1 (Gemma), every norm weight
    // dtype, packed and unpacked weights, decode and prefill row counts.
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    for (i, (wdtype, k, n, t, tt)) in [
        (DType::BF16, 576, 100, 1, 1),
        (DType::F32, 64, 5, 13, 8),
        (DType::F16, 130, 64, 3, 8),
        (DType::BF16, 7, 37, 1, 1),
        (DType::F32, 300, 13, 13, 16),
        (DType::F16, 96, 100, 8, 8),
    ]
    .into_iter()
    .enumerate()
    {
        let norm = Some(([0.0, 1.0][i % 2], dtypes[i % 3]));
        for (bias, norm, residual) in [
            (i % 2 == 1, norm, false),
            (i % 2 == 0, None, true),
            (i % 3 == 0, norm, true),
        ] {
            cases.push(MatMulCase {
                bias,
                norm,
                residual,
                ..case(Rows::Tokens, t, k, n, wdtype, tt)
            });
        }
    }
    // The final norm on one fixed row (lm_head), and a sharded weight.
    cases.push(MatMulCase {
        norm: Some((1.0, DType::BF16)),
        bias: false,
        ..case(Rows::Fixed(1), 1, 64, 100, DType::BF16, 1)
    });
    // The LM head reading the last of `t` rows (`fuse-last-row-matmul`):
    // packed and unpacked weights, with and without its norm prologue, one
    // row and several, rows per workgroup 1 and 8, a bias, a residual and
    // shards as the attributes allow.
    for (i, (wdtype, k, n, t, tt, shard)) in [
        (DType::BF16, 64, 100, 13, 8, None),
        (DType::F32, 7, 37, 3, 1, None),
        (DType::F16, 130, 64, 1, 8, None),
        (DType::BF16, 576, 300, 5, 1, Some(128)),
        (DType::F32, 96, 5, 40, 16, Some(4)),
    ]
    .into_iter()
    .enumerate()
    {
        cases.push(MatMulCase {
            norm: (i != 1).then_some(([0.0, 1.0][i % 2], dtypes[i % 3])),
            bias: i % 2 == 1,
            residual: i == 2,
            shard_rows: shard,
            last_row: true,
            ..case(Rows::Fixed(1), t, k, n, wdtype, tt)
        });
    }
    for (wdtype, k, n, shard, residual) in [
        (DType::BF16, 130, 100, 48, true),
        (DType::F32, 7, 13, 4, false),
    ] {
        cases.push(MatMulCase {
            norm: Some((0.0, DType::F32)),
            shard_rows: Some(shard),
            residual,
            ..case(Rows::Tokens, 3, k, n, wdtype, 8)
        });
    }
    // Gated matmuls with a norm prologue (the gate/up matmul), sharded too,
    // and one with a residual (the template allows it; the IR never asks).
    for (act, wdtype, k, n, t, tt, shard, offset, gdtype) in [
        (
            UnaryOp::Silu,
            DType::BF16,
            576,
            100,
            1,
            1,
            None,
            0.0,
            DType::BF16,
        ),
        (
            UnaryOp::GeluTanh,
            DType::BF16,
            130,
            37,
            13,
            8,
            None,
            1.0,
            DType::F32,
        ),
        (UnaryOp::Silu, DType::F16, 7, 5, 3, 8, None, 1.0, DType::F16),
        (
            UnaryOp::Silu,
            DType::F32,
            64,
            13,
            3,
            8,
            Some(8),
            0.0,
            DType::BF16,
        ),
        (
            UnaryOp::GeluTanh,
            DType::BF16,
            130,
            100,
            1,
            1,
            Some(48),
            1.0,
            DType::BF16,
        ),
    ] {
        cases.push(MatMulCase {
            glu: Some(act),
            shard_rows: shard,
            norm: Some((offset, gdtype)),
            bias: k % 2 == 0,
            ..case(Rows::Tokens, t, k, n, wdtype, tt)
        });
    }
    cases.push(MatMulCase {
        glu: Some(UnaryOp::Silu),
        residual: true,
        ..case(Rows::Tokens, 3, 64, 13, DType::BF16, 8)
    });
    cases
}

#[test]
fn matmul_matches_reference() {
    check_all(matmul_cases(), check_matmul);
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::BF16), Just(DType::F16)]
}

proptest! {
    #![proptest_config(proptest_config(24, 64))]

    #[test]
    fn matmul_random_shapes(
        k in 1u32..200,
        n in 1u32..200,
        t in 1u32..10,
        wdtype in dtype_strategy(),
        bias: bool,
        fixed_rows: bool,
        tt in 1u32..=16,
        norm in proptest::option::of((0u8..2, dtype_strategy())),
        residual: bool,
        last_row: bool,
    ) {
        let rows = match (last_row, fixed_rows) {
            (true, _) => Rows::Fixed(1),
            (false, true) => Rows::Fixed(t),
            (false, false) => Rows::Tokens,
        };
        let norm = norm.map(|(offset, dtype)| (f32::from(offset), dtype));
        let case = MatMulCase {
            rows, t, k, n, wdtype, bias, tt, shard_rows: None, glu: None, norm, residual, last_row,
            act: None,
        };
        check_matmul(&case).map_err(|e| TestCaseError::fail(format!("{case:?}: {e}")))?;
    }
}

// ------------------------------------------------------------------ gemv

/// Every matmul case (`tt` unused: one row of `x` per workgroup row), and
/// the decode shapes the gemv template handles differently: every load width
/// (`K` a multiple of 8, of 4, even, odd), several chunks per thread
/// (`K / E` above 256, with and without a partial last chunk row), and `N` large enough for 2 to 16 outputs per
/// workgroup with a partial last workgroup, plain, gated, normed, sharded.
fn gemv_cases() -> Vec<MatMulCase> {
    let case = MatMulCase::plain;
    let mut cases = matmul_cases();
    for wdtype in [DType::F32, DType::BF16, DType::F16] {
        for k in [96, 100, 130, 7, 2056] {
            cases.push(MatMulCase {
                bias: k % 3 == 0,
                residual: k % 2 == 0,
                ..case(k, 600, wdtype)
            });
        }
        cases.push(MatMulCase {
            norm: Some((1.0, wdtype)),
            ..case(1028, 37, wdtype)
        });
    }
    let norm = Some((0.0, DType::BF16));
    // Outputs per workgroup double while `TARGET_GROUPS` workgroups remain:
    // `16g + 12` outputs get 16 per workgroup and a partial last one, `8g + 4`
    // get 8; shards of `8(g/2) + 4` rows end inside a workgroup's outputs.
    let g = kernels::gemv::TARGET_GROUPS;
    let shard = Some(8 * (g / 2) + 4);
    cases.extend([
        // 16 outputs per workgroup and the final norm on one fixed row (lm_head).
        MatMulCase {
            rows: Rows::Fixed(1),
            norm,
            ..case(64, 16 * g + 12, DType::BF16)
        },
        // The LM head reading the last of 3 rows with its norm (SmolLM2's K),
        // 16 outputs per workgroup, and with a sharded f16 weight.
        MatMulCase {
            rows: Rows::Fixed(1),
            t: 3,
            norm,
            last_row: true,
            ..case(576, 16 * g + 12, DType::BF16)
        },
        MatMulCase {
            rows: Rows::Fixed(1),
            t: 2,
            norm: Some((1.0, DType::F32)),
            shard_rows: shard,
            last_row: true,
            ..case(100, 8 * g + 4, DType::F16)
        },
        // 8 gated outputs per workgroup, sharded, normed, with bias.
        MatMulCase {
            glu: Some(UnaryOp::Silu),
            norm: Some((1.0, DType::F16)),
            bias: true,
            shard_rows: shard,
            ..case(96, 8 * g + 4, DType::BF16)
        },
        // A sharded weight whose shards split a workgroup's outputs, and a
        // residual; three rows of `x`.
        MatMulCase {
            shard_rows: shard,
            residual: true,
            t: 3,
            ..case(576, 8 * g + 4, DType::F16)
        },
        // Several chunks per thread with no partial one (K / E = 2 · 256).
        MatMulCase {
            norm: Some((0.0, DType::F32)),
            residual: true,
            ..case(4096, 300, DType::BF16)
        },
        MatMulCase {
            bias: true,
            ..case(2048, 70, DType::F32)
        },
        // SmolLM2's q/k/v with its input norm and gate/up + SwiGLU.
        MatMulCase {
            norm,
            ..case(576, 960, DType::BF16)
        },
        MatMulCase {
            glu: Some(UnaryOp::Silu),
            norm,
            ..case(576, 1536, DType::BF16)
        },
    ]);
    cases
}

/// `c` run through the gemv template with `reduce`.
fn check_gemv(c: &MatMulCase, reduce: kernels::gemv::Reduce) -> Result<(), String> {
    let src = kernels::gemv::kernel(&matmul_spec(c), reduce, kernels::gemv::Dots::Float);
    check_matmul_kernel(c, &src)
}

/// The GEMV with integer dot products, against the reference on `x` as the
/// kernel quantizes it: each 32-value unit to int8 with scale `max|x| / 127`,
/// rounded half to even, in f32 as the shader computes it (a case without a
/// norm: with one the kernel quantizes `x` times the norm weight).
fn check_gemv_int8(c: &MatMulCase) -> Result<(), String> {
    assert!(c.k.is_multiple_of(32) && !c.last_row, "{c:?}");
    let src = kernels::gemv::kernel(
        &matmul_spec(c),
        kernels::gemv::Reduce::Subgroup,
        kernels::gemv::Dots::Int8,
    );
    let k = c.k as usize;
    let gain = |g: &[f64]| -> Vec<f32> {
        match c.norm {
            Some((offset, _)) => g.iter().map(|g| *g as f32 + offset).collect(),
            None => vec![1.0; k],
        }
    };
    // Each unit of 32 values of x·gain as int8 steps: (its values, the step).
    let units = |row: &[f32], gain: &[f32]| -> Vec<(Vec<f32>, f32)> {
        let normed: Vec<f32> = row.iter().zip(gain).map(|(v, g)| v * g).collect();
        normed
            .chunks(32)
            .map(|unit| {
                let amax = unit.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if amax > 0.0 { 1.0 / d } else { 0.0 };
                (unit.iter().map(|v| v * id).collect(), d)
            })
            .collect()
    };
    // A driver's division may be 2.5 ULP off (Vulkan's precision for
    // OpFDiv), so a value within that of a rounding tie may round the other
    // way than here (an H200 once did, 6.9e-3 off at K = 9216): each value
    // within 1e-3 steps of a tie shrinks by 4e-3 steps, the unit's largest
    // (127 steps) never moving.
    let away_from_ties = |x: &mut [f32], g: &[f64]| {
        let gain = gain(g);
        for row in x.chunks_mut(k) {
            let scaled = units(row, &gain);
            for (u, (steps, _)) in scaled.iter().enumerate() {
                for (i, s) in steps.iter().enumerate() {
                    let s = s.abs();
                    if (s.fract() - 0.5).abs() < 1e-3 {
                        row[32 * u + i] *= (s - 4e-3) / s;
                    }
                }
            }
        }
    };
    // Each row normed (x·(g + offset), its inverse RMS applied after the
    // products), then rounded to int8 per 32 values.
    let seen = |x: &[f32], g: &[f64]| -> Vec<f32> {
        let gain = gain(g);
        x.chunks(k)
            .flat_map(|row| {
                let inv = match c.norm {
                    Some(_) => {
                        let ssq: f64 = row.iter().map(|v| f64::from(*v).powi(2)).sum();
                        (1.0 / (ssq / k as f64 + f64::from(MATMUL_NORM_EPS)).sqrt()) as f32
                    }
                    None => 1.0,
                };
                units(row, &gain)
                    .into_iter()
                    .flat_map(|(steps, d)| {
                        assert!(
                            steps.iter().all(|s| (s.abs().fract() - 0.5).abs() > 9e-4),
                            "a value near a rounding tie"
                        );
                        steps
                            .into_iter()
                            .map(move |s| s.round_ties_even() * d * inv)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    check_matmul_kernel_seeing(c, &src, Some(&seen), Some(&away_from_ties))
}

/// The GEMV's own cases and, of [`matmul_cases`]' grid, the `i`-th of
/// every `every` (each case is a kernel lavapipe compiles): the two
/// reductions share the rest of the kernel, so each takes half the grid's
/// shapes, and the `cpu` variant's kernel a third.
fn gemv_cases_of(every: usize, i: usize) -> Vec<MatMulCase> {
    let grid = matmul_cases().len();
    gemv_cases()
        .into_iter()
        .enumerate()
        .filter(|(j, _)| *j >= grid || j % every == i)
        .map(|(_, c)| c)
        .collect()
}

#[test]
fn gemv_subgroup_matches_reference() {
    check_all(gemv_cases_of(2, 0), |c| {
        check_gemv(c, kernels::gemv::Reduce::Subgroup)
    });
}

#[test]
fn gemv_workgroup_matches_reference() {
    check_all(gemv_cases_of(2, 1), |c| {
        check_gemv(c, kernels::gemv::Reduce::Workgroup)
    });
}

proptest! {
    #![proptest_config(proptest_config(24, 64))]

    #[test]
    fn gemv_random_shapes(
        k in 1u32..600,
        n in 1u32..5000,
        t in 1u32..3,
        wdtype in dtype_strategy(),
        bias: bool,
        glu: bool,
        shards in proptest::option::of(2u32..4),
        norm in proptest::option::of((0u8..2, dtype_strategy())),
        residual: bool,
        subgroup: bool,
        last_row: bool,
    ) {
        let norm = norm.map(|(offset, dtype)| (f32::from(offset), dtype));
        // The IR has no gated last-row matmul.
        let last_row = last_row && !glu;
        let case = MatMulCase {
            rows: if last_row { Rows::Fixed(1) } else { Rows::Tokens },
            t, k, n, wdtype, bias, tt: 1,
            shard_rows: shards.map(|s| (n * (1 + u32::from(glu))).div_ceil(s).next_multiple_of(4)),
            glu: glu.then_some(UnaryOp::Silu),
            norm, residual, last_row,
            act: None,
        };
        let reduce = if subgroup {
            kernels::gemv::Reduce::Subgroup
        } else {
            kernels::gemv::Reduce::Workgroup
        };
        check_gemv(&case, reduce).map_err(|e| TestCaseError::fail(format!("{case:?} {reduce:?}: {e}")))?;
    }
}

// ------------------------------------------------------------ matmul_cpu

/// `c` run through the CPU adapters' matmul with the rows of `x` per thread
/// the lowering gives it: one for a single token (a decode step), else a
/// prefill step's.
fn check_matmul_cpu(c: &MatMulCase) -> Result<(), String> {
    let most_rows = match c.rows {
        Rows::Tokens if c.t == 1 => 1,
        Rows::Tokens => kernels::matmul_cpu::TOKENS,
        Rows::Fixed(n) => n,
    };
    let tt = kernels::matmul_cpu::rows_per_thread(most_rows);
    check_matmul_kernel(c, &kernels::matmul_cpu::kernel(&matmul_spec(c), tt))
}

/// The gemv cases beyond the matmul ones (every option, load width, shard
/// edge and fixed-row read) and every third matmul case (each dtype, `K`
/// and `N` still among them: lavapipe takes a second or two to compile
/// each kernel), and over the step's tokens with every option at once
/// (gated, normed, biased, residual, sharded): `T` below, at and past a
/// thread's rows of `x`, 8 and 1 values a load, `N` short of a thread's
/// outputs and past a workgroup's.
#[test]
fn matmul_cpu_matches_reference() {
    let mut cases = gemv_cases_of(3, 0);
    for (t, k, n, wdtype) in [
        (5, 576, 300, DType::BF16),
        (8, 7, 37, DType::F32),
        (17, 576, 37, DType::F16),
        (17, 7, 300, DType::BF16),
    ] {
        cases.push(MatMulCase {
            rows: Rows::Tokens,
            t,
            k,
            n,
            wdtype,
            bias: true,
            tt: 1,
            shard_rows: Some((2 * n).div_ceil(3).next_multiple_of(4)),
            glu: Some(UnaryOp::Silu),
            norm: Some((1.0, wdtype)),
            residual: true,
            last_row: false,
            act: None,
        });
    }
    check_all(cases, check_matmul_cpu);
}

// ------------------------------------------------------------------ gemm

/// `c` run through the prefill GEMM template with `tile`.
fn check_gemm(c: &MatMulCase, tile: GemmTile) -> Result<(), String> {
    check_matmul_kernel(c, &kernels::gemm::kernel(&matmul_spec(c), tile))
}

/// The `i`th of the candidate tiles that suit a (gated, with `glu`) spec.
fn gemm_tile(i: usize, glu: bool) -> GemmTile {
    let tiles: Vec<GemmTile> = GemmTile::CANDIDATES
        .into_iter()
        .chain(GemmTile::SHORT)
        .filter(|t| t.supports(glu))
        .collect();
    tiles[i % tiles.len()]
}

/// Every 12th matmul case over `T` rows (the ones the lowering gives the
/// GEMM; lavapipe takes about half a second to compile each kernel), the
/// candidate tiles in turn; then, for every tile, shapes that cross its
/// edges: `T` past one row tile and below it, `N` past a column tile, a
/// partial last `K` tile, every chunk width (K a multiple of 8, of 4, odd),
/// gated epilogues with each activation, norm prologues, residuals, biases,
/// and weight shards whose boundaries fall inside a tile.
fn gemm_cases() -> Vec<(MatMulCase, GemmTile)> {
    let mut cases: Vec<(MatMulCase, GemmTile)> = matmul_cases()
        .into_iter()
        .filter(|c| c.rows == Rows::Tokens && !c.last_row)
        .step_by(12)
        .enumerate()
        .map(|(i, c)| (c, gemm_tile(i, c.glu.is_some())))
        .collect();
    let case = |t, k, n, wdtype| MatMulCase {
        t,
        ..MatMulCase::plain(k, n, wdtype)
    };
    for tile in GemmTile::CANDIDATES.into_iter().chain(GemmTile::SHORT) {
        let gated = |act| tile.supports(true).then_some(act);
        let out = |glu: Option<UnaryOp>| tile.out_cols(glu.is_some());
        let glu = gated(UnaryOp::Silu);
        cases.push((
            MatMulCase {
                bias: true,
                residual: true,
                ..case(tile.bm + 3, 2 * tile.bk + 4, tile.bn + 5, DType::F32)
            },
            tile,
        ));
        cases.push((
            MatMulCase {
                glu,
                norm: Some((1.0, DType::BF16)),
                ..case(1, 3 * tile.bk + 8, 2 * out(glu) + 3, DType::BF16)
            },
            tile,
        ));
        let glu = gated(UnaryOp::GeluTanh);
        let n = out(glu) - 1;
        cases.push((
            MatMulCase {
                glu,
                bias: true,
                norm: Some((0.0, DType::F32)),
                shard_rows: Some(n / 2 + 3),
                ..case(2 * tile.bm - 1, 37, n, DType::F16)
            },
            tile,
        ));
        let glu = gated(UnaryOp::Softcap(30.0));
        let n = out(glu) + 7;
        cases.push((
            MatMulCase {
                glu,
                residual: true,
                norm: Some((1.0, DType::F16)),
                shard_rows: Some(36),
                ..case(tile.bm + 1, 100, n, DType::BF16)
            },
            tile,
        ));
    }
    cases
}

#[test]
fn gemm_matches_reference() {
    check_all(gemm_cases(), |(c, tile)| check_gemm(c, *tile));
}

/// Split-K kernels (each block's `K` shared among workgroups, the last to
/// finish adding the partial sums): every tile, 2 to 5 splits (one walking
/// fewer tiles than the others, one with more splits than some rows'
/// blocks need), with every epilogue — gated, norm (whose sums of squares
/// are split too), residual, bias, shards, quantized weights — and `T`
/// short of, at and past a block; every other tile with partial sums for
/// one block only, so that its cases past a block run unsplit.
#[test]
fn gemm_split_matches_reference() {
    use gerbil_codegen_wgsl::kernels::gemm::GemmSplit;
    let case = |t, k, n, wdtype| MatMulCase {
        t,
        ..MatMulCase::plain(k, n, wdtype)
    };
    let cases: Vec<(MatMulCase, GemmTile, GemmSplit)> = GemmTile::CANDIDATES
        .into_iter()
        .chain(GemmTile::SHORT)
        .enumerate()
        .map(|(i, tile)| {
            let glu = tile.supports(true).then_some(UnaryOp::Silu);
            let splits = 2 + i as u32 % 4;
            let c = match i % 3 {
                0 => MatMulCase {
                    glu,
                    norm: Some((1.0, DType::BF16)),
                    residual: true,
                    ..case(
                        tile.bm + 3,
                        7 * tile.bk + 5,
                        tile.out_cols(glu.is_some()) + 9,
                        DType::BF16,
                    )
                },
                1 => MatMulCase {
                    bias: true,
                    norm: Some((0.0, DType::F32)),
                    shard_rows: Some(40),
                    ..case(tile.bm - 1, 6 * tile.bk, 70, DType::F16)
                },
                _ => MatMulCase {
                    glu,
                    residual: true,
                    ..case(
                        2 * tile.bm + 1,
                        288,
                        2 * tile.out_cols(glu.is_some()) + 1,
                        DType::Q4_0,
                    )
                },
            };
            let max_rows = if i % 2 == 0 { c.t + 40 } else { tile.bm };
            (c, tile, GemmSplit { splits, max_rows })
        })
        .collect();
    check_all(cases, |(c, tile, split)| {
        check_matmul_kernel(
            c,
            &kernels::gemm::kernel_split(&matmul_spec(c), *tile, *split),
        )
    });
}

proptest! {
    #![proptest_config(proptest_config(6, 64))]

    #[test]
    fn gemm_random_shapes(
        k in 1u32..200,
        n in 1u32..200,
        t in 1u32..140,
        wdtype in dtype_strategy(),
        bias: bool,
        glu in proptest::option::of(prop_oneof![Just(UnaryOp::Silu), Just(UnaryOp::GeluTanh)]),
        shards in proptest::option::of(2u32..4),
        norm in proptest::option::of((0u8..2, dtype_strategy())),
        residual: bool,
        tile in 0usize..GemmTile::CANDIDATES.len() + GemmTile::SHORT.len(),
    ) {
        let norm = norm.map(|(offset, dtype)| (f32::from(offset), dtype));
        let case = MatMulCase {
            rows: Rows::Tokens, t, k, n, wdtype, bias, tt: 1,
            shard_rows: shards.map(|s| (n * (1 + u32::from(glu.is_some()))).div_ceil(s)),
            glu, norm, residual, last_row: false,
            act: None,
        };
        let tile = gemm_tile(tile, glu.is_some());
        check_gemm(&case, tile).map_err(|e| TestCaseError::fail(format!("{case:?} {tile:?}: {e}")))?;
    }
}

// -------------------------------------------------------------- rms_norm

#[derive(Clone, Copy, Debug)]
struct RmsNormCase {
    rows: Rows,
    t: u32,
    /// Width of one normalized group.
    width: u32,
    /// Groups per row (per-head q/k norms).
    groups: u32,
    eps: f32,
    offset: f32,
    wdtype: DType,
}

fn check_rms_norm(c: &RmsNormCase) -> Result<(), String> {
    let src = kernels::rms_norm::kernel(kernels::rms_norm::RmsNormSpec {
        rows: c.rows,
        width: c.width,
        groups: c.groups,
        eps: c.eps,
        offset: c.offset,
        wdtype: c.wdtype,
    });
    // Each group of `width` is normalized on its own with the same weight.
    let (m, h) = (row_count(c.rows, c.t) * c.groups as usize, c.width as usize);
    let mut rng = rng(c);
    let x = rng.vec(m * h);
    let (w_bytes, w) = encode(&rng.vec(h), c.wdtype);
    let norm = RmsNorm {
        eps: c.eps,
        weight_offset: c.offset,
        groups: c.groups,
    };
    let want = reference::rms_norm(&widen(&x), &w, &norm);
    expect(
        &src,
        c.t,
        0,
        &[f32_bytes(&x), w_bytes, poison(m * h)],
        2,
        &want,
    )
}

fn rms_norm_cases() -> Vec<RmsNormCase> {
    let launches = [(Rows::Tokens, 1), (Rows::Tokens, 13), (Rows::Fixed(1), 4)];
    let mut cases = Vec::new();
    for (i, width) in [7, 64, 300].into_iter().enumerate() {
        for offset in [0.0, 1.0] {
            for (j, wdtype) in [DType::F32, DType::BF16, DType::F16]
                .into_iter()
                .enumerate()
            {
                let (rows, t) = launches[(i + j) % 3];
                cases.push(RmsNormCase {
                    rows,
                    t,
                    width,
                    groups: 1,
                    eps: 1e-6,
                    offset,
                    wdtype,
                });
            }
        }
    }
    // Per-head norms: several groups per row, odd group widths included.
    for (rows, t, width, groups, offset, wdtype) in [
        (Rows::Tokens, 13, 32, 4, 0.0, DType::F32),
        (Rows::Tokens, 5, 7, 3, 1.0, DType::BF16),
        (Rows::Fixed(1), 2, 300, 2, 1.0, DType::F16),
        (Rows::Tokens, 1, 256, 1, 1.0, DType::BF16),
    ] {
        cases.push(RmsNormCase {
            rows,
            t,
            width,
            groups,
            eps: 1e-6,
            offset,
            wdtype,
        });
    }
    // An epsilon large enough to matter.
    cases.push(RmsNormCase {
        rows: Rows::Tokens,
        t: 3,
        width: 64,
        groups: 1,
        eps: 0.5,
        offset: 0.0,
        wdtype: DType::BF16,
    });
    cases
}

#[test]
fn rms_norm_matches_reference() {
    check_all(rms_norm_cases(), check_rms_norm);
}

/// `rms_norm_add`: the norm of a row added to the residual stream's row
/// (Gemma 3's post-norms), on the one-group cases of the norm.
#[test]
fn rms_norm_add_matches_reference() {
    let cases = rms_norm_cases().into_iter().filter(|c| c.groups == 1);
    check_all(cases, |c| {
        let src = kernels::rms_norm::add_after_kernel(kernels::rms_norm::RmsNormSpec {
            rows: c.rows,
            width: c.width,
            groups: 1,
            eps: c.eps,
            offset: c.offset,
            wdtype: c.wdtype,
        });
        let (m, h) = (row_count(c.rows, c.t), c.width as usize);
        let mut rng = rng(c);
        let (x, r) = (rng.vec(m * h), rng.vec(m * h));
        let (w_bytes, w) = encode(&rng.vec(h), c.wdtype);
        let norm = RmsNorm {
            eps: c.eps,
            weight_offset: c.offset,
            groups: 1,
        };
        let normed = reference::rms_norm(&widen(&x), &w, &norm);
        let want = reference::binary(BinaryOp::Add, &widen(&r), &normed);
        let inputs = [f32_bytes(&x), w_bytes, f32_bytes(&r), poison(m * h)];
        expect(&src, c.t, 0, &inputs, 3, &want)
    });
}

// ------------------------------------------------------------- embedding

#[derive(Clone, Copy, Debug)]
struct EmbeddingCase {
    vocab: u32,
    width: u32,
    t: u32,
    wdtype: DType,
    scale: Option<f32>,
    shard_rows: Option<u32>,
    /// `embedding_rms_norm`: the norm's `(weight offset, weight dtype)`.
    norm: Option<(f32, DType)>,
}

fn check_embedding(c: &EmbeddingCase) -> Result<(), String> {
    let spec = kernels::embedding::EmbeddingSpec {
        shard_rows: c.shard_rows,
        vocab: c.vocab,
        width: c.width,
        wdtype: c.wdtype,
        scale: c.scale,
    };
    let src = match c.norm {
        None => kernels::embedding::kernel(spec),
        Some((offset, wdtype)) => kernels::embedding::kernel_with_norm(
            spec,
            kernels::embedding::NormSpec {
                eps: 1e-6,
                offset,
                wdtype,
            },
        ),
    };
    let (v, h, t) = (c.vocab as usize, c.width as usize, c.t as usize);
    let mut rng = rng(c);
    let (table_bytes, table) = encode(&rng.vec(v * h), c.wdtype);
    let mut ids: Vec<u32> = (0..t).map(|_| rng.below(c.vocab)).collect();
    // The last id is out of range when there are several: it reads row 0.
    if t > 1 {
        ids[t - 1] = c.vocab + 3;
    }
    let lookup = Embedding {
        scale: c.scale,
        padding: None,
    };
    let mut inputs = shard_bytes(table_bytes, v, c.shard_rows, c.wdtype);
    inputs.push(u32_bytes(&ids));
    let Some((offset, wdtype)) = c.norm else {
        let want = reference::embedding(&table, h, &ids, &lookup);
        inputs.push(poison(t * h));
        return expect(&src, c.t, 0, &inputs, inputs.len() - 1, &want);
    };
    let (w_bytes, w) = encode(&rng.vec(h), wdtype);
    let norm = RmsNorm {
        eps: 1e-6,
        weight_offset: offset,
        groups: 1,
    };
    let (want, normed) = reference::embedding_rms_norm(&table, &ids, &lookup, &w, &norm);
    inputs.push(w_bytes);
    inputs.push(poison(t * h));
    inputs.push(poison(t * h));
    let n = inputs.len();
    expect_all(&src, c.t, 0, &inputs, &[(n - 2, &want), (n - 1, &normed)])
}

fn embedding_cases() -> Vec<EmbeddingCase> {
    let shapes = [(50, 7, 5), (33, 64, 13), (10, 130, 1), (257, 300, 3)];
    let mut cases = Vec::new();
    for (i, wdtype) in [DType::F32, DType::BF16, DType::F16]
        .into_iter()
        .enumerate()
    {
        for (j, scale) in [None, Some(7.875)].into_iter().enumerate() {
            let (vocab, width, t) = shapes[(2 * i + j) % shapes.len()];
            cases.push(EmbeddingCase {
                vocab,
                width,
                t,
                wdtype,
                scale,
                shard_rows: None,
                norm: None,
            });
        }
    }
    // Tables split into row shards; ids land in every shard.
    for (wdtype, vocab, width, shard) in [
        (DType::BF16, 50, 7, 8),
        (DType::F32, 257, 64, 64),
        (DType::F16, 33, 130, 12),
    ] {
        cases.push(EmbeddingCase {
            vocab,
            width,
            t: 13,
            wdtype,
            scale: Some(2.5),
            shard_rows: Some(shard),
            norm: None,
        });
    }
    // The lookup fused with the first RMSNorm, plain, Gemma-style (scaled,
    // offset 1) and sharded.
    let fused: Vec<EmbeddingCase> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| EmbeddingCase {
            norm: Some((
                [0.0, 1.0][i % 2],
                [DType::F32, DType::BF16, DType::F16][i % 3],
            )),
            ..*c
        })
        .collect();
    cases.extend(fused);
    cases
}

#[test]
fn embedding_matches_reference() {
    check_all(embedding_cases(), check_embedding);
}

// ------------------------------------------------------------ quantized

/// A kernel of every weight-reading template for one quantized weight.
#[derive(Clone, Copy, Debug)]
enum QuantCase {
    Gemv(MatMulCase, kernels::gemv::Reduce),
    /// The GEMV with integer dot products ([`check_gemv_int8`]).
    GemvInt8(MatMulCase),
    /// The CPU adapters' matmul ([`check_matmul_cpu`]).
    Cpu(MatMulCase),
    Gemm(MatMulCase, GemmTile),
    /// The rows template (prefill's LM head: the last row), which reads
    /// packed pairs.
    Rows(MatMulCase),
    Embedding(EmbeddingCase),
}

/// Every ggml block type through every template that reads weights, at
/// `K` = 512 (two K-quant super-blocks, sixteen 32-value blocks), the
/// matmul options rotating over the types: gated, normed, biased, residual,
/// row shards whose edges fall inside a pair of blocks, both reductions.
fn quant_cases() -> Vec<QuantCase> {
    let mut cases = Vec::new();
    for (i, wdtype) in gerbil_ir::QUANTIZED.into_iter().enumerate() {
        let glu = (i % 2 == 1).then_some(UnaryOp::Silu);
        let base = MatMulCase {
            rows: Rows::Tokens,
            t: 1,
            k: 512,
            n: 37 + 8 * i as u32,
            wdtype,
            bias: i % 3 == 0,
            tt: 1,
            // Row shards: five of Q4_1, two of Q5_K (each shard repeats the
            // format's decoder in the GEMM; eight shards of Q5_K took
            // lavapipe 80 s to compile).
            shard_rows: match i {
                2 => Some(12),
                6 => Some(48),
                _ => None,
            },
            glu,
            norm: (i % 3 == 1).then_some(([0.0, 1.0][i % 2], DType::F32)),
            residual: i % 2 == 0,
            last_row: false,
            act: None,
        };
        let reduce = [
            kernels::gemv::Reduce::Workgroup,
            kernels::gemv::Reduce::Subgroup,
        ][i % 2];
        cases.push(QuantCase::Gemv(base, reduce));
        // t = 2: a second row of x, each row its own units; K = 64 gives
        // row groups narrower than lavapipe's subgroups, K = 9216 two stages
        // of staged units, K = 9248 two stages whose last is short.
        cases.push(QuantCase::GemvInt8(MatMulCase { t: 2, ..base }));
        cases.push(QuantCase::GemvInt8(MatMulCase { k: 9216, ..base }));
        if wdtype.block().0 == 32 {
            cases.push(QuantCase::GemvInt8(MatMulCase {
                t: 2,
                k: 64,
                ..base
            }));
            if i % 2 == 0 {
                cases.push(QuantCase::GemvInt8(MatMulCase { k: 9248, ..base }));
            }
        }
        // t = 11: a thread's rows of `x` and part of the next.
        cases.push(QuantCase::Cpu(MatMulCase { t: 11, ..base }));
        cases.push(QuantCase::Gemm(
            MatMulCase { t: 70, ..base },
            gemm_tile(i, glu.is_some()),
        ));
        cases.push(QuantCase::Rows(MatMulCase {
            rows: Rows::Fixed(1),
            t: 5,
            glu: None,
            last_row: true,
            ..base
        }));
        cases.push(QuantCase::Embedding(EmbeddingCase {
            vocab: 41,
            width: 256,
            t: 6,
            wdtype,
            scale: (i % 2 == 0).then_some(2.5),
            shard_rows: (i % 3 == 0).then_some(9),
            norm: (i % 2 == 1).then_some((1.0, DType::F32)),
        }));
    }
    cases
}

#[test]
fn quantized_weights_match_reference() {
    check_all(quant_cases(), |c| match c {
        QuantCase::Gemv(m, reduce) => check_gemv(m, *reduce),
        QuantCase::GemvInt8(m) => check_gemv_int8(m),
        QuantCase::Cpu(m) => check_matmul_cpu(m),
        QuantCase::Gemm(m, tile) => check_gemm(m, *tile),
        QuantCase::Rows(m) => check_matmul(m),
        QuantCase::Embedding(e) => check_embedding(e),
    });
}

// ------------------------------------------------------------------ rope

/// A real RoPE table (θ = 10000, `rotary_dim` wide) of `rows` positions, as
/// the compiler materializes it.
fn theta_table(rotary_dim: u32, rows: usize) -> Vec<f32> {
    let inv_freq: Vec<f32> = (0..rotary_dim / 2)
        .map(|i| 10000f64.powf(-2.0 * f64::from(i) / f64::from(rotary_dim)) as f32)
        .collect();
    to_f32(&rope_table(&inv_freq, 1.0, rows as u64))
}

#[derive(Clone, Copy, Debug)]
struct RopeCase {
    heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    t: u32,
    p: u32,
}

fn check_rope(c: &RopeCase) -> Result<(), String> {
    let src = kernels::rope::kernel(kernels::rope::RopeSpec {
        heads: c.heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
    });
    let (nh, hd) = (c.heads as usize, c.head_dim as usize);
    let (t, p) = (c.t as usize, c.p as usize);
    let table = theta_table(c.rotary_dim, p + t + 1);
    let x = rng(c).vec(t * nh * hd);
    let spec = Rope {
        n_heads: c.heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
    };
    let want = reference::rope(&widen(&x), &widen(&table), &spec, p);
    let inputs = [f32_bytes(&x), f32_bytes(&table), poison(x.len())];
    expect(&src, c.t, c.p, &inputs, 2, &want)
}

#[test]
fn rope_matches_reference() {
    let case = |heads, head_dim, rotary_dim, t, p| RopeCase {
        heads,
        head_dim,
        rotary_dim,
        t,
        p,
    };
    check_all(
        [
            case(2, 16, 16, 3, 5),
            case(3, 32, 32, 13, 40),
            case(2, 40, 40, 4, 7),
            case(4, 6, 6, 13, 0),
            case(2, 32, 24, 5, 9),
            case(1, 40, 16, 1, 100),
            case(8, 64, 64, 13, 3),
        ],
        check_rope,
    );
}

// ------------------------------------------------------------- attention

#[derive(Clone, Copy, Debug)]
struct AttentionCase {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    window: u32,
    scale: f32,
    t: u32,
    p: u32,
    /// How the KV cache is stored (F16 in an f16 variant).
    kv: DType,
    /// The `cpu` variant's kernel (`attention_cpu`) instead of the tiled one.
    cpu: bool,
    /// The tiled kernel's workgroup memory (the `tensor-f16` variant's tiles
    /// are larger).
    max_bytes: u32,
    /// Causal (decoders); the bidirectional form is [`check_packed_attention`]'s.
    causal: bool,
}

fn check_attention(c: &AttentionCase) -> Result<(), String> {
    let spec = kernels::attention::AttentionSpec {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: c.scale,
        window: c.window,
        kv: c.kv,
        causal: c.causal,
        packed: false,
    };
    let src = if c.cpu {
        kernels::attention_cpu::kernel_at(spec, kernels::Positions::Step)
    } else {
        kernels::attention::kernel(spec, c.max_bytes)
    };
    let (nh, nkv, hd) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let (t, p) = (c.t as usize, c.p as usize);
    let mut rng = rng(c);
    let q = rng.vec(t * nh * hd);
    // The cache holds rows [0, P + T); two more rows of NaN past the end
    // catch a kernel that reads keys after its position.
    let filled = (p + t) * nkv * hd;
    let spare = 2 * nkv * hd;
    let mut kc = rng.vec(filled);
    let mut vc = rng.vec(filled);
    kc.extend(std::iter::repeat_n(f32::NAN, spare));
    vc.extend(std::iter::repeat_n(f32::NAN, spare));
    let spec = Attention {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: c.scale,
        window: (c.window > 0).then_some(c.window),
        causal: c.causal,
    };
    let (kc_bytes, kc) = encode(&kc, c.kv);
    let (vc_bytes, vc) = encode(&vc, c.kv);
    let want = reference::attention(&widen(&q), &kc, &vc, &spec, p);
    let inputs = [f32_bytes(&q), kc_bytes, vc_bytes, poison(q.len())];
    expect(&src, c.t, c.p, &inputs, 3, &want)
}

#[test]
fn attention_matches_reference() {
    let case = |heads, kv_heads, head_dim, window, scale, t, p| AttentionCase {
        heads,
        kv_heads,
        head_dim,
        window,
        scale,
        t,
        p,
        kv: DType::F32,
        cpu: false,
        max_bytes: kernels::attention::MAX_WORKGROUP_BYTES,
        causal: true,
    };
    let f16 = |c: AttentionCase| AttentionCase {
        kv: DType::F16,
        ..c
    };
    // The tiles of the device's whole workgroup memory, up to tensor-f16's
    // 48 KiB (lavapipe: 32 KiB, so Gemma 3's head width gets 4 rows × 8-key
    // tiles; the H200: the 4 × 16 of tensor-f16).
    let wide = |c: AttentionCase| AttentionCase {
        max_bytes: gerbil_e2e::kernel_harness::max_workgroup_bytes().min(48 << 10),
        ..c
    };
    let cases = [
        // An f16 KV cache (the f16 variants): decode, prefill, windowed.
        f16(case(4, 2, 16, 0, 0.3, 1, 70)),
        f16(case(6, 3, 256, 0, 0.05, 13, 130)),
        f16(case(4, 2, 16, 100, 0.3, 13, 120)),
        // Decode against 71 cached keys: two key chunks.
        case(4, 2, 16, 0, 0.3, 1, 70),
        case(4, 2, 16, 4, 0.3, 13, 70),
        case(4, 2, 16, 0, 1.0, 13, 0),
        case(4, 1, 24, 0, 0.5, 13, 60),
        case(4, 1, 24, 4, 0.5, 5, 0),
        // head_dim > 64: each thread owns two output dims.
        case(3, 3, 100, 0, 0.12, 7, 80),
        case(3, 3, 100, 4, 0.12, 1, 0),
        // head_dim 256: four dims per thread, three key chunks.
        case(6, 3, 256, 0, 0.05, 13, 130),
        case(6, 3, 256, 4, 0.05, 3, 9),
        // A window wider than a chunk, starting mid-chunk.
        case(4, 2, 16, 100, 0.3, 13, 120),
        // Large scores: the online softmax must rescale without overflow
        // (at head width 64: a head-256 kernel takes lavapipe seconds).
        case(6, 3, 64, 0, 5.0, 2, 70),
        // Flash tiles: blocks of query rows (T not a multiple of the
        // block) over key tiles, after an earlier chunk's cache (P > 0),
        // for GQA ratios 1, 3, 4 and 8 (two head groups per KV head).
        case(4, 4, 64, 0, 0.125, 37, 0),
        case(9, 3, 64, 0, 0.125, 45, 50),
        case(8, 2, 64, 0, 0.125, 29, 75),
        case(16, 2, 64, 0, 0.125, 19, 33),
        // Windows smaller than a key tile, larger than one, larger than
        // the context; over several row blocks.
        case(8, 2, 64, 5, 0.125, 29, 75),
        case(9, 3, 64, 40, 0.125, 45, 50),
        case(4, 1, 256, 7, 0.0625, 10, 20),
        case(4, 1, 256, 512, 0.0625, 21, 40),
        // A GQA ratio of 5 (one head per group) and a head width that is
        // not a multiple of 4.
        case(5, 1, 30, 0, 0.2, 17, 11),
        case(5, 1, 30, 9, 0.2, 17, 11),
        f16(case(9, 3, 64, 0, 0.125, 45, 50)),
        f16(case(4, 1, 256, 7, 0.0625, 10, 20)),
        // Larger tiles (where the default's split a key's dot product):
        // rows over several blocks and a window inside a tile at head width
        // 256 (each such kernel takes lavapipe seconds to compile), none at
        // a head width that is not a multiple of 4.
        wide(f16(case(4, 1, 256, 7, 0.0625, 37, 20))),
        wide(case(3, 3, 100, 0, 0.12, 29, 75)),
    ];
    // The `cpu` variant's kernel on the cases, and decode steps deep in
    // the context (SmolLM2's shape; Gemma 3's sliding and global layers).
    let deep = [
        case(9, 3, 64, 0, 0.125, 1, 2999),
        case(4, 1, 256, 0, 0.0625, 2, 4107),
        // A head-256 case above at head width 64: a window wider than the
        // context; and Gemma 3's sliding layers deep in the context, at
        // that width too (the same kernel).
        case(4, 1, 64, 512, 0.0625, 21, 40),
        case(4, 1, 64, 512, 0.0625, 1, 4107),
    ];
    // Every other case of the tiled kernel's (each is a kernel lavapipe
    // compiles), and of head width 256 (Gemma 3) only the global layer's
    // deep step: each such kernel takes lavapipe seconds to compile.
    let cpu = cases
        .iter()
        .filter(|c| c.max_bytes == kernels::attention::MAX_WORKGROUP_BYTES && c.head_dim < 256)
        .step_by(2)
        .chain(&deep)
        .map(|&c| AttentionCase { cpu: true, ..c });
    check_all(cases.into_iter().chain(cpu), check_attention);
}

/// Bidirectional attention over a packed encoder step: sequences of
/// `lengths` laid end to end (position 0, the segment table of
/// `kernels::Segments`), each row seeing every key of its own sequence.
fn check_packed_attention(
    (heads, kv_heads, head_dim, scale): (u32, u32, u32, f32),
    lengths: &[usize],
    kv: DType,
    cpu: bool,
    (causal, window): (bool, Option<u32>),
) -> Result<(), String> {
    let spec = kernels::attention::AttentionSpec {
        heads,
        kv_heads,
        head_dim,
        scale,
        window: window.unwrap_or(0),
        kv,
        causal,
        packed: true,
    };
    let src = if cpu {
        kernels::attention_cpu::kernel_at(spec, kernels::Positions::Packed)
    } else {
        kernels::attention::kernel(spec, kernels::attention::MAX_WORKGROUP_BYTES)
    };
    let (nh, nkv, hd) = (heads as usize, kv_heads as usize, head_dim as usize);
    let t: usize = lengths.iter().sum();
    let mut rng = Rng::from_label(&format!("packed {heads} {head_dim} {lengths:?}"));
    let q = rng.vec(t * nh * hd);
    let (kc, vc) = (rng.vec(t * nkv * hd), rng.vec(t * nkv * hd));
    let (kc_bytes, kc) = encode(&kc, kv);
    let (vc_bytes, vc) = encode(&vc, kv);
    let a = Attention {
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim,
        scale,
        window,
        causal,
    };
    // Each sequence alone is a step of its own, at position 0.
    let (q64, qw, kw) = (widen(&q), nh * hd, nkv * hd);
    let (mut want, mut table, mut first) = (Vec::new(), Vec::new(), 0);
    for &len in lengths {
        let rows = |v: &[f64], w: usize| v[first * w..(first + len) * w].to_vec();
        let (q, k, v) = (rows(&q64, qw), rows(&kc, kw), rows(&vc, kw));
        want.extend(reference::attention(&q, &k, &v, &a, 0));
        table.extend((0..len).flat_map(|_| [first as u32, len as u32]));
        first += len;
    }
    table.extend(std::iter::repeat_n(0u32, 2 * lengths.len()));
    let inputs = [
        f32_bytes(&q),
        kc_bytes,
        vc_bytes,
        poison(q.len()),
        u32_bytes(&table),
    ];
    expect(&src, t as u32, 0, &inputs, 3, &want)
}

/// Packed steps of whole sequences: bidirectional (BERT), bidirectional
/// within a window on both sides (EmbeddingGemma's local layers), and
/// causal within each sequence (decoder-based embedders), windowed or not.
#[test]
fn packed_attention_matches_reference() {
    let minilm = (12, 12, 32, 0.176_776_69);
    let gqa = (4, 2, 16, 0.3);
    let odd = (5, 1, 30, 0.2);
    let bidirectional = (false, None);
    let mut failures = Vec::new();
    for cpu in [false, true] {
        for (shape, lengths, kv, mask) in [
            // One sequence over several row blocks; sequences that end
            // inside a row block and a key tile; a one-token sequence.
            (minilm, vec![37], DType::F32, bidirectional),
            (gqa, vec![5, 1, 13, 20], DType::F32, bidirectional),
            (gqa, vec![1], DType::F32, bidirectional),
            (odd, vec![17, 3], DType::F16, bidirectional),
            (gqa, vec![5, 1, 13, 20], DType::F32, (false, Some(4))),
            (minilm, vec![37, 2], DType::F32, (false, Some(9))),
            (gqa, vec![5, 1, 13, 20], DType::F32, (true, None)),
            (odd, vec![17, 3], DType::F16, (true, None)),
            (gqa, vec![9, 30], DType::F32, (true, Some(6))),
        ] {
            if let Err(e) = check_packed_attention(shape, &lengths, kv, cpu, mask) {
                failures.push(format!("{shape:?} {lengths:?} {mask:?} cpu={cpu}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ------------------------------------------------------ decode attention

/// SmolLM2's attention shape (9 heads, 3 KV heads of 64).
const SMOLLM2_ATTENTION: kernels::attention::AttentionSpec = kernels::attention::AttentionSpec {
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
    scale: 0.125,
    window: 0,
    kv: DType::F32,
    causal: true,
    packed: false,
};

#[derive(Clone, Copy, Debug)]
struct DecodeAttentionCase {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    window: u32,
    scale: f32,
    max_context: u32,
    /// Position of the step's one token: `p + 1` keys before the window.
    p: u32,
    /// How the KV cache is stored (F16 in an f16 variant).
    kv: DType,
}

/// Runs the split-K decode kernel twice on the same scratch, with two
/// different queries, and checks both outputs: the second run starts from
/// the counters the first one left (the harness also checks they are zero).
fn check_decode_attention(c: &DecodeAttentionCase) -> Result<(), String> {
    use gerbil_e2e::kernel_harness::{run_steps_outputs, Step};
    let spec = kernels::attention::AttentionSpec {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: c.scale,
        window: c.window,
        kv: c.kv,
        causal: true,
        packed: false,
    };
    let src = kernels::attention_decode::kernel(spec, c.max_context);
    let (nh, nkv, hd, p) = (
        c.heads as usize,
        c.kv_heads as usize,
        c.head_dim as usize,
        c.p as usize,
    );
    let mut rng = rng(c);
    // Rows [0, P] hold keys; two more rows of NaN catch a read past P.
    let filled = (p + 1) * nkv * hd;
    let spare = 2 * nkv * hd;
    let mut kc = rng.vec(filled);
    let mut vc = rng.vec(filled);
    kc.extend(std::iter::repeat_n(f32::NAN, spare));
    vc.extend(std::iter::repeat_n(f32::NAN, spare));
    let queries = [rng.vec(nh * hd), rng.vec(nh * hd)];
    let (kc_bytes, kc) = encode(&kc, c.kv);
    let (vc_bytes, vc) = encode(&vc, c.kv);
    let a = Attention {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: c.scale,
        window: (c.window > 0).then_some(c.window),
        causal: true,
    };
    let steps: Vec<Step> = queries
        .iter()
        .map(|q| Step {
            t: 1,
            p: c.p,
            inputs: vec![
                f32_bytes(q),
                kc_bytes.clone(),
                vc_bytes.clone(),
                poison(q.len()),
            ],
        })
        .collect();
    let got = run_steps_outputs(&src, &steps, &[3])?;
    for (n, (q, got)) in queries.iter().zip(got).enumerate() {
        let want = reference::attention(&widen(q), &kc, &vc, &a, p);
        check_close(&format!("{} run {}", src.name, n + 1), &got[0], &want, TOL)?;
    }
    Ok(())
}

#[test]
fn decode_attention_matches_reference() {
    use kernels::attention_decode::MIN_KEYS;
    let case = |heads, kv_heads, head_dim, window, max_context, p| DecodeAttentionCase {
        heads,
        kv_heads,
        head_dim,
        window,
        scale: 1.0 / (head_dim as f32).sqrt(),
        max_context,
        p,
        kv: DType::F32,
    };
    // SmolLM2's shape at a 4096-token context: 43 splits.
    let splits = kernels::attention_decode::splits(&SMOLLM2_ATTENTION, 4096);
    assert_eq!(splits, 43);
    let full = MIN_KEYS * splits;
    let mut cases = vec![
        // One key, two keys, a few: one split.
        case(9, 3, 64, 0, 4096, 0),
        case(9, 3, 64, 0, 4096, 1),
        case(9, 3, 64, 0, 4096, 5),
        // One full split, then a second one.
        case(9, 3, 64, 0, 4096, MIN_KEYS - 1),
        case(9, 3, 64, 0, 4096, MIN_KEYS),
        // Every split exactly full, then one key more (the last split empty).
        case(9, 3, 64, 0, 4096, full - 1),
        case(9, 3, 64, 0, 4096, full),
        // Long context, and the longest.
        case(9, 3, 64, 0, 4096, 2999),
        case(9, 3, 64, 0, 4096, 4095),
        // GQA groups of 1, 4 and 8; head_dim 128, 256 and one not a multiple of 64.
        case(4, 4, 64, 0, 4096, 700),
        case(8, 2, 128, 0, 4096, 2999),
        case(8, 1, 256, 0, 4096, 2999),
        case(8, 1, 100, 0, 4096, 333),
        // 16 splits of 256 keys (the most one split holds) at the longest context.
        case(32, 8, 64, 0, 4096, 4095),
        // Sliding windows: smaller than the position, larger, larger than the context.
        case(4, 1, 256, 100, 4096, 2999),
        case(4, 1, 256, 512, 4096, 300),
        case(9, 3, 64, 5000, 4096, 3000),
        // A small context: few splits.
        case(4, 2, 16, 0, 64, 63),
        // Llama-3.2-1B at bench.sh's context: one split, a few, all of them.
        case(32, 8, 64, 0, 4608, 16),
        case(32, 8, 64, 0, 4608, 511),
        case(32, 8, 64, 0, 4608, 4107),
        // Gemma 3 270M: sliding layers (window 512) and the global one.
        case(4, 1, 256, 512, 4608, 16),
        case(4, 1, 256, 512, 4608, 4107),
        case(4, 1, 256, 0, 4608, 4107),
        // Very large groups: 128- and 64-thread workgroups.
        case(16, 1, 64, 0, 4096, 1234),
        case(32, 1, 64, 0, 2048, 2047),
        // A group of 12 with head_dim 96: 128 threads, 3 dimensions per score
        // lane, 96 live value lanes of 128.
        case(12, 1, 96, 0, 1024, 900),
    ];
    // Large scores: the combine must rescale without overflow.
    cases.push(DecodeAttentionCase {
        scale: 5.0,
        ..case(6, 3, 256, 0, 4096, 1500)
    });
    // An f16 KV cache (the f16 variants): one split, many, a window.
    for c in [
        case(9, 3, 64, 0, 4096, 5),
        case(9, 3, 64, 0, 4096, 2999),
        case(8, 1, 100, 0, 4096, 333),
        case(4, 1, 256, 512, 4608, 4107),
    ] {
        cases.push(DecodeAttentionCase {
            kv: DType::F16,
            ..c
        });
    }
    check_all(cases, check_decode_attention);
}

// --------------------------------------- decode attention with its RoPE

#[derive(Clone, Copy, Debug)]
struct RopeAttentionCase {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    window: u32,
    max_context: u32,
    /// Position of the step's one token.
    p: u32,
    /// `(weight offset, weight dtype)` of the per-head norms.
    norm: Option<(f32, DType)>,
    kv: DType,
}

/// The fused kernel against `qkv_rope` then attention in the reference: its
/// output, and both caches (the step's row written, every other row kept).
fn check_rope_attention(c: &RopeAttentionCase) -> Result<(), String> {
    let spec = kernels::attention::AttentionSpec {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        window: c.window,
        kv: c.kv,
        causal: true,
        packed: false,
    };
    let rope = kernels::qkv_rope::QkvRopeSpec {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        norm: c.norm.map(|(off, dt)| (1e-6, off, dt)),
        kv: c.kv,
    };
    let src = kernels::attention_decode::kernel_with_rope(spec, rope, c.max_context);
    let (nh, nkv, hd) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let (qw, kw, p) = (nh * hd, nkv * hd, c.p as usize);
    let rows = p + 2;
    let table = theta_table(c.rotary_dim, rows);
    let mut rng = rng(c);
    let x = rng.vec(qw + 2 * kw);
    // Every cache row random: a read past the step's key would change the
    // output, a write past its row the caches.
    let (kc_bytes, kc) = encode(&rng.vec(rows * kw), c.kv);
    let (vc_bytes, vc) = encode(&rng.vec(rows * kw), c.kv);
    let norm_dtype = c.norm.map_or(DType::F32, |n| n.1);
    let (qn_bytes, qn) = encode(&rng.vec(hd), norm_dtype);
    let (kn_bytes, kn) = encode(&rng.vec(hd), norm_dtype);
    let r = QkvRope {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        qk_norm: c.norm.map(|(offset, _)| QkNorm {
            eps: 1e-6,
            weight_offset: offset,
        }),
    };
    let norms = c.norm.map(|_| (qn.as_slice(), kn.as_slice()));
    let out = reference::qkv_rope(&widen(&x), &widen(&table), &kc, &vc, &r, norms, p);
    // The caches hold what the kernel stores: the new row rounded as `kv`.
    let stored = |v: &[f64]| encode(&v.iter().map(|&v| v as f32).collect::<Vec<_>>(), c.kv).1;
    let (want_k, want_v) = (stored(&out.k_cache), stored(&out.v_cache));
    let a = Attention {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        scale: spec.scale,
        window: (c.window > 0).then_some(c.window),
        causal: true,
    };
    let want_y = reference::attention(&out.q, &want_k, &want_v, &a, p);
    let mut inputs = vec![f32_bytes(&x), f32_bytes(&table), kc_bytes, vc_bytes];
    if c.norm.is_some() {
        inputs.extend([qn_bytes, kn_bytes]);
    }
    let y = inputs.len();
    inputs.push(poison(qw));
    let got = run_outputs(&src, 1, c.p, &inputs, &[y, 2, 3])?;
    check_close(&format!("{} y", src.name), &got[0], &want_y, TOL)?;
    check_close(&format!("{} k cache", src.name), &got[1], &want_k, TOL)?;
    check_close(&format!("{} v cache", src.name), &got[2], &want_v, TOL)
}

/// The decode attention that rotates its own queries and stores the step's
/// key and value: one split, several, the step's key in the last split and
/// (every split full) in the one before it, windows, partial rotation, GQA
/// groups, per-head norms (Gemma 3's and Qwen 3's), f16 caches.
#[test]
fn decode_attention_with_rope_matches_reference() {
    use kernels::attention_decode::MIN_KEYS;
    let case = |heads, kv_heads, head_dim, rotary_dim, window, p| RopeAttentionCase {
        heads,
        kv_heads,
        head_dim,
        rotary_dim,
        window,
        max_context: 4096,
        p,
        norm: None,
        kv: DType::F32,
    };
    let normed = |norm, c: RopeAttentionCase| RopeAttentionCase {
        norm: Some(norm),
        ..c
    };
    let splits = kernels::attention_decode::splits(&SMOLLM2_ATTENTION, 4096);
    let full = MIN_KEYS * splits;
    let gemma = (1.0, DType::BF16);
    let qwen = (0.0, DType::F32);
    let mut cases = vec![
        case(9, 3, 64, 64, 0, 0),
        case(9, 3, 64, 64, 0, 5),
        case(9, 3, 64, 64, 0, MIN_KEYS),
        case(9, 3, 64, 64, 0, full),
        case(9, 3, 64, 64, 0, 700),
        case(32, 8, 64, 64, 0, 511),
        case(4, 1, 256, 256, 512, 1000),
        case(8, 1, 100, 64, 0, 333),
        case(2, 1, 96, 32, 0, 40),
        // Heads wider than the workgroup: queries rotated as they load.
        case(4, 1, 512, 512, 0, 70),
        case(4, 1, 256, 256, 100, 150),
        normed(gemma, case(4, 1, 256, 256, 512, 1000)),
        normed(gemma, case(4, 1, 256, 256, 0, 600)),
        normed(qwen, case(16, 8, 128, 128, 0, 77)),
        normed(qwen, case(6, 2, 7, 4, 0, 9)),
        // A large group normalized: segments of 8 lanes per head (the
        // largest, 63 heads of a lane each, costs lavapipe 30 s to compile).
        normed(qwen, case(15, 1, 64, 64, 0, 40)),
    ];
    for c in [
        case(9, 3, 64, 64, 0, 700),
        case(8, 1, 100, 64, 0, 90),
        normed(gemma, case(4, 1, 256, 256, 512, 20)),
    ] {
        cases.push(RopeAttentionCase {
            kv: DType::F16,
            ..c
        });
    }
    check_all(cases, check_rope_attention);
}

// ----------------------------------------------------------- elementwise

#[derive(Clone, Copy, Debug)]
struct UnaryCase {
    op: UnaryOp,
    rows: Rows,
    t: u32,
    width: u32,
}

fn check_unary(c: &UnaryCase) -> Result<(), String> {
    let src = kernels::elementwise::unary(c.op, c.rows, c.width);
    let len = row_count(c.rows, c.t) * c.width as usize;
    let mut x = rng(c).vec(len);
    // Large magnitudes must saturate, not overflow to inf or NaN.
    let large = [50.0, -50.0, 100.0, -100.0, 1e4, -1e4, 0.0, 20.0, -20.0];
    for (slot, v) in x.iter_mut().step_by(7).zip(large) {
        *slot = v;
    }
    let want = reference::unary(c.op, &widen(&x));
    expect(&src, c.t, 0, &[f32_bytes(&x), poison(len)], 1, &want)
}

#[test]
fn unary_matches_reference() {
    let ops = [
        UnaryOp::Silu,
        UnaryOp::GeluTanh,
        UnaryOp::Softcap(30.0),
        UnaryOp::Softcap(15.0),
        UnaryOp::Scale(-0.375),
    ];
    let launches = [
        (Rows::Tokens, 3, 300),
        (Rows::Fixed(2), 5, 7),
        (Rows::Tokens, 13, 64),
    ];
    let cases = ops
        .into_iter()
        .flat_map(|op| launches.map(|(rows, t, width)| UnaryCase { op, rows, t, width }));
    check_all(cases, check_unary);
}

#[derive(Clone, Copy, Debug)]
struct BinaryCase {
    op: BinaryOp,
    rows: Rows,
    t: u32,
    width: u32,
}

fn check_binary(c: &BinaryCase) -> Result<(), String> {
    let src = kernels::elementwise::binary(c.op, c.rows, c.width);
    let len = row_count(c.rows, c.t) * c.width as usize;
    let mut rng = rng(c);
    let (a, b) = (rng.vec(len), rng.vec(len));
    let want = reference::binary(c.op, &widen(&a), &widen(&b));
    expect(
        &src,
        c.t,
        0,
        &[f32_bytes(&a), f32_bytes(&b), poison(len)],
        2,
        &want,
    )
}

#[derive(Clone, Copy, Debug)]
struct AddBiasCase {
    rows: Rows,
    t: u32,
    width: u32,
    dtype: DType,
}

fn check_add_bias(c: &AddBiasCase) -> Result<(), String> {
    let src = kernels::elementwise::add_bias(c.rows, c.width, c.dtype);
    let (m, n) = (row_count(c.rows, c.t), c.width as usize);
    let mut rng = rng(c);
    let x = rng.vec(m * n);
    let (b_bytes, b) = encode(&rng.vec(n), c.dtype);
    let want = reference::add_bias(&widen(&x), &b);
    expect(
        &src,
        c.t,
        0,
        &[f32_bytes(&x), b_bytes, poison(m * n)],
        2,
        &want,
    )
}

#[test]
fn add_bias_matches_reference() {
    let case = |rows, t, width, dtype| AddBiasCase {
        rows,
        t,
        width,
        dtype,
    };
    check_all(
        [
            case(Rows::Tokens, 13, 100, DType::F32),
            case(Rows::Fixed(1), 1, 7, DType::BF16),
            case(Rows::Tokens, 3, 129, DType::F16),
        ],
        check_add_bias,
    );
}

#[test]
fn binary_matches_reference() {
    let launches = [
        (Rows::Tokens, 13, 100),
        (Rows::Fixed(1), 4, 7),
        (Rows::Tokens, 1, 300),
    ];
    let cases = [BinaryOp::Add, BinaryOp::Mul]
        .into_iter()
        .flat_map(|op| launches.map(|(rows, t, width)| BinaryCase { op, rows, t, width }));
    check_all(cases, check_binary);
}

#[derive(Clone, Copy, Debug)]
struct CacheWriteCase {
    width: u32,
    t: u32,
    p: u32,
    /// How the cache is stored (F16 in an f16 variant).
    kv: DType,
}

fn check_cache_write(c: &CacheWriteCase) -> Result<(), String> {
    let src = kernels::elementwise::cache_write(c.width, c.kv);
    let (w, t, p) = (c.width as usize, c.t as usize, c.p as usize);
    let mut rng = rng(c);
    // Rows before P and two rows after P + T hold values that must survive;
    // the step's rows start as NaN.
    let mut cache = rng.vec((p + t + 2) * w);
    cache[p * w..(p + t) * w].fill(f32::NAN);
    let x = rng.vec(t * w);
    let (cache_bytes, cache) = encode(&cache, c.kv);
    let want = reference::cache_write(&cache, &widen(&x), w, p);
    let got = run_output(&src, c.t, c.p, &[cache_bytes, f32_bytes(&x)], 0)?;
    check_close(&src.name, &got, &want, kv_tol(c.kv))
}

/// Tolerance for values stored in a KV cache of `kv`: f16 keeps 11
/// significant bits, so a stored value is within 2⁻¹¹ of the f32 one.
fn kv_tol(kv: DType) -> f64 {
    match kv {
        DType::F16 => 1e-3,
        _ => TOL,
    }
}

#[test]
fn cache_write_matches_reference() {
    let case = |width, t, p| CacheWriteCase {
        width,
        t,
        p,
        kv: DType::F32,
    };
    let f16 = |width, t, p| CacheWriteCase {
        kv: DType::F16,
        ..case(width, t, p)
    };
    check_all(
        [
            case(32, 1, 0),
            case(7, 13, 5),
            case(300, 3, 60),
            case(64, 1, 17),
            // An f16 cache: odd widths leave a row's last half-word shared.
            f16(32, 1, 0),
            f16(7, 13, 5),
            f16(63, 1, 17),
        ],
        check_cache_write,
    );
}

#[derive(Clone, Copy, Debug)]
struct SliceCase {
    width: u32,
    t: u32,
}

fn check_slice_last_row(c: &SliceCase) -> Result<(), String> {
    let src = kernels::elementwise::slice_last_row(c.width);
    let (w, t) = (c.width as usize, c.t as usize);
    let x = rng(c).vec(t * w);
    let want = reference::slice_last_row(&widen(&x), w);
    expect(&src, c.t, 0, &[f32_bytes(&x), poison(w)], 1, &want)
}

#[test]
fn slice_last_row_matches_reference() {
    let case = |width, t| SliceCase { width, t };
    check_all(
        [case(7, 1), case(64, 5), case(300, 13)],
        check_slice_last_row,
    );
}

// ---------------------------------------------------------- add_rms_norm

#[derive(Clone, Copy, Debug)]
struct AddRmsNormCase {
    rows: Rows,
    t: u32,
    width: u32,
    offset: f32,
    wdtype: DType,
    /// The `add_rms_norm_last_row` variant: only row `t - 1`, one output row.
    last_row: bool,
}

fn check_add_rms_norm(c: &AddRmsNormCase) -> Result<(), String> {
    let build = if c.last_row {
        kernels::rms_norm::add_kernel_last_row
    } else {
        kernels::rms_norm::add_kernel
    };
    let src = build(kernels::rms_norm::RmsNormSpec {
        rows: if c.last_row { Rows::Fixed(1) } else { c.rows },
        width: c.width,
        groups: 1,
        eps: 1e-6,
        offset: c.offset,
        wdtype: c.wdtype,
    });
    let (m, h) = (row_count(c.rows, c.t), c.width as usize);
    let mut rng = rng(c);
    let (a, b) = (rng.vec(m * h), rng.vec(m * h));
    let (w_bytes, w) = encode(&rng.vec(h), c.wdtype);
    let norm = RmsNorm {
        eps: 1e-6,
        weight_offset: c.offset,
        groups: 1,
    };
    let (a64, b64) = (widen(&a), widen(&b));
    let (sum, normed) = if c.last_row {
        reference::add_rms_norm_last_row(&a64, &b64, &w, &norm)
    } else {
        reference::add_rms_norm(&a64, &b64, &w, &norm)
    };
    let out_rows = sum.len() / h;
    let inputs = [
        f32_bytes(&a),
        f32_bytes(&b),
        w_bytes,
        poison(out_rows * h),
        poison(out_rows * h),
    ];
    expect_all(&src, c.t, 0, &inputs, &[(3, &sum), (4, &normed)])
}

#[test]
fn add_rms_norm_matches_reference() {
    let case = |rows, t, width, offset, wdtype| AddRmsNormCase {
        rows,
        t,
        width,
        offset,
        wdtype,
        last_row: false,
    };
    let last = |t, width, offset, wdtype| AddRmsNormCase {
        last_row: true,
        ..case(Rows::Tokens, t, width, offset, wdtype)
    };
    check_all(
        [
            case(Rows::Tokens, 1, 576, 0.0, DType::BF16),
            case(Rows::Tokens, 13, 7, 1.0, DType::F32),
            case(Rows::Tokens, 5, 300, 1.0, DType::F16),
            case(Rows::Fixed(3), 1, 640, 1.0, DType::BF16),
            case(Rows::Tokens, 2, 257, 0.0, DType::F32),
            last(1, 576, 0.0, DType::BF16),
            last(13, 7, 1.0, DType::F32),
            last(5, 300, 0.0, DType::F16),
        ],
        check_add_rms_norm,
    );
}

// -------------------------------------------------------------- qkv_rope

#[derive(Clone, Copy, Debug)]
struct QkvRopeCase {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    /// `(weight offset, weight dtype)` of the per-head norms.
    norm: Option<(f32, DType)>,
    t: u32,
    p: u32,
    /// How the KV caches are stored (F16 in an f16 variant).
    kv: DType,
}

fn check_qkv_rope(c: &QkvRopeCase) -> Result<(), String> {
    let src = kernels::qkv_rope::kernel(kernels::qkv_rope::QkvRopeSpec {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        norm: c.norm.map(|(off, dt)| (1e-6, off, dt)),
        kv: c.kv,
    });
    let (nh, nkv, hd) = (c.heads as usize, c.kv_heads as usize, c.head_dim as usize);
    let (t, p) = (c.t as usize, c.p as usize);
    let lmax = p + t + 2;
    let (qw, kw) = (nh * hd, nkv * hd);
    let table = theta_table(c.rotary_dim, lmax);
    let mut rng = rng(c);
    let x = rng.vec(t * (qw + 2 * kw));
    let (qn_bytes, qn) = encode(&rng.vec(hd), c.norm.map_or(DType::F32, |n| n.1));
    let (kn_bytes, kn) = encode(&rng.vec(hd), c.norm.map_or(DType::F32, |n| n.1));
    // Caches start with recognizable contents; rows outside P..P+T must keep them.
    let (kc0_bytes, kc0) = encode(&rng.vec(lmax * kw), c.kv);
    let (vc0_bytes, vc0) = encode(&rng.vec(lmax * kw), c.kv);
    let spec = QkvRope {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        qk_norm: c.norm.map(|(offset, _)| QkNorm {
            eps: 1e-6,
            weight_offset: offset,
        }),
    };
    let want = reference::qkv_rope(
        &widen(&x),
        &widen(&table),
        &kc0,
        &vc0,
        &spec,
        c.norm.map(|_| (qn.as_slice(), kn.as_slice())),
        p,
    );
    let mut inputs = vec![f32_bytes(&x), f32_bytes(&table), kc0_bytes, vc0_bytes];
    if c.norm.is_some() {
        inputs.extend([qn_bytes, kn_bytes]);
    }
    inputs.push(poison(t * qw));
    let q_out = inputs.len() - 1;
    let got = run_outputs(&src, c.t, c.p, &inputs, &[q_out, 2, 3])?;
    check_close(&format!("{} q", src.name), &got[0], &want.q, TOL)?;
    check_close(
        &format!("{} k cache", src.name),
        &got[1],
        &want.k_cache,
        kv_tol(c.kv),
    )?;
    check_close(
        &format!("{} v cache", src.name),
        &got[2],
        &want.v_cache,
        kv_tol(c.kv),
    )
}

#[test]
fn qkv_rope_matches_reference() {
    let case = |heads, kv_heads, head_dim, rotary_dim, norm, t, p| QkvRopeCase {
        heads,
        kv_heads,
        head_dim,
        rotary_dim,
        norm,
        t,
        p,
        kv: DType::F32,
    };
    let f16 = |c: QkvRopeCase| QkvRopeCase {
        kv: DType::F16,
        ..c
    };
    check_all(
        [
            // SmolLM2: 9 heads, 3 KV heads of 64, decode at P = 5.
            case(9, 3, 64, 64, None, 1, 5),
            // Gemma 3 270M: 4 heads, 1 KV head of 256, (1 + w) norms.
            case(4, 1, 256, 256, Some((1.0, DType::BF16)), 3, 2),
            // Qwen 3-like norms, odd head width, partial rotation, prefill.
            case(3, 3, 10, 6, Some((0.0, DType::F32)), 13, 0),
            case(6, 2, 7, 4, Some((0.0, DType::F16)), 4, 9),
            // Heads wider than the workgroup and not a multiple of it.
            case(2, 1, 96, 32, None, 2, 1),
            // f16 caches (the f16 variants); an odd head width.
            f16(case(9, 3, 64, 64, None, 1, 5)),
            f16(case(4, 1, 256, 256, Some((1.0, DType::BF16)), 3, 2)),
            f16(case(6, 2, 7, 4, Some((0.0, DType::F16)), 4, 9)),
        ],
        check_qkv_rope,
    );
}

// ------------------------------------------------------------ slice_cols

#[test]
fn slice_cols_matches_reference() {
    let check = |&(rows, t, width, start, len): &(Rows, u32, u32, u32, u32)| {
        let src = kernels::elementwise::slice_cols(rows, width, start, len);
        let m = row_count(rows, t);
        let x = rng(&(rows, t, width, start, len)).vec(m * width as usize);
        let (w, a, n) = (width as usize, start as usize, len as usize);
        let want = reference::slice_cols(&widen(&x), w, a, n);
        expect(
            &src,
            t,
            0,
            &[f32_bytes(&x), poison(m * len as usize)],
            1,
            &want,
        )
    };
    check_all(
        [
            (Rows::Tokens, 13, 128, 0, 64),
            (Rows::Tokens, 3, 128, 64, 32),
            (Rows::Fixed(1), 1, 352, 176, 176),
            (Rows::Tokens, 5, 7, 2, 5),
            (Rows::Tokens, 1, 9, 8, 1),
        ],
        check,
    );
}

// ---------------------------------------------------------- sample_token

/// Logits of a `sample_token` case: random, or with the maximum tied at
/// several columns, or with NaNs sprinkled in (which must never win), or
/// peaked like a trained model's (a few dozen columns far above the rest, so
/// a nucleus or a min-p cut holds few tokens).
#[derive(Clone, Copy, Debug)]
enum Logits {
    Random,
    Ties,
    Nans,
    Peaked,
}

/// `sample_token` chooses exactly what `gerbil_runtime::Sampler` chooses
/// from the same logits at the same position: greedy (ties, NaN) and seeded
/// sampling with every filter, in the GPU's shape and (every case but two
/// in three of random logits) the `cpu` variant's.
#[test]
fn sample_token_matches_the_cpu_sampler() {
    type Case = (Rows, u32, u32, Logits, SamplingParams, Shape);
    let check = |&(rows, t, vocab, kind, params, shape): &Case| {
        let src = kernels::sample_token::kernel(rows, vocab, shape);
        let m = row_count(rows, t);
        let mut r = rng(&(rows, t, vocab, kind, params));
        // Logits spread over several units, like a model's.
        let mut x: Vec<f32> = r.vec(m * vocab as usize).iter().map(|v| v * 6.0).collect();
        let last = &mut x[(m - 1) * vocab as usize..];
        match kind {
            Logits::Random => {}
            Logits::Ties => {
                for _ in 0..3 {
                    last[r.below(vocab) as usize] = 7.0;
                }
            }
            Logits::Nans => {
                for _ in 0..vocab / 3 + 1 {
                    last[r.below(vocab) as usize] = f32::NAN;
                }
            }
            Logits::Peaked => {
                for _ in 0..r.below(40) + 2 {
                    last[r.below(vocab) as usize] = 14.0 + 4.0 * r.unit();
                }
            }
        }
        let last = &x[(m - 1) * vocab as usize..];
        if params.is_greedy() {
            assert_eq!(
                reference::argmax(&widen(last)),
                gerbil_runtime::argmax(last),
                "the CPU sampler and the reference agree"
            );
        }
        let p = 5;
        let want = Sampler::new(params)
            .map_err(|e| e.to_string())?
            .sample(last, p + t - 1);
        let words = u32_bytes(&params.to_words());
        let out = gerbil_e2e::kernel_harness::run(
            &src,
            t,
            p,
            &[f32_bytes(&x), words, u32_bytes(&[u32::MAX])],
        );
        let got = u32::from_le_bytes([out[1][0], out[1][1], out[1][2], out[1][3]]);
        (got == want)
            .then_some(())
            .ok_or_else(|| format!("chose {got}, the CPU sampler {want}"))
    };
    let greedy = SamplingParams::default();
    let sample = |temperature, top_k, top_p, min_p, seed| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
        ..SamplingParams::default()
    };
    let mut cases: Vec<(Rows, u32, u32, Logits, SamplingParams)> = vec![
        (Rows::Fixed(1), 1, 1, Logits::Random, greedy),
        (Rows::Fixed(1), 1, 262_144, Logits::Random, greedy),
        (Rows::Fixed(1), 1, 262_144, Logits::Ties, greedy),
        (Rows::Fixed(1), 1, 1023, Logits::Nans, greedy),
        (Rows::Tokens, 7, 300, Logits::Random, greedy),
        (Rows::Tokens, 3, 300, Logits::Ties, greedy),
        (
            Rows::Fixed(1),
            1,
            1,
            Logits::Random,
            sample(1.0, 0, 1.0, 0.0, 3),
        ),
        (
            Rows::Fixed(1),
            1,
            1023,
            Logits::Nans,
            sample(0.7, 0, 0.9, 0.0, 4),
        ),
        (
            Rows::Fixed(1),
            1,
            262_144,
            Logits::Random,
            sample(0.8, 40, 0.95, 0.05, 11),
        ),
        (
            Rows::Tokens,
            4,
            300,
            Logits::Ties,
            sample(1.0, 5, 1.0, 0.0, 1),
        ),
        (
            Rows::Tokens,
            2,
            300,
            Logits::Random,
            sample(1.3, 0, 1.0, 0.1, u64::MAX),
        ),
    ];
    // The kernel's slices: vocabularies of one to 128 workgroups (Gemma 3's
    // size too), multiples of a slice or not (49,153: a last slice of one
    // token, fewer than its candidates); the
    // common filters, which resolve from the slices' candidates, and ones
    // that need the whole row (a large top-k, a wide nucleus or min-p cut,
    // no filter); ties at the top-k threshold across slices. Each
    // vocabulary is a kernel of its own (seconds of lavapipe's compiler), so
    // the cases after these reuse their vocabularies.
    for (vocab, seed) in [(1023, 1), (1025, 2), (49_153, 4), (262_144, 6)] {
        cases.push((
            Rows::Fixed(1),
            1,
            vocab,
            Logits::Random,
            sample(0.8, 40, 0.95, 0.0, seed),
        ));
        cases.push((
            Rows::Fixed(1),
            1,
            vocab,
            Logits::Peaked,
            sample(0.7, 0, 0.9, 0.0, seed),
        ));
        cases.push((Rows::Fixed(1), 1, vocab, Logits::Random, greedy));
    }
    for (kind, params) in [
        (Logits::Random, sample(1.0, 3000, 1.0, 0.0, 8)),
        (Logits::Random, sample(1.0, 3000, 0.5, 0.0, 9)),
        (Logits::Random, sample(0.8, 0, 0.95, 0.0, 10)),
        (Logits::Random, sample(0.8, 0, 1.0, 0.1, 11)),
        (Logits::Random, sample(0.8, 0, 1.0, 0.0, 12)),
        (Logits::Peaked, sample(1.0, 0, 1.0, 0.05, 13)),
        (Logits::Peaked, sample(1.0, 0, 0.5, 0.0, 14)),
        (Logits::Peaked, sample(0.6, 100, 0.9, 0.01, 15)),
        (Logits::Ties, sample(1.0, 2, 1.0, 0.0, 16)),
        (Logits::Ties, sample(1.0, 1000, 0.3, 0.0, 17)),
        (Logits::Nans, sample(1.0, 30, 0.9, 0.0, 18)),
        (Logits::Nans, sample(0.5, 0, 1.0, 0.3, 19)),
    ] {
        cases.push((Rows::Fixed(1), 1, 49_153, kind, params));
    }
    // Each filter alone and together, over several seeds.
    for seed in 0..6u64 {
        for (k, top_p, min_p) in [
            (0, 1.0, 0.0),
            (20, 1.0, 0.0),
            (0, 0.6, 0.0),
            (0, 1.0, 0.2),
            (50, 0.9, 0.02),
        ] {
            cases.push((
                Rows::Fixed(1),
                1,
                1025,
                Logits::Random,
                sample(0.9, k, top_p, min_p, seed),
            ));
        }
    }
    let gpu = cases
        .iter()
        .map(|&(r, t, v, k, p)| (r, t, v, k, p, Shape::GPU));
    // The CPU's shape: every case of ties, NaN or a peaked row, and every
    // third of random logits.
    let cpu = cases
        .iter()
        .enumerate()
        .filter(|(i, c)| !matches!(c.3, Logits::Random) || i % 3 == 2)
        .map(|(_, &(r, t, v, k, p))| (r, t, v, k, p, Shape::CPU));
    check_all(gpu.chain(cpu).collect::<Vec<Case>>(), check);
}

// ---------------------------------------------------------- argmax_rows

/// `argmax_rows` gives every row of a batch step the CPU's greedy token —
/// the largest value, the lowest column among equals — and a row holding a
/// NaN or an infinity `NOT_FINITE`; rows past `T` are left alone. Random
/// rows, ties across the threads' strides, a vocabulary smaller than a
/// workgroup, and the GPU's and the `cpu` variant's workgroups.
#[test]
fn argmax_rows_matches_the_cpu_argmax() {
    use gerbil_codegen_wgsl::kernels::argmax_rows::{kernel, NOT_FINITE};
    for (vocab, t, cpu) in [
        (100, 3, false),
        (49_152, 5, false),
        (1_000, 4, true),
        (7, 2, true),
    ] {
        let mut r = rng(&(vocab, t, cpu));
        let rows = t + 1;
        let mut x: Vec<f32> = r
            .vec((rows * vocab) as usize)
            .iter()
            .map(|v| v * 6.0)
            .collect();
        let row = |i: u32| (i * vocab) as usize..((i + 1) * vocab) as usize;
        // Row 1: the maximum tied at three columns; row 2: a NaN; row 3
        // (where there is one): an infinity among finite values.
        let tied = row(1);
        for _ in 0..3 {
            let c = tied.start + r.below(vocab) as usize;
            x[c] = 7.0;
        }
        if t > 2 {
            let nan = row(2);
            x[nan.start + r.below(vocab) as usize] = f32::NAN;
        }
        if t > 3 {
            let inf = row(3);
            x[inf.start + r.below(vocab) as usize] = f32::NEG_INFINITY;
        }
        let src = kernel(vocab, cpu);
        let out = gerbil_e2e::kernel_harness::run(
            &src,
            t,
            0,
            &[f32_bytes(&x), u32_bytes(&vec![12_345; rows as usize])],
        );
        let got: Vec<u32> = out[1]
            .chunks(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for i in 0..rows {
            let values = &x[row(i)];
            let want = if i >= t {
                12_345
            } else if values.iter().any(|v| !v.is_finite()) {
                NOT_FINITE
            } else {
                gerbil_runtime::argmax(values)
            };
            assert_eq!(
                got[i as usize], want,
                "vocab {vocab}, row {i} of {t}, cpu {cpu}"
            );
        }
    }
}

// ------------------------------------------------------------- gemm_coop

/// The exact result of the tensor-core GEMM for case `c`: the weights
/// rounded to f16 as the kernel stages them, `x` (or `x · (gamma + offset)`,
/// the f32 product) as it is — the kernel stages it as two f16 parts whose
/// sum keeps 22 of its bits; the norm's sum of squares from the f32 `x`;
/// the sums in f64.
fn coop_reference(
    c: &MatMulCase,
    x: &[f32],
    w: &[f64],
    b: &[f32],
    g: &[f64],
    res: &[f32],
) -> Vec<f64> {
    let (m, k, n) = (c.t as usize, c.k as usize, c.n as usize);
    let f16 = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
    let wh: Vec<f64> = w.iter().map(|&v| f16(v as f32)).collect();
    let mut out = Vec::with_capacity(m * n);
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let xh: Vec<f64> = match c.norm {
            Some((offset, _)) => (0..k)
                .map(|i| f64::from(row[i] * (g[i] as f32 + offset)))
                .collect(),
            None => row.iter().map(|&v| f64::from(v)).collect(),
        };
        let inv = c.norm.map_or(1.0, |_| {
            let ssq: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            1.0 / (ssq / k as f64 + f64::from(MATMUL_NORM_EPS)).sqrt()
        });
        let dot = |wr: usize| -> f64 {
            let bias = if c.bias { f64::from(b[wr]) } else { 0.0 };
            xh.iter()
                .zip(&wh[wr * k..(wr + 1) * k])
                .map(|(a, w)| a * w)
                .sum::<f64>()
                * inv
                + bias
        };
        for col in 0..n {
            let v = match (c.glu, c.act) {
                (Some(act), _) => reference::unary_scalar(act, dot(col)) * dot(n + col),
                (None, Some(act)) => reference::unary_scalar(act, dot(col)),
                (None, None) => dot(col),
            };
            let add = if c.residual {
                f64::from(res[r * n + col])
            } else {
                0.0
            };
            out.push(v + add);
        }
    }
    out
}

/// Runs `src`, the tensor-core GEMM of case `c`, and checks it against
/// [`coop_reference`].
fn check_coop(c: &MatMulCase, src: &KernelSource, tol: f64) -> Result<(), String> {
    let MatMulInputs {
        inputs,
        x,
        w,
        b,
        g,
        res,
    } = matmul_inputs(c);
    let want = coop_reference(c, &x, &w, &b, &g, &res);
    let got = run_output(src, c.t, 0, &inputs, inputs.len() - 1)?;
    check_close(&src.name, &got, &want, tol)
}

/// Every third matmul case over `T` rows (each kernel builds two ~0.5 s
/// cooperative-matrix pipelines, checked and unchecked), plus shapes that
/// cross the coop tiles: `T` past one 64-row block, partial last blocks of
/// rows and columns, K not a multiple of 32 or 16, the gated, norm,
/// residual and sharded forms at those shapes, and quantized weights.
fn coop_cases() -> Vec<MatMulCase> {
    let mut cases: Vec<MatMulCase> = matmul_cases()
        .into_iter()
        .filter(|c| c.rows == Rows::Tokens && !c.last_row)
        .step_by(3)
        .collect();
    let case = |t, k, n, wdtype| MatMulCase {
        t,
        tt: 8,
        ..MatMulCase::plain(k, n, wdtype)
    };
    cases.extend([
        case(70, 64, 100, DType::BF16),
        case(130, 96, 8200, DType::BF16),
        case(65, 40, 2050, DType::F16),
        MatMulCase {
            glu: Some(UnaryOp::Silu),
            norm: Some((0.0, DType::BF16)),
            ..case(129, 576, 4100, DType::BF16)
        },
        MatMulCase {
            glu: Some(UnaryOp::GeluTanh),
            norm: Some((1.0, DType::F32)),
            bias: true,
            ..case(67, 130, 70, DType::F16)
        },
        MatMulCase {
            residual: true,
            bias: true,
            ..case(100, 1000, 576, DType::BF16)
        },
        MatMulCase {
            shard_rows: Some(1024),
            glu: Some(UnaryOp::Silu),
            ..case(66, 64, 2500, DType::BF16)
        },
        MatMulCase {
            shard_rows: Some(3000),
            glu: Some(UnaryOp::GeluTanh),
            bias: true,
            residual: true,
            ..case(200, 64, 4100, DType::F32)
        },
        // Quantized weights, dequantized while the tile is staged.
        MatMulCase {
            glu: Some(UnaryOp::Silu),
            norm: Some((1.0, DType::F32)),
            ..case(70, 256, 100, DType::Q4_0)
        },
        MatMulCase {
            residual: true,
            bias: true,
            ..case(65, 256, 130, DType::Q4K)
        },
        MatMulCase {
            shard_rows: Some(64),
            ..case(129, 512, 200, DType::Q6K)
        },
        case(66, 256, 70, DType::Q8_0),
    ]);
    cases
}

/// Tolerance of the tensor-core GEMM on a GPU, against the exact reference
/// (`x` unrounded): staged in two parts, `x` keeps 21–22 bits (H200: the
/// error 1.3e-6 of the outputs' RMS at K = 2048, where rounding `x` to f16
/// once gave 2.1e-4 and failed this test). Not [`TOL`]: the tensor cores
/// truncate their sums (about 1.7e-6 of the RMS toward zero at K = 2048),
/// and the norm cases' outputs near zero among sums of ~16 came 1.45e-4
/// from the reference on the H200.
const COOP_GPU_TOL: f64 = 5e-4;

#[test]
#[ignore = "needs a GPU with cooperative matrices (16x16x16 f16 -> f32), which lavapipe lacks: run with --ignored there"]
fn gemm_coop_matches_reference() {
    assert!(
        gerbil_e2e::kernel_harness::has_cooperative_matrix(),
        "this device has no cooperative matrices (16x16x16 f16 -> f32): run this test on a GPU with tensor cores"
    );
    let cases = coop_cases().into_iter().enumerate().flat_map(|(i, c)| {
        let b = batch_case(&c, i);
        [
            (c, coop_gemm(&c, 3 * i)),
            (c, coop_gemm(&c, 3 * i + 1)),
            (b, coop_batch_gemm(&b, i)),
        ]
    });
    check_all(cases, |(c, g)| {
        check_coop(
            c,
            &kernels::gemm_coop::kernel(matmul_spec(c), *g),
            COOP_GPU_TOL,
        )
    });
}

/// The `i`-th of the tensor-core configurations to check case `c` with:
/// every tile in turn, K split 1, 2 or 3 ways where that divides the K
/// tiles, the partial sums sized for a few more rows than `c` has.
fn coop_gemm(c: &MatMulCase, i: usize) -> CoopGemm {
    let tiles = CoopTile::CANDIDATES;
    coop_split(c, tiles[i % tiles.len()], i / tiles.len())
}

/// `gemv_batch` in every layout it takes — one group of threads or
/// several sharing the workgroup's `x` (2 and 4 groups of 16 to 64
/// threads, and 4 groups of 4, which lavapipe's wider subgroups hold
/// several of: the shuffle reduction), 1 to 4 outputs a group,
/// 4 and 16 rows a workgroup — against the reference, with every option
/// (gated, normed, biased, residual, sharded, quantized) and `T` short of,
/// at and past a workgroup's rows.
#[test]
fn gemv_batch_matches_reference() {
    use gerbil_codegen_wgsl::kernels::gemv_batch::{kernel_with, Layout};
    let base = MatMulCase::plain;
    let cases = [
        // (case, rows per workgroup, outputs a group, groups, threads)
        (
            MatMulCase {
                t: 5,
                ..base(256, 37, DType::F32)
            },
            16,
            1,
            1,
            64,
        ),
        (
            MatMulCase {
                t: 16,
                residual: true,
                ..base(512, 130, DType::BF16)
            },
            16,
            2,
            2,
            64,
        ),
        (
            MatMulCase {
                t: 7,
                glu: Some(UnaryOp::Silu),
                norm: Some((1.0, DType::F32)),
                ..base(384, 70, DType::F16)
            },
            4,
            2,
            4,
            128,
        ),
        (
            MatMulCase {
                t: 17,
                bias: true,
                shard_rows: Some(64),
                ..base(576, 150, DType::BF16)
            },
            16,
            4,
            2,
            128,
        ),
        (
            MatMulCase {
                t: 9,
                residual: true,
                ..base(512, 100, DType::Q4_0)
            },
            16,
            2,
            4,
            256,
        ),
        (
            MatMulCase {
                t: 6,
                norm: Some((0.0, DType::F32)),
                ..base(128, 45, DType::F32)
            },
            16,
            2,
            4,
            16,
        ),
        (
            MatMulCase {
                t: 3,
                glu: Some(UnaryOp::Gelu),
                norm: Some((0.0, DType::BF16)),
                ..base(256, 40, DType::Q8_0)
            },
            4,
            1,
            2,
            64,
        ),
    ];
    let mut failures = Vec::new();
    for (c, br, r, groups, threads) in cases {
        let layout = Layout {
            br,
            r,
            groups,
            threads,
        };
        let src = kernel_with(&matmul_spec(&c), layout);
        if let Err(e) = check_matmul_kernel(&c, &src) {
            failures.push(format!("{layout:?} {c:?}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Case `c` as a batch step, or a short prompt's (which runs the batch
/// step's matmuls): 1 to `SHORT_PROMPT` rows (by `i`), past one 16-row
/// block every third case.
fn batch_case(c: &MatMulCase, i: usize) -> MatMulCase {
    let rows = if i % 3 == 2 {
        gerbil_codegen_wgsl::SHORT_PROMPT
    } else {
        16
    };
    MatMulCase {
        t: 1 + (i as u32 * 5) % rows,
        ..*c
    }
}

/// The `i`-th of the batch-step tensor-core configurations: every
/// [`CoopTile::BATCH`] tile in turn, K split 1, 2 or 3 ways.
fn coop_batch_gemm(c: &MatMulCase, i: usize) -> CoopGemm {
    let tiles = CoopTile::BATCH;
    coop_split(c, tiles[i % tiles.len()], i / tiles.len())
}

/// Case `c` on `tile`, K split 1, 2 or 3 ways (by `i`) where that divides
/// the K tiles, the partial sums sized for a few more rows than `c` has.
fn coop_split(c: &MatMulCase, tile: CoopTile, i: usize) -> CoopGemm {
    let splits = [1, 2, 3][i % 3];
    let kt = c.k.div_ceil(tile.bk);
    CoopGemm {
        tile,
        splits: if kt.is_multiple_of(splits) { splits } else { 1 },
        max_rows: c.t + 17 * (i % 3) as u32,
    }
}

/// The tensor-core GEMM with emulated cooperative matrices
/// ([`gerbil_e2e::coop_emulation::emulate_coop`]) on every device, lavapipe included: all of the
/// kernel but the matrix operations themselves, checked against the same
/// reference. Every other case of [`coop_cases`] (each emulated kernel
/// takes lavapipe seconds to compile), each with 64 × 64 blocks (split in K
/// where its K tiles allow) or, in turn, one of the 16-row batch tiles;
/// leaving those whose emulated products would take it
/// long, and the larger blocks, to [`gemm_coop_matches_reference`]:
/// lavapipe gave NaN in the first emulation (accumulators passed as array
/// values) of blocks with 8 or more accumulators per subgroup from about 10
/// K tiles on (as it did for 64 × 64 blocks from the 15th K tile: K = 448
/// passed, 480 was off by about one tile, 512 gave wrong sums or NaN — a
/// lavapipe miscompile of the emulation, not the kernel's; since the kernel
/// multiplies `x` in two parts, twice the multiply-adds a tile, K = 300 gives
/// NaN with or without the second part's values, so the cases with
/// `K > 256` are not emulated here), while every block shape and every
/// K (up to 8192) passes for real on the H100 (docs/performance.md).
#[test]
fn gemm_coop_emulated_matches_reference() {
    check_emulated(|c| c.k <= 256);
}

/// Runs the emulated kernel on the emulation cases that `keep` selects.
fn check_emulated(keep: impl Fn(&MatMulCase) -> bool) {
    let case = |t, k, n| MatMulCase {
        t,
        tt: 8,
        ..MatMulCase::plain(k, n, DType::BF16)
    };
    // Quantized weights reach the tile through the `pair_` loaders, which
    // `quantized_weights_match_reference` checks on lavapipe; their
    // tensor-core cases run for real on the H100.
    let mut cases: Vec<MatMulCase> = coop_cases()
        .into_iter()
        .filter(|c| !c.wdtype.is_quantized())
        .step_by(2)
        .collect();
    cases.extend([
        MatMulCase {
            bias: true,
            ..case(3, 32, 300)
        },
        MatMulCase {
            glu: Some(UnaryOp::Silu),
            norm: Some((1.0, DType::BF16)),
            residual: true,
            ..case(70, 16, 130)
        },
    ]);
    // Each case with one of the tiles, in turn (every case with both took
    // lavapipe's compiler twice as long, a minute). Emulated multiply-adds:
    // blocks × K tiles × BM · BN · 32 (every subgroup computes a tile, those
    // without one a duplicate).
    // Only the 64-row blocks and the 16-row batch blocks: lavapipe computes
    // NaN in the emulation of the 128-row ones (8 or 16 emulated
    // accumulators per subgroup), which pass for real on the H100
    // (`gemm_coop_matches_reference`).
    let tiled = cases.into_iter().enumerate().map(|(i, c)| {
        if i % 2 == 1 {
            (c, coop_split(&c, CoopTile::new(2, 2, 2, 2, 32), i))
        } else {
            let b = batch_case(&c, i);
            (b, coop_batch_gemm(&b, i))
        }
    });
    let cost = |(c, g): &(MatMulCase, CoopGemm)| {
        let src = kernels::gemm_coop::kernel(matmul_spec(c), *g);
        let (bm, bn) = (g.tile.bm(), g.tile.bn());
        let blocks = u64::from(c.t).div_ceil(bm.into())
            * u64::from(src.workgroups[1].constant * src.workgroups[2].constant);
        blocks * u64::from(c.k.div_ceil(32)) * u64::from(bm * bn) * 32
    };
    check_all(
        tiled.filter(|cg| cost(cg) <= 1 << 24 && keep(&cg.0)),
        |(c, g)| {
            check_coop(
                c,
                &gerbil_e2e::coop_emulation::emulate_coop(&kernels::gemm_coop::kernel(
                    matmul_spec(c),
                    *g,
                )),
                TOL,
            )
        },
    );
}

/// Every tensor-core kernel the desktop target emits for the tiny models
/// validates with the cooperative-matrix capability and is written to
/// SPIR-V by naga without a panic (`validate_with` does both): what CI, whose
/// lavapipe cannot run these kernels, can know of them.
#[test]
fn tiny_models_coop_kernels_write_spirv() {
    let dir = gerbil_e2e::data_dir().join("models/tiny");
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tiny models dir") {
        let repo = entry.expect("entry").path();
        let plan_path = gerbil_e2e::compile_plan(&repo, |o| {
            o.target = gerbil_codegen_wgsl::Target::desktop();
        });
        let plan = gerbil_plan::PlanFile::open(&plan_path).expect("open plan");
        let coop: Vec<_> = plan
            .header
            .kernels
            .iter()
            .filter(|k| k.name.starts_with("gemm_coop"))
            .collect();
        if coop.is_empty() {
            failures.push(format!("{}: no gemm_coop kernel", repo.display()));
        }
        let features = [
            gerbil_plan::Feature::ShaderF16,
            gerbil_plan::Feature::Subgroups,
            gerbil_plan::Feature::CooperativeMatrix,
        ];
        failures.extend(coop.iter().filter_map(|k| {
            gerbil_codegen_wgsl::validate_with(&k.name, &k.wgsl, &features)
                .err()
                .map(|e| e.to_string())
        }));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
