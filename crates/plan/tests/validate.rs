//! `PlanHeader::validate` as the runtime's guard: a valid header with every
//! kind of buffer, each cross-reference and size broken in turn with the
//! exact message a user reads, the version errors, and a proptest that
//! mutates the numeric fields and checks that whatever is accepted is in
//! range.

use gerbil_plan::*;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::borrow::Cow;

/// Positions of the KV cache, tokens per step and vocabulary of [`valid`].
const CONTEXT: u64 = 8;
const STEP: u64 = 4;
const VOCAB: u64 = 4;
/// Bytes of one KV-cache row (two f32 values).
const KV_ROW: u64 = 8;

fn decl(name: &str, port: Port, access: Access, bytes: u64) -> BindingDecl {
    BindingDecl {
        name: name.into(),
        port,
        access,
        elem: Elem::F32,
        bytes,
    }
}

fn slice(buffer: u32, offset: u64, size: u64) -> BufferSlice {
    BufferSlice {
        buffer,
        offset,
        size,
    }
}

fn dispatch(kernel: u32, bindings: Vec<BufferSlice>, workgroups: WorkgroupCount) -> Dispatch {
    Dispatch {
        kernel,
        bindings,
        workgroups: [
            workgroups,
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        label: format!("k{kernel}"),
        layer: Some(0),
        group: String::new(),
        flops: FlopCount::default(),
        tokens: None,
    }
}

/// The schedule of both phases: `attend` (weight and KV cache in, logits
/// out; a workgroup per token) then `sample` (logits in, next token out,
/// with counters and working memory in the scratch buffer).
fn schedule() -> Vec<Dispatch> {
    vec![
        dispatch(
            0,
            vec![
                slice(0, 0, STEP_PARAMS_BYTES),
                slice(2, 0, 12),
                slice(4, 0, CONTEXT * KV_ROW),
                slice(3, 0, VOCAB * 4),
            ],
            WorkgroupCount::per_token(1, 0, 1),
        ),
        dispatch(
            1,
            vec![
                slice(0, 0, STEP_PARAMS_BYTES),
                slice(6, 0, SAMPLING_PARAMS_BYTES),
                slice(3, 0, VOCAB * 4),
                slice(5, 0, 4),
                slice(7, 0, 256),
                slice(7, 256, 256),
            ],
            WorkgroupCount::fixed(1),
        ),
    ]
}

/// A header that passes, with a weight in `w`, a KV cache, both outputs,
/// the sampling uniform and the scratch buffer.
fn valid(w: SectionRef) -> PlanHeader {
    let buffer = |size, kind| BufferDecl { size, kind };
    PlanHeader {
        model: ModelInfo {
            architecture: "LlamaForCausalLM".into(),
            family: "llama".into(),
            name: "t".into(),
            vocab_size: VOCAB,
            hidden_size: 2,
            num_layers: 1,
            max_context: CONTEXT,
            max_tokens_per_step: STEP,
            config: serde_json::json!({}),
            embedding: None,
        },
        text: TextInfo::default(),
        compile: CompileInfo::default(),
        buffers: vec![
            buffer(STEP_PARAMS_BYTES, BufferKind::StepParams),
            buffer(STEP * 4, BufferKind::TokenIds),
            buffer(
                w.len,
                BufferKind::Weight {
                    section: w,
                    name: "w".into(),
                    dtype: "f32".into(),
                    shape: vec![3],
                    position_rows: false,
                },
            ),
            buffer(
                VOCAB * 4,
                BufferKind::Output {
                    output: OutputKind::Logits,
                },
            ),
            buffer(
                CONTEXT * KV_ROW,
                BufferKind::KvCache {
                    layer: 0,
                    half: KvHalf::K,
                    row_bytes: Some(KV_ROW),
                },
            ),
            buffer(
                4,
                BufferKind::Output {
                    output: OutputKind::NextToken,
                },
            ),
            buffer(SAMPLING_PARAMS_BYTES, BufferKind::SamplingParams),
            buffer(512, BufferKind::Scratch { counter_bytes: 256 }),
        ],
        kernels: vec![
            Kernel {
                op: Default::default(),
                name: "attend".into(),
                wgsl: String::new(),
                entry: "main".into(),
                workgroup_size: [64, 1, 1],
                bindings: vec![
                    decl("params", Port::Params, Access::Uniform, STEP_PARAMS_BYTES),
                    decl("w", Port::Input { index: 0, shard: 0 }, Access::Read, 12),
                    decl(
                        "kc",
                        Port::Input { index: 1, shard: 0 },
                        Access::ReadWrite,
                        CONTEXT * KV_ROW,
                    ),
                    decl("y", Port::Output { index: 0 }, Access::ReadWrite, VOCAB * 4),
                ],
            },
            Kernel {
                op: Default::default(),
                name: "sample".into(),
                wgsl: String::new(),
                entry: "main".into(),
                workgroup_size: [256, 1, 1],
                bindings: vec![
                    decl("params", Port::Params, Access::Uniform, STEP_PARAMS_BYTES),
                    decl(
                        "sampling",
                        Port::Sampling,
                        Access::Uniform,
                        SAMPLING_PARAMS_BYTES,
                    ),
                    decl(
                        "logits",
                        Port::Input { index: 0, shard: 0 },
                        Access::Read,
                        VOCAB * 4,
                    ),
                    decl("next", Port::Output { index: 0 }, Access::ReadWrite, 4),
                    decl("count", Port::Counters, Access::ReadWrite, 256),
                    decl("part", Port::Scratch, Access::ReadWrite, 256),
                ],
            },
        ],
        variants: vec![Variant {
            name: "portable".into(),
            features: vec![],
            precision: Precision::F32,
            requirements: Requirements {
                max_storage_buffer_binding_size: 512,
                max_buffer_size: 512,
                max_storage_buffers_per_shader_stage: 4,
                max_compute_workgroup_storage_size: 0,
                max_compute_invocations_per_workgroup: 256,
            },
            prefill: schedule(),
            decode: schedule(),
            batch: Vec::new(),
            int8_dots: false,
            split_x: false,
        }],
        io: IoBindings {
            step_params: 0,
            token_ids: 1,
            logits: slice(3, 0, VOCAB * 4),
            logits_all_rows: false,
            next_token: Some(slice(5, 0, 4)),
            sampling_params: Some(6),
            step_rows: None,
            max_batch: 0,
            batch_tokens: None,
        },
        selftest: None,
    }
}

/// The data region of [`valid`]: one 12-byte weight.
fn data() -> (DataLayout<'static>, SectionRef) {
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![1u8; 12]));
    (data, w)
}

/// `validate`'s message for [`valid`] after `edit`.
fn error_after(edit: impl FnOnce(&mut PlanHeader)) -> String {
    let (data, w) = data();
    let mut h = valid(w);
    edit(&mut h);
    h.validate(data.len())
        .expect_err("the edited header should be refused")
}

#[test]
fn the_valid_header_passes_and_runs_through_a_file() {
    let (data, w) = data();
    let h = valid(w);
    assert_eq!(h.validate(data.len()), Ok(()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.plan");
    write_plan(&path, &h, &data).unwrap();
    assert_eq!(PlanFile::open(&path).unwrap().header, h);
}

/// A self-test's steps are tokens of the vocabulary, steps within a step's
/// tokens and the context, and outputs of the size the runtime reads.
#[test]
fn self_tests_fit_the_plan() {
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![1u8; 12]));
    let out = data.push(Cow::Owned(vec![0u8; 4 * VOCAB as usize]));
    let step = |ids: Vec<u32>, output| SelfTestStep {
        input_ids: ids,
        output,
    };
    let check = |steps: Vec<SelfTestStep>| {
        let mut h = valid(w);
        h.selftest = Some(SelfTest { steps });
        h.validate(data.len())
    };
    assert_eq!(
        check(vec![step(vec![1, 2, 3], out), step(vec![0], out)]),
        Ok(())
    );
    let err = |steps| check(steps).expect_err("refused");
    assert!(err(vec![step(vec![VOCAB as u32], out)]).contains("past the vocabulary of 4"));
    assert!(err(vec![step(vec![0; STEP as usize + 1], out)]).contains("not 1 to 4"));
    assert!(err(vec![
        step(vec![0; 4], out),
        step(vec![0; 4], out),
        step(vec![0], out)
    ])
    .contains("within a context of 8"));
    assert!(err(vec![step(vec![], out)]).contains("has 0 tokens"));
    assert!(err(vec![]).contains("has no step"));
    let short = SectionRef { len: 4, ..out };
    assert!(err(vec![step(vec![1], short)]).contains("not 4 f32 values"));
    let outside = SectionRef {
        offset: data.len(),
        ..out
    };
    assert!(err(vec![step(vec![1], outside)]).contains("outside the data region"));
}

#[test]
fn model_sizes_are_positive_and_within_the_limits() {
    assert_eq!(
        error_after(|h| h.model.max_context = 0),
        "model.max_context is 0; it must be at least 1"
    );
    assert_eq!(
        error_after(|h| h.model.max_tokens_per_step = 0),
        "model.max_tokens_per_step is 0; it must be at least 1"
    );
    assert_eq!(
        error_after(|h| h.model.max_tokens_per_step = 9),
        "model.max_tokens_per_step 9 exceeds model.max_context 8"
    );
    assert_eq!(
        error_after(|h| h.model.max_context = 1 << 32),
        "model.max_context 4294967296 exceeds the largest context gerbil supports (1073741824 \
         tokens: each layer's KV cache is one storage binding of at most 2 GiB - 4 bytes \
         holding at least one 2-byte value per position, and kernels keep positions in u32); \
         the plan was edited or damaged"
    );
    assert_eq!(
        error_after(|h| h.model.max_tokens_per_step = 1 << 20),
        "model.max_tokens_per_step 1048576 exceeds the largest step gerbil supports (65535 \
         tokens: the embedding, RMSNorm and GEMV kernels dispatch one workgroup per token \
         along one axis, and WebGPU allows at most 65535 workgroups per dimension); the plan \
         was edited or damaged"
    );
    assert_eq!(
        error_after(|h| h.model.vocab_size = u64::MAX),
        "model.vocab_size 18446744073709551615 exceeds the largest vocabulary gerbil supports \
         (16777216 tokens: the GPU sampler (`sample_token`) holds token ids in f32, exact up \
         to 2^24); the plan was edited or damaged"
    );
    assert!(error_after(|h| h.model.hidden_size = 1 << 40)
        .starts_with("model.hidden_size 1099511627776 exceeds the largest hidden size"));
    assert!(error_after(|h| h.model.num_layers = 1 << 17)
        .starts_with("model.num_layers 131072 exceeds the largest layer count"));
    // A vocabulary of 0 is caught with the logits it sizes.
    assert_eq!(
        error_after(|h| h.model.vocab_size = 0),
        "logits output holds 16 bytes, less than 1 row(s) of 0 f32 logits"
    );
}

#[test]
fn buffers_hold_what_the_runtime_writes_and_reads() {
    assert_eq!(
        error_after(|h| h.buffers[3].size = 1 << 41),
        "buffer 3 (logits) size 2199023255552 exceeds the largest buffer gerbil supports \
         (1099511627776 bytes: no GPU has a terabyte of memory; a larger buffer can only come \
         from a damaged header, and is refused before the device is asked for it); the plan \
         was edited or damaged"
    );
    assert_eq!(
        error_after(|h| h.buffers[4].size = 60),
        "buffer 4 (a KV cache) has 60 bytes, not 8 (max_context) rows of 2-byte or 4-byte values"
    );
    // Eight times the context makes every row of the same cache too short.
    assert_eq!(
        error_after(|h| h.model.max_context = 64),
        "buffer 4 (a KV cache) has 64 bytes, not 64 (max_context) rows of 2-byte or 4-byte values"
    );
    // Twice the context would pass for rows of one f32 value, but the
    // cache says its rows hold two.
    assert_eq!(
        error_after(|h| h.model.max_context = 16),
        "buffer 4 (a KV cache) has 64 bytes: 16 (max_context) rows of 4 bytes, but its rows are \
         8 bytes"
    );
    // A plan written before rows were recorded is checked by size alone.
    let (data, w) = data();
    let mut h = valid(w);
    h.buffers[4].kind = BufferKind::KvCache {
        layer: 0,
        half: KvHalf::K,
        row_bytes: None,
    };
    assert_eq!(h.validate(data.len()), Ok(()));
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(
        json["buffers"][4]["kind"],
        serde_json::json!({"kind": "kv_cache", "layer": 0, "half": "k"})
    );
    assert_eq!(
        error_after(|h| h.buffers[0].size = 4),
        "buffer 0 (step parameters) has 4 bytes, less than the 16 the runtime writes"
    );
    assert_eq!(
        error_after(|h| h.buffers[1].size = 8),
        "the token-ids buffer holds 8 bytes, less than 4 u32 ids"
    );
    assert_eq!(
        error_after(|h| h.io.logits_all_rows = true),
        "logits output holds 16 bytes, less than 4 row(s) of 4 f32 logits"
    );
    assert_eq!(
        error_after(|h| h.buffers[6].size = 16),
        "io.sampling_params names buffer 6, which is not a 32-byte sampling-parameter uniform"
    );
}

/// [`valid`] with its weight replaced by a table indexed by position (like
/// the RoPE table): `CONTEXT` rows of one f32, bound whole by `attend`.
fn with_position_table() -> (DataLayout<'static>, PlanHeader) {
    let mut data = DataLayout::default();
    let table = data.push(Cow::Owned(vec![1u8; CONTEXT as usize * 4]));
    let mut h = valid(table);
    h.buffers[2] = BufferDecl {
        size: table.len,
        kind: BufferKind::Weight {
            section: table,
            name: "rope_table".into(),
            dtype: "f32".into(),
            shape: vec![CONTEXT, 1],
            position_rows: true,
        },
    };
    rebind_attend(&mut h, 1, slice(2, 0, table.len));
    (data, h)
}

/// Binding `n` of kernel 0 (`attend`) declared and bound as `to` in both
/// phases.
fn rebind_attend(h: &mut PlanHeader, n: usize, to: BufferSlice) {
    h.kernels[0].bindings[n].bytes = to.size;
    let v = &mut h.variants[0];
    for d in v.prefill.iter_mut().chain(v.decode.iter_mut()) {
        if d.kernel == 0 {
            d.bindings[n] = to;
        }
    }
}

#[test]
fn tables_indexed_by_position_hold_max_context_rows_and_are_bound_whole() {
    let (data, h) = with_position_table();
    assert_eq!(h.validate(data.len()), Ok(()));
    // A context raised consistently for the KV cache (rows of the same
    // bytes) still leaves the table short: the GPU would read past it.
    let mut longer = h.clone();
    longer.model.max_context = 2 * CONTEXT;
    longer.buffers[4].size = 2 * CONTEXT * KV_ROW;
    rebind_attend(&mut longer, 2, slice(4, 0, 2 * CONTEXT * KV_ROW));
    assert_eq!(
        longer.validate(data.len()).unwrap_err(),
        "buffer 2 (rope_table) is indexed by position with shape [8, 1] in 32 bytes, not 16 \
         (max_context) rows of 4-byte values"
    );
    // The shape and the size must agree too.
    let mut wide = h.clone();
    if let BufferKind::Weight { shape, .. } = &mut wide.buffers[2].kind {
        *shape = vec![CONTEXT, 2];
    }
    assert!(wide
        .validate(data.len())
        .unwrap_err()
        .starts_with("buffer 2 (rope_table) is indexed by position with shape [8, 2] in 32 bytes"));
    // A binding of part of the table would let a kernel index past it.
    let mut part = h.clone();
    rebind_attend(&mut part, 1, slice(2, 0, 16));
    assert_eq!(
        part.validate(data.len()).unwrap_err(),
        "portable prefill dispatch 0 (k0), binding 1 (`w` of kernel attend) binds bytes 0+16 \
         of the rope_table, a table indexed by position; it must bind all 32 bytes"
    );
    // Plans written before the flag read as `false`: it is omitted then.
    let (_, w) = self::data();
    let json = serde_json::to_value(valid(w)).unwrap();
    assert!(json["buffers"][2]["kind"].get("position_rows").is_none());
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json["buffers"][2]["kind"]["position_rows"], true);
}

#[test]
fn io_bindings_name_buffers_of_their_kind() {
    assert_eq!(
        error_after(|h| h.io.step_params = 1),
        "the step-params binding is not a step-params buffer"
    );
    assert_eq!(
        error_after(|h| h.io.token_ids = 99),
        "token ids names buffer 99 of 8"
    );
    assert_eq!(
        error_after(|h| h.io.logits.buffer = 5),
        "logits output binds bytes 0+16 of buffer 5 (4 bytes)"
    );
    assert_eq!(
        error_after(|h| h.io.logits = slice(4, 0, 16)),
        "the logits binding is not a logits output buffer"
    );
    assert_eq!(
        error_after(|h| {
            h.buffers[3].size = 32;
            h.io.logits = slice(3, 2, 16);
        }),
        "the logits output starts at byte 2, not a multiple of 4"
    );
    assert_eq!(
        error_after(|h| h.io.next_token = Some(slice(3, 0, 4))),
        "the next-token binding is not a u32 next-token output buffer"
    );
    assert_eq!(
        error_after(|h| h.io.sampling_params = Some(0)),
        "io.sampling_params names buffer 0, which is not a 32-byte sampling-parameter uniform"
    );
}

/// A batch schedule comes with its row table and room for its rows, in
/// every variant, and only its `rows` port binds the table.
#[test]
fn batch_schedules_have_their_row_table_and_rows() {
    assert_eq!(
        error_after(|h| h.variants[0].batch = schedule()),
        "variant `portable` has 2 batch dispatches but the plan's max_batch is 0"
    );
    assert_eq!(
        error_after(|h| h.io.max_batch = 1),
        "a plan with a batch schedule has no step-rows buffer"
    );
    assert!(error_after(|h| {
        h.io.max_batch = 1;
        h.io.step_rows = Some(1);
    })
    .contains("not a step-rows buffer"));
    assert!(error_after(|h| {
        h.io.max_batch = 1_000_000;
    })
    .starts_with("max_batch 1000000 is more rows than"));
    // A valid batch plan: a step-rows buffer, room for the rows' logits.
    let (data, w) = data();
    let mut h = valid(w);
    h.buffers.push(BufferDecl {
        size: 16,
        kind: BufferKind::StepRows,
    });
    h.io.step_rows = Some(h.buffers.len() as u32 - 1);
    h.io.max_batch = 1;
    h.variants[0].batch = schedule();
    h.validate(data.len())
        .expect("a plan with a batch schedule");
    h.io.max_batch = 2;
    let e = h.validate(data.len()).unwrap_err();
    assert!(e.contains("less than 2 row(s)"), "{e}");
}

#[test]
fn kernels_and_dispatches_stay_within_the_limits() {
    assert_eq!(
        error_after(|h| h.kernels[1].workgroup_size = [256, 0, 1]),
        "kernel 1 (sample) has workgroup size [256, 0, 1]; every axis must be at least 1"
    );
    assert!(
        error_after(|h| h.kernels[0].workgroup_size = [64, 64, 1]).starts_with(
            "kernel 0 (attend): invocations per workgroup 4096 exceeds the largest workgroup \
         gerbil supports (1024 invocations"
        )
    );
    // 2^22 · 2^22 · 2^20 = 2^64: wrapped to 0 in u64 before, and passed the limit.
    assert!(
        error_after(|h| h.kernels[0].workgroup_size = [1 << 22, 1 << 22, 1 << 20]).starts_with(
            "kernel 0 (attend): invocations per workgroup 18446744073709551615 exceeds"
        )
    );
    assert_eq!(
        error_after(|h| h.variants[0].decode[0].workgroups[0].divisor = 0),
        "portable decode dispatch 0 (k0) divides its workgroup count (axis 0) by 0"
    );
    assert!(
        error_after(|h| h.variants[0].prefill[0].workgroups[0].per_token = 20_000).starts_with(
            "portable prefill dispatch 0 (k0): workgroups along axis 0 at T=4 80000 exceeds the \
             largest dispatch gerbil supports (65535 workgroups per dimension"
        )
    );
    assert_eq!(
        error_after(|h| h.variants[0].prefill[1].kernel = 7),
        "portable prefill dispatch 1 (k1) names kernel 7 of 2"
    );
    assert_eq!(
        error_after(|h| {
            h.kernels[0].bindings[2].bytes = 0;
            for v in &mut h.variants {
                v.prefill[0].bindings[2].size = 0;
                v.decode[0].bindings[2].size = 0;
            }
        }),
        "portable prefill dispatch 0 (k0), binding 2 (`kc` of kernel attend) binds 0 bytes, \
         not a positive multiple of 4"
    );
    assert_eq!(
        error_after(|h| {
            h.kernels[0].bindings[2].bytes = KV_ROW;
            for v in &mut h.variants {
                for phase in [&mut v.prefill, &mut v.decode] {
                    phase[0].bindings[2] = slice(4, 256, KV_ROW);
                }
            }
            h.buffers[4].size = 512;
            h.model.max_context = 64;
            h.model.max_tokens_per_step = 4;
        }),
        "portable prefill dispatch 0 (k0), binding 2 (`kc` of kernel attend) binds a KV cache \
         from byte 256; caches are bound from their start"
    );
    assert!(error_after(|h| {
        h.variants[0].requirements.max_storage_buffer_binding_size = 1 << 40;
    })
    .starts_with("variant `portable` requirement max_storage_buffer_binding_size 1099511627776 exceeds the largest storage binding"));
}

/// A dispatch for some steps only runs in the steps of its range, bounds
/// included; a range that is empty or starts at 0 tokens is refused.
#[test]
fn dispatches_for_some_steps_run_in_their_range_only() {
    let mut d = schedule().remove(0);
    assert!(d.runs_at(1) && d.runs_at(4096), "no range: every step");
    d.tokens = Some(TokenRange { min: 1, max: 16 });
    assert!(d.runs_at(1) && d.runs_at(16) && !d.runs_at(17));
    d.tokens = Some(TokenRange { min: 17, max: 64 });
    assert!(!d.runs_at(16) && d.runs_at(17) && d.runs_at(64) && !d.runs_at(65));
    for (min, max) in [(0, 16), (9, 8), (1, STEP as u32 + 1)] {
        let e = error_after(|h| {
            h.variants[0].prefill[0].tokens = Some(TokenRange { min, max });
        });
        assert!(
            e.ends_with(&format!(
                "runs in steps of {min}..={max} tokens: not a range within 1..={STEP}"
            )),
            "{e}"
        );
    }
    let e = error_after(|h| {
        h.variants[0].decode[0].tokens = Some(TokenRange { min: 1, max: 1 });
    });
    assert!(
        e.ends_with("runs in steps of 1..=1 tokens only; ranges are for prefill dispatches"),
        "{e}"
    );
}

#[test]
fn format_versions_say_which_side_to_update() {
    let (data, w) = data();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.plan");
    write_plan(&path, &valid(w), &data).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let with_version = |v: u32| {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&v.to_le_bytes());
        PlanFile::from_bytes("v.plan", b).err().unwrap().to_string()
    };
    assert_eq!(
        with_version(FORMAT_VERSION + 1),
        format!(
            "v.plan: plan format version {} is not supported (this gerbil reads version {}); a \
             newer gerbil wrote it: upgrade gerbil-run, or recompile the model with this gerbilc",
            FORMAT_VERSION + 1,
            FORMAT_VERSION
        )
    );
    assert_eq!(
        with_version(FORMAT_VERSION - 1),
        format!(
            "v.plan: plan format version {} is not supported (this gerbil reads version {}); an \
             older gerbil wrote it: recompile the model with this gerbilc (`gerbilc compile`)",
            FORMAT_VERSION - 1,
            FORMAT_VERSION
        )
    );
}

/// Every slice the runtime reads through `io` or a dispatch, in range of
/// its buffer, and every quantity it divides or chunks by, positive.
fn assert_in_range(h: &PlanHeader) {
    let m = &h.model;
    assert!(m.max_context >= 1 && m.max_tokens_per_step >= 1 && m.vocab_size >= 1);
    assert!(m.max_tokens_per_step <= m.max_context);
    assert!(m.max_context <= limits::CONTEXT.max);
    assert!(m.vocab_size <= limits::VOCABULARY.max);
    let in_range = |s: &BufferSlice| {
        let b = &h.buffers[s.buffer as usize];
        assert!(s.offset.checked_add(s.size).unwrap() <= b.size, "{s:?}");
    };
    in_range(&h.io.logits);
    assert!(h.io.logits.size >= m.vocab_size * 4);
    assert!(h.buffers[h.io.token_ids as usize].size >= m.max_tokens_per_step * 4);
    assert!(h.buffers[h.io.step_params as usize].size >= STEP_PARAMS_BYTES);
    if let Some(n) = &h.io.next_token {
        in_range(n);
    }
    for b in &h.buffers {
        if let BufferKind::KvCache { .. } = b.kind {
            // A session of any smaller context sizes the cache from its row.
            assert!(b.size / m.max_context >= 2);
        }
    }
    for k in &h.kernels {
        assert!(k.workgroup_size.iter().all(|&n| n >= 1));
    }
    for v in &h.variants {
        assert!(!v.prefill.is_empty() && !v.decode.is_empty());
        for d in v.prefill.iter().chain(&v.decode) {
            let k = &h.kernels[d.kernel as usize];
            assert_eq!(k.bindings.len(), d.bindings.len());
            d.bindings.iter().for_each(in_range);
            for w in &d.workgroups {
                assert!(w.divisor >= 1);
                assert!(w.eval(m.max_tokens_per_step as u32) <= 65_535);
            }
        }
    }
}

/// One numeric field of the header, by index, set to `value`.
fn mutate(h: &mut PlanHeader, field: usize, value: u64) {
    let u32v = value as u32;
    let v = &mut h.variants[0];
    match field {
        0 => h.model.max_context = value,
        1 => h.model.max_tokens_per_step = value,
        2 => h.model.vocab_size = value,
        3 => h.model.hidden_size = value,
        4 => h.model.num_layers = value,
        5 => h.buffers[(value % 8) as usize].size = value / 8,
        6 => h.io.logits.offset = value,
        7 => h.io.logits.size = value,
        8 => h.io.logits.buffer = u32v,
        9 => h.io.token_ids = u32v,
        10 => h.io.step_params = u32v,
        11 => h.io.next_token = Some(slice(u32v % 10, value >> 32, value & 0xff)),
        12 => h.io.sampling_params = Some(u32v),
        13 => v.decode[1].bindings[(value % 6) as usize].offset = value / 6,
        14 => v.prefill[0].bindings[(value % 4) as usize].size = value / 4,
        15 => v.prefill[0].bindings[(value % 4) as usize].buffer = (value / 4) as u32,
        16 => v.prefill[0].workgroups[0].per_token = u32v,
        17 => v.decode[0].workgroups[0].divisor = u32v,
        18 => v.decode[0].kernel = u32v,
        19 => h.kernels[1].workgroup_size[(value % 3) as usize] = (value / 3) as u32,
        20 => h.kernels[0].bindings[(value % 4) as usize].bytes = value / 4,
        21 => {
            h.buffers[7].kind = BufferKind::Scratch {
                counter_bytes: value,
            }
        }
        22 => h.io.logits_all_rows = value % 2 == 1,
        _ => {
            h.buffers[2].kind = BufferKind::Weight {
                section: SectionRef {
                    offset: value >> 8,
                    len: value & 0xff,
                },
                name: "w".into(),
                dtype: "f32".into(),
                shape: vec![3],
                position_rows: value % 2 == 1,
            }
        }
    }
}

/// Values near the edges that break arithmetic: 0, 1, powers of two and
/// their neighbours, and the largest values.
fn edgy() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        (0u32..64).prop_map(|s| 1u64 << s),
        (0u32..64).prop_map(|s| (1u64 << s) - 1),
        0u64..1024,
        any::<u64>(),
    ]
}

/// proptest's configuration for `cases` cases at the default scale: `PROPTEST_CASES` (256 when
/// unset) scales it, and failures persist beside this file (`*.proptest-regressions`).
fn scaled(cases: u32) -> ProptestConfig {
    let scale = ProptestConfig::default().cases;
    ProptestConfig {
        cases: (u64::from(cases) * u64::from(scale) / 256).clamp(1, u64::from(u32::MAX)) as u32,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(scaled(4096))]

    /// Any numeric edit of a valid header is refused, or leaves every slice
    /// the runtime uses in range; validate itself never panics.
    #[test]
    fn numeric_edits_are_refused_or_in_range(
        edits in prop::collection::vec((0usize..24, edgy()), 1..4)
    ) {
        let (data, w) = data();
        let mut h = valid(w);
        for (field, value) in edits {
            mutate(&mut h, field, value);
        }
        if h.validate(data.len()).is_ok() {
            assert_in_range(&h);
        }
    }
}
