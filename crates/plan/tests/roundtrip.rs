//! Writing and reading plan files.

use gerbil_plan::*;
use std::borrow::Cow;

fn decl(name: &str, port: Port, access: Access, bytes: u64) -> BindingDecl {
    BindingDecl {
        name: name.into(),
        port,
        access,
        elem: Elem::F32,
        bytes,
    }
}

fn input(index: u32) -> Port {
    Port::Input { index, shard: 0 }
}

fn slice(buffer: u32, size: u64) -> BufferSlice {
    BufferSlice {
        buffer,
        offset: 0,
        size,
    }
}

/// A dispatch of the `copy` kernel: weight (buffer 2) to logits (buffer 3).
fn copy(weight_len: u64) -> Dispatch {
    Dispatch {
        kernel: 0,
        bindings: vec![
            slice(0, STEP_PARAMS_BYTES),
            slice(2, weight_len),
            slice(3, 16),
        ],
        workgroups: [WorkgroupCount::fixed(1); 3],
        label: "copy".into(),
        layer: None,
        group: String::new(),
        flops: FlopCount::default(),
        tokens: None,
    }
}

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
            embedding: None,
        },
        text: TextInfo::default(),
        compile: CompileInfo::default(),
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
                    position_rows: false,
                },
            },
            BufferDecl {
                size: 16,
                kind: BufferKind::Output {
                    output: OutputKind::Logits,
                },
            },
        ],
        kernels: vec![Kernel {
            op: Default::default(),
            name: "copy".into(),
            wgsl: String::new(),
            entry: "main".into(),
            workgroup_size: [1, 1, 1],
            bindings: vec![
                decl("params", Port::Params, Access::Uniform, STEP_PARAMS_BYTES),
                decl("w", input(0), Access::Read, weight.len),
                decl("y", Port::Output { index: 0 }, Access::ReadWrite, 16),
            ],
        }],
        variants: vec![Variant {
            name: "portable".into(),
            features: vec![],
            precision: Precision::F32,
            requirements: Requirements::default(),
            prefill: vec![copy(weight.len)],
            decode: vec![copy(weight.len)],
            batch: Vec::new(),
            int8_dots: false,
            split_x: false,
        }],
        io: IoBindings {
            step_params: 0,
            token_ids: 1,
            logits: BufferSlice {
                buffer: 3,
                offset: 0,
                size: 16,
            },
            logits_all_rows: false,
            next_token: None,
            sampling_params: None,
            step_rows: None,
            max_batch: 0,
            batch_tokens: None,
        },
        selftest: None,
    }
}

#[test]
fn sections_are_aligned_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.plan");
    let mut data = DataLayout::default();
    let tok = data.push(Cow::Borrowed(b"{\"tokenizer\": 1}"));
    let w = data.push(Cow::Owned(vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]));
    assert_eq!(w.offset % SECTION_ALIGN, 0);
    let mut h = header(w);
    h.text.tokenizer = Some(tok);
    write_plan(&path, &h, &data).unwrap();
    let plan = PlanFile::open(&path).unwrap();
    assert_eq!(plan.header, h);
    assert_eq!(&*plan.section_bytes(tok).unwrap(), b"{\"tokenizer\": 1}");
    assert_eq!(
        &*plan.section_bytes(w).unwrap(),
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    );
    let mut buf = [0u8; 6];
    plan.read_section(w, 4, &mut buf).unwrap();
    assert_eq!(buf, [5, 6, 7, 8, 9, 10]);
    let err = plan
        .read_section(w, 8, &mut [0u8; 5])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bytes 8..+5 asked of a section of 12 bytes"),
        "{err}"
    );
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
    h.variants[0].prefill[0].kernel = 1;
    assert!(h
        .validate(data.len())
        .unwrap_err()
        .contains("names kernel 1"));
}

/// Every dispatch is checked against its kernel's binding contract.
#[test]
fn bindings_must_match_the_kernel_contract() {
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![0u8; 12]));
    let check = |edit: &dyn Fn(&mut PlanHeader)| {
        let mut h = header(w);
        edit(&mut h);
        h.validate(data.len()).unwrap_err()
    };
    // A slice of another size than the kernel declares.
    let e = check(&|h| h.variants[0].decode[0].bindings[2].size = 8);
    assert!(e.contains("binds 8 bytes; the kernel declares 16"), "{e}");
    // The uniform bound to something that is not the step parameters.
    let e = check(&|h| h.variants[0].decode[0].bindings[0] = slice(1, STEP_PARAMS_BYTES));
    assert!(
        e.contains("declared uniform but binds the token ids"),
        "{e}"
    );
    // A writable binding of a weight.
    let e = check(&|h| {
        h.kernels[0].bindings[2].bytes = 12;
        h.variants[0].prefill[0].bindings[2] = slice(2, 12);
        h.variants[0].decode[0].bindings[2] = slice(2, 12);
    });
    assert!(e.contains("declared read_write but binds the w"), "{e}");
    // A count mismatch, an unaligned offset, no variant, an empty schedule.
    let e = check(&|h| {
        h.variants[0].prefill[0].bindings.pop();
    });
    assert!(e.contains("binds 2 buffers, kernel copy declares 3"), "{e}");
    let e = check(&|h| {
        h.buffers[3].size = 512;
        h.variants[0].prefill[0].bindings[2].offset = 4;
    });
    assert!(e.contains("not a multiple of 256"), "{e}");
    let e = check(&|h| h.variants.clear());
    assert!(e.contains("no variant"), "{e}");
    let e = check(&|h| h.variants[0].decode.clear());
    assert!(e.contains("empty decode schedule"), "{e}");
    // I/O buffers of the wrong kind.
    let e = check(&|h| h.io.token_ids = 2);
    assert!(e.contains("not a token-ids buffer"), "{e}");
    let e = check(&|h| h.model.vocab_size = 0);
    assert!(e.contains("f32 logits"), "{e}");
    // One buffer bound read-only and writable in one dispatch.
    let e = check(&|h| {
        h.kernels[0].bindings[1].bytes = 16;
        let v = &mut h.variants[0];
        v.prefill[0].bindings[1] = slice(3, 16);
        v.decode[0].bindings[1] = slice(3, 16);
    });
    assert!(e.contains("both read-only (`w`) and writable"), "{e}");
}

#[test]
fn workgroup_counts_round_up() {
    let w = WorkgroupCount::per_token(3, 1, 4);
    assert_eq!(w.eval(0), 1);
    assert_eq!(w.eval(1), 1);
    assert_eq!(w.eval(5), 4);
    assert_eq!(WorkgroupCount::fixed(7).eval(100), 7);
    assert_eq!(WorkgroupCount::fixed(7).eval_at(100, 1), 7);
}

#[test]
fn key_splits_bound_a_count_by_the_keys_in_the_window() {
    let splits = |window| WorkgroupCount {
        key_splits: Some(KeySplits {
            keys_per_split: 32,
            window,
        }),
        ..WorkgroupCount::fixed(43)
    };
    // One split up to 32 keys, one more per 32, never past the kernel's 43.
    assert_eq!(splits(0).eval_at(1, 0), 1);
    assert_eq!(splits(0).eval_at(1, 1), 1);
    assert_eq!(splits(0).eval_at(1, 32), 1);
    assert_eq!(splits(0).eval_at(1, 33), 2);
    assert_eq!(splits(0).eval_at(1, 43 * 32), 43);
    assert_eq!(splits(0).eval_at(1, u32::MAX), 43);
    assert_eq!(splits(0).eval(1), 43);
    // A window of 100 keys: 4 splits however long the cache.
    assert_eq!(splits(100).eval_at(1, 64), 2);
    assert_eq!(splits(100).eval_at(1, 4000), 4);
    // Older plans have no bound, and a plan without one writes none.
    let old: WorkgroupCount =
        serde_json::from_str(r#"{"per_token": 0, "constant": 43, "divisor": 1}"#).unwrap();
    assert_eq!(old.eval_at(1, 1), 43);
    let text = serde_json::to_string(&WorkgroupCount::fixed(3)).unwrap();
    assert!(!text.contains("key_splits"), "{text}");
    let text = serde_json::to_string(&splits(100)).unwrap();
    assert_eq!(
        serde_json::from_str::<WorkgroupCount>(&text).unwrap(),
        splits(100)
    );
}

#[test]
fn a_plan_in_memory_reads_like_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.plan");
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![7u8, 6, 5, 4, 3, 2, 1, 0, 9, 8, 7, 6]));
    let h = header(w);
    write_plan(&path, &h, &data).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let plan = PlanFile::from_bytes("https://example.test/b.plan", bytes.clone()).unwrap();
    assert_eq!(plan.header, h);
    assert_eq!(
        &*plan.section_bytes(w).unwrap(),
        &[7, 6, 5, 4, 3, 2, 1, 0, 9, 8, 7, 6]
    );
    let mut buf = [0u8; 3];
    plan.read_section(w, 2, &mut buf).unwrap();
    assert_eq!(buf, [5, 4, 3]);
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

/// A plan behind a [`PlanSource`] (a browser worker's synchronous reads)
/// reads its sections through it, and fails like a file when it is cut
/// short, corrupt, or the source's reads fail.
#[test]
fn a_plan_read_through_a_source_checks_and_reads_like_a_file() {
    struct Bytes {
        bytes: Vec<u8>,
        fail_past: u64,
    }
    impl PlanSource for Bytes {
        fn size(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn read_exact_at(&self, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
            if at + buf.len() as u64 > self.fail_past {
                return Err(std::io::Error::other("the file handle was closed"));
            }
            buf.copy_from_slice(&self.bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        }
    }
    let source = |bytes: Vec<u8>, fail_past: u64| Box::new(Bytes { bytes, fail_past });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.plan");
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned((0..=251u8).rev().collect()));
    let h = header(w);
    write_plan(&path, &h, &data).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let plan = PlanFile::from_source("opfs:s.plan", source(bytes.clone(), u64::MAX)).unwrap();
    assert_eq!(plan.header, h);
    assert_eq!(plan.file_len(), bytes.len() as u64);
    let mut buf = [0u8; 3];
    plan.read_section(w, 10, &mut buf).unwrap();
    assert_eq!(buf, [241, 240, 239]);
    assert_eq!(plan.section_bytes(w).unwrap()[251], 0);

    let mut corrupt = bytes.clone();
    *corrupt.last_mut().unwrap() ^= 1;
    let err = PlanFile::from_source("opfs:s.plan", source(corrupt, u64::MAX))
        .err()
        .unwrap();
    assert!(
        matches!(err, PlanError::Checksum { what: "data", .. }),
        "{err}"
    );
    let cut = bytes[..bytes.len() - 1].to_vec();
    let err = PlanFile::from_source("opfs:s.plan", source(cut, u64::MAX))
        .err()
        .unwrap();
    assert!(matches!(err, PlanError::Truncated { .. }), "{err}");
    let failing = source(bytes.clone(), bytes.len() as u64 - 1);
    let err = PlanFile::from_source("opfs:s.plan", failing).err().unwrap();
    assert!(matches!(err, PlanError::Io { .. }), "{err}");
    assert_eq!(err.to_string(), "opfs:s.plan: the file handle was closed");
}

/// Scratch ports bind only the scratch buffer: counters inside its counter
/// region, working memory past it, always `read_write`.
#[test]
fn scratch_bindings_stay_in_their_region() {
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![0u8; 12]));
    // The copy kernel gains a counters and a working-memory binding.
    let with_scratch = |edit: &dyn Fn(&mut PlanHeader)| {
        let mut h = header(w);
        h.buffers.push(BufferDecl {
            size: 1024,
            kind: BufferKind::Scratch { counter_bytes: 256 },
        });
        let k = &mut h.kernels[0].bindings;
        k.push(decl("count", Port::Counters, Access::ReadWrite, 8));
        k.push(decl("part", Port::Scratch, Access::ReadWrite, 512));
        let v = &mut h.variants[0];
        for d in v.prefill.iter_mut().chain(v.decode.iter_mut()) {
            d.bindings.push(slice(4, 8));
            d.bindings.push(BufferSlice {
                buffer: 4,
                offset: 256,
                size: 512,
            });
        }
        edit(&mut h);
        h.validate(data.len())
    };
    assert!(with_scratch(&|_| {}).is_ok());
    // Working memory over the counters.
    let e = with_scratch(&|h| h.variants[0].decode[0].bindings[4].offset = 0).unwrap_err();
    assert!(e.contains("may bind it past its counters"), "{e}");
    // Counters past the counter region.
    let e = with_scratch(&|h| h.variants[0].decode[0].bindings[3].offset = 256).unwrap_err();
    assert!(e.contains("may bind it inside its counters"), "{e}");
    // An IR operand in the scratch buffer, a scratch port elsewhere.
    let e = with_scratch(&|h| {
        h.kernels[0].bindings[2].bytes = 16;
        h.variants[0].decode[0].bindings[2] = BufferSlice {
            buffer: 4,
            offset: 256,
            size: 16,
        };
    })
    .unwrap_err();
    assert!(e.contains("only through a scratch port"), "{e}");
    let e = with_scratch(&|h| h.variants[0].decode[0].bindings[3].buffer = 3).unwrap_err();
    assert!(
        e.contains("is a scratch binding (Counters) but binds the logits"),
        "{e}"
    );
    // Read-only scratch, and a counter region that is not aligned.
    let e = with_scratch(&|h| h.kernels[0].bindings[4].access = Access::Read).unwrap_err();
    assert!(e.contains("scratch is read_write"), "{e}");
    let e = with_scratch(&|h| h.buffers[4].kind = BufferKind::Scratch { counter_bytes: 100 })
        .unwrap_err();
    assert!(e.contains("100 bytes of counters"), "{e}");
}

#[test]
fn writing_with_progress_counts_the_data_up_to_its_length_and_writes_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = 0x2545_f491u32;
    let weight: Vec<u8> = (0..(20 << 20) + 12)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let mut data = DataLayout::default();
    let tok = data.push(Cow::Borrowed(b"{\"tokenizer\": 1}"));
    let w = data.push(Cow::Borrowed(&weight));
    let mut h = header(w);
    h.text.tokenizer = Some(tok);
    let (plain, with) = (dir.path().join("a.plan"), dir.path().join("b.plan"));
    write_plan(&plain, &h, &data).unwrap();
    let mut seen = Vec::new();
    write_plan_with_progress(&with, &h, &data, &mut |done, total| {
        seen.push((done, total))
    })
    .unwrap();
    assert!(seen.iter().all(|&(_, t)| t == data.len()), "{seen:?}");
    let done: Vec<u64> = seen.iter().map(|&(d, _)| d).collect();
    assert!(
        done.windows(2)
            .all(|p| p[0] < p[1] && p[1] - p[0] <= (8 << 20) + SECTION_ALIGN),
        "{done:?}"
    );
    assert!(
        done.len() >= 3,
        "a 20 MiB section reports in 8 MiB steps: {done:?}"
    );
    assert_eq!(done.last(), Some(&data.len()));
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&with).unwrap()
    );
    assert_eq!(
        &*PlanFile::open(&with).unwrap().section_bytes(w).unwrap(),
        &weight[..]
    );
}

/// A plan cut short is a clear error; a plan truncated while it is open
/// fails the read of the missing bytes with an error (the file is read, not
/// mapped, so there is no page to fault on); a plan rewritten in place is
/// caught by `check_unchanged`; a plan replaced by `write_plan` while open
/// leaves the open one as it was.
#[test]
fn truncated_and_changed_plans_are_errors_not_faults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.plan");
    let mut data = DataLayout::default();
    let w = data.push(Cow::Owned(vec![9u8; 4096]));
    let h = header(w);
    write_plan(&path, &h, &data).unwrap();
    let plan = PlanFile::open(&path).unwrap();
    plan.check_unchanged().unwrap();

    // Replaced through write_plan (rename): the open file still reads the old bytes.
    let mut other = DataLayout::default();
    let w2 = other.push(Cow::Owned(vec![5u8; 4096]));
    write_plan(&path, &header(w2), &other).unwrap();
    plan.check_unchanged().unwrap();
    assert_eq!(&*plan.section_bytes(w).unwrap(), &[9u8; 4096][..]);
    drop(plan);

    // Truncated in place while open: reading the section is an error.
    let plan = PlanFile::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 1000).unwrap();
    let message = format!(
        "{}: the plan file changed while it was being read (now {} bytes, was {len}); \
         do not rewrite a plan while gerbil runs it: rerun the command",
        path.display(),
        len - 1000
    );
    let err = plan.section_bytes(w).unwrap_err().to_string();
    assert_eq!(err, message);
    let err = plan.read_section(w, 0, &mut [0u8; 4096]).unwrap_err();
    assert_eq!(err.to_string(), message);
    // The bytes before the cut still read (those of the replacement).
    let mut buf = [0u8; 16];
    plan.read_section(w, 0, &mut buf).unwrap();
    assert_eq!(buf, [5u8; 16]);
    assert_eq!(plan.check_unchanged().unwrap_err().to_string(), message);
    drop(plan);

    // Truncated before opening: a clear error naming both lengths.
    let err = PlanFile::open(&path).err().unwrap().to_string();
    assert!(
        err.contains(&format!(
            "truncated plan file ({} bytes, expected {len})",
            len - 1000
        )),
        "{err}"
    );
    drop(file);

    // Rewritten in place with the same length: `check_unchanged` says so.
    write_plan(&path, &h, &data).unwrap();
    let plan = PlanFile::open(&path).unwrap();
    let before = std::fs::metadata(&path).unwrap().modified().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_modified(before + std::time::Duration::from_secs(2))
        .unwrap();
    let err = plan.check_unchanged().unwrap_err().to_string();
    assert!(
        err.contains("the plan file changed while it was being read (modified in place)"),
        "{err}"
    );
}

/// A file that shrinks between the preamble check and the data checksum at
/// open fails with the same error, not with a checksum mismatch or a fault.
#[cfg(unix)]
#[test]
fn a_plan_that_shrinks_while_its_checksum_is_read_is_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.plan");
    let mut data = DataLayout::default();
    // Large enough that the checksum reads many chunks while it is cut.
    let w = data.push(Cow::Owned(vec![3u8; 96 << 20]));
    write_plan(&path, &header(w), &data).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let cutter = {
        let path = path.clone();
        std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(len / 2).unwrap();
        })
    };
    // Whichever wins the race, opening is an error naming the file, or a
    // plan whose weight bytes are all still readable.
    let opened = PlanFile::open(&path);
    cutter.join().unwrap();
    match opened {
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("changed while it was being read") || e.contains("truncated plan file"),
                "{e}"
            );
        }
        Ok(plan) => {
            let err = plan.section_bytes(w).unwrap_err().to_string();
            assert!(err.contains("changed while it was being read"), "{err}");
        }
    }
}

/// A directory as the plan says so (not "No such device").
#[test]
fn a_directory_as_the_plan_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = PlanFile::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("is a directory, not a regular file"), "{err}");
}

/// A layout whose sections are reserved and filled while the plan is
/// written gives the very file a layout holding the same bytes gives, and
/// each section's bytes are asked for only when that section is written.
#[test]
fn a_streamed_plan_is_the_same_file_as_one_written_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sections: Vec<Vec<u8>> = [3usize, 1000, 257, 9 << 20]
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| (i * 31 + k) as u8).collect())
        .collect();
    let tokenizer: &[u8] = b"{\"tokenizer\": 1}";
    let (mut held, mut streamed) = (DataLayout::default(), DataLayout::default());
    let mut refs = Vec::new();
    for s in &sections {
        refs.push(held.push(Cow::Borrowed(s)));
        assert_eq!(streamed.reserve(s.len() as u64), *refs.last().unwrap());
    }
    let tok = held.push(Cow::Borrowed(tokenizer));
    assert_eq!(streamed.push(Cow::Borrowed(tokenizer)), tok);
    let mut h = header(refs[3]);
    h.text.tokenizer = Some(tok);
    let (plain, stream) = (dir.path().join("a.plan"), dir.path().join("b.plan"));
    write_plan(&plain, &h, &held).unwrap();
    let mut asked = Vec::new();
    let written = std::cell::Cell::new(0);
    write_plan_streaming(
        &stream,
        &h,
        &streamed,
        |k| {
            // Section k is asked for once the sections before it are written.
            let gap = refs[k].offset.checked_sub(written.get());
            assert!(gap < Some(SECTION_ALIGN), "section {k} asked for early");
            asked.push(k);
            Ok::<_, PlanError>(Cow::Owned(sections[k].clone()))
        },
        &mut |done, _| written.set(done),
    )
    .unwrap();
    assert_eq!(asked, [0, 1, 2, 3]);
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&stream).unwrap()
    );
    PlanFile::open(&stream).unwrap();
}

/// A section that cannot be made stops the write with the caller's own
/// error and leaves no file behind; a section of the wrong size, and a
/// reserved section given to `write_plan`, are errors too.
#[test]
fn a_streamed_section_that_fails_leaves_no_file() {
    #[derive(Debug)]
    enum Mine {
        Weight(&'static str),
        Plan(PlanError),
    }
    impl From<PlanError> for Mine {
        fn from(e: PlanError) -> Self {
            Mine::Plan(e)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.plan");
    let mut data = DataLayout::default();
    data.reserve(4 << 20);
    let w = data.reserve(16);
    let h = header(w);
    let fail = |k| match k {
        0 => Ok(Cow::Owned(vec![1u8; 4 << 20])),
        _ => Err(Mine::Weight("bad tensor")),
    };
    let e = write_plan_streaming(&path, &h, &data, fail, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, Mine::Weight("bad tensor")), "{e:?}");
    let short = |_| Ok::<_, Mine>(Cow::Owned(vec![0u8; 8]));
    let e = write_plan_streaming(&path, &h, &data, short, &mut |_, _| {}).unwrap_err();
    let Mine::Plan(e) = e else { panic!("{e:?}") };
    assert!(
        e.to_string()
            .contains("reserved section 0 was reserved for 4194304 bytes but given 8"),
        "{e}"
    );
    let e = write_plan(&path, &h, &data).unwrap_err();
    assert!(
        e.to_string()
            .contains("reserved section 0 was given no bytes"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `split_x` is written only where true, and a variant without it (every
/// variant of a plan from before it) reads as false.
#[test]
fn split_x_is_written_when_true_and_absent_reads_false() {
    let mut h = header(SectionRef { offset: 0, len: 8 });
    h.variants[0].split_x = true;
    let json = serde_json::to_value(&h.variants[0]).unwrap();
    assert_eq!(json["split_x"], true);
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("split_x");
    let v: Variant = serde_json::from_value(old).unwrap();
    assert!(!v.split_x);
    h.variants[0].split_x = false;
    let json = serde_json::to_value(&h.variants[0]).unwrap();
    assert!(json.get("split_x").is_none(), "{json}");
}
