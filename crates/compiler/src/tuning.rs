//! The tuning file: prefill GEMM tiles measured on one device, as `gerbilc
//! tune` writes them and `gerbilc compile --tuning FILE` reads them.
//!
//! A [`Tuning`] names the adapter and driver it was measured on and, per
//! GEMM shape (`K`, `N`, gated or not, weight dtype), the tile that ran
//! fastest and how long it and the untuned choice took. Compiling with it
//! sets [`CompileOptions::tuning`](crate::CompileOptions::tuning): codegen
//! uses the measured tiles (those the target can run) and the plan records
//! where they came from (`CompileInfo::tuned_on`, shown by `gerbilc
//! inspect`). The surprise: the file is advice, not a contract — a shape it
//! lacks, or a tile the target cannot fit, falls back to the built-in choice,
//! so a stale or foreign file never breaks a compile, it only loses speed.

use crate::error::CompileError;
use gerbil_codegen_wgsl::kernels::gemm::GemmTile;
use gerbil_codegen_wgsl::tuning::{GemmShape, GemmTiles};
use gerbil_ir::DType;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The `format` field of a tuning file this version reads and writes.
pub const TUNING_FORMAT: &str = "gerbil-tuning-v1";

/// Tiles measured on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    /// Always [`TUNING_FORMAT`].
    pub format: String,
    /// Adapter name, e.g. `NVIDIA H100 80GB HBM3`.
    pub adapter: String,
    /// Driver and its version, as the adapter reports them.
    pub driver: String,
    /// Graphics backend, e.g. `Vulkan`.
    pub backend: String,
    /// The target the kernels were compiled for.
    pub target: String,
    /// Rows (`T`) of the step the kernels were timed at.
    pub rows: u32,
    /// One entry per GEMM shape.
    pub gemms: Vec<TunedGemm>,
}

/// The fastest tile of one GEMM shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedGemm {
    /// Inner dimension.
    pub k: u32,
    /// Output columns (a gated GEMM's, half its weight rows).
    pub n: u32,
    /// Gated (GLU) epilogue.
    pub glu: bool,
    /// Weight dtype.
    pub dtype: DType,
    /// `[BM, BN, BK, TM, TN]` of the fastest tile.
    pub tile: [u32; 5],
    /// Its GPU time for one prefill step's GEMMs of this shape, µs.
    pub micros: f64,
    /// The untuned choice's time, µs.
    pub default_micros: f64,
}

impl TunedGemm {
    /// The shape it was measured for.
    pub fn shape(&self) -> GemmShape {
        GemmShape {
            k: self.k,
            n: self.n,
            glu: self.glu,
            wdtype: self.dtype,
        }
    }

    /// The tile it found.
    pub fn gemm_tile(&self) -> GemmTile {
        let [bm, bn, bk, tm, tn] = self.tile;
        GemmTile::new(bm, bn, bk, tm, tn)
    }
}

impl Tuning {
    /// Reads a tuning file; a file that is not one names the cause.
    pub fn read(path: &Path) -> Result<Tuning, CompileError> {
        let bad = |reason: String| CompileError::Option {
            option: "--tuning",
            value: path.display().to_string(),
            reason,
        };
        gerbil_plan::safe_file::check_input(path).map_err(|e| bad(e.to_string()))?;
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let tuning: Tuning = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not a tuning file ({e}); write one with `gerbilc tune`"
            ))
        })?;
        if tuning.format != TUNING_FORMAT {
            return Err(bad(format!(
                "format `{}` is not `{TUNING_FORMAT}`; rerun `gerbilc tune`",
                tuning.format
            )));
        }
        Ok(tuning)
    }

    /// Writes the file (pretty JSON).
    pub fn write(&self, path: &Path) -> Result<(), CompileError> {
        let text =
            serde_json::to_string_pretty(self).map_err(|e| CompileError::io(path, e.into()))?;
        gerbil_plan::safe_file::write_file(path, (text + "\n").as_bytes())
            .map_err(|e| gerbil_plan::PlanError::from(e).into())
    }

    /// The tiles by shape, for codegen.
    pub fn tiles(&self) -> GemmTiles {
        self.gemms
            .iter()
            .map(|g| (g.shape(), g.gemm_tile()))
            .collect()
    }

    /// Where the tiles were measured, for the plan: adapter, driver, backend.
    pub fn measured_on(&self) -> String {
        format!("{} ({}, {})", self.adapter, self.driver, self.backend)
    }
}
