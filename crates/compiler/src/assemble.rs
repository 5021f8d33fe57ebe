//! Plan assembly: a codegen [`Program`](gerbil_codegen_wgsl::Program) plus the
//! text assets become a [`Plan`] — a header and the layout of its data
//! sections — whose weights are materialized only as the plan is written.
//!
//! [`build_plan`] is the back half of the compiler, usable on any graph whose
//! passes have run and any [`TensorSource`]; the pass-equivalence tests build
//! random graphs with in-memory weights and go through it. The header is
//! checked with `PlanHeader::validate` before it is returned, so a plan this
//! crate hands out is one the runtime accepts.
//!
//! The surprise: building a plan reads no weights. Every weight buffer's
//! size is known from codegen (`BufferDecl::size`), so the header, with
//! every section's offset, is complete before any weight exists;
//! [`Plan::write`] then materializes each buffer, writes it and drops it
//! before the next (`gerbil_plan::write_plan_streaming`), and that is when
//! a weight's errors (a NaN, a file changed under it) come out.
//! [`Plan::check_weights`] runs the same materialization without writing.

use crate::error::CompileError;
use crate::materialize::{weight_buffer_bytes, TensorSource, WeightOptions};
use gerbil_codegen_wgsl::{generate, CodegenOptions, WeightBuffer};
use gerbil_frontend_hf::{GenerationConfig, TextAssets};
use gerbil_ir::Graph;
use gerbil_plan::{
    write_plan_streaming, BufferKind, CompileInfo, DataLayout, GenerationDefaults, ModelInfo,
    PlanHeader, SectionData, SectionRef, TextInfo,
};
use std::borrow::Cow;
use std::path::Path;

/// A plan ready to write: its header, and the layout of its data sections,
/// whose weights are read from the tensor source (the checkpoint) as they
/// are written.
pub struct Plan<'a> {
    /// The header.
    pub header: PlanHeader,
    /// Bytes of weight data.
    pub weight_bytes: u64,
    /// The data region: a reserved section per weight buffer, in the order
    /// of `weights`, then the tokenizer.
    data: DataLayout<'a>,
    /// The weight buffers, each made when its section is written.
    weights: Vec<WeightBuffer>,
    tensors: &'a dyn TensorSource,
    options: WeightOptions,
}

impl<'a> Plan<'a> {
    /// Writes the plan file (to a temporary name, then renamed into place),
    /// materializing one weight buffer at a time; on an error, such as a
    /// weight that cannot be made, nothing is left at `path`.
    pub fn write(&self, path: &Path) -> Result<(), CompileError> {
        self.write_with_progress(path, &mut |_, _| {})
    }

    /// Like [`Plan::write`], calling `progress(done, total)` as the data
    /// region's bytes are written (see `gerbil_plan::write_plan_with_progress`).
    pub fn write_with_progress(
        &self,
        path: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), CompileError> {
        write_plan_streaming(path, &self.header, &self.data, |k| self.weight(k), progress)
    }

    /// Materializes every weight buffer and drops it: the checks writing
    /// makes (NaN and infinities unless allowed, sizes, readable tensors),
    /// without writing.
    pub fn check_weights(&self) -> Result<(), CompileError> {
        (0..self.weights.len()).try_for_each(|k| self.weight(k).map(drop))
    }

    /// The bytes of weight buffer `k`, of the size the header gives it.
    fn weight(&self, k: usize) -> Result<SectionData<'a>, CompileError> {
        let w = &self.weights[k];
        let bytes = weight_buffer_bytes(self.tensors, w, self.options)?;
        let size = self.header.buffers[w.buffer as usize].size;
        if bytes.len() as u64 != size {
            return Err(CompileError::Weight {
                weight: w.source.to_string(),
                reason: format!("{} bytes materialized, {size} expected", bytes.len()),
            });
        }
        Ok(bytes)
    }

    /// Appends `bytes` to the data region, after the weights and tokenizer.
    pub(crate) fn push_section(&mut self, bytes: SectionData<'a>) -> SectionRef {
        self.data.push(bytes)
    }

    /// Gives the plan its self-test (whose outputs [`Plan::push_section`]
    /// placed), checking the header again.
    pub(crate) fn set_selftest(&mut self, t: gerbil_plan::SelfTest) -> Result<(), CompileError> {
        self.header.selftest = Some(t);
        self.header
            .validate(self.data.len())
            .map_err(CompileError::Inconsistent)
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

/// Generates code for a graph whose passes have run and lays out the plan,
/// its weights to be materialized from `tensors` as it is written
/// ([`Plan::write`]). `model`'s context fields are taken from `codegen`;
/// float weights the graph gives a block type are quantized by `options`'
/// quantizer.
pub fn build_plan<'a>(
    graph: &Graph,
    tensors: &'a dyn TensorSource,
    mut model: ModelInfo,
    text: &'a TextAssets,
    mut compile: CompileInfo,
    codegen: &CodegenOptions,
    options: WeightOptions,
) -> Result<Plan<'a>, CompileError> {
    let program = generate(graph, codegen)?;
    model.max_context = codegen.max_context;
    model.max_tokens_per_step = codegen.max_tokens_per_step;
    compile.activation_naive_bytes = program.activation_naive_bytes;
    let mut data = DataLayout::default();
    let mut buffers = program.buffers;
    let mut weight_bytes = 0;
    let mut sections = Vec::new();
    for w in &program.weights {
        let decl = &mut buffers[w.buffer as usize];
        weight_bytes += decl.size;
        let section = data.reserve(decl.size);
        sections.push((w.buffer, section));
        if let BufferKind::Weight { section: s, .. } = &mut decl.kind {
            *s = section;
        }
    }
    // A shard desktop variants bind whole is a range of the whole's bytes.
    for alias in &program.aliases {
        let whole = sections
            .iter()
            .find(|(b, _)| *b == alias.of)
            .map(|&(_, s)| s)
            .ok_or_else(|| {
                CompileError::Inconsistent(format!(
                    "weight buffer {} is a range of buffer {}, which has no bytes of its own",
                    alias.buffer, alias.of
                ))
            })?;
        let decl = &mut buffers[alias.buffer as usize];
        if let BufferKind::Weight { section, .. } = &mut decl.kind {
            *section = SectionRef {
                offset: whole.offset + alias.offset,
                len: decl.size,
            };
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
        selftest: None,
    };
    header
        .validate(data.len())
        .map_err(CompileError::Inconsistent)?;
    Ok(Plan {
        header,
        weight_bytes,
        data,
        weights: program.weights,
        tensors,
        options,
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
