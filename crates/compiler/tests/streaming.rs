//! Plans are written as their weights are made: building a plan reads no
//! tensor, writing it reads the tensors of one weight buffer, writes that
//! buffer and only then reads the next buffer's (the bytes of the buffers
//! already written are gone). A compile that read every tensor before
//! writing — holding the model in memory — fails here. The streamed file is
//! byte for byte the file `write_plan` makes of the same sections held in
//! memory, with and without `--quantize` and row shards.

use gerbil_codegen_wgsl::CodegenOptions;
use gerbil_compiler::quantize::{retype, Quantization};
use gerbil_compiler::{build_plan, Checkpoint, TensorSource, WeightOptions};
use gerbil_frontend_hf::{lower, FrontendError, TensorView};
use gerbil_passes::{default_pipeline, PassManager};
use gerbil_plan::{write_plan, BufferKind, CompileInfo, DataLayout, ModelInfo, PlanFile};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

fn tiny_llama() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/models/tiny/llama")
}

/// A checkpoint whose reads are logged with the data bytes written so far.
struct Recording<'a> {
    ckpt: &'a Checkpoint,
    written: &'a Cell<u64>,
    reads: RefCell<Vec<(String, u64)>>,
}

impl TensorSource for Recording<'_> {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError> {
        self.reads
            .borrow_mut()
            .push((name.to_string(), self.written.get()));
        self.ckpt.tensor(name)
    }

    fn rows(&self, name: &str) -> Result<u64, FrontendError> {
        TensorSource::rows(self.ckpt, name)
    }
}

/// Compiles the tiny Llama (quantized by `quantize`, its weights split into
/// row shards of at most `max_binding` bytes) to `dir/name.plan`, checking
/// how the tensors were read; returns the plan's path.
fn compile_streamed(
    dir: &Path,
    name: &str,
    quantize: Option<Quantization>,
    max_binding: u64,
) -> PathBuf {
    let ckpt = Checkpoint::open(&tiny_llama()).unwrap();
    let mut graph = lower(&ckpt).unwrap().graph;
    if let Some(q) = quantize {
        assert!(retype(&mut graph, q) > 0);
    }
    PassManager::new(default_pipeline())
        .run(&mut graph, |_, _| {})
        .unwrap();
    let mut codegen = CodegenOptions {
        max_context: 16,
        max_tokens_per_step: 4,
        ..CodegenOptions::default()
    };
    codegen.target.limits.max_storage_binding = max_binding;
    let written = Cell::new(0);
    let source = Recording {
        ckpt: &ckpt,
        written: &written,
        reads: RefCell::default(),
    };
    let model = ModelInfo {
        architecture: "LlamaForCausalLM".into(),
        family: "llama".into(),
        name: name.into(),
        vocab_size: 512,
        hidden_size: 64,
        num_layers: 2,
        max_context: 0,
        max_tokens_per_step: 0,
        config: serde_json::Value::Null,
        embedding: None,
    };
    let options = WeightOptions {
        rounding: quantize.map(|q| q.rounding()).unwrap_or_default(),
        allow_non_finite: false,
    };
    let text = ckpt.text.clone();
    let plan = build_plan(
        &graph,
        &source,
        model,
        &text,
        CompileInfo::default(),
        &codegen,
        options,
    )
    .unwrap();
    assert!(
        source.reads.borrow().is_empty(),
        "building a plan read tensors"
    );
    let path = dir.join(format!("{name}.plan"));
    plan.write_with_progress(&path, &mut |done, _| written.set(done))
        .unwrap();
    let reads = source.reads.borrow();
    let sections = plan
        .header
        .buffers
        .iter()
        .filter(|b| matches!(b.kind, BufferKind::Weight { .. }))
        .count();
    assert!(reads.len() >= sections, "{} reads", reads.len());
    // Between two progress reports (one per small section) one buffer is
    // made: at most three tensors (a fused QKV projection) are read at once.
    let most = reads
        .iter()
        .map(|(_, at)| reads.iter().filter(|(_, b)| b == at).count())
        .max();
    assert!(
        most <= Some(3),
        "{most:?} tensors read before the same byte was written: {reads:?}"
    );
    path
}

/// The plan at `path` written again by `write_plan` from its sections held
/// in memory.
fn rewritten_from_memory(path: &Path, to: &Path) {
    let plan = PlanFile::open(path).unwrap();
    let mut sections: Vec<_> = plan
        .header
        .buffers
        .iter()
        .filter_map(|b| match b.kind {
            BufferKind::Weight { section, .. } => Some(section),
            _ => None,
        })
        .chain(plan.header.text.tokenizer)
        .collect();
    sections.sort_by_key(|s| s.offset);
    let mut data = DataLayout::default();
    for s in sections {
        let bytes = plan.section_bytes(s).unwrap().into_owned();
        assert_eq!(data.push(bytes.into()), s);
    }
    write_plan(to, &plan.header, &data).unwrap();
}

#[test]
fn weights_are_read_one_buffer_at_a_time_while_the_plan_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for (name, quantize, max_binding) in [
        ("f32", None, 1 << 30),
        ("f32-shards", None, 24 << 10),
        ("q4_k_m-shards", Some(Quantization::Q4KM), 6 << 10),
        ("q8_0", Some(Quantization::Q8_0), 1 << 30),
    ] {
        let streamed = compile_streamed(dir.path(), name, quantize, max_binding);
        let again = dir.path().join(format!("{name}.held.plan"));
        rewritten_from_memory(&streamed, &again);
        assert!(
            std::fs::read(&streamed).unwrap() == std::fs::read(&again).unwrap(),
            "{name}: the streamed plan differs from the plan written from memory"
        );
    }
}
