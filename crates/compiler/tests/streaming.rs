//! Plans are written as their weights are made: building a plan reads no
//! tensor, writing it reads the tensors of one weight buffer, writes that
//! buffer and only then reads the next buffer's (the bytes of the buffers
//! already written are gone). A compile that read every tensor before
//! writing — holding the model in memory — fails here. The streamed file is
//! byte for byte the file `write_plan` makes of the same sections held in
//! memory, with and without `--quantize` and row shards.

use gerbil_codegen_wgsl::{CodegenOptions, Target};
use gerbil_compiler::quantize::{retype, Quantization};
use gerbil_compiler::{build_plan, Checkpoint, TensorSource, WeightOptions};
use gerbil_frontend_hf::{lower, FrontendError, TensorView};
use gerbil_passes::{default_pipeline, PassManager};
use gerbil_plan::{write_plan, BufferKind, CompileInfo, DataLayout, ModelInfo, PlanFile};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
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
    compile_streamed_for(dir, name, quantize, Target::portable(), max_binding)
}

/// [`compile_streamed`] for `target`, whose shared binding limit (not its
/// desktop variants' [`Target::wide_binding`]) becomes `max_binding`.
fn compile_streamed_for(
    dir: &Path,
    name: &str,
    quantize: Option<Quantization>,
    target: Target,
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
        target,
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
    let sections = own_sections(&plan.header).len();
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

/// The weight sections of `header` that are not ranges of another weight's:
/// the bytes written for weights.
fn own_sections(header: &gerbil_plan::PlanHeader) -> Vec<gerbil_plan::SectionRef> {
    let sections: Vec<_> = header
        .buffers
        .iter()
        .filter_map(|b| match b.kind {
            BufferKind::Weight { section, .. } => Some(section),
            _ => None,
        })
        .collect();
    sections
        .iter()
        .filter(|s| {
            !sections
                .iter()
                .any(|w| w != *s && w.offset <= s.offset && s.offset + s.len <= w.offset + w.len)
        })
        .copied()
        .collect()
}

/// Weight buffers of the plan at `path`: name → (buffer index, section).
fn weight_sections(plan: &PlanFile) -> HashMap<String, (u32, gerbil_plan::SectionRef)> {
    plan.header
        .buffers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match &b.kind {
            BufferKind::Weight { section, name, .. } => Some((name.clone(), (i as u32, *section))),
            _ => None,
        })
        .collect()
}

/// A `universal` plan whose shared bindings are small stores each large
/// weight once: its desktop variants bind the whole weight, its portable
/// ones row shards whose sections are ranges of the whole's bytes — the
/// bytes a `portable` plan materializes for the same shards, one by one. A
/// quantized weight's rows are not ranges of its bytes (its blocks are
/// stored in planes), so every variant binds its shards.
#[test]
fn shards_of_a_weight_bound_whole_are_ranges_of_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut quantized_shards = 0;
    for (name, quantize, max_binding) in [
        ("f32", None, 24 << 10),
        ("q4_k_m", Some(Quantization::Q4KM), 6 << 10),
    ] {
        let universal = PlanFile::open(&compile_streamed_for(
            dir.path(),
            &format!("{name}-universal"),
            quantize,
            Target::universal(),
            max_binding,
        ))
        .unwrap();
        let portable = PlanFile::open(&compile_streamed(
            dir.path(),
            &format!("{name}-portable"),
            quantize,
            max_binding,
        ))
        .unwrap();
        let in_universal = weight_sections(&universal);
        let mut shards = 0;
        for (shard, &(_, section)) in weight_sections(&portable)
            .iter()
            .filter(|(n, _)| n.contains('['))
        {
            let (of, _) = shard.split_once('[').unwrap();
            let (shard_buffer, stored) = in_universal[shard];
            assert_eq!(
                universal.section_bytes(stored).unwrap(),
                portable.section_bytes(section).unwrap(),
                "{name}: {shard}'s bytes"
            );
            let whole = in_universal.get(of).copied();
            let quantized = universal.header.buffers[shard_buffer as usize].kind.clone();
            let quantized =
                matches!(quantized, BufferKind::Weight { dtype, .. } if dtype.starts_with('q'));
            assert_eq!(whole.is_some(), !quantized, "{name}: {of} whole");
            quantized_shards += usize::from(quantized);
            if let Some((_, w)) = whole {
                let inside =
                    w.offset <= stored.offset && stored.offset + stored.len <= w.offset + w.len;
                assert!(inside, "{name}: {shard} is not a range of {of}");
            }
            // Desktop variants bind the whole weight where there is one,
            // the others (and all, without it) its shards.
            for v in &universal.header.variants {
                let bound: Vec<u32> = v.bound_buffers().collect();
                let wide = whole.is_some()
                    && [
                        "tensor-f16",
                        "subgroups-f16",
                        "subgroups-f16-i8",
                        "subgroups",
                    ]
                    .contains(&v.name.as_str());
                if let Some((whole_buffer, _)) = whole {
                    assert_eq!(
                        bound.contains(&whole_buffer),
                        wide,
                        "{name}: {} binds {of}",
                        v.name
                    );
                }
                assert_eq!(
                    bound.contains(&shard_buffer),
                    !wide,
                    "{name}: {} binds {shard}",
                    v.name
                );
            }
            shards += 1;
        }
        assert!(shards >= 3, "{name}: {shards} shards");
        // A portable variant needs no buffer larger than its bindings: the
        // whole weights are the desktop variants' alone.
        for v in universal.header.variants.iter().filter(|v| {
            ![
                "tensor-f16",
                "subgroups-f16",
                "subgroups-f16-i8",
                "subgroups",
            ]
            .contains(&v.name.as_str())
        }) {
            let r = &v.requirements;
            assert!(
                r.max_buffer_size <= max_binding,
                "{name}: {} needs {r:?}",
                v.name
            );
        }
        // Each byte is stored once: the weights' sections that are not
        // ranges of another add up to the portable plan's, give or take
        // section padding.
        let stored = |p: &PlanFile| -> u64 { own_sections(&p.header).iter().map(|s| s.len).sum() };
        let (u, p) = (stored(&universal), stored(&portable));
        assert!(
            u <= p + 256 * shards,
            "{name}: {u} weight bytes against {p}"
        );
    }
    assert!(quantized_shards >= 3, "{quantized_shards} quantized shards");
}
