//! The training graph (`gerbil_passes::training_passes`: `autodiff`, then
//! `dce`) of every tiny decoder, run on the CPU interpreter: its loss is
//! the cross-entropy of transformers' recorded logits, and every weight's
//! gradient matches central finite differences of that loss, in f64.
//! The training graph also prints and parses back unchanged, which covers
//! the text form of every backward op a decoder needs. And 50 steps of
//! training with the reference optimizer (`gerbil_interp::optimizer`) on
//! the documented batches (`gerbil_train::Windows`) give the losses and
//! gradient norms PyTorch recorded (`scripts/make-train-refs.py`).
//!
//! No GPU is involved: this is the oracle the training kernels will be
//! checked against.

use gerbil_compiler::Checkpoint;
use gerbil_e2e::interpreter::{Interpreter, Tensor};
use gerbil_e2e::{interpreter_weights, tiny_model, tiny_ref, TINY_DECODERS};
use gerbil_frontend_hf::{lower_with, LowerOptions};
use gerbil_ir::{DType, Graph, UnaryOp, LOSS};
use gerbil_passes::{training_passes, Pass, PassManager};

/// The training graph of a tiny model, lowered for `context` tokens.
fn training_graph(ckpt: &Checkpoint, context: usize) -> Graph {
    let options = LowerOptions {
        max_context: Some(context as u64),
    };
    let mut graph = lower_with(ckpt, &options)
        .unwrap_or_else(|e| panic!("lowering: {e}"))
        .graph;
    PassManager::new(training_passes())
        .run(&mut graph, |_, _| {})
        .unwrap_or_else(|e| panic!("training passes: {e}"));
    graph
}

/// The same graph with the loss as its only output (what a finite
/// difference evaluates: no backward ops).
fn loss_only(training: &Graph) -> Graph {
    let mut graph = training.clone();
    graph.outputs.retain(|(name, _)| name == LOSS);
    gerbil_passes::dce::Dce
        .run(&mut graph)
        .unwrap_or_else(|e| panic!("dce: {e}"));
    graph
}

/// A 13-token prompt of the model's reference and its next-token split.
fn sequence(name: &str) -> (Vec<u32>, Vec<u32>, Vec<Vec<f32>>) {
    let reference = tiny_ref(name);
    let case = reference
        .cases
        .into_iter()
        .find(|c| c.logits.is_some())
        .expect("a case with every position's logits");
    let ids = case.input_ids;
    let logits = case.logits.expect("logits");
    let n = ids.len() - 1;
    (ids[..n].to_vec(), ids[1..].to_vec(), logits[..n].to_vec())
}

/// The mean cross-entropy of transformers' logits rows against `targets`.
fn reference_loss(logits: &[Vec<f32>], targets: &[u32]) -> f64 {
    let per_row = logits.iter().zip(targets).map(|(row, &t)| {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        lse - row[t as usize]
    });
    per_row.sum::<f64>() / targets.len() as f64
}

fn loss_of(out: &[Tensor]) -> f64 {
    out[0].data[0]
}

/// `count` spread, seeded coordinates of `n` values.
fn coordinates(n: usize, count: usize, seed: usize) -> Vec<usize> {
    (0..count)
        .map(|i| (seed * 7919 + i * 104_729 + i * i * 31) % n)
        .collect()
}

#[test]
fn gradients_match_finite_differences_and_the_loss_transformers_logits_give() {
    let mut failures = Vec::new();
    for name in TINY_DECODERS {
        let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (tokens, targets, logits) = sequence(name);
        let graph = training_graph(&ckpt, tokens.len());
        // The padding row's lookups give it no gradient by design (PyTorch's
        // `padding_idx`), which finite differences would not see.
        let padding = graph.g.node_weights().find_map(|n| match &n.op {
            gerbil_ir::Op::Embedding(e) => e.padding,
            _ => None,
        });
        assert!(
            padding.is_none_or(|p| !tokens.contains(&p)),
            "{name}: the prompt holds the padding token"
        );
        let text = gerbil_ir::print::print(&graph);
        let reparsed = gerbil_ir::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            gerbil_ir::print::print(&reparsed),
            text,
            "{name}: the training graph's text does not round-trip"
        );

        let weights = interpreter_weights(&ckpt);
        let mut it = Interpreter::new(&graph, &weights, tokens.len())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = it
            .train_step(&tokens, &targets)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let loss = loss_of(&out);
        let want = reference_loss(&logits, &targets);
        if (loss - want).abs() > 1e-4 * want {
            failures.push(format!(
                "{name}: loss {loss}, transformers' logits give {want}"
            ));
        }

        let loss_graph = loss_only(&graph);
        let mut fd = Interpreter::new(&loss_graph, &weights, tokens.len())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut worst = 0.0f64;
        let grads = graph.outputs.iter().zip(&out).skip(1);
        for (seed, ((output, _), grad)) in grads.enumerate() {
            let label = output.strip_prefix("grad.").expect("a gradient output");
            // Three anywhere, and for a table the prompt reads, one in the
            // rows of its first and last tokens (most rows get no lookup).
            let mut picks = coordinates(grad.data.len(), 3, seed);
            if label == "model.embed_tokens.weight" {
                let width = grad.width;
                for &id in [tokens[0], tokens[tokens.len() - 1]].iter() {
                    picks.push(id as usize * width + seed % width);
                }
            }
            for i in picks {
                let eps = 1e-5;
                let mut at = |delta: f64| {
                    let w = fd.weight_mut(label).expect("the gradient's weight");
                    let saved = w[i];
                    w[i] += delta;
                    let out = fd.train_step(&tokens, &targets).expect("loss step");
                    fd.weight_mut(label).expect("weight")[i] = saved;
                    loss_of(&out)
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                let err = (numeric - grad.data[i]).abs() / numeric.abs().max(1e-3);
                worst = worst.max(err);
                if err > 1e-5 {
                    failures.push(format!(
                        "{name}: {output}[{i}] = {}, finite differences {numeric}",
                        grad.data[i]
                    ));
                }
            }
        }
        eprintln!(
            "{name:<11} loss {loss:.6} (transformers' logits {want:.6}); {} gradients, \
             worst relative error against finite differences {worst:.1e}",
            out.len() - 1
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_training_graph_needs_one_target_per_token() {
    let ckpt = Checkpoint::open(&tiny_model("llama")).unwrap_or_else(|e| panic!("{e}"));
    let graph = training_graph(&ckpt, 4);
    let weights = interpreter_weights(&ckpt);
    let mut it = Interpreter::new(&graph, &weights, 4).unwrap_or_else(|e| panic!("{e}"));
    let err = it.step(&[1, 2]).expect_err("no targets").to_string();
    assert!(err.contains("run it with train_step"), "{err}");
    let err = it.train_step(&[1, 2], &[3]).expect_err("short").to_string();
    assert!(err.contains("1 targets for 2 tokens"), "{err}");
    let err = it
        .train_step(&[1, 2], &[3, 512])
        .expect_err("past")
        .to_string();
    assert!(
        err.contains("target 512 is past the vocabulary of 512"),
        "{err}"
    );
    assert!(it.train_step(&[1, 2], &[2, 3]).is_ok());
}

#[test]
fn codegen_refuses_a_training_graph() {
    let ckpt = Checkpoint::open(&tiny_model("llama")).unwrap_or_else(|e| panic!("{e}"));
    let graph = training_graph(&ckpt, 4);
    let opts = gerbil_codegen_wgsl::CodegenOptions::default();
    let err = match gerbil_codegen_wgsl::generate(&graph, &opts) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a training graph was compiled to a plan"),
    };
    assert!(err.contains("next-token targets"), "{err}");
}

/// One step of PyTorch's recorded training (`scripts/make-train-refs.py`).
#[derive(serde::Deserialize)]
struct RefStep {
    loss: f64,
    grad_norm: f64,
    lr: f64,
}

/// A `train-ref-v1` file: the settings, the token stream and the trajectory.
#[derive(serde::Deserialize)]
struct TrainRef {
    seq_len: usize,
    batch: usize,
    lr: f64,
    warmup: u64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    max_grad_norm: f64,
    /// The adapter a LoRA reference trains (`lora-NAME.json`).
    #[serde(default)]
    lora: Option<LoraRef>,
    stream: Vec<u32>,
    trajectory: Vec<RefStep>,
}

/// A LoRA reference's adapter: over every projection of `targets` the
/// model has as a tensor of its own (`gerbil-train --lora`'s default).
#[derive(serde::Deserialize)]
struct LoraRef {
    rank: u32,
    alpha: f32,
    seed: u64,
}

impl TrainRef {
    /// The run's optimizer settings.
    fn hyperparameters(&self) -> gerbil_train::Hyperparameters {
        gerbil_train::Hyperparameters {
            lr: self.lr,
            warmup: self.warmup,
            betas: self.betas,
            eps: self.eps,
            weight_decay: self.weight_decay,
            max_grad_norm: Some(self.max_grad_norm),
        }
    }
}

fn train_ref(name: &str) -> TrainRef {
    let path = gerbil_e2e::data_dir().join(format!("refs/train/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Trains on the interpreter as PyTorch did (with `state` as the
/// optimizer's starting state: f32 or 8-bit moments) and returns each
/// step's (mean loss, gradient norm before clipping, learning rate).
fn train_on_the_interpreter(
    name: &str,
    r: &TrainRef,
    mut state: gerbil_interp::optimizer::AdamWState,
) -> Vec<(f64, f64, f64)> {
    use gerbil_interp::optimizer::{clip_grad_norm, AdamW};
    use gerbil_train::Windows;
    let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let graph = training_graph(&ckpt, r.seq_len);
    let weights = interpreter_weights(&ckpt);
    let mut it = Interpreter::new(&graph, &weights, r.seq_len).unwrap_or_else(|e| panic!("{e}"));
    let labels: Vec<String> = graph.outputs[1..]
        .iter()
        .map(|(name, _)| name["grad.".len()..].to_string())
        .collect();
    let hyper = r.hyperparameters();
    let opt = AdamW {
        beta1: hyper.betas.0,
        beta2: hyper.betas.1,
        eps: hyper.eps,
        weight_decay: hyper.weight_decay,
    };
    let windows = Windows::new(r.stream.clone(), r.seq_len).unwrap_or_else(|e| panic!("{e}"));
    let mut steps = Vec::new();
    for step in 0..r.trajectory.len() {
        // The batch's mean loss and mean gradients: each sequence's loss is
        // already a mean over its tokens, and every sequence has `L`.
        let mut loss = 0.0;
        let mut grads: Vec<Vec<f64>> = Vec::new();
        for window in windows.batch(step, r.batch) {
            let (tokens, targets) = Windows::split(window);
            let out = it
                .train_step(tokens, targets)
                .unwrap_or_else(|e| panic!("{e}"));
            loss += loss_of(&out) / r.batch as f64;
            grads.resize(out.len() - 1, Vec::new());
            for (sum, g) in grads.iter_mut().zip(&out[1..]) {
                sum.resize(g.data.len(), 0.0);
                sum.iter_mut()
                    .zip(&g.data)
                    .for_each(|(s, g)| *s += g / r.batch as f64);
            }
        }
        let norm = clip_grad_norm(&mut grads, r.max_grad_norm);
        let lr = hyper.lr_at(step as u64);
        let mut params: Vec<Vec<f64>> = labels
            .iter()
            .map(|l| it.weight_mut(l).expect("a trained weight").clone())
            .collect();
        let mut refs: Vec<&mut Vec<f64>> = params.iter_mut().collect();
        opt.step(&mut state, lr, &mut refs, &grads);
        for (l, p) in labels.iter().zip(params) {
            *it.weight_mut(l).expect("a trained weight") = p;
        }
        steps.push((loss, norm, lr));
    }
    steps
}

/// Compares each step of `got` (loss, gradient norm, learning rate) with
/// the reference's: a line in `failures` for each step whose loss differs
/// by more than `loss_tol` (relative) or whose gradient norm by more than
/// `norm_tol`; returns the worst relative loss difference.
fn follow(
    name: &str,
    got: &[(f64, f64, f64)],
    r: &TrainRef,
    (loss_tol, norm_tol): (f64, f64),
    failures: &mut Vec<String>,
) -> f64 {
    let mut worst = 0.0f64;
    for (i, ((loss, norm, _), want)) in got.iter().zip(&r.trajectory).enumerate() {
        let err = (loss - want.loss).abs() / want.loss;
        worst = worst.max(err);
        if err > loss_tol || (norm - want.grad_norm).abs() > norm_tol * want.grad_norm {
            failures.push(format!(
                "{name} step {i}: loss {loss} (PyTorch {}), grad norm {norm} (PyTorch {})",
                want.loss, want.grad_norm
            ));
        }
    }
    worst
}

#[test]
fn fifty_steps_on_the_interpreter_follow_pytorchs_losses() {
    let mut failures = Vec::new();
    for name in TINY_DECODERS {
        let r = train_ref(name);
        let got = train_on_the_interpreter(name, &r, Default::default());
        // f64 against PyTorch's f32: the bar for the GPU trainer is
        // 1e-3; the oracle holds itself to 5e-5.
        let worst = follow(name, &got, &r, (5e-5, 5e-5), &mut failures);
        for (i, ((_, _, lr), want)) in got.iter().zip(&r.trajectory).enumerate() {
            assert_eq!(*lr, want.lr, "{name} step {i}: learning rate");
        }
        let (first, last) = (got[0].0, got[got.len() - 1].0);
        eprintln!(
            "{name:<11} {} steps: loss {first:.4} -> {last:.4}, worst relative difference \
             from PyTorch {worst:.1e}",
            got.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Trains on the GPU as PyTorch did — the program `compile_training`
/// makes, run by `Trainer`, one submission per optimizer step — with f32
/// or 8-bit moments, in f32 or `mixed` precision (which needs a GPU with
/// cooperative matrices), and with `binding` bytes to a binding (a small one
/// spreads the weights over several banks); returns each step's (mean
/// loss, gradient norm before clipping, learning rate).
fn train_on_the_gpu(
    name: &str,
    r: &TrainRef,
    (eight_bit, mixed): (bool, bool),
    (binding, micro_batch): (Option<u64>, Option<u32>),
) -> Vec<(f64, f64, f64)> {
    use gerbil_codegen_wgsl::{kernels::adamw::AdamwSettings, Target, TrainingOptions};
    use gerbil_train::Windows;
    let mut ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Some(l) = &r.lora {
        let lora = gerbil_train::LoraOptions {
            rank: l.rank,
            alpha: Some(l.alpha),
            targets: None,
            seed: l.seed,
        };
        let adapter = gerbil_train::run::new_adapter(&ckpt, &lora);
        ckpt.adapter = Some(adapter.unwrap_or_else(|e| panic!("{name}: {e}")));
    }
    let mut target = if mixed {
        Target::desktop()
    } else {
        Target::portable()
    };
    if let Some(bytes) = binding {
        target.limits.max_storage_binding = bytes;
    }
    let opts = TrainingOptions {
        seq_len: r.seq_len as u32,
        batch: r.batch as u32,
        micro_batch,
        eight_bit,
        mixed,
        target,
    };
    let build =
        gerbil_compiler::compile_training(&ckpt, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Some(m) = micro_batch {
        assert_eq!(build.program.plan.micro_batch, m, "{name}: the micro-batch");
    } else {
        assert_eq!(
            build.program.plan.micro_batch, opts.batch,
            "{name}: one pass a step"
        );
    }
    if binding.is_some() {
        let banks = build.program.plan.io.parameters.len();
        assert!(
            banks > 1,
            "{name}: {banks} bank at a binding of {binding:?}"
        );
    }
    // The process's device of the default options (tensor cores included
    // where the adapter has them).
    let need = &build.program.plan.requirements;
    let gpu = pollster::block_on(gerbil_runtime::Gpu::open_on(need, &Default::default()))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut trainer = pollster::block_on(gerbil_runtime::Trainer::new(
        gpu,
        build.program.plan,
        &build.parameters,
        &build.frozen,
    ))
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let hyper = r.hyperparameters();
    let windows = Windows::new(r.stream.clone(), r.seq_len).unwrap_or_else(|e| panic!("{e}"));
    let mut applied = 0;
    let mut steps = Vec::new();
    for step in 0..r.trajectory.len() {
        let batch: Vec<(&[u32], &[u32])> = windows
            .batch(step, r.batch)
            .into_iter()
            .map(Windows::split)
            .collect();
        let lr = hyper.lr_at(step as u64);
        let settings = AdamwSettings::at_step(
            applied + 1,
            lr,
            hyper.betas,
            hyper.eps,
            hyper.weight_decay,
            hyper.max_grad_norm,
        );
        let report = pollster::block_on(trainer.step(&batch, settings.to_array()))
            .unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
        applied += u64::from(report.applied);
        steps.push((f64::from(report.loss()), f64::from(report.grad_norm), lr));
    }
    steps
}

/// The bar: 50 steps of the GPU trainer (f32 master weights and
/// moments, batches of 2 sequences of 16 tokens) on every tiny decoder,
/// each step's loss within 1e-3 (relative) of PyTorch's and its gradient
/// norm within 1e-2. Each batch is one pass of both sequences packed end to
/// end, but the Llama's: its weights are spread over banks of at most 128
/// KiB, as a model past one binding's 2 GiB is (its optimizer then reduces
/// the norm over every bank), and its batch runs as two passes of one
/// sequence (`--micro-batch 1`), their gradients accumulated.
#[test]
fn fifty_steps_on_the_gpu_follow_pytorchs_losses() {
    let mut failures = Vec::new();
    for name in TINY_DECODERS {
        let r = train_ref(name);
        let llama = *name == "llama";
        let split = (llama.then_some(128 << 10), llama.then_some(1));
        let got = train_on_the_gpu(name, &r, (false, false), split);
        let worst = follow(name, &got, &r, (1e-3, 1e-2), &mut failures);
        let (first, last) = (got[0].0, got[got.len() - 1].0);
        eprintln!(
            "{name:<11} GPU, {} steps: loss {first:.4} -> {last:.4}, worst relative difference \
             from PyTorch {worst:.1e}",
            got.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Mixed precision (every matmul on tensor cores, `--precision mixed`):
/// the same 50 steps on every tiny decoder, each step's loss within 3e-3
/// (relative) of PyTorch's f32 run and its gradient norm within 1e-2, on a
/// GPU with cooperative matrices (on the H200 the worst was 1.2e-3, Qwen 3,
/// the others 1.7e-4 to 6.8e-4 over two runs: each product rounds one side
/// to f16). Lavapipe has none: there the test says so
/// and checks nothing, and
/// [`a_mixed_precision_step_compiles_for_tensor_cores`] is what CI knows of
/// the step.
#[test]
fn mixed_precision_on_tensor_cores_follows_pytorchs_f32_losses() {
    if !gerbil_e2e::kernel_harness::has_cooperative_matrix() {
        eprintln!("no cooperative matrices on this device: mixed-precision training not run");
        return;
    }
    let mut failures = Vec::new();
    for name in TINY_DECODERS {
        let r = train_ref(name);
        let got = train_on_the_gpu(name, &r, (false, true), (None, None));
        let worst = follow(name, &got, &r, (3e-3, 1e-2), &mut failures);
        eprintln!(
            "{name:<11} GPU mixed, {} steps: loss {:.4} -> {:.4}, worst relative difference \
             from PyTorch f32 {worst:.1e}",
            got.len(),
            got[0].0,
            got[got.len() - 1].0
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every tiny decoder's mixed-precision training step compiles for a GPU
/// with tensor cores: its forward matmuls are `gemm_coop` kernels, its
/// matmul gradients `grad_coop` ones (none of the f32 tiled ones is left),
/// and `generate_training` validates every kernel with the
/// cooperative-matrix capability and writes it to SPIR-V (naga). A target
/// without cooperative matrices is refused, naming the feature.
#[test]
fn a_mixed_precision_step_compiles_for_tensor_cores() {
    use gerbil_codegen_wgsl::{generate_training, Target, TrainingOptions};
    for name in TINY_DECODERS {
        let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Longer than the short prompts that plans give a matmul form of
        // their own (`gemv_batch`), which a training step must not take.
        let graph = training_graph(&ckpt, 128);
        let opts = TrainingOptions {
            seq_len: 128,
            batch: 2,
            micro_batch: None,
            eight_bit: false,
            mixed: true,
            target: Target::desktop(),
        };
        let program = generate_training(&graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let names: Vec<&str> = program
            .plan
            .kernels
            .iter()
            .map(|k| k.name.as_str())
            .collect();
        for kind in ["gemm_coop", "matmul_grad_x_coop", "matmul_grad_w_coop"] {
            assert!(
                names.iter().any(|n| n.starts_with(kind)),
                "{name}: no {kind} kernel in {names:?}"
            );
        }
        let simt = names.iter().filter(|n| {
            (n.starts_with("gemm") || n.starts_with("matmul") || n.starts_with("gemv"))
                && !n.contains("coop")
        });
        assert_eq!(simt.count(), 0, "{name}: an f32 matmul is left: {names:?}");
        if *name == "llama" {
            let refused = generate_training(
                &graph,
                &TrainingOptions {
                    target: Target::portable(),
                    ..opts
                },
            );
            let err = refused.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("train in f32"), "{err}");
        }
    }
}

/// LoRA: 20 steps of a rank-4 adapter (alpha 8) over every projection the
/// model has as a tensor of its own — Phi-3's fused `qkv_proj` and
/// `gate_up_proj` are not — with the weights frozen (the Llama's in the
/// bf16 it stores them in, which the kernels read exactly), on the GPU: each
/// step's loss within 1e-3 (relative) of PyTorch's and its gradient norm
/// within 1e-2, from the same documented starting factors.
#[test]
fn a_lora_adapter_on_the_gpu_follows_pytorchs_losses() {
    let mut failures = Vec::new();
    for name in ["llama_bf16", "gemma3", "phi3"] {
        let r = train_ref(&format!("lora-{name}"));
        let got = train_on_the_gpu(name, &r, (false, false), (None, None));
        assert_eq!(got.len(), r.trajectory.len());
        let worst = follow(name, &got, &r, (1e-3, 1e-2), &mut failures);
        eprintln!(
            "{name:<11} LoRA, {} steps: loss {:.4} -> {:.4}, worst relative difference from \
             PyTorch {worst:.1e}",
            got.len(),
            got[0].0,
            got[got.len() - 1].0
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A pass packs as many of a batch's sequences as the target's limits
/// allow: all 8 of the tiny Llama's 128-token sequences on a portable
/// target; 4 where a dispatch may have at most 600 workgroups on an axis
/// (the loss takes a workgroup a row: 1,024 rows of 8 would need 1,024).
/// A micro-batch asked for that does not fit, or does not divide the batch,
/// is an error that names the flag.
#[test]
fn a_pass_packs_as_many_sequences_as_the_limits_allow() {
    use gerbil_codegen_wgsl::{generate_training, Target, TrainingOptions};
    let ckpt = Checkpoint::open(&tiny_model("llama")).unwrap_or_else(|e| panic!("{e}"));
    let graph = training_graph(&ckpt, 128);
    let micro = |micro_batch, target| {
        let opts = TrainingOptions {
            seq_len: 128,
            batch: 8,
            micro_batch,
            eight_bit: false,
            mixed: false,
            target,
        };
        generate_training(&graph, &opts)
            .map(|p| p.plan.micro_batch)
            .map_err(|e| e.to_string())
    };
    assert_eq!(micro(None, Target::portable()), Ok(8));
    let mut narrow = Target::portable();
    narrow.limits.max_workgroups_per_dim = 600;
    assert_eq!(micro(None, narrow.clone()), Ok(4));
    let err = micro(Some(8), narrow).unwrap_err();
    assert!(err.contains("smaller --micro-batch"), "{err}");
    let err = micro(Some(3), Target::portable()).unwrap_err();
    assert!(err.contains("does not divide the batch of 8"), "{err}");

    // A rank-1 adapter's `A` factors are one-row values: in a pass of 8
    // sequences, each gradient's binding is still the factor's own bytes.
    let mut ckpt = ckpt;
    let lora = gerbil_train::LoraOptions {
        rank: 1,
        alpha: None,
        targets: None,
        seed: 0,
    };
    ckpt.adapter =
        Some(gerbil_train::run::new_adapter(&ckpt, &lora).unwrap_or_else(|e| panic!("{e}")));
    let opts = TrainingOptions {
        seq_len: 16,
        batch: 8,
        micro_batch: None,
        eight_bit: false,
        mixed: false,
        target: Target::portable(),
    };
    let plan = gerbil_compiler::compile_training(&ckpt, &opts)
        .unwrap_or_else(|e| panic!("{e}"))
        .program
        .plan;
    assert_eq!(plan.micro_batch, 8);
    let bank = plan.io.gradients[0];
    for p in &plan.parameters {
        let at = 4 * p.offset;
        for d in &plan.pass {
            for b in d
                .bindings
                .iter()
                .filter(|b| b.buffer == bank && b.offset == at)
            {
                assert_eq!(
                    b.size,
                    4 * p.len(),
                    "{}: {}'s gradient binding",
                    d.label,
                    p.label
                );
            }
        }
    }
}

/// The optimizer-state bytes of `name`'s training program, f32 or 8-bit.
fn state_bytes(name: &str, seq_len: u32, eight_bit: bool) -> u64 {
    use gerbil_codegen_wgsl::{Target, TrainingOptions};
    use gerbil_plan::{BufferKind, TrainingBuffer as B};
    let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let opts = TrainingOptions {
        seq_len,
        batch: 1,
        micro_batch: None,
        eight_bit,
        mixed: false,
        target: Target::portable(),
    };
    let program =
        gerbil_codegen_wgsl::generate_training(&training_graph(&ckpt, seq_len as usize), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    program
        .plan
        .buffers
        .iter()
        .filter(|b| {
            matches!(
                b.kind,
                BufferKind::Training {
                    holds: B::FirstMoment | B::SecondMoment | B::Scales
                }
            )
        })
        .map(|b| b.size)
        .sum()
}

/// The bar for the 8-bit optimizer state, on the GPU trainer:
/// at most 30% of the f32 state's bytes, and every step's loss within 3%
/// of PyTorch's f32 run (which the f32 trainer follows to 1e-6).
#[test]
fn the_eight_bit_state_on_the_gpu_follows_the_f32_losses_in_under_30_percent_of_the_bytes() {
    for name in ["llama", "gemma3"] {
        let r = train_ref(name);
        let (f32_bytes, q_bytes) = (
            state_bytes(name, r.seq_len as u32, false),
            state_bytes(name, r.seq_len as u32, true),
        );
        let share = q_bytes as f64 / f32_bytes as f64;
        assert!(share <= 0.30, "{name}: 8-bit state is {share:.3} of f32's");
        let got = train_on_the_gpu(name, &r, (true, false), (None, None));
        let worst = got
            .iter()
            .zip(&r.trajectory)
            .map(|((loss, _, _), want)| (loss - want.loss).abs() / want.loss)
            .fold(0.0, f64::max);
        eprintln!(
            "{name:<11} GPU 8-bit: {q_bytes} state bytes ({:.1}% of f32's), worst loss \
             difference from f32 {:.2}%",
            100.0 * share,
            100.0 * worst
        );
        assert!(
            worst < 0.03,
            "{name}: 8-bit losses differ by {worst} from f32's"
        );
    }
}

/// The fused optimizer step on the GPU (`kernels::adamw`: the norm's
/// partials, then the update) against the f64 oracle, over 300,000 weights
/// cut into three ranges as a model past the binding limit is (each range
/// its own two dispatches, every update reducing all ranges' partials, so
/// the norm is the global one; each thread strides over several weights):
/// two consecutive steps with weight decay, the first clipped and the
/// second not; then a step whose gradient holds an infinity, which leaves
/// the weights and moments as they were, reports itself skipped and still
/// zeroes the gradients. The f16 mirror holds every updated weight rounded
/// to f16, saturated at 65504 (one weight is a million).
#[test]
fn the_fused_adamw_step_matches_the_oracle_and_skips_non_finite_gradients() {
    use gerbil_codegen_wgsl::kernels::adamw::{self, AdamwSettings};
    use gerbil_e2e::kernel_harness::{f16_to_f32, f32_bytes, poison, run, to_f32, Rng};
    use gerbil_interp::optimizer::{clip_grad_norm, AdamW, AdamWState};

    let n = 300_000;
    // Three banks of at most 131,072 weights.
    let ranges: Vec<(u64, u32)> = (0..n as u64)
        .step_by(131_072)
        .map(|start| (start, (n as u64 - start).min(131_072) as u32))
        .collect();
    assert_eq!(ranges.len(), 3);
    let mut rng = Rng::from_label("adamw");
    let mut weights = rng.vec(n);
    // For the mirror: a weight past f16's range, one that rounds down to
    // its largest, one at the edge, subnormal ones and a tie. Their
    // gradients stay zero, so only the decay moves them.
    let specials = [1e6, 65519.0, 65520.0, 3e-6, -1e-7, 2.9802322e-8, 6.0e-5];
    weights[5..5 + specials.len()].copy_from_slice(&specials);
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&x| f64::from(x)).collect() };
    let mut oracle_w = wide(&weights);
    let mut state = AdamWState::default();
    let (betas, eps, decay, lr, max_norm) = ((0.9, 0.95), 1e-8, 0.1, 1e-2, 1.0);
    let opt = AdamW {
        beta1: betas.0,
        beta2: betas.1,
        eps,
        weight_decay: decay,
    };
    for t in 1..=3u64 {
        let mut grads = rng.vec(n);
        grads[5..5 + specials.len()].fill(0.0);
        if t == 3 {
            grads[212_345] = f32::INFINITY;
        }
        // Step 2 does not clip (an infinite norm in the settings).
        let clip = (t != 2).then_some(max_norm);
        let settings = AdamwSettings::at_step(t, lr, betas, eps, decay, clip);
        let mut partials = Vec::new();
        for &(start, len) in &ranges {
            let range = start as usize..start as usize + len as usize;
            let inputs = [f32_bytes(&grads[range]), poison(adamw::PARTIALS as usize)];
            let src = adamw::grad_norm_partials(len);
            partials.extend(to_f32(&run(&src, 1, 0, &inputs)[1]));
        }
        let (mut w1, mut g1, mut m1, mut v1): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) =
            Default::default();
        let (mut report, mut mirror) = (Vec::new(), Vec::new());
        for &(start, len) in &ranges {
            let r = start as usize..start as usize + len as usize;
            let inputs = [
                f32_bytes(&settings.to_array()),
                f32_bytes(&partials),
                f32_bytes(&weights[r.clone()]),
                f32_bytes(&grads[r.clone()]),
                f32_bytes(&m[r.clone()]),
                f32_bytes(&v[r.clone()]),
                poison(3),
                f16_bytes(&weights[r]),
            ];
            let src = adamw::adamw_update(len, ranges.len() as u32, true);
            let out = run(&src, 1, 0, &inputs);
            w1.extend(to_f32(&out[2]));
            g1.extend(to_f32(&out[3]));
            m1.extend(to_f32(&out[4]));
            v1.extend(to_f32(&out[5]));
            report = to_f32(&out[6]);
            mirror.extend(f16_to_f32(&out[7]));
        }
        assert_eq!(mirror, saturated_f16(&w1), "step {t}: the f16 mirror");
        assert!(
            g1.iter().all(|&g| g == 0.0),
            "step {t}: gradients not zeroed"
        );
        if t == 3 {
            assert_eq!(report[2], 0.0, "a non-finite gradient must skip the step");
            assert_eq!((&w1, &m1, &v1), (&weights, &m, &v), "skipped step moved");
            continue;
        }
        let mut oracle_g = vec![wide(&grads)];
        let norm = clip_grad_norm(&mut oracle_g, clip.unwrap_or(f64::INFINITY));
        opt.step(&mut state, lr, &mut [&mut oracle_w], &oracle_g);
        assert_eq!(report[2], 1.0);
        assert!(
            (f64::from(report[0]) - norm).abs() < 1e-5 * norm,
            "norm {report:?} vs {norm}"
        );
        let worst = w1
            .iter()
            .zip(&oracle_w)
            .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(1.0))
            .fold(0.0, f64::max);
        // Each step moves a weight by about lr; f32 keeps ~1e-7 of it (of
        // the weight, for the one of a million).
        assert!(
            worst < 1e-6,
            "step {t}: weights differ from the oracle by {worst:e}"
        );
        (weights, m, v) = (w1, m1, v1);
    }
}

/// Every backward kernel (`kernels::backward`, `kernels::rope::backward`)
/// on random inputs against `gerbil_interp::gradient` (f64), on shapes
/// that stride past a workgroup: rows longer than 256, more columns than
/// threads, grouped norms, a weight in bf16, a single row.
#[test]
fn backward_kernels_match_the_gradients() {
    use gerbil_codegen_wgsl::kernels::{backward, rope};
    use gerbil_e2e::kernel_harness::{
        check_close, encode, f32_bytes, poison, run_outputs, u32_bytes, widen, Rng,
    };
    use gerbil_interp::gradient as grad;
    let mut failures = Vec::new();
    let mut check = |what: String, result: Result<(), String>| {
        if let Err(e) = result {
            failures.push(format!("{what}: {e}"));
        }
    };
    let mut rng = Rng::from_label("backward kernels");
    let scaled = |rng: &mut Rng, n: usize, by: f32| -> Vec<f32> {
        rng.vec(n).iter().map(|v| v * by).collect()
    };

    for (t, vocab) in [(5u32, 300u32), (1, 50)] {
        let logits = scaled(&mut rng, (t * vocab) as usize, 4.0);
        let targets: Vec<u32> = (0..t).map(|_| rng.below(vocab)).collect();
        let inputs = [f32_bytes(&logits), u32_bytes(&targets)];
        let (loss, dl) = grad::cross_entropy(&widen(&logits), vocab as usize, &targets);
        let src = backward::cross_entropy(vocab, 8);
        let got = run_outputs(
            &src,
            t,
            0,
            &[inputs[0].clone(), inputs[1].clone(), poison(1)],
            &[2],
        );
        check(
            format!("cross_entropy t={t} v={vocab}"),
            got.and_then(|g| check_close("loss", &g[0], &[loss], 1e-5)),
        );
        let src = backward::cross_entropy_grad(vocab);
        let n = logits.len();
        let got = run_outputs(
            &src,
            t,
            0,
            &[inputs[0].clone(), inputs[1].clone(), poison(n)],
            &[2],
        );
        check(
            format!("cross_entropy_grad t={t} v={vocab}"),
            got.and_then(|g| check_close("dlogits", &g[0], &dl, 1e-6)),
        );
    }

    use gerbil_codegen_wgsl::kernels::Rows;
    // The step's rows from the parameters, or a constant (a training pass).
    for (op, rows) in [
        (UnaryOp::Silu, Rows::Tokens),
        (UnaryOp::GeluTanh, Rows::Fixed(3)),
        (UnaryOp::Gelu, Rows::Tokens),
        (UnaryOp::Softcap(2.5), Rows::Fixed(3)),
        (UnaryOp::Scale(2.5), Rows::Tokens),
    ] {
        let (t, width) = (3u32, 70u32);
        let n = (t * width) as usize;
        let (x, dy) = (scaled(&mut rng, n, 4.0), rng.vec(n));
        let want = grad::unary(op, &widen(&x), &widen(&dy));
        let src = backward::unary_grad(op, rows, width);
        let got = run_outputs(
            &src,
            t,
            0,
            &[f32_bytes(&x), f32_bytes(&dy), poison(n)],
            &[2],
        );
        check(
            src.name.clone(),
            got.and_then(|g| check_close("dx", &g[0], &want, 1e-5)),
        );
    }

    let (t, width) = (7u32, 300u32);
    let x = rng.vec((t * width) as usize);
    let want = grad::sum_rows(&widen(&x), width as usize);
    let got = run_outputs(
        &backward::sum_rows(width),
        t,
        0,
        &[f32_bytes(&x), poison(width as usize)],
        &[1],
    );
    check(
        "sum_rows".into(),
        got.and_then(|g| check_close("y", &g[0], &want, 1e-5)),
    );

    let (t, p, width, lmax) = (3u32, 4u32, 12u32, 10u32);
    let cache = rng.vec((lmax * width) as usize);
    let want = widen(&cache[(p * width) as usize..((p + t) * width) as usize]);
    let got = run_outputs(
        &backward::cache_rows(width),
        t,
        p,
        &[f32_bytes(&cache), poison((t * width) as usize)],
        &[1],
    );
    check(
        "cache_rows".into(),
        got.and_then(|g| check_close("y", &g[0], &want, 0.0)),
    );

    // Partial tiles everywhere, and (the last) two tiles of rows and of
    // columns with a depth of several steps.
    // A depth of 5,000 over few tiles takes the pieces (16 of 313, the last
    // shorter), in steps of at most 9 rows; so do a LoRA factor's shapes:
    // dx of 8 columns over a depth of 600 (9 pieces), and dw of 8 rows
    // over 300 of a step's at most 310 rows (4 pieces).
    for (t, n, k, wdtype) in [
        (5u32, 40u32, 33u32, DType::F32),
        (2, 17, 300, DType::BF16),
        (70, 50, 130, DType::F16),
        (7, 5000, 33, DType::BF16),
        (9, 600, 8, DType::F32),
        (300, 8, 70, DType::F32),
    ] {
        use gerbil_codegen_wgsl::kernels::{input, output};
        let dy = rng.vec((t * n) as usize);
        let (wbytes, wvals) = encode(&rng.vec((n * k) as usize), wdtype);
        let want = grad::matmul_dx(&widen(&dy), n as usize, &wvals);
        let max_rows = if t == 300 { 310 } else { t.max(9) };
        let kernels = backward::matmul_grad_x(n, k, wdtype, max_rows);
        assert_eq!(kernels.len(), if matches!(n, 5000 | 600) { 2 } else { 1 });
        let operands = [
            (input(0), f32_bytes(&dy)),
            (input(1), wbytes),
            (output(0), poison((t * k) as usize)),
        ];
        let got = gerbil_e2e::kernel_harness::run_chain(&kernels, t, 0, &operands);
        check(
            format!("matmul_grad_x t={t} n={n} k={k} {wdtype}"),
            // f32 sums of `n` products: their rounding grows with √n.
            check_close(
                "dx",
                &gerbil_e2e::kernel_harness::to_f32(&got[2]),
                &want,
                1e-5 * (f64::from(n) / 256.0).sqrt().max(1.0),
            ),
        );
        let x = rng.vec((t * k) as usize);
        let want = grad::matmul_dw(&widen(&dy), n as usize, &widen(&x));
        let kernels = backward::matmul_grad_w(n, k, max_rows);
        assert_eq!(kernels.len(), if t == 300 { 2 } else { 1 });
        let operands = [
            (input(0), f32_bytes(&dy)),
            (input(1), f32_bytes(&x)),
            (output(0), poison((n * k) as usize)),
        ];
        let got = gerbil_e2e::kernel_harness::run_chain(&kernels, t, 0, &operands);
        check(
            format!("matmul_grad_w t={t} n={n} k={k}"),
            check_close(
                "dw",
                &gerbil_e2e::kernel_harness::to_f32(&got[2]),
                &want,
                1e-5 * (f64::from(t) / 256.0).sqrt().max(1.0),
            ),
        );
    }

    // The tensor-core gradients (`grad_coop`, emulated where the device has
    // no cooperative matrices), against references whose `b` side (the
    // weight, the saved input) is rounded to f16 as the kernels stage it:
    // what is left is `dy`'s two-part rounding (about 22 bits) and the f32
    // sums. Each `dy` is scaled by `by`, and compared scaled back: 1e-9 puts
    // it far below f16's range and 1e6 above it, which the scales must undo
    // exactly; a row of zeros (`dx`'s scales) and a column of zeros (`dw`'s)
    // keep theirs finite. The cases (each emulated kernel takes lavapipe
    // some 4 s to compile): two blocks of rows and a partial block of
    // columns, a depth of 1,500 in 16 pieces (`dx`), and 1,500 rows of `dw`
    // in 24 blocks; 5 blocks of a step's 300 rows (`dx`) and those rows in 4
    // pieces (`dw`) for a LoRA factor's 8 rows, over 270 columns (every
    // subgroup's columns of a 256-wide block, and a partial second block).
    // Lavapipe computes NaN in the emulation of a subgroup's 8 accumulators
    // from the fourth K tile of a piece on (half of every accumulator's columns, as it did for
    // `gemm_coop`'s larger blocks: a miscompile of the emulation), so the
    // deeper cases run only on a GPU with cooperative matrices: a depth of
    // 5,000 in pieces of 10 tiles, 4 tiles unpieced, and `dw` over a step of
    // 300 rows (10 tiles) for 17,000 rows of `dw`, `dy` scaled up. The
    // tolerance grows with the depth past 1,024: a tensor core's f32
    // accumulator does not round to nearest, so its error grows with the
    // steps it adds (the H200's worst at a depth of 17,000 was 1.6e-4, on an
    // output near zero among sums of some 40).
    let tol = |depth: u32| 2e-5 * f64::from(depth.max(1024)) / 1024.0;
    let real = gerbil_e2e::kernel_harness::has_cooperative_matrix();
    let deep = [
        (7, 5000, 33, DType::BF16, 1e-9),
        (300, 100, 33, DType::BF16, 1.0),
        (300, 17_000, 33, DType::F32, 1e6),
    ];
    for (t, n, k, wdtype, by) in [
        (70u32, 1500u32, 33u32, DType::BF16, 1e-9f32),
        (300, 8, 270, DType::F32, 1e3),
    ]
    .into_iter()
    .chain(deep.into_iter().filter(|_| real))
    {
        use gerbil_codegen_wgsl::kernels::{grad_coop, input, output};
        use gerbil_e2e::coop_emulation::emulate_coop;
        use gerbil_e2e::kernel_harness::{run_chain, to_f32};
        let runnable = |kernels: Vec<gerbil_codegen_wgsl::kernels::KernelSource>| {
            kernels
                .iter()
                .map(|k| match real || !k.wgsl.contains("coop") {
                    true => k.clone(),
                    false => emulate_coop(k),
                })
                .collect::<Vec<_>>()
        };
        let f16 = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|&x| f64::from(half::f16::from_f64(x).to_f32()))
                .collect()
        };
        let mut dy = scaled(&mut rng, (t * n) as usize, by);
        if t > 1 {
            dy[n as usize..2 * n as usize].fill(0.0);
        }
        for row in dy.chunks_mut(n as usize) {
            row[(n as usize - 1).min(3)] = 0.0;
        }
        let back = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| x / by).collect() };
        let unscaled = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|x| x / f64::from(by)).collect() };
        let (wbytes, wvals) = encode(&rng.vec((n * k) as usize), wdtype);
        let want = unscaled(grad::matmul_dx(&widen(&dy), n as usize, &f16(&wvals)));
        let max_rows = if t == 300 { 310 } else { t.max(9) };
        let kernels = runnable(grad_coop::matmul_grad_x(n, k, wdtype, max_rows));
        let operands = [
            (input(0), f32_bytes(&dy)),
            (input(1), wbytes),
            (output(0), poison((t * k) as usize)),
        ];
        let got = run_chain(&kernels, t, 0, &operands);
        check(
            format!("{} ×{by}", kernels[1].name),
            check_close("dx", &back(to_f32(&got[2])), &want, tol(n)),
        );
        let x = rng.vec((t * k) as usize);
        let want = unscaled(grad::matmul_dw(&widen(&dy), n as usize, &f16(&widen(&x))));
        let kernels = runnable(grad_coop::matmul_grad_w(n, k, max_rows));
        let operands = [
            (input(0), f32_bytes(&dy)),
            (input(1), f32_bytes(&x)),
            (output(0), poison((n * k) as usize)),
        ];
        let got = run_chain(&kernels, t, 0, &operands);
        check(
            format!("{} ×{by}", kernels[1].name),
            check_close("dw", &back(to_f32(&got[2])), &want, tol(t)),
        );
    }

    // Steps of at most 9 rows (the scratch holds more than this step's),
    // and of 300, whose weight gradients sum 5 and 19 chunks of the rows.
    for (t, width, groups, offset, wdtype, max_rows) in [
        (3u32, 64u32, 1u32, 0.0f32, DType::F32, 9u32),
        (3, 300, 1, 1.0, DType::F32, 9),
        (1, 300, 1, 0.0, DType::F32, 9),
        (2, 128, 4, 1.0, DType::BF16, 9),
        (200, 64, 1, 0.0, DType::F32, 300),
        (150, 128, 4, 1.0, DType::BF16, 300),
    ] {
        let norm = gerbil_ir::RmsNorm {
            eps: 1e-6,
            weight_offset: offset,
            groups,
        };
        let g = width / groups;
        let n = (t * width) as usize;
        let (x, dy) = (scaled(&mut rng, n, 2.0), rng.vec(n));
        let (wbytes, wvals) = encode(&rng.vec(g as usize), wdtype);
        let (dx, dw) = grad::rms_norm(&widen(&x), &wvals, &norm, &widen(&dy));
        use gerbil_codegen_wgsl::kernels::{input, output};
        use gerbil_e2e::kernel_harness::{run_chain, to_f32};
        let operands = [
            (input(0), f32_bytes(&x)),
            (input(1), wbytes),
            (input(2), f32_bytes(&dy)),
            (output(0), poison(n)),
            (output(1), poison(g as usize)),
        ];
        let kernels = backward::rms_norm_grad(width, &norm, wdtype, max_rows);
        let chunks = if max_rows > 9 {
            5 + 14 * (groups / 4)
        } else {
            1
        };
        assert!(
            kernels[1]
                .wgsl
                .contains(&format!("const CHUNKS: u32 = {chunks}u;")),
            "{}: {chunks} chunks",
            kernels[1].name
        );
        let got = run_chain(&kernels, t, 0, &operands);
        check(
            format!("{} t={t}", kernels[0].name),
            check_close("dx", &to_f32(&got[3]), &dx, 1e-5)
                .and_then(|_| check_close("dw", &to_f32(&got[4]), &dw, 1e-5)),
        );
    }

    // Repeated ids, an id past the table (row 0's) and the padding row.
    // More ids than one tile (1,024 of them, so the sums cross tiles), and
    // a table past 65,535 rows (its workgroups split over x and y).
    let long: Vec<u32> = (0..1500u32).map(|i| (i * 7919) % 37).collect();
    for (padding, scale, vocab, width, ids) in [
        (
            Some(5u32),
            Some(2.5f32),
            40u32,
            300u32,
            vec![3u32, 5, 39, 3, 7, 44, 0, 5, 3],
        ),
        (None, None, 40, 3, long),
        (None, None, 70_000, 2, vec![69_999, 3, 69_999, 70_001]),
    ] {
        let t = ids.len() as u32;
        let dy = rng.vec((t * width) as usize);
        let e = gerbil_ir::Embedding { scale, padding };
        let want = grad::embedding(&ids, width as usize, vocab as usize, &e, &widen(&dy));
        let src = backward::embedding_grad(vocab, width, &e);
        let inputs = [
            u32_bytes(&ids),
            f32_bytes(&dy),
            poison((vocab * width) as usize),
        ];
        let got = run_outputs(&src, t, 0, &inputs, &[2]);
        // f32 sums of up to some 40 rows (the long case's): their rounding.
        check(
            src.name.clone(),
            got.and_then(|g| check_close("dtable", &g[0], &want, 4e-6)),
        );
    }

    // GQA groups of 2 and an odd head width; causal with and without a
    // window, bidirectional; a training step (P = 0, the cache exactly the
    // step) and a step after cached rows with cache rows no query sees; and
    // two sequences packed end to end (a training pass of a micro-batch),
    // each with caches of its own. Steps of 130 rows, three 64-row tiles
    // a side, skip the tiles of keys no row sees: past the causal diagonal,
    // and outside a window of 40 (causal, and both sides, packed).
    for (causal, window, p, lmax, seqs, t) in [
        (true, None, 0u32, 3u32, 1u32, 3u32),
        (true, Some(2), 0, 3, 1, 3),
        (false, None, 0, 3, 1, 3),
        (false, Some(2), 0, 3, 1, 3),
        (true, None, 2, 7, 1, 3),
        (true, Some(2), 0, 3, 2, 3),
        (false, None, 0, 3, 2, 3),
        (true, None, 0, 130, 2, 130),
        (true, Some(40), 0, 130, 1, 130),
        (false, Some(40), 0, 130, 2, 130),
    ] {
        let a = gerbil_ir::Attention {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 3,
            scale: 0.7,
            window,
            causal,
        };
        let (qw, kw) = (12usize, 6usize);
        let n = seqs as usize;
        let q = rng.vec(n * t as usize * qw);
        let (kc, vc) = (
            rng.vec(n * lmax as usize * kw),
            rng.vec(n * lmax as usize * kw),
        );
        let dy = rng.vec(n * t as usize * qw);
        let (q64, k64, v64, dy64) = (widen(&q), widen(&kc), widen(&vc), widen(&dy));
        // Each sequence on its own, end to end.
        let (mut out, mut lse) = (Vec::<f64>::new(), Vec::<f64>::new());
        let (mut dq, mut dk, mut dv) = (Vec::<f64>::new(), Vec::new(), Vec::new());
        for s in 0..n {
            let rows = |v: &[f64], len: u32, w: usize| -> Vec<f64> {
                v[s * len as usize * w..(s + 1) * len as usize * w].to_vec()
            };
            let (qs, ks, vs) = (
                rows(&q64, t, qw),
                rows(&k64, lmax, kw),
                rows(&v64, lmax, kw),
            );
            let p = p as usize;
            out.extend(gerbil_e2e::reference::attention(&qs, &ks, &vs, &a, p));
            lse.extend(grad::attention_lse(&qs, &ks, &a, p));
            let g = grad::attention(&qs, &ks, &vs, &a, p, &rows(&dy64, t, qw));
            dq.extend(g.0);
            dk.extend(g.1);
            dv.extend(g.2);
        }
        let what =
            format!("attention causal={causal} window={window:?} p={p} lmax={lmax} seqs={seqs}");
        use gerbil_codegen_wgsl::kernels::{input, output};
        let got = gerbil_e2e::kernel_harness::run_chain(
            &backward::attention_lse(&a, lmax, t.max(5), seqs),
            seqs * t,
            p,
            &[
                (input(0), f32_bytes(&q)),
                (input(1), f32_bytes(&kc)),
                (output(0), poison(n * t as usize * 4)),
            ],
        );
        check(
            format!("{what} lse"),
            check_close(
                "lse",
                &gerbil_e2e::kernel_harness::to_f32(&got[2]),
                &lse,
                1e-5,
            ),
        );
        let as_f32 = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
        let operands = [
            (input(0), f32_bytes(&q)),
            (input(1), f32_bytes(&kc)),
            (input(2), f32_bytes(&vc)),
            (input(3), f32_bytes(&dy)),
            (input(4), f32_bytes(&as_f32(&out))),
            (input(5), f32_bytes(&as_f32(&lse))),
            (output(0), poison(q.len())),
            (output(1), poison(kc.len())),
            (output(2), poison(vc.len())),
        ];
        // Steps of at most 5 rows: the scratch's row stride is not `T`. At
        // most 64 after cached rows: a group's 128 rows are two pieces of
        // the cache gradients' depth, each 3 of this step's 6. At most 512
        // for the windowed bidirectional case: 16 pieces of its 6 rows, some
        // empty (a step shorter than the longest). Packed, 64: two pieces
        // of each sequence's depth. Steps of 130: four pieces.
        let (max_rows, splits) = match (p, causal, window, seqs) {
            _ if t > 64 => (t, 4),
            (0, false, Some(_), 1) => (512, 16),
            (0, .., 1) => (5, 1),
            _ => (64, 2),
        };
        let kernels = backward::attention_grad(&a, lmax, max_rows, seqs);
        assert!(
            kernels[0]
                .wgsl
                .contains(&format!("const SPLITS: u32 = {splits}u;")),
            "{what}: {splits} pieces of the cache gradients"
        );
        let got = gerbil_e2e::kernel_harness::run_chain(&kernels, seqs * t, p, &operands);
        for (i, (port, bytes)) in operands.iter().enumerate().take(6) {
            assert_eq!(&got[i], bytes, "{what}: {port:?} was modified");
        }
        let g = |i: usize| gerbil_e2e::kernel_harness::to_f32(&got[i]);
        check(
            format!("{what} grad"),
            check_close("dq", &g(6), &dq, 1e-5)
                .and_then(|_| check_close("dk", &g(7), &dk, 1e-5))
                .and_then(|_| check_close("dv", &g(8), &dv, 1e-5)),
        );
    }

    let spec = rope::RopeSpec {
        heads: 2,
        head_dim: 8,
        rotary_dim: 6,
    };
    let inv_freq: Vec<f32> = (0..3).map(|i| 10000f32.powf(-(i as f32) / 3.0)).collect();
    // An attention scaling of 0.8 (YaRN's), so the table is not a pure rotation.
    let table_bytes = gerbil_ir::rope_table::rope_table(&inv_freq, 0.8, 16);
    let table: Vec<f64> = gerbil_e2e::kernel_harness::to_f32(&table_bytes)
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    let (t, p) = (4u32, 3u32);
    let dy = rng.vec((t * 16) as usize);
    let ir_rope = gerbil_ir::Rope {
        n_heads: 2,
        head_dim: 8,
        rotary_dim: 6,
    };
    let want = grad::rope(&widen(&dy), &table, &ir_rope, p as usize);
    let got = run_outputs(
        &rope::backward(spec, gerbil_codegen_wgsl::kernels::Positions::Step),
        t,
        p,
        &[f32_bytes(&dy), table_bytes, poison((t * 16) as usize)],
        &[2],
    );
    check(
        "rope_grad".into(),
        got.and_then(|g| check_close("dx", &g[0], &want, 1e-6)),
    );

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The 8-bit optimizer state (`AdamWState::eight_bit`: both moments in a
/// byte each, a scale per block of 256) trains every tiny decoder for the
/// same 50 steps to losses within 3% of the f32 state's at every step: on
/// the interpreter every decoder but the Llama and Gemma 3, which the GPU
/// trainer's 8-bit test trains (each decoder's two interpreted runs cost
/// CI seconds of its CPU).
#[test]
fn the_eight_bit_state_follows_the_f32_losses() {
    use gerbil_interp::optimizer::AdamWState;
    let mut failures = Vec::new();
    for name in TINY_DECODERS
        .iter()
        .filter(|n| !["llama", "gemma3"].contains(n))
    {
        let r = train_ref(name);
        let f32_run = train_on_the_interpreter(name, &r, AdamWState::default());
        let eight = train_on_the_interpreter(name, &r, AdamWState::eight_bit());
        let worst = f32_run
            .iter()
            .zip(&eight)
            .map(|(a, b)| (a.0 - b.0).abs() / a.0)
            .fold(0.0, f64::max);
        let last = eight.len() - 1;
        eprintln!(
            "{name:<11} 8-bit state: loss {:.4} -> {:.4} (f32 state -> {:.4}), worst relative \
             difference {worst:.1e}",
            eight[0].0, eight[last].0, f32_run[last].0
        );
        if worst > 0.03 {
            failures.push(format!(
                "{name}: the 8-bit state's losses differ by {worst:.3}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The 8-bit update on the GPU (`kernels::adamw::adamw_update_8bit`)
/// against the oracle's 8-bit state over the same 300,000 weights: three
/// steps (clipped, unclipped, then one skipped for an infinite gradient),
/// the weights within 1e-6 of the oracle's (a byte that rounds the other
/// way at a tie moves a weight by far less), every block's scales within
/// 1e-6 of the oracle's largest moments, and a skipped step that changes
/// no byte or scale (nor the f16 mirror, checked as in the f32 test). The
/// state is a quarter of the f32 state's bytes.
#[test]
fn the_eight_bit_adamw_step_matches_the_oracle() {
    use gerbil_codegen_wgsl::kernels::adamw::{self, AdamwSettings};
    use gerbil_e2e::kernel_harness::{f32_bytes, poison, run, to_f32, u32_bytes, Rng};
    use gerbil_interp::optimizer::{clip_grad_norm, AdamW, AdamWState, STATE_BLOCK};

    let n = 300_000usize;
    let blocks = n.div_ceil(STATE_BLOCK);
    assert!(adamw::eight_bit_state_bytes(n as u32) * 100 <= 30 * 8 * n as u64);
    let mut rng = Rng::from_label("adamw 8-bit");
    let mut weights = rng.vec(n);
    let (mut mq, mut vq) = (vec![0u32; n / 4], vec![0u32; n / 4]);
    let mut scales = vec![0f32; 2 * blocks];
    let mut oracle_w: Vec<f64> = weights.iter().map(|&x| f64::from(x)).collect();
    let mut state = AdamWState::eight_bit();
    let (betas, eps, decay, lr) = ((0.9, 0.95), 1e-8, 0.1, 1e-2);
    let opt = AdamW {
        beta1: betas.0,
        beta2: betas.1,
        eps,
        weight_decay: decay,
    };
    let partials_src = adamw::grad_norm_partials(n as u32);
    let update_src = adamw::adamw_update_8bit(n as u32, 1, true);
    for t in 1..=3u64 {
        let mut grads = rng.vec(n);
        if t == 3 {
            grads[777] = f32::NAN;
        }
        let clip = (t == 1).then_some(1.0);
        let settings = AdamwSettings::at_step(t, lr, betas, eps, decay, clip);
        let partials = {
            let inputs = [f32_bytes(&grads), poison(adamw::PARTIALS as usize)];
            to_f32(&run(&partials_src, 1, 0, &inputs)[1])
        };
        let inputs = [
            f32_bytes(&settings.to_array()),
            f32_bytes(&partials),
            f32_bytes(&weights),
            f32_bytes(&grads),
            u32_bytes(&mq),
            u32_bytes(&vq),
            f32_bytes(&scales),
            poison(3),
            f16_bytes(&weights),
        ];
        let out = run(&update_src, 1, 0, &inputs);
        let mirror = gerbil_e2e::kernel_harness::f16_to_f32(&out[8]);
        let words = |b: &[u8]| -> Vec<u32> { bytemuck::cast_slice(b).to_vec() };
        let (w1, g1, m1, v1, s1, report) = (
            to_f32(&out[2]),
            to_f32(&out[3]),
            words(&out[4]),
            words(&out[5]),
            to_f32(&out[6]),
            to_f32(&out[7]),
        );
        assert_eq!(mirror, saturated_f16(&w1), "step {t}: the f16 mirror");
        assert!(
            g1.iter().all(|&g| g == 0.0),
            "step {t}: gradients not zeroed"
        );
        if t == 3 {
            assert_eq!(report[2], 0.0);
            assert_eq!(
                (&w1, &m1, &v1, &s1),
                (&weights, &mq, &vq, &scales),
                "skipped step moved"
            );
            continue;
        }
        let mut oracle_g = vec![grads.iter().map(|&g| f64::from(g)).collect::<Vec<f64>>()];
        clip_grad_norm(&mut oracle_g, clip.unwrap_or(f64::INFINITY));
        opt.step(&mut state, lr, &mut [&mut oracle_w], &oracle_g);
        let worst = w1
            .iter()
            .zip(&oracle_w)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        assert!(
            worst < 1e-6,
            "step {t}: weights differ from the oracle by {worst:e}"
        );
        for (b, m) in state.m[0].chunks(STATE_BLOCK).enumerate() {
            let want = m.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            let got = f64::from(s1[2 * b]);
            assert!(
                (got - want).abs() <= 1e-6 * want,
                "step {t} block {b}: scale {got} vs {want}"
            );
        }
        (weights, mq, vq, scales) = (w1, m1, v1, s1);
    }
}

/// `v` rounded to f16, saturated at ±65504: what the optimizer's mirror
/// should hold.
fn saturated_f16(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_f32())
        .collect()
}

/// `v` as saturated f16 bytes (the mirror's contents before a step).
fn f16_bytes(v: &[f32]) -> Vec<u8> {
    let h: Vec<half::f16> = v
        .iter()
        .map(|&x| half::f16::from_f32(x.clamp(-65504.0, 65504.0)))
        .collect();
    bytemuck::cast_slice(&h).to_vec()
}
