//! A training run on the GPU: [`Run::start`] compiles the model's training
//! step (`gerbil_compiler::compile_training`), opens a device and loads it
//! (`gerbil_runtime::Trainer`), optionally resuming a checkpoint's
//! optimizer state; [`Run::step`] takes the next batch of the documented
//! windows ([`crate::Windows`]) through one optimizer step; [`Run::save`]
//! writes a checkpoint directory (HF weights and optimizer state) that
//! `gerbilc compile` takes and `--resume` continues from. With
//! [`RunOptions::lora`] (or when resuming an adapter checkpoint) the run
//! trains a LoRA adapter instead of the weights ([`prepare_adapter`]) and
//! saves the adapter.
//!
//! The surprise: a step's AdamW settings depend on how many steps were
//! *applied* before it — a step skipped for a non-finite gradient does not
//! advance the bias correction, as in PyTorch when the scaler skips
//! `optimizer.step()` — so the run keeps that count, and checkpoints save
//! it.

use crate::data::Windows;
use crate::schedule::Hyperparameters;
use crate::state::{saved_buffers, Batches, OptimizerState};
use crate::{export, TrainError};
use gerbil_codegen_wgsl::kernels::adamw::AdamwSettings;
use gerbil_codegen_wgsl::{Target, TrainingOptions};
use gerbil_frontend_hf::adapter::{Adapter, LoraConfig, DEFAULT_TARGETS};
use gerbil_frontend_hf::Checkpoint;
use gerbil_ir::WeightSource;
use gerbil_plan::{Requirements, TrainingBuffer};
use gerbil_runtime::device::DeviceOptions;
use gerbil_runtime::{Gpu, Trainer};
use std::path::Path;

/// How to train.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Tokens per sequence.
    pub seq_len: u32,
    /// Sequences per optimizer step.
    pub batch: u32,
    /// Sequences per pass on the GPU, packed end to end (a divisor of
    /// `batch`); `None`: as many as `TrainingOptions::micro_batch` chooses.
    /// The losses are the same either way, up to f32 rounding.
    pub micro_batch: Option<u32>,
    /// The optimizer's settings and schedule.
    pub hyper: Hyperparameters,
    /// AdamW's moments in 8 bits.
    pub eight_bit: bool,
    /// Every matmul on tensor cores (`--precision mixed`).
    pub mixed: bool,
    /// Shuffle the windows with this seed (each pass over them in a new
    /// order); `None`: in file order.
    pub shuffle: Option<u64>,
    /// Which device to open.
    pub device: DeviceOptions,
    /// Train a LoRA adapter of these settings instead of the weights.
    pub lora: Option<LoraOptions>,
}

/// A LoRA adapter to train (`--lora`).
#[derive(Clone, Debug)]
pub struct LoraOptions {
    /// The rank `r`.
    pub rank: u32,
    /// `alpha` (the update is scaled by `alpha / r`); `None`: the rank.
    pub alpha: Option<f32>,
    /// The projections to adapt; `None`: those of
    /// [`DEFAULT_TARGETS`] the model has.
    pub targets: Option<Vec<String>>,
    /// Seeds the `A` factors' start.
    pub seed: u64,
}

/// The target of a mixed-precision run on `gpu`: [`Target::desktop`]'s
/// features, which the device must have (cooperative matrices of f16, f16
/// and subgroups), or an error that names what it lacks.
fn mixed_target(gpu: &Gpu) -> Result<Target, TrainError> {
    let target = Target::desktop();
    let have = gerbil_runtime::variant::device_features(gpu);
    let missing: Vec<String> = target
        .features
        .iter()
        .filter(|f| !have.contains(f))
        .map(|f| f.name().to_string())
        .collect();
    if missing.is_empty() {
        return Ok(target);
    }
    Err(TrainError::Options(format!(
        "--precision mixed runs every matmul on tensor cores, and the adapter `{}` lacks {} \
         (cooperative matrices of f16 with f32 sums, f16 and subgroups are needed); train \
         with --precision f32",
        gpu.adapter.name,
        missing.join(", ")
    )))
}

/// Readies `ckpt` for a LoRA run when `lora` asks for one or `resume`
/// continues an adapter checkpoint: the adapter it holds, unmerged, or a
/// new one ([`Adapter::init`]) over its weights. Returns whether the run
/// trains an adapter.
fn prepare_adapter(
    ckpt: &mut Checkpoint,
    lora: Option<&LoraOptions>,
    resume: bool,
) -> Result<bool, TrainError> {
    match (&mut ckpt.adapter, lora) {
        (Some(adapter), Some(l)) if adapter.config.rank != l.rank => {
            Err(TrainError::Options(format!(
                "the checkpoint's adapter has rank {}, --lora asks for {}; pass --lora {} to \
                 go on training it, or train a new adapter on its base model {}",
                adapter.config.rank, l.rank, adapter.config.rank, adapter.config.base
            )))
        }
        (Some(adapter), Some(l)) => {
            // The adapter's own settings stand: a different one asked for is
            // a new adapter, not this one.
            let modules = adapter.modules();
            let differs = l.alpha.is_some_and(|a| a != adapter.config.alpha)
                || l.targets.as_ref().is_some_and(|t| {
                    let mut t = t.clone();
                    t.sort();
                    t.dedup();
                    t != modules
                });
            if differs {
                return Err(TrainError::Options(format!(
                    "the checkpoint's adapter has alpha {} over {}; leave out --lora-alpha and \
                     --lora-targets to go on training it, or train a new adapter on its base \
                     model {}",
                    adapter.config.alpha,
                    modules.join(","),
                    adapter.config.base
                )));
            }
            adapter.merged = false;
            Ok(true)
        }
        (Some(adapter), None) if resume => {
            adapter.merged = false;
            Ok(true)
        }
        (None, Some(_)) if resume => Err(TrainError::Options(
            "the checkpoint holds a whole model, not an adapter: resume it without --lora, or \
             start a new adapter on it without --resume"
                .into(),
        )),
        (None, Some(l)) => {
            ckpt.adapter = Some(new_adapter(ckpt, l)?);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A new adapter of `lora`'s settings over `ckpt`'s weights, naming
/// `ckpt`'s directory as its base (not merged: ready to train).
pub fn new_adapter(ckpt: &Checkpoint, lora: &LoraOptions) -> Result<Adapter, TrainError> {
    let targets = lora.targets.clone().unwrap_or_else(|| {
        let names = ckpt.weights.names();
        DEFAULT_TARGETS
            .iter()
            .filter(|t| {
                let suffix = format!(".{t}.weight");
                names
                    .iter()
                    .any(|n| n.ends_with(&suffix) && n.contains(".layers."))
            })
            .map(|t| t.to_string())
            .collect()
    });
    let base = ckpt.dir.canonicalize().unwrap_or_else(|_| ckpt.dir.clone());
    let config = LoraConfig {
        rank: lora.rank,
        alpha: lora.alpha.unwrap_or(lora.rank as f32),
        targets,
        base: base.display().to_string(),
    };
    Ok(Adapter::init(&ckpt.weights, config, lora.seed)?)
}

/// What one step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLog {
    /// The step's number, from 1.
    pub step: u64,
    /// The batch's mean cross-entropy (before the update).
    pub loss: f64,
    /// The gradient's global norm before clipping.
    pub grad_norm: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// Whether the weights changed (`false`: a non-finite gradient, skipped).
    pub applied: bool,
    /// Tokens the step trained on.
    pub tokens: u64,
}

/// A run in progress; see the module documentation.
pub struct Run {
    ckpt: Checkpoint,
    trainer: Trainer,
    windows: Windows,
    opts: RunOptions,
    trained: Vec<WeightSource>,
    batches: Batches,
    step: u64,
    applied: u64,
}

impl Run {
    /// Compiles and loads the training step of `ckpt` for `tokens` (the
    /// tokenized training text); with `resume`, continues from the optimizer
    /// state saved beside `ckpt`'s weights (a checkpoint [`Run::save`] wrote).
    pub async fn start(
        ckpt: Checkpoint,
        tokens: Vec<u32>,
        opts: RunOptions,
        resume: bool,
    ) -> Result<Run, TrainError> {
        opts.hyper.check()?;
        // An adapter's state is in its own directory (a PEFT adapter's
        // checkpoint holds the base model's `dir`).
        let state_dir = ckpt
            .adapter
            .as_ref()
            .and_then(|a| a.dir.clone())
            .unwrap_or_else(|| ckpt.dir.clone());
        if resume {
            OptimizerState::check_present(&state_dir)?;
        }
        if opts.batch == 0 {
            return Err(TrainError::Options("--batch must be at least 1".into()));
        }
        // The trained weights are saved as safetensors: refuse what cannot be.
        if let Some(gguf) = ckpt
            .weights
            .files()
            .into_iter()
            .find(|f| f.extension().is_some_and(|e| e == "gguf"))
        {
            return Err(TrainError::Options(format!(
                "{} is a GGUF file, whose quantized weights cannot train or be saved as a \
                 checkpoint; train the model's safetensors checkpoint (a HF directory or hub id)",
                gguf.display()
            )));
        }
        let mut ckpt = ckpt;
        prepare_adapter(&mut ckpt, opts.lora.as_ref(), resume)?;
        let batches = Batches::of(&tokens, opts.seq_len, opts.batch, opts.shuffle);
        let context = ckpt
            .config_json
            .get("max_position_embeddings")
            .and_then(|v| v.as_u64())
            .unwrap_or(u64::MAX);
        let windows = Windows::for_model(
            tokens,
            opts.seq_len as usize,
            usize::try_from(context).unwrap_or(usize::MAX),
        )?;
        let windows = match opts.shuffle {
            Some(seed) => windows.shuffled(seed),
            None => windows,
        };
        // The device first: its binding limit is the program's.
        let gpu = Gpu::open_on(&Requirements::default(), &opts.device).await?;
        let mut target = if opts.mixed {
            mixed_target(&gpu)?
        } else {
            Target::portable()
        };
        target.limits.max_storage_binding = gpu.limits.max_storage_buffer_binding_size;
        target.wide_binding = target.limits.max_storage_binding;
        let training = TrainingOptions {
            seq_len: opts.seq_len,
            batch: opts.batch,
            micro_batch: opts.micro_batch,
            eight_bit: opts.eight_bit,
            mixed: opts.mixed,
            target,
        };
        let build = gerbil_compiler::compile_training(&ckpt, &training)?;
        let plan = build.program.plan;
        // A tokenizer may give ids past the model's vocabulary (added tokens):
        // say so now, not at the step whose batch holds one.
        if let Some(&id) = windows.tokens().iter().find(|&&t| t >= plan.vocab) {
            return Err(TrainError::Options(format!(
                "the tokenizer gives token id {id}, past the model's vocabulary of {}; train \
                 on a text without it, or a model whose embedding covers the tokenizer",
                plan.vocab
            )));
        }
        let trainer = Trainer::new(gpu, plan, &build.parameters, &build.frozen).await?;
        let (mut step, mut applied) = (0, 0);
        if resume {
            let parameters = &trainer.plan().parameters;
            let state = OptimizerState::load(&state_dir, parameters, opts.eight_bit, &batches)?;
            for (holds, bytes) in &state.buffers {
                trainer.write(*holds, bytes)?;
            }
            (step, applied) = (state.step, state.applied);
        }
        Ok(Run {
            ckpt,
            trainer,
            windows,
            opts,
            trained: build.program.trained,
            batches,
            step,
            applied,
        })
    }

    /// Steps taken so far (a resumed run counts its checkpoint's).
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// Whether the run trains a LoRA adapter.
    pub fn trains_adapter(&self) -> bool {
        self.ckpt.adapter.as_ref().is_some_and(|a| !a.merged)
    }

    /// The trained values (every weight, or a LoRA adapter's factors).
    pub fn trained_values(&self) -> u64 {
        self.trainer.plan().parameters.iter().map(|p| p.len()).sum()
    }

    /// The bytes of every GPU buffer the training step holds.
    pub fn gpu_bytes(&self) -> u64 {
        self.trainer.plan().buffers.iter().map(|b| b.size).sum()
    }

    /// The trainer, for its plan.
    pub fn trainer(&self) -> &Trainer {
        &self.trainer
    }

    /// The next optimizer step.
    pub async fn step(&mut self) -> Result<StepLog, TrainError> {
        let (seq_len, batch) = (self.opts.seq_len as usize, self.opts.batch as usize);
        let windows = self.windows.batch(self.step as usize, batch);
        let sequences: Vec<(&[u32], &[u32])> = windows.into_iter().map(Windows::split).collect();
        let hyper = &self.opts.hyper;
        let lr = hyper.lr_at(self.step);
        let settings = AdamwSettings::at_step(
            self.applied + 1,
            lr,
            hyper.betas,
            hyper.eps,
            hyper.weight_decay,
            hyper.max_grad_norm,
        );
        let report = self.trainer.step(&sequences, settings.to_array()).await?;
        self.step += 1;
        self.applied += u64::from(report.applied);
        Ok(StepLog {
            step: self.step,
            loss: f64::from(report.loss()),
            grad_norm: f64::from(report.grad_norm),
            lr,
            applied: report.applied,
            tokens: (seq_len * batch) as u64,
        })
    }

    /// The GPU time of each dispatch of one pass (the next batch's first
    /// micro-batch), without changing the weights; the device must have
    /// been opened with timestamps ([`RunOptions::device`]).
    pub async fn profile(&self) -> Result<Vec<gerbil_runtime::DispatchTime>, TrainError> {
        let plan = self.trainer.plan();
        let (batch, micro) = (plan.batch as usize, plan.micro_batch as usize);
        let (mut tokens, mut targets) = (Vec::new(), Vec::new());
        for &window in self
            .windows
            .batch(self.step as usize, batch)
            .iter()
            .take(micro)
        {
            let (t, y) = Windows::split(window);
            tokens.extend_from_slice(t);
            targets.extend_from_slice(y);
        }
        Ok(self.trainer.profile(&tokens, &targets).await?)
    }

    /// Writes a checkpoint directory `dir`: the model in HF format (or the
    /// adapter, with the model's config and tokenizer) and the optimizer
    /// state ([`crate::state`]).
    pub async fn save(&self, dir: &Path) -> Result<(), TrainError> {
        let plan = self.trainer.plan();
        let mut buffers = Vec::new();
        for holds in saved_buffers(self.opts.eight_bit) {
            buffers.push((holds, self.trainer.read(holds).await?));
        }
        let master = buffers
            .iter()
            .find(|(b, _)| *b == TrainingBuffer::Parameters)
            .map(|(_, bytes)| bytemuck::pod_collect_to_vec::<u8, f32>(bytes))
            .unwrap_or_default();
        match self.ckpt.adapter.as_ref().filter(|a| !a.merged) {
            Some(adapter) => export::write_adapter(
                dir,
                &self.ckpt,
                adapter,
                &plan.parameters,
                &self.trained,
                &master,
            )?,
            None => export::write_model(dir, &self.ckpt, &plan.parameters, &self.trained, &master)?,
        }
        OptimizerState {
            step: self.step,
            applied: self.applied,
            eight_bit: self.opts.eight_bit,
            parameters: plan.parameters.clone(),
            batches: self.batches,
            buffers,
        }
        .save(dir)
    }
}
