//! Model families against HF transformers reference outputs on the tiny
//! random-weight models: every recorded logit, greedy continuations and
//! sampling, through every variant, pass set, chunking and sharding (the
//! real checkpoints are [`crate::real_checkpoints`]'s).

use gerbil::{GenerationSettings, Model, ModelOptions};
use gerbil_e2e::*;
use gerbil_plan::PlanFile;
use gerbil_plan::Precision;
use gerbil_runtime::{argmax, PrecisionChoice, SamplingParams, Session, SessionOptions};
use pollster::block_on;
use std::path::Path;

/// Random-weight variants of the tiny models (shared with the frontend's tests).
#[path = "../../crates/frontend-hf/tests/common/random_checkpoint.rs"]
mod random_checkpoint;

/// Tolerance on tiny-model logits in f32 compute (shared/models/README.md).
const TINY_TOL: f32 = 1e-3;
/// Tolerance on logits of the f16 variants (an f16 KV cache), tiny and real
/// models alike (the decode issue's bound).
pub(crate) const F16_TOL: f32 = 5e-2;

/// A session on `plan` running only variants of `precision`.
pub(crate) fn session_at(plan: &PlanFile, precision: Precision) -> Session {
    let opts = SessionOptions {
        precision: PrecisionChoice::Only(precision),
        ..SessionOptions::default()
    };
    let session = block_on(Session::open(plan, &opts)).expect("session");
    assert_eq!(session.variant().precision, precision, "variant precision");
    session
}

/// The facade's model on `plan` (f32 variants; the one called `variant`
/// where given), for what generation does.
fn model_at_f32(plan: &PlanFile, variant: Option<&str>) -> Model {
    let opts = ModelOptions {
        session: SessionOptions {
            precision: PrecisionChoice::Only(Precision::F32),
            variant: variant.map(str::to_string),
            ..SessionOptions::default()
        },
        ..ModelOptions::default()
    };
    let model = block_on(Model::load(plan, &opts)).expect("model");
    assert_eq!(model.session().variant().precision, Precision::F32);
    model
}

/// Sampling through the generation loop users run: the GPU's sampler
/// (decode-ahead) draws what the CPU sampler draws from read-back logits
/// (asking for top logits keeps the CPU in the loop).
fn check_sampled(model: &mut Model, case: &TinyCase) -> Result<(), String> {
    let sampling = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.02,
        seed: 42,
        ..SamplingParams::default()
    };
    let mut sampled = |top_logits| -> Result<Vec<u32>, String> {
        model.clear_cache();
        let settings = GenerationSettings {
            max_new_tokens: case.greedy_ids.len(),
            sampling,
            ignore_eos: true,
            top_logits,
            ..GenerationSettings::default()
        };
        let mut g = model
            .generate(&case.input_ids, &settings)
            .map_err(|e| e.to_string())?;
        let mut tokens = Vec::new();
        while let Some(piece) = block_on(g.next()) {
            tokens.push(piece.map_err(|e| e.to_string())?.token);
        }
        Ok(tokens)
    };
    let (gpu, cpu) = (sampled(None)?, sampled(Some(1))?);
    if gpu != cpu {
        return Err(format!("sampled on the GPU: {gpu:?}, on the CPU: {cpu:?}"));
    }
    Ok(())
}

/// Every tiny model of `tests/data/models/tiny` and what it exercises
/// (shared/models/README.md): the table the family tests run over.
const TINY_MODELS: &[(&str, &str)] = &[
    ("llama", "Llama, tied embeddings"),
    ("llama_bf16", "Llama, bf16 checkpoint"),
    ("qwen2", "q/k/v biases, untied LM head, θ 1e6"),
    ("qwen3", "per-head q/k norms, head_dim 32 with hidden 64"),
    ("mistral", "sliding window 4"),
    (
        "gemma3",
        "sandwich norms, (1 + w), √hidden embedding, GeGLU, 1 KV head, \
         sliding and full layers with their own RoPE, query_pre_attn_scalar, logit softcap",
    ),
    ("phi3", "fused qkv_proj and gate_up_proj"),
];

/// Checks one reference case on `model`: the last logits after a prefill,
/// the logits of every position fed one token at a time through the decode
/// path (when recorded), the greedy tokens, and sampling through both
/// samplers. Returns what differed.
fn check_case(model: &mut Model, case: &TinyCase) -> Result<(), String> {
    check_logits(model, case)?;
    check_gpu_greedy(model.session_mut(), case)?;
    check_sampled(model, case)
}

/// [`check_case`]'s logits and greedy tokens (what matching transformers
/// means), without the GPU decoding and sampling paths.
fn check_logits(model: &mut Model, case: &TinyCase) -> Result<(), String> {
    let session = model.session_mut();
    session.reset();
    let last = block_on(session.forward(&case.input_ids)).map_err(|e| e.to_string())?;
    let d = max_abs_diff(&last, &case.last_logits);
    if d > TINY_TOL {
        return Err(format!("last logits differ by {d}"));
    }

    if let Some(all) = &case.logits {
        session.reset();
        for (pos, (&id, want)) in case.input_ids.iter().zip(all).enumerate() {
            let got = block_on(session.forward(&[id])).map_err(|e| e.to_string())?;
            let d = max_abs_diff(&got, want);
            if d > TINY_TOL {
                return Err(format!(
                    "position {pos} logits differ by {d} (token-by-token)"
                ));
            }
        }
    }

    session.reset();
    let mut logits = block_on(session.forward(&case.input_ids)).map_err(|e| e.to_string())?;
    let mut greedy = Vec::new();
    for _ in 0..case.greedy_ids.len() {
        let next = argmax(&logits);
        greedy.push(next);
        logits = block_on(session.forward(&[next])).map_err(|e| e.to_string())?;
    }
    if greedy != case.greedy_ids {
        return Err(format!(
            "greedy tokens {greedy:?}, reference {:?}",
            case.greedy_ids
        ));
    }
    Ok(())
}

/// GPU greedy decoding (argmax on the GPU, steps encoded ahead in batches)
/// gives the reference tokens at every batch size; sampling on the GPU
/// draws the CPU sampler's tokens; with a reference token
/// as end-of-sequence it stops there even in the middle of a batch, and
/// leaves the KV cache where step-by-step decoding would: feeding the stop
/// token then predicts the reference's next token.
fn check_gpu_greedy(session: &mut Session, case: &TinyCase) -> Result<(), String> {
    let want = &case.greedy_ids;
    let err = |e: gerbil_runtime::RuntimeError| e.to_string();
    // Batches of 1, 3 and 8 steps, and batches doubling from 1 to 8 (a browser's).
    for batches in [(1, 1), (3, 3), (8, 8), (1, 8)] {
        session.reset();
        block_on(session.forward_no_readback(&case.input_ids)).map_err(err)?;
        let got =
            block_on(session.decode_on_gpu(want.len(), &[], batches, |_| true)).map_err(err)?;
        if &got != want {
            return Err(format!(
                "GPU greedy (batches {batches:?}): {got:?}, reference {want:?}"
            ));
        }
    }
    if want.len() < 3 {
        return Ok(());
    }
    let eos = want[2];
    let stop = want.iter().position(|&t| t == eos).unwrap_or(2);
    session.reset();
    block_on(session.forward_no_readback(&case.input_ids)).map_err(err)?;
    let got = block_on(session.decode_on_gpu(want.len(), &[eos], (8, 8), |_| true)).map_err(err)?;
    if got != want[..=stop] {
        return Err(format!(
            "GPU greedy with stop token {eos}: {got:?}, reference {:?}",
            &want[..=stop]
        ));
    }
    let position = (case.input_ids.len() + stop) as u64;
    if session.position() != position {
        return Err(format!(
            "after a stop token mid-batch the position is {}, expected {position}",
            session.position()
        ));
    }
    if let Some(&next) = want.get(stop + 1) {
        let logits = block_on(session.forward(&[eos])).map_err(err)?;
        if argmax(&logits) != next {
            return Err(format!(
                "after a stop token mid-batch the next step predicts {}, reference {next}",
                argmax(&logits)
            ));
        }
    }
    Ok(())
}

/// Compiles tiny model `name` once, with options adjusted by `tweak`, and
/// checks every case of its reference; returns one line per failed case.
fn tiny_failures(
    name: &str,
    variant: &str,
    tweak: impl FnOnce(&mut gerbil_compiler::CompileOptions),
) -> Vec<String> {
    tiny_failures_of(name, variant, tweak, check_case)
}

/// [`tiny_failures`] with `check` in place of [`check_case`].
fn tiny_failures_of(
    name: &str,
    variant: &str,
    tweak: impl FnOnce(&mut gerbil_compiler::CompileOptions),
    check: CaseCheck,
) -> Vec<String> {
    let plan = compile_plan(&tiny_model(name), tweak);
    plan_failures(name, variant, &plan, &tiny_ref(name), check)
}

/// What to check of one reference case: [`check_case`] or [`check_logits`].
type CaseCheck = fn(&mut Model, &TinyCase) -> Result<(), String>;

/// Checks every case of `reference` on the plan at `path` with `check`,
/// through the best f32 variant (on lavapipe the `cpu` variant of a
/// portable plan); returns one line per failed case, labelled `label`.
fn plan_failures(
    name: &str,
    label: &str,
    path: &Path,
    reference: &TinyRef,
    check: CaseCheck,
) -> Vec<String> {
    variant_failures(name, label, None, path, reference, check)
}

/// [`plan_failures`] through the plan's variant called `variant` where
/// given.
fn variant_failures(
    name: &str,
    label: &str,
    variant: Option<&str>,
    path: &Path,
    reference: &TinyRef,
    check: CaseCheck,
) -> Vec<String> {
    let plan = PlanFile::open(path).expect("open plan");
    let _gpu = gpu_lock();
    let mut model = model_at_f32(&plan, variant);
    reference
        .cases
        .iter()
        .filter_map(|case| {
            check(&mut model, case)
                .err()
                .map(|e| format!("{name}/{} ({label}): {e}", case.name))
        })
        .collect()
}

/// Panics listing every failure.
fn assert_none_failed(failures: Vec<String>, total: usize) {
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// [`tiny_failures`] for one model, failing the test on any failure.
fn check_tiny_with(
    name: &str,
    variant: &str,
    tweak: impl FnOnce(&mut gerbil_compiler::CompileOptions),
) {
    let total = tiny_ref(name).cases.len();
    assert_none_failed(tiny_failures(name, variant, tweak), total);
}

/// Every family against transformers: for each tiny model and each of its
/// reference inputs (1 and 13 tokens), the prefill's last logits, every
/// position's logits through the decode path, and 8 greedy tokens, through
/// both variants of the default plan: `cpu` (what lavapipe runs by
/// default) and `portable` (what a browser on a GPU runs).
#[test]
fn tiny_models_match_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, _) in TINY_MODELS {
        let plan = compile_plan(&tiny_model(name), |_| {});
        let reference = tiny_ref(name);
        for variant in ["cpu", "portable"] {
            total += reference.cases.len();
            failures.extend(variant_failures(
                name,
                variant,
                Some(variant),
                &plan,
                &reference,
                check_case,
            ));
        }
    }
    assert_none_failed(failures, total);
}

/// The tiny models as GGUF files written the way llama.cpp's converter
/// writes them (`scripts/make-tiny-gguf.py`: gguf-py's key and tensor names,
/// Llama's permuted query and key rows, f32 data): the plan of each file
/// gives the logits transformers gives for the original checkpoint.
#[test]
fn tiny_gguf_files_match_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    for name in ["llama", "qwen2", "qwen3", "phi3"] {
        let plan = compile_plan(&tiny_gguf(name), |_| {});
        let reference = tiny_ref(name);
        total += reference.cases.len();
        failures.extend(plan_failures(name, "gguf", &plan, &reference, check_logits));
    }
    assert_none_failed(failures, total);
}

/// The tiny models quantized to every block type gguf-py writes (Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1; `scripts/make-tiny-gguf.py`) against
/// transformers loading each file itself: logits within the tiny tolerance,
/// greedy tokens identical. (transformers cannot run the Qwen 3 files: its
/// GGUF loader ignores `attention.key_length`, which Qwen 3's head width
/// needs; their dequantization is the other families'.) Every file through
/// the `portable` variant, which dots the blocks with `x` one by one; the
/// Llama's five through `cpu` too, which dequantizes whole units, and one of
/// Qwen 2's (its q/k/v biases: the quantized matmul's bias epilogue). The
/// tiny families share their widths, and Phi-3 lowers to the Llama's graph,
/// so the other files would only repeat those kernels (a second of
/// lavapipe's compiler each, with a cold cache).
#[test]
fn quantized_tiny_gguf_files_match_transformers_on_the_same_file() {
    let mut failures = Vec::new();
    let mut total = 0;
    let names = tiny_gguf_refs();
    for block in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"] {
        for family in ["llama", "qwen2", "phi3"] {
            let name = format!("{family}-{block}");
            assert!(names.contains(&name), "no reference for {name}");
        }
    }
    for name in names {
        let plan = compile_plan(&tiny_gguf(&name), |_| {});
        let reference = tiny_gguf_ref(&name);
        let variants: &[&str] = if name.starts_with("llama-") || name == "qwen2-Q4_1" {
            &["cpu", "portable"]
        } else {
            &["portable"]
        };
        for &variant in variants {
            total += reference.cases.len();
            failures.extend(variant_failures(
                &name,
                variant,
                Some(variant),
                &plan,
                &reference,
                check_logits,
            ));
        }
    }
    assert_none_failed(failures, total);
}

/// Logit tolerance of the `subgroups-f16-i8` variant on the tiny quantized
/// models: its decode GEMVs round `x` to int8 per 32 values (0.27 was the
/// largest difference from transformers measured on them).
const INT8_TOL: f32 = 0.4;

/// A quantized plan of the desktop target carries `subgroups-f16-i8`, whose
/// decode GEMVs dot the blocks with int8 activations (`gemv::Dots::Int8`;
/// its kernels match the f64 reference on rounded `x` exactly, see
/// `kernels::quantized_weights_match_reference`): the tiny Llama's GGUF of
/// each block type on it within [`INT8_TOL`] of transformers loading the
/// file, the greedy tokens identical but at near-ties (as
/// [`tiny_models_f16_match_transformers`]); the float plan has no such variant.
#[test]
fn quantized_tiny_gguf_files_on_int8_dots_match_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    let desktop =
        |o: &mut gerbil_compiler::CompileOptions| o.target = gerbil_codegen_wgsl::Target::desktop();
    for block in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"] {
        let name = format!("llama-{block}");
        let reference = tiny_gguf_ref(&name);
        let plan_path = compile_plan(&tiny_gguf(&name), desktop);
        let plan = PlanFile::open(&plan_path).expect("open plan");
        let _gpu = gpu_lock();
        let opts = SessionOptions {
            variant: Some("subgroups-f16-i8".into()),
            ..SessionOptions::default()
        };
        let mut int8 = block_on(Session::open(&plan, &opts)).expect("the int8 variant");
        let mut f32 = session_at(&plan, Precision::F32);
        for case in &reference.cases {
            total += 1;
            if let Err(e) = check_f16_case(&mut int8, &mut f32, case, INT8_TOL) {
                failures.push(format!("{name}/{} (int8 dots): {e}", case.name));
            }
        }
    }
    assert_none_failed(failures, total);
    let float = PlanFile::open(&compile_plan(&tiny_model("llama"), desktop)).expect("open plan");
    let names: Vec<&str> = float
        .header
        .variants
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert!(!names.contains(&"subgroups-f16-i8"), "{names:?}");
}

/// `--quantize q8_0` of the tiny float models (every matrix whose rows are
/// whole blocks, the tied LM head included) makes the blocks gguf-py makes,
/// so each plan matches transformers loading the family's Q8_0 GGUF: the
/// quantizer and the retyping, through Llama's fused Q/K/V, Qwen 2's biases
/// and Phi-3's row-sliced `qkv_proj` and `gate_up_proj`.
#[test]
fn quantized_checkpoints_match_transformers_on_the_gguf_of_their_blocks() {
    let mut failures = Vec::new();
    let mut total = 0;
    for family in ["llama", "qwen2", "phi3"] {
        let plan = compile_plan(&data_dir().join("models/tiny").join(family), |o| {
            o.quantize = Some(gerbil_compiler::Quantization::Q8_0);
        });
        let name = format!("{family}-Q8_0");
        let reference = tiny_gguf_ref(&name);
        total += reference.cases.len();
        failures.extend(plan_failures(
            &name,
            "--quantize q8_0",
            &plan,
            &reference,
            check_logits,
        ));
    }
    assert_none_failed(failures, total);
}

#[test]
fn the_table_covers_every_tiny_model() {
    let mut on_disk: Vec<String> = std::fs::read_dir(data_dir().join("models/tiny"))
        .expect("tiny models dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = TINY_MODELS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(listed, on_disk);
}

#[test]
fn chunked_prefill_matches_transformers() {
    // 13 prompt tokens in chunks of 4, 4, 4, 1; Gemma 3's and Mistral's
    // windows of 4 then span chunk boundaries.
    let mut failures = Vec::new();
    let mut total = 0;
    for name in ["llama", "mistral", "gemma3"] {
        total += tiny_ref(name).cases.len();
        failures.extend(tiny_failures(name, "chunk 4", |o| {
            o.max_tokens_per_step = Some(4)
        }));
    }
    assert_none_failed(failures, total);
}

/// The `desktop` target's plan at `--precision f32`, on an adapter with
/// subgroups (lavapipe has them), runs its `subgroups` variant: decode GEMVs
/// that reduce with `subgroupAdd`. Every family matches transformers
/// through it too.
#[test]
fn desktop_target_matches_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, _) in TINY_MODELS {
        total += tiny_ref(name).cases.len();
        failures.extend(tiny_failures(name, "desktop", |o| {
            o.target = gerbil_codegen_wgsl::Target::desktop()
        }));
    }
    assert_none_failed(failures, total);
}

/// The passes whose rewrites reach what the decoding paths read: the rows
/// of logits a sampler picks from.
const DECODING_PASSES: [&str; 2] = ["slice-last-row", "fuse-last-row-matmul"];

/// Every pass of the default pipeline is optional for correctness: each
/// tiny model still matches transformers with any one of them disabled.
/// A pass that rewrites nothing in a model's full pipeline leaves every
/// later graph, and so the plan, as they are without it: that plan is the
/// full pipeline's, checked once per model rather than once per such pass.
/// Without a pass of [`DECODING_PASSES`] a plan gets every check of
/// [`check_case`]; without another (a fusion, `dce`) the logits of every
/// position and the greedy tokens ([`check_logits`]): such a pass changes
/// only kernels that compute logits, and the decoding paths after them run
/// as in every other plan (the GPU decoding and sampling checks were half
/// of this test's minute and a half on lavapipe). The bf16 Llama and Phi-3
/// get the full pipeline's check only: their graphs are the Llama's (bf16
/// weights; fused projections the frontend splits), so disabling a pass
/// there would only compile the Llama's rewrites again.
#[test]
fn every_optional_pass_can_be_disabled() {
    let passes: Vec<&str> = gerbil_passes::default_pipeline()
        .iter()
        .map(|p| p.name())
        .collect();
    for pass in DECODING_PASSES.iter().chain(&["fuse-residual-norm"]) {
        assert!(
            passes.contains(pass),
            "{pass} is not a pass of the default pipeline: {passes:?}"
        );
    }
    let chunk_8 = |o: &mut gerbil_compiler::CompileOptions| o.max_tokens_per_step = Some(8);
    let mut failures = Vec::new();
    let mut total = 0;
    let mut idle = 0;
    for &(name, _) in TINY_MODELS {
        let reference = tiny_ref(name);
        let (full, report) = compile_plan_reporting(&tiny_model(name), chunk_8);
        total += reference.cases.len();
        failures.extend(plan_failures(
            name,
            "every pass",
            &full,
            &reference,
            check_case,
        ));
        for pass in &passes {
            let run = report.ran.iter().find(|r| r.name == *pass);
            if !run
                .unwrap_or_else(|| panic!("{pass} did not run"))
                .changed()
            {
                idle += 1;
                continue;
            }
            if matches!(name, "llama_bf16" | "phi3") {
                continue;
            }
            total += reference.cases.len();
            let check = if DECODING_PASSES.contains(pass) {
                check_case
            } else {
                check_logits
            };
            failures.extend(tiny_failures_of(
                name,
                &format!("without {pass}"),
                |o| {
                    chunk_8(o);
                    o.disabled_passes = vec![pass.to_string()];
                },
                check,
            ));
        }
    }
    eprintln!(
        "{idle} of {} (pass, model) pairs rewrite nothing",
        passes.len() * TINY_MODELS.len()
    );
    assert_none_failed(failures, total);
}

#[test]
fn weights_larger_than_a_binding_are_sharded() {
    // The tied 512×64 f32 embedding is 128 KiB; 48 KiB bindings hold 192
    // rows, so it becomes 3 shards (192, 192, 128 rows) that both the
    // embedding lookup and the LM head read.
    check_tiny_with("llama", "48 KiB bindings", |o| {
        o.max_storage_binding = Some(48 << 10);
        o.max_tokens_per_step = Some(16);
        o.max_context = Some(64);
    });
}

/// A plan compiled without `slice-last-row` keeps every position's logits:
/// after one prefill of the 13-token prompts, `read_step_logits` returns a
/// row per token, each within the tiny tolerance of transformers' logits at
/// that position, in chunks of 5 (the last chunk's 3 rows) and in one step.
#[test]
fn every_position_logits_match_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, _) in TINY_MODELS {
        let reference = tiny_ref(name);
        for chunk in [5usize, 16] {
            let plan_path = compile_plan(&tiny_model(name), |o| {
                o.disabled_passes = vec!["slice-last-row".into()];
                o.max_tokens_per_step = Some(chunk as u64);
            });
            let plan = PlanFile::open(&plan_path).expect("open plan");
            assert!(plan.header.io.logits_all_rows, "{name}: all rows kept");
            let _gpu = gpu_lock();
            let mut session = session_at(&plan, Precision::F32);
            for case in &reference.cases {
                let Some(all) = &case.logits else { continue };
                total += 1;
                session.reset();
                block_on(session.forward_no_readback(&case.input_ids)).expect("prefill");
                let rows = block_on(session.read_step_logits()).expect("logits");
                let first = (case.input_ids.len() - 1) / chunk * chunk;
                let last = block_on(session.read_logits()).expect("last logits");
                let worst = rows
                    .iter()
                    .zip(&all[first..])
                    .map(|(got, want)| max_abs_diff(got, want))
                    .fold(0f32, f32::max);
                if rows.len() != case.input_ids.len() - first {
                    failures.push(format!("{name} chunk {chunk}: {} rows", rows.len()));
                } else if worst > TINY_TOL || rows.last() != Some(&last) {
                    failures.push(format!("{name} chunk {chunk}: rows differ by {worst}"));
                }
            }
        }
    }
    assert!(total >= TINY_MODELS.len() * 2, "{total} cases");
    assert_none_failed(failures, total);
}

/// Largest difference allowed between two f32 computations of the same
/// logits that only sum in different orders (tiny models: ≤ 1e-5 in torch).
const SAME_MATH_TOL: f32 = 1e-4;

/// A prefill step of at most `SHORT_PROMPT` tokens multiplies through the
/// batch step's matmuls (`gemv_batch`), a longer one through the GEMM
/// tiles. Either form is right for any `T`, so each is checked over every
/// length: the `subgroups` variant as compiled, with its short forms only
/// and with its long forms only (each widened to every step) gives every
/// position the logits the `cpu` variant gives (one matmul kernel for every
/// step), for prompts of 2, `SHORT_PROMPT` (the longest short one), one
/// more, and 90 tokens.
/// Which form a step runs is `Dispatch::runs_at`'s (the plan's tests).
#[test]
fn short_and_long_prompts_take_their_own_matmuls_to_the_same_logits() {
    use gerbil_codegen_wgsl::SHORT_PROMPT;
    use gerbil_plan::TokenRange;
    const CHUNK: u32 = 100;
    let mut failures = Vec::new();
    for name in ["llama", "gemma3"] {
        let plan_path = compile_plan(&tiny_model(name), |o| {
            o.disabled_passes = vec!["slice-last-row".into()];
            o.max_tokens_per_step = Some(CHUNK.into());
        });
        let plan = PlanFile::open(&plan_path).expect("open plan");
        let index = plan
            .header
            .variants
            .iter()
            .position(|v| v.name == "subgroups");
        let index = index.expect("a subgroups variant");
        let forms = |d: &gerbil_plan::Dispatch| d.tokens.map(|r| (r.min, r.max));
        let ranges: Vec<_> = plan.header.variants[index]
            .prefill
            .iter()
            .filter_map(forms)
            .collect();
        assert!(
            ranges.contains(&(1, SHORT_PROMPT)) && ranges.contains(&(SHORT_PROMPT + 1, CHUNK)),
            "{name}: {ranges:?}"
        );
        // The plan with only one form of each matmul, run for every `T`.
        let only = |short: bool| {
            let mut p = PlanFile::open(&plan_path).expect("open plan");
            let prefill = &mut p.header.variants[index].prefill;
            prefill.retain(|d| d.tokens.is_none_or(|r| (r.min == 1) == short));
            for d in prefill.iter_mut() {
                d.tokens = d.tokens.map(|_| TokenRange { min: 1, max: CHUNK });
            }
            p
        };
        let _gpu = gpu_lock();
        let open = |plan: &PlanFile, variant: &str| {
            let opts = SessionOptions {
                variant: Some(variant.into()),
                ..SessionOptions::default()
            };
            block_on(Session::open(plan, &opts)).expect("session")
        };
        let mut cpu = open(&plan, "cpu");
        let mut runs = [
            ("as compiled", open(&plan, "subgroups")),
            ("short forms", open(&only(true), "subgroups")),
            ("long forms", open(&only(false), "subgroups")),
        ];
        let vocab = plan.header.model.vocab_size as usize;
        for len in [2usize, SHORT_PROMPT as usize, SHORT_PROMPT as usize + 1, 90] {
            let tokens: Vec<u32> = (0..len).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
            let logits = |s: &mut Session| {
                s.reset();
                block_on(s.forward_no_readback(&tokens)).expect("prefill");
                block_on(s.read_step_logits()).expect("logits")
            };
            let want = logits(&mut cpu);
            for (form, session) in &mut runs {
                let got = logits(session);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| max_abs_diff(g, w))
                    .fold(0f32, f32::max);
                if got.len() != len || want.len() != len || worst > SAME_MATH_TOL {
                    failures.push(format!(
                        "{name}, {form}, {len} tokens: {} / {} rows, worst |Δ| {worst}",
                        got.len(),
                        want.len()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Shapes that do not divide evenly (head widths that are not multiples of
/// 8, odd MLP widths, 1 and 3 KV heads, partial rotation, YaRN, LongRoPE,
/// windows shorter than the prompt) compile and run: on random weights, a
/// 9-token prompt prefilled in chunks of 4 gives finite, spread-out logits
/// equal to those of the same prompt fed one token at a time (a different
/// matmul and attention path).
#[test]
fn odd_shapes_compile_and_run() {
    use random_checkpoint::{odd_shape_variants, write_variant};
    let root = temp_dir("odd");
    let prompt: Vec<u32> = (0..9).map(|i| 3 + (37 * i) % 500).collect();
    let mut failures = Vec::new();
    let variants = odd_shape_variants();
    for (seed, v) in variants.iter().enumerate() {
        let dir = root.path().join(v.name);
        write_variant(&data_dir().join("models/tiny"), v, &dir, seed as u64);
        let plan_path = compile_plan(&dir, |o| o.max_tokens_per_step = Some(4));
        let plan = PlanFile::open(&plan_path).expect("open plan");
        let _gpu = gpu_lock();
        let mut session = block_on(Session::new(&plan)).expect("session");
        let chunked = block_on(session.forward(&prompt)).expect("prefill");
        session.reset();
        let mut one_by_one = Vec::new();
        for &id in &prompt {
            one_by_one = block_on(session.forward(&[id])).expect("decode");
        }
        let spread = chunked.iter().fold(f32::MIN, |m, &x| m.max(x))
            - chunked.iter().fold(f32::MAX, |m, &x| m.min(x));
        let d = max_abs_diff(&chunked, &one_by_one);
        if chunked.iter().any(|x| !x.is_finite()) {
            failures.push(format!("{}: non-finite logits", v.name));
        } else if spread <= 0.5 {
            failures.push(format!("{}: logits spread only {spread}", v.name));
        } else if d > SAME_MATH_TOL {
            failures.push(format!(
                "{}: chunked prefill and token-by-token logits differ by {d}",
                v.name
            ));
        }
    }
    assert_none_failed(failures, variants.len());
}

/// `--precision f16` on every tiny model (desktop target): every recorded
/// logit within 5e-2 of transformers, and teacher-forced over the reference
/// greedy tokens, each step's argmax is the reference token unless the
/// step is a near-tie: the f32 variant's margin (within 1e-3 of
/// transformers) is below twice the step's f16-vs-f32 logit error.
#[test]
fn tiny_models_f16_match_transformers() {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, _) in TINY_MODELS {
        let reference = tiny_ref(name);
        let plan_path = compile_plan(&tiny_model(name), |o| {
            o.target = gerbil_codegen_wgsl::Target::desktop()
        });
        let plan = PlanFile::open(&plan_path).expect("open plan");
        let _gpu = gpu_lock();
        let mut f16 = session_at(&plan, Precision::F16);
        let mut f32 = session_at(&plan, Precision::F32);
        for case in &reference.cases {
            total += 1;
            if let Err(e) = check_f16_case(&mut f16, &mut f32, case, F16_TOL) {
                failures.push(format!("{name}/{} (f16): {e}", case.name));
            }
        }
    }
    assert_none_failed(failures, total);
}

/// One tiny reference case on the f16 session within `tol`, with the f32 one
/// for margins.
fn check_f16_case(
    f16: &mut Session,
    f32: &mut Session,
    case: &TinyCase,
    tol: f32,
) -> Result<(), String> {
    let err = |e: gerbil_runtime::RuntimeError| e.to_string();
    f16.reset();
    let last = block_on(f16.forward(&case.input_ids)).map_err(err)?;
    let d = max_abs_diff(&last, &case.last_logits);
    if d > tol {
        return Err(format!("last logits differ by {d}"));
    }
    if let Some(all) = &case.logits {
        f16.reset();
        for (pos, (&id, want)) in case.input_ids.iter().zip(all).enumerate() {
            let got = block_on(f16.forward(&[id])).map_err(err)?;
            let d = max_abs_diff(&got, want);
            if d > tol {
                return Err(format!(
                    "position {pos} logits differ by {d} (token-by-token)"
                ));
            }
        }
    }
    f16.reset();
    f32.reset();
    let mut lo = block_on(f16.forward(&case.input_ids)).map_err(err)?;
    let mut hi = block_on(f32.forward(&case.input_ids)).map_err(err)?;
    for (step, &want) in case.greedy_ids.iter().enumerate() {
        let step_err = max_abs_diff(&lo, &hi);
        if step_err > tol {
            return Err(format!(
                "step {step}: f16 and f32 logits differ by {step_err}"
            ));
        }
        let got = argmax(&lo);
        if got != want && margin(&hi) >= 2.0 * step_err {
            return Err(format!(
                "step {step}: f16 greedy token {got}, reference {want} (margin {}, logit error {step_err})",
                margin(&hi)
            ));
        }
        lo = block_on(f16.forward(&[want])).map_err(err)?;
        hi = block_on(f32.forward(&[want])).map_err(err)?;
    }
    Ok(())
}

/// The gap between the largest and second-largest logit.
fn margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::MIN, f32::MIN);
    for &x in logits {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// The plan counts each matmul's arithmetic for `bench --profile`: over a
/// prefill step of `T` tokens, 2·T times the parameters of every layer's
/// projections (from the config, not from the plan), plus 2·hidden·vocab
/// once for the LM head, which computes only the last row.
#[test]
fn prefill_flops_count_every_projection_once() {
    let dir = tiny_model("llama");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("config json");
    let n = |k: &str| cfg[k].as_u64().expect(k);
    let (h, i, d) = (n("hidden_size"), n("intermediate_size"), n("head_dim"));
    let (q, kv) = (n("num_attention_heads") * d, n("num_key_value_heads") * d);
    let per_layer = h * (q + 2 * kv) + q * h + 3 * h * i;
    let plan = PlanFile::open(&compile_plan(&dir, |_| {})).expect("open plan");
    for t in [1u32, 7] {
        let flops: u64 = plan.header.variants[0]
            .prefill
            .iter()
            .map(|d| d.flops.eval(t))
            .sum();
        let want = 2 * u64::from(t) * n("num_hidden_layers") * per_layer + 2 * h * n("vocab_size");
        assert_eq!(flops, want, "T = {t}");
    }
}
