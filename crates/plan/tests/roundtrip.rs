//! Writing and reading plan files.

use gerbil_plan::*;
use std::borrow::Cow;

fn header(weight: SectionRef) -> PlanHeader {
    PlanHeader {
        model: ModelInfo {
            architecture: "LlamaForCausalLM".into(),
            family: "llama".into(),
            name: "t".into(),
            vocab_size: 4,
            hidden_size: 2,
            num_layers: 0,
            max_context: 8,
            max_tokens_per_step: 8,
            config: serde_json::json!({"hidden_size": 2}),
        },
        text: TextInfo::default(),
        compile: CompileInfo::default(),
        requirements: Requirements::default(),
        buffers: vec![
            BufferDecl {
                size: STEP_PARAMS_BYTES,
                kind: BufferKind::StepParams,
            },
            BufferDecl {
                size: 32,
                kind: BufferKind::TokenIds,
            },
            BufferDecl {
                size: weight.len,
                kind: BufferKind::Weight {
                    section: weight,
                    name: "w".into(),
                    dtype: "f32".into(),
                    shape: vec![3],
                },
            },
            BufferDecl {
                size: 16,
                kind: BufferKind::State {
                    name: "logits".into(),
                },
            },
        ],
        kernels: vec![],
        prefill: vec![],
        decode: vec![],
        io: IoBindings {
            step_params: 0,
            token_ids: 1,
            logits: BufferSlice {
                buffer: 3,
                offset: 0,
                size: 16,
            },
            logits_all_rows: false,
        },
    }
}

#[test]
fn sections_are_aligned_and_read_back_exactly() {
    let dir = std::env::temp_dir().join(format!("gerbil-plan-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.plan");
    let mut data = DataLayout::default();
    let tok = data.push(Cow::Borrowed(b"{\"tokenizer\": 1}"));
    let w = data.push(Cow::Owned(vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]));
    assert_eq!(w.offset % SECTION_ALIGN, 0);
    let mut h = header(w);
    h.text.tokenizer = Some(tok);
    write_plan(&path, &h, &data).unwrap();
    let plan = PlanFile::open(&path).unwrap();
    assert_eq!(plan.header, h);
    assert_eq!(plan.section(tok), b"{\"tokenizer\": 1}");
    assert_eq!(plan.section(w), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
}

#[test]
fn inconsistent_headers_are_rejected() {
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![0u8; 12]));
    let mut h = header(w);
    assert!(h.validate(data.len()).is_ok());
    h.io.logits.buffer = 9;
    assert!(h
        .validate(data.len())
        .unwrap_err()
        .contains("names buffer 9"));
    let mut h = header(SectionRef {
        offset: 1 << 20,
        len: 12,
    });
    h.buffers[2].size = 12;
    assert!(h
        .validate(data.len())
        .unwrap_err()
        .contains("outside the data region"));
    let mut h = header(w);
    h.prefill.push(Dispatch {
        kernel: 0,
        bindings: vec![],
        workgroups: [WorkgroupCount::fixed(1); 3],
        label: "x".into(),
    });
    assert!(h
        .validate(data.len())
        .unwrap_err()
        .contains("names kernel 0"));
}

#[test]
fn workgroup_counts_round_up() {
    let w = WorkgroupCount {
        per_token: 3,
        constant: 1,
        divisor: 4,
    };
    assert_eq!(w.eval(0), 1);
    assert_eq!(w.eval(1), 1);
    assert_eq!(w.eval(5), 4);
    assert_eq!(WorkgroupCount::fixed(7).eval(100), 7);
}

#[test]
fn a_plan_in_memory_reads_like_the_file() {
    let dir = std::env::temp_dir().join(format!("gerbil-plan-bytes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("b.plan");
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![7u8, 6, 5, 4, 3, 2, 1, 0, 9, 8, 7, 6]));
    let h = header(w);
    write_plan(&path, &h, &data).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let plan = PlanFile::from_bytes("https://example.test/b.plan", bytes.clone()).unwrap();
    assert_eq!(plan.header, h);
    assert_eq!(plan.section(w), &[7, 6, 5, 4, 3, 2, 1, 0, 9, 8, 7, 6]);
    assert_eq!(plan.file_len(), bytes.len() as u64);
    assert_eq!(
        plan.path(),
        std::path::Path::new("https://example.test/b.plan")
    );

    // The same checks as a file: a flipped data byte, a cut, a wrong magic.
    let mut corrupt = bytes.clone();
    *corrupt.last_mut().unwrap() ^= 1;
    let err = PlanFile::from_bytes("fetched.plan", corrupt).err().unwrap();
    assert!(
        matches!(err, PlanError::Checksum { what: "data", .. }),
        "{err}"
    );
    assert!(err.to_string().starts_with("fetched.plan: "), "{err}");
    let err = PlanFile::from_bytes("cut.plan", bytes[..bytes.len() - 1].to_vec())
        .err()
        .unwrap();
    assert!(matches!(err, PlanError::Truncated { .. }), "{err}");
    let err = PlanFile::from_bytes("page.html", b"<!doctype html>".to_vec())
        .err()
        .unwrap();
    assert!(matches!(err, PlanError::BadMagic(_)), "{err}");
}
