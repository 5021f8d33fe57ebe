//! GPU faults, injected on a real device: a plan needing more than the
//! adapter allows, the device running out of memory while a model loads, and
//! the device lost in the middle of a generation. Each must end in a typed
//! error whose message says what happened and what to do — never a panic,
//! never a hang (every test runs under a deadline).
//!
//! The surprise: a process shares one device between its sessions, so the
//! out-of-memory hook and a device loss reach every model of this binary;
//! the tests hold the GPU lock, undo the hook when done, and a lost device is
//! replaced by a fresh one at the next load.

use gerbil::{Error, Generation, GenerationSettings, Model, ModelOptions, Piece};
use gerbil_e2e::*;
use gerbil_plan::{PlanFile, Requirements};
use gerbil_runtime::{Gpu, RuntimeError};
use pollster::block_on;
use std::sync::mpsc;
use std::time::Duration;

/// Longest any test may take: a wait that hangs fails the test instead.
const DEADLINE: Duration = Duration::from_secs(300);

/// Runs `f` on a thread of its own and returns its result, failing the test
/// if it takes longer than [`DEADLINE`] (a hang) or panics.
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung for {DEADLINE:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test thread panicked"),
    }
}

fn tiny_plan() -> (TempFile, PlanFile) {
    let file = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&file).expect("plan");
    (file, plan)
}

fn greedy(n: usize) -> GenerationSettings {
    GenerationSettings {
        max_new_tokens: n,
        ignore_eos: true,
        ..GenerationSettings::default()
    }
}

/// The pieces of `g` up to its first error, and the error (`None` when the
/// generation ended without one).
fn until_error(g: &mut Generation<'_>) -> (Vec<Piece>, Option<Error>) {
    let mut pieces = Vec::new();
    while let Some(p) = block_on(g.next()) {
        match p {
            Ok(p) => pieces.push(p),
            Err(e) => return (pieces, Some(e)),
        }
    }
    (pieces, None)
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
    assert!(!message.contains("panicked"), "{message}");
}

/// The message of the [`RuntimeError::NoVariant`] that opening `plan` with
/// `opts` must end in.
fn no_variant(plan: &PlanFile, opts: &gerbil_runtime::SessionOptions) -> String {
    match block_on(gerbil_runtime::Session::open(plan, opts)) {
        Ok(_) => panic!("a session opened where no variant should run"),
        Err(e @ RuntimeError::NoVariant { .. }) => e.to_string(),
        Err(e) => panic!("not NoVariant: {e:?}"),
    }
}

/// The tensor-core variant asked for where the device has no tensor cores
/// (lavapipe; or a GPU with them turned off) is refused with what is
/// missing and both reasons it can be, not only the feature's name.
#[test]
fn a_tensor_core_variant_asked_for_without_tensor_cores_says_why() {
    let _gpu = gpu_lock();
    let path = compile_plan(&tiny_model("llama"), |o| {
        o.target = gerbil_codegen_wgsl::Target::desktop();
    });
    let plan = PlanFile::open(&path).expect("plan");
    let opts = gerbil_runtime::SessionOptions {
        variant: Some("tensor-f16".into()),
        tensor_cores: false,
        ..gerbil_runtime::SessionOptions::default()
    };
    assert_mentions(
        &no_variant(&plan, &opts),
        &[
            "`tensor-f16` needs cooperative_matrix",
            "this adapter has none, or they were turned off with `--no-tensor-cores` or \
             GERBIL_TENSOR_CORES=0",
        ],
    );
}

/// A plan from before the tensor-core GEMMs split `x` (its `tensor-f16`
/// without `split_x`) does not run that variant unasked, and says why and
/// what to do; the compiler marks the variants it writes.
#[test]
fn an_old_plans_tensor_core_variant_is_not_run_unasked() {
    let _gpu = gpu_lock();
    let (_file, mut plan) = tiny_plan();
    let tensor = plan
        .header
        .variants
        .iter()
        .find(|v| v.name == "tensor-f16")
        .expect("a default plan has a tensor-core variant");
    assert!(tensor.split_x, "the compiler marks its tensor-core variant");
    plan.header.variants.retain(|v| v.name == "tensor-f16");
    plan.header.variants[0].split_x = false;
    assert_mentions(
        &no_variant(&plan, &gerbil_runtime::SessionOptions::default()),
        &[
            "`tensor-f16` comes from an older gerbil",
            "recompile the plan, or name it (--variant tensor-f16)",
        ],
    );
}

#[test]
fn a_plan_needing_more_than_the_adapter_allows_names_the_limit_and_both_values() {
    let _gpu = gpu_lock();
    within_deadline(|| {
        let (_file, mut plan) = tiny_plan();
        let gpu = block_on(Gpu::open(&Requirements::default())).expect("a GPU");
        let have = gpu.limits.max_storage_buffer_binding_size;
        let needed = have + 4;
        for v in &mut plan.header.variants {
            v.requirements.max_storage_buffer_binding_size = needed;
        }
        let err = match block_on(Model::load(&plan, &ModelOptions::default())) {
            Ok(_) => panic!("a plan over the adapter's limit loaded"),
            Err(e) => e,
        };
        assert!(
            matches!(err, Error::Runtime(RuntimeError::NoVariant { .. })),
            "{err:?}"
        );
        let message = err.to_string();
        assert_mentions(
            &message,
            &[
                &format!(
                    "the GPU `{}` can run none of the plan's variants",
                    gpu.adapter.name
                ),
                &format!(
                    "needs max_storage_buffer_binding_size of {needed}, the device's is {have}"
                ),
                "--max-context",
                "--device N",
            ],
        );

        // Opening a device for the same requirements names the limit too.
        let need = Requirements {
            max_storage_buffer_binding_size: needed,
            ..Requirements::default()
        };
        let err = match block_on(Gpu::open(&need)) {
            Ok(_) => panic!("a device opened for more than the adapter allows"),
            Err(e) => e,
        };
        assert!(matches!(err, RuntimeError::Limit { .. }), "{err:?}");
        assert_mentions(
            &err.to_string(),
            &[
                &format!("its max_storage_buffer_binding_size is {have}, the plan needs {needed}"),
                "recompile the plan for this device",
                "`gerbil-run devices`",
            ],
        );
    });
}

/// Ends the out-of-memory injection when dropped, however the test ends.
struct NoInjection(Gpu);

impl Drop for NoInjection {
    fn drop(&mut self) {
        self.0.inject_out_of_memory_over(None);
    }
}

#[test]
fn running_out_of_memory_while_loading_names_the_buffer_the_bytes_and_the_remedies() {
    let _gpu = gpu_lock();
    within_deadline(|| {
        let (_file, plan) = tiny_plan();
        let gpu = block_on(Gpu::open(&Requirements::default())).expect("a GPU");
        let _undo = NoInjection(gpu.clone());
        gpu.inject_out_of_memory_over(Some(1024));
        let err = match block_on(Model::load(&plan, &ModelOptions::default())) {
            Ok(_) => panic!("loaded with every buffer over 1 KiB refused"),
            Err(e) => e,
        };
        let Error::Runtime(RuntimeError::OutOfMemory { bytes, .. }) = &err else {
            panic!("not an out-of-memory error: {err:?}");
        };
        let bytes = bytes.expect("the bytes asked for");
        assert!(bytes > 1024, "{err}");
        assert_mentions(
            &err.to_string(),
            &[
                &format!(
                    "out of GPU memory on `{}` while allocating buffer `",
                    gpu.adapter.name
                ),
                &format!("(asked for {bytes} bytes, "),
                "a smaller --ctx",
                "--precision f16",
                "a smaller model",
            ],
        );

        // Memory back, the same plan loads and runs.
        gpu.inject_out_of_memory_over(None);
        let mut model = block_on(Model::load(&plan, &ModelOptions::default())).expect("load");
        let case = &tiny_ref("llama").cases[0];
        let mut g = model.generate(&case.input_ids, &greedy(2)).expect("start");
        let (pieces, error) = until_error(&mut g);
        assert!(error.is_none(), "{error:?}");
        assert_eq!(pieces.len(), 2);
    });
}

/// Loses the device after `after` tokens of a generation whose tokens come
/// from the GPU's sampler (`top_logits: None`) or the CPU's (`Some`), then
/// checks the generation, a second one on the same model and a fresh load.
fn lose_the_device_mid_generation(top_logits: Option<usize>) {
    let (_file, plan) = tiny_plan();
    let case = &tiny_ref("llama").cases[1];
    let mut model = block_on(Model::load(&plan, &ModelOptions::default())).expect("load");
    let gpu = model.session().gpu().clone();
    let room = (model.context() as usize - case.input_ids.len()).min(64);
    let settings = GenerationSettings {
        top_logits,
        ..greedy(room)
    };
    let after = 3;
    let mut g = model.generate(&case.input_ids, &settings).expect("start");
    for _ in 0..after {
        block_on(g.next())
            .expect("a token")
            .expect("a token before the loss");
    }
    gpu.inject_device_loss();
    let (pieces, error) = until_error(&mut g);
    let err = error.unwrap_or_else(|| {
        panic!(
            "the generation ended without an error after {} more tokens",
            pieces.len()
        )
    });
    // The GPU sampler decodes a few batches ahead: tokens already read back
    // may still come, but not the whole generation.
    assert!(after + pieces.len() < room, "{} tokens", pieces.len());
    assert!(
        matches!(err, Error::Runtime(RuntimeError::DeviceLost { .. })),
        "{err:?}"
    );
    assert_mentions(
        &err.to_string(),
        &[
            &format!("the GPU `{}` was lost while ", gpu.adapter.name),
            "the device was destroyed",
            "load the model again",
            "dmesg",
        ],
    );
    assert!(block_on(g.next()).is_none(), "the generation ended");
    drop(g);
    assert!(gpu.lost().is_some());

    // The model's device stays lost: the next generation fails at once.
    let mut g = model.generate(&case.input_ids, &settings).expect("start");
    let (pieces, error) = until_error(&mut g);
    assert!(pieces.is_empty(), "{pieces:?}");
    let err = error.expect("an error on a lost device");
    assert!(
        matches!(err, Error::Runtime(RuntimeError::DeviceLost { .. })),
        "{err:?}"
    );
    drop(g);
    drop(model);

    // Loading again opens a fresh device, which runs.
    let mut model = block_on(Model::load(&plan, &ModelOptions::default())).expect("reload");
    assert!(model.session().gpu().lost().is_none());
    let n = case.greedy_ids.len();
    let mut g = model.generate(&case.input_ids, &greedy(n)).expect("start");
    let (pieces, error) = until_error(&mut g);
    assert!(error.is_none(), "{error:?}");
    let tokens: Vec<u32> = pieces.iter().map(|p| p.token).collect();
    assert_eq!(tokens, case.greedy_ids, "the fresh device decodes right");
}

#[test]
fn a_device_lost_while_the_gpu_samples_ends_the_generation_with_device_lost() {
    let _gpu = gpu_lock();
    within_deadline(|| lose_the_device_mid_generation(None));
}

#[test]
fn a_device_lost_while_the_cpu_samples_ends_the_generation_with_device_lost() {
    let _gpu = gpu_lock();
    within_deadline(|| lose_the_device_mid_generation(Some(2)));
}
