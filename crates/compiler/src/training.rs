//! [`compile_training`]: a checkpoint becomes a training program and the
//! bytes it starts from, in process (no plan file).
//!
//! The forward graph is lowered for the sequence length, the training
//! passes make its f32 master weights, loss and backward
//! (`gerbil_passes::training_passes`), and codegen lays it out
//! ([`gerbil_codegen_wgsl::generate_training`]). Then every trained weight
//! is read from the checkpoint, widened to f32 if it is stored in 16 bits,
//! into its range of the parameter buffer, and every frozen one (RoPE
//! tables, quantized weights) into bytes of its own buffer. Hand the result
//! to `gerbil_runtime::Trainer::new`. A checkpoint holding an adapter that
//! is not merged ([`gerbil_frontend_hf::adapter`]) trains that adapter: the
//! `lora` pass runs first, its factors are the trained weights, and every
//! checkpoint weight is frozen.
//!
//! The surprise: non-finite weights are refused here as in `gerbilc
//! compile` — a NaN in the starting weights would only show up as a
//! skipped step later.

use crate::error::CompileError;
use crate::materialize::{materialize, weight_buffer_bytes, WeightOptions};
use crate::quantize::Rounding;
use gerbil_codegen_wgsl::{generate_training, TrainingOptions, TrainingProgram};
use gerbil_frontend_hf::adapter::factor_names;
use gerbil_frontend_hf::{lower_with, Checkpoint, LowerOptions};
use gerbil_ir::DType;
use gerbil_passes::lora::Lora;
use gerbil_passes::{training_passes, PassManager};

/// A training program and what its buffers start as.
pub struct TrainingBuild {
    /// The program.
    pub program: TrainingProgram,
    /// The parameter banks' values, laid end to end: every trained weight
    /// at its offset.
    pub parameters: Vec<f32>,
    /// Each frozen weight's buffer index and bytes.
    pub frozen: Vec<(u32, Vec<u8>)>,
}

/// Compiles a training step of `ckpt` (see the module documentation).
pub fn compile_training(
    ckpt: &Checkpoint,
    opts: &TrainingOptions,
) -> Result<TrainingBuild, CompileError> {
    let lower = LowerOptions {
        max_context: Some(u64::from(opts.seq_len)),
    };
    let mut graph = lower_with(ckpt, &lower)?.graph;
    let mut passes: Vec<Box<dyn gerbil_passes::Pass>> = Vec::new();
    if let Some(adapter) = ckpt.adapter.as_ref().filter(|a| !a.merged) {
        let adapted = adapter
            .adapted()
            .into_iter()
            .map(|w| {
                let names = factor_names(&w);
                (w, names)
            })
            .collect();
        passes.push(Box::new(Lora {
            adapted,
            rank: adapter.config.rank,
            scale: adapter.config.scale(),
        }));
    }
    passes.extend(training_passes());
    PassManager::new(passes).run(&mut graph, |_, _| {})?;
    let program = generate_training(&graph, opts)?;
    let options = WeightOptions {
        rounding: Rounding::Ggml,
        allow_non_finite: false,
    };
    let plan = &program.plan;
    let bank_bytes: u64 = plan
        .io
        .parameters
        .iter()
        .map(|&b| plan.buffers[b as usize].size)
        .sum();
    let mut parameters = vec![0f32; (bank_bytes / 4) as usize];
    for (p, source) in plan.parameters.iter().zip(&program.trained) {
        let rows = p.shape.first().copied().unwrap_or(1);
        let bytes = materialize(ckpt, source, DType::F32, rows, options)?;
        let start = p.offset as usize;
        let values = parameters
            .get_mut(start..start + p.len() as usize)
            .filter(|v| v.len() * 4 == bytes.len())
            .ok_or_else(|| {
                CompileError::Inconsistent(format!(
                    "weight `{}` has {} bytes, its parameter range {} values",
                    p.label,
                    bytes.len(),
                    p.len()
                ))
            })?;
        for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    let frozen = program
        .frozen
        .iter()
        .map(|w| {
            Ok((
                w.buffer,
                weight_buffer_bytes(ckpt, w, options)?.into_owned(),
            ))
        })
        .collect::<Result<_, CompileError>>()?;
    Ok(TrainingBuild {
        program,
        parameters,
        frozen,
    })
}
