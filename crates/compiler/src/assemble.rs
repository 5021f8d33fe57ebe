//! Plan assembly: a codegen [`Program`](gerbil_codegen_wgsl::Program) plus materialized weights and the text
//! assets become a [`Plan`] — a header and its data sections — ready to write.
//!
//! [`build_plan`] is the back half of the compiler, usable on any graph whose
//! passes have run and any [`TensorSource`]; the pass-equivalence tests build
//! random graphs with in-memory weights and go through it. The header is
//! checked with `PlanHeader::validate` before it is returned, so a plan this
//! crate hands out is one the runtime accepts.

use crate::error::CompileError;
use crate::materialize::{weight_buffer_bytes, TensorSource};
use crate::quantize::Rounding;
use gerbil_codegen_wgsl::{generate, CodegenOptions};
use gerbil_frontend_hf::{GenerationConfig, TextAssets};
use gerbil_ir::Graph;
use gerbil_plan::{
    write_plan, write_plan_with_progress, BufferKind, CompileInfo, DataLayout, GenerationDefaults,
    ModelInfo, PlanHeader, TextInfo,
};
use std::borrow::Cow;
use std::path::Path;

/// A plan ready to write: its header and data sections, which borrow from
/// the tensor source (the checkpoint's tensor bytes) where they can.
pub struct Plan<'a> {
    /// The header.
    pub header: PlanHeader,
    /// Weight and tokenizer sections.
    pub data: DataLayout<'a>,
    /// Bytes of weight data.
    pub weight_bytes: u64,
}

impl Plan<'_> {
    /// Writes the plan file (to a temporary name, then renamed into place).
    pub fn write(&self, path: &Path) -> Result<(), CompileError> {
        Ok(write_plan(path, &self.header, &self.data)?)
    }

    /// Like [`Plan::write`], calling `progress(done, total)` as the data
    /// region's bytes are written (see `gerbil_plan::write_plan_with_progress`).
    pub fn write_with_progress(
        &self,
        path: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), CompileError> {
        Ok(write_plan_with_progress(
            path,
            &self.header,
            &self.data,
            progress,
        )?)
    }

    /// Writes every kernel's WGSL to `dir/<kernel>.wgsl`.
    pub fn emit_wgsl(&self, dir: &Path) -> Result<(), CompileError> {
        std::fs::create_dir_all(dir).map_err(|e| CompileError::io(dir, e))?;
        for k in &self.header.kernels {
            let path = dir.join(format!("{}.wgsl", k.name));
            gerbil_plan::safe_file::write_file(&path, k.wgsl.as_bytes())
                .map_err(gerbil_plan::PlanError::from)?;
        }
        Ok(())
    }
}

/// Generates code for a graph whose passes have run, materializes its
/// weights from `tensors` and assembles the plan. `model`'s context fields
/// are taken from `codegen`; float weights the graph gives a block type are
/// quantized by `rounding`'s quantizer.
pub fn build_plan<'a>(
    graph: &Graph,
    tensors: &'a dyn TensorSource,
    mut model: ModelInfo,
    text: &'a TextAssets,
    mut compile: CompileInfo,
    codegen: &CodegenOptions,
    rounding: Rounding,
) -> Result<Plan<'a>, CompileError> {
    let program = generate(graph, codegen)?;
    model.max_context = codegen.max_context;
    model.max_tokens_per_step = codegen.max_tokens_per_step;
    compile.activation_naive_bytes = program.activation_naive_bytes;
    let mut data = DataLayout::default();
    let mut buffers = program.buffers;
    let mut weight_bytes = 0;
    for w in &program.weights {
        let bytes = weight_buffer_bytes(tensors, w, rounding)?;
        let decl = &mut buffers[w.buffer as usize];
        if bytes.len() as u64 != decl.size {
            return Err(CompileError::Weight {
                weight: w.source.to_string(),
                reason: format!("{} bytes materialized, {} expected", bytes.len(), decl.size),
            });
        }
        weight_bytes += decl.size;
        let section = data.push(bytes);
        if let BufferKind::Weight { section: s, .. } = &mut decl.kind {
            *s = section;
        }
    }
    let tokenizer = text
        .tokenizer_json
        .as_ref()
        .map(|t| data.push(Cow::Borrowed(t.as_slice())));
    let header = PlanHeader {
        model,
        text: TextInfo {
            tokenizer,
            chat_template: text.chat_template.clone(),
            bos_token: text.bos_token.clone(),
            eos_token: text.eos_token.clone(),
            eos_token_ids: text.eos_token_ids.clone(),
            generation: generation_defaults(&text.generation),
        },
        compile,
        buffers,
        kernels: program.kernels,
        variants: program.variants,
        io: program.io,
    };
    header
        .validate(data.len())
        .map_err(CompileError::Inconsistent)?;
    Ok(Plan {
        header,
        data,
        weight_bytes,
    })
}

/// The plan's copy of the checkpoint's `generation_config.json` settings
/// (the frontend has checked their ranges).
fn generation_defaults(g: &GenerationConfig) -> GenerationDefaults {
    GenerationDefaults {
        do_sample: g.do_sample,
        temperature: g.temperature,
        top_k: g.top_k,
        top_p: g.top_p,
        min_p: g.min_p,
        repetition_penalty: g.repetition_penalty,
        max_new_tokens: g.max_new_tokens,
        max_length: g.max_length,
    }
}
