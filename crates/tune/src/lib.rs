//! `gerbilc tune`: times the prefill GEMM tiles of one model on this
//! machine's GPU and keeps the fastest per shape.
//!
//! [`tune`] compiles the model once as it would be compiled without tuning
//! data, then once per candidate tile ([`GemmTile::CANDIDATES`] that fit the
//! target's workgroup memory) with that tile forced on every GEMM shape it
//! can serve. In each plan it times, alone on the GPU, every distinct GEMM
//! kernel of the prefill schedule of the plan's last variant (`portable`,
//! whose tiled GEMM every variant without tensor cores shares) at the plan's
//! full prefill chunk (found by the [`KernelOp`] the plan records for each
//! kernel: its shape and template), and adds up, per shape, the time of
//! every dispatch of that shape in one step. The fastest per shape goes into the [`Tuning`],
//! with the untuned time beside it; the untuned tile competes with its own
//! time, so a tuning never picks a tile that measured slower than it. The surprise: nothing is
//! timed inside a real step — a kernel alone on synthetic operands
//! ([`gerbil_runtime::kernel_timer`]) ranks tiles the same way and takes
//! milliseconds, so a 1B model tunes in seconds.

use anyhow::{bail, Context, Result};
use gerbil_codegen_wgsl::kernels::gemm::GemmTile;
use gerbil_codegen_wgsl::tuning::{gemm_shapes, tile_for, GemmShape, GemmTiles};
use gerbil_compiler::{compile, Checkpoint, CompileOptions, TunedGemm, Tuning, TUNING_FORMAT};
use gerbil_plan::{KernelOp, MatMulTemplate, Requirements};
use gerbil_runtime::kernel_timer::time_kernel;
use gerbil_runtime::Gpu;
use std::collections::HashMap;

/// What [`gemm_micros`] measured in one plan.
struct Timed {
    /// The step's rows (`T`) the kernels ran at: the plan's prefill chunk.
    rows: u32,
    /// The plan's GEMM shapes, in graph order.
    shapes: Vec<GemmShape>,
    /// GPU time of one step's GEMMs per shape, µs.
    micros: HashMap<GemmShape, f64>,
}

/// Times the prefill GEMMs of the plan `opts` compiles to; with `tile`,
/// only those whose kernel uses it.
async fn gemm_micros(
    gpu: &Gpu,
    ckpt: &Checkpoint,
    opts: &CompileOptions,
    tile: Option<GemmTile>,
) -> Result<Timed> {
    let compiled = compile(ckpt, opts, &mut ())?;
    let header = &compiled.plan.header;
    let graph = &compiled.graph;
    let rows = u32::try_from(header.model.max_tokens_per_step)
        .context("the prefill chunk does not fit in u32")?;
    let variant = header.variants.last().context("the plan has no variant")?;
    let shapes = gemm_shapes(graph);
    let mut kernel_micros: HashMap<u32, f64> = HashMap::new();
    let mut totals: HashMap<GemmShape, f64> = HashMap::new();
    for d in &variant.prefill {
        let kernel = &header.kernels[d.kernel as usize];
        let KernelOp::MatMul {
            k,
            n,
            glu,
            wdtype,
            template: MatMulTemplate::Gemm { tile: used },
        } = &kernel.op
        else {
            continue;
        };
        if tile.is_some_and(|t| t.tag() != *used) {
            continue;
        }
        let Some(&shape) = shapes
            .iter()
            .find(|s| s.k == *k && s.n == *n && s.glu == *glu && s.wdtype.to_string() == *wdtype)
        else {
            continue;
        };
        let micros = match kernel_micros.get(&d.kernel) {
            Some(m) => *m,
            None => {
                let groups = d.workgroups.map(|w| w.eval(rows));
                let m = time_kernel(gpu, kernel, groups, rows).await? * 1e6;
                tracing::debug!("{}: {m:.1} µs at T = {rows}", kernel.name);
                kernel_micros.insert(d.kernel, m);
                m
            }
        };
        *totals.entry(shape).or_default() += micros;
    }
    Ok(Timed {
        rows,
        shapes,
        micros: totals,
    })
}

/// Measures every candidate tile of `ckpt`'s prefill GEMMs compiled with
/// `opts` on this machine's GPU; `progress` hears one line per candidate.
pub async fn tune(
    ckpt: &Checkpoint,
    opts: &CompileOptions,
    mut progress: impl FnMut(&str),
) -> Result<Tuning> {
    let gpu = Gpu::open_with(&Requirements::default(), true).await?;
    if !gpu.has_timestamps() {
        bail!(
            "the GPU `{}` has no timestamp queries inside compute passes, which tuning times kernels with",
            gpu.adapter.name
        );
    }
    let untuned = CompileOptions {
        tuning: None,
        ..opts.clone()
    };
    let Timed {
        rows,
        shapes,
        micros: defaults,
    } = gemm_micros(&gpu, ckpt, &untuned, None).await?;
    progress(&format!(
        "{} GEMM shapes, timed at T = {rows} on {}",
        shapes.len(),
        gpu.adapter.name
    ));
    let room = opts.target.limits.max_workgroup_storage;
    // The untuned choice competes with its own time: a candidate must beat it.
    let mut best: HashMap<GemmShape, (GemmTile, f64)> = shapes
        .iter()
        .filter_map(|s| {
            let tile = tile_for(&GemmTiles::new(), *s, rows, room);
            defaults.get(s).map(|m| (*s, (tile, *m)))
        })
        .collect();
    for tile in GemmTile::CANDIDATES
        .into_iter()
        .filter(|t| t.workgroup_bytes() <= room)
    {
        let served: Vec<&GemmShape> = shapes.iter().filter(|s| tile.supports(s.glu)).collect();
        if served.is_empty() {
            continue;
        }
        let forced = Tuning {
            gemms: served
                .iter()
                .map(|s| TunedGemm {
                    k: s.k,
                    n: s.n,
                    glu: s.glu,
                    dtype: s.wdtype,
                    tile: [tile.bm, tile.bn, tile.bk, tile.tm, tile.tn],
                    micros: 0.0,
                    default_micros: 0.0,
                })
                .collect(),
            ..empty_tuning(&gpu, opts, rows)
        };
        let with_tile = CompileOptions {
            tuning: Some(forced),
            ..opts.clone()
        };
        let micros = gemm_micros(&gpu, ckpt, &with_tile, Some(tile))
            .await?
            .micros;
        progress(&format!(
            "tile {}: {}",
            tile.tag(),
            served
                .iter()
                .filter_map(|s| micros
                    .get(s)
                    .map(|m| format!("k{} n{} {m:.0} µs", s.k, s.n)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for (shape, m) in micros {
            if best.get(&shape).is_none_or(|(_, b)| m < *b) {
                best.insert(shape, (tile, m));
            }
        }
    }
    let mut tuning = empty_tuning(&gpu, opts, rows);
    for shape in &shapes {
        let (Some((tile, micros)), Some(default)) = (best.get(shape), defaults.get(shape)) else {
            continue;
        };
        tuning.gemms.push(TunedGemm {
            k: shape.k,
            n: shape.n,
            glu: shape.glu,
            dtype: shape.wdtype,
            tile: [tile.bm, tile.bn, tile.bk, tile.tm, tile.tn],
            micros: *micros,
            default_micros: *default,
        });
    }
    Ok(tuning)
}

/// A tuning of no shapes, naming this device and `opts`' target.
fn empty_tuning(gpu: &Gpu, opts: &CompileOptions, rows: u32) -> Tuning {
    Tuning {
        format: TUNING_FORMAT.to_string(),
        adapter: gpu.adapter.name.clone(),
        driver: format!("{} {}", gpu.adapter.driver, gpu.adapter.driver_info)
            .trim()
            .to_string(),
        backend: format!("{:?}", gpu.adapter.backend),
        target: opts.target.name.clone(),
        rows,
        gemms: Vec::new(),
    }
}
