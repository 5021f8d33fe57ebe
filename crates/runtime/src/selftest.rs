//! A plan's self-test: every variant this device runs, on the short prompt
//! whose output the compiler computed on the CPU (`gerbil_plan::SelfTest`).
//!
//! [`run`] opens a session per variant (tensor cores as the options ask,
//! as the variant would run: on unless turned off), its KV cache as long
//! as the prompt, runs the
//! prompt's steps in order from an empty cache — for a language model a
//! prefill then one decode step, so both schedules are checked — and
//! compares each step's output with the reference: the largest |Δ| against
//! the variant's tolerance (`SelfTest::tolerance`: 1e-4 per unit of the
//! largest |value| for f32 variants, 5e-2 for f16 ones). A variant the
//! device cannot run is skipped with the reason; one whose session fails
//! to open or to run fails with the error. `gerbil-run PLAN selftest`
//! prints the result.
//!
//! The surprise: the `cpu` variant is skipped on a GPU. It runs there only
//! when named (`--variant cpu`), never unasked, so a GPU's self-test is of
//! the variants it would run; on a CPU adapter it is the first one checked.

use crate::device::{DeviceOptions, Gpu};
use crate::error::RuntimeError;
use crate::session::{Session, SessionOptions};
use gerbil_plan::{Feature, PlanFile, Requirements, SelfTest};
use serde::Serialize;

/// What the self-test found for one variant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantCheck {
    /// The variant's name.
    pub name: String,
    /// `f32` or `f16`.
    pub precision: &'static str,
    /// `passed`, `failed` or `skipped`.
    pub status: Status,
    /// The largest |Δ| from the reference over every step (absent when
    /// skipped, or when it failed before an output; NaN and infinities
    /// count as infinitely far).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_abs_diff: Option<f32>,
    /// The largest |Δ| allowed.
    pub tolerance: f32,
    /// Why it was skipped or failed without an output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A variant's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within its tolerance at every step.
    Passed,
    /// Past its tolerance at some step, or it could not run.
    Failed,
    /// This device does not run it.
    Skipped,
}

/// The whole self-test.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelfTestReport {
    /// The adapter it ran on.
    pub device: String,
    /// Each step's token ids.
    pub steps: Vec<Vec<u32>>,
    /// The largest |value| of the reference outputs.
    pub max_abs: f32,
    /// Every variant of the plan, best first.
    pub variants: Vec<VariantCheck>,
}

impl SelfTestReport {
    /// Whether no variant failed and at least one passed.
    pub fn passed(&self) -> bool {
        self.variants.iter().any(|v| v.status == Status::Passed)
            && !self.variants.iter().any(|v| v.status == Status::Failed)
    }
}

/// Runs the self-test of `plan` on the device `base` chooses (its variant
/// and precision are ignored: every variant is tried).
pub async fn run(plan: &PlanFile, base: &SessionOptions) -> Result<SelfTestReport, RuntimeError> {
    let header = &plan.header;
    let test = header.selftest.as_ref().ok_or(RuntimeError::NoSelfTest)?;
    let want: Vec<Vec<f32>> = test
        .steps
        .iter()
        .map(|s| {
            // Little-endian f32, possibly unaligned in the file.
            Ok(bytemuck::pod_collect_to_vec(&plan.section_bytes(s.output)?))
        })
        .collect::<Result<_, RuntimeError>>()?;
    let max_abs = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let embedding = header.model.embedding.is_some();
    let tokens = test.steps.iter().map(|s| s.input_ids.len() as u64).sum();
    // The device the sessions open on (native processes share it): whether
    // it is a CPU adapter, before any session uploads weights.
    let gpu = Gpu::open_on(
        &Requirements::default(),
        &DeviceOptions {
            timestamps: base.profiling,
            adapter: base.adapter,
            tensor_cores: base.tensor_cores,
        },
    )
    .await?;
    let cpu_adapter = crate::variant::device_features(&gpu).contains(&Feature::Cpu);
    let device = gpu.adapter.name.clone();
    drop(gpu);
    let mut variants = Vec::new();
    for v in &header.variants {
        let tolerance = SelfTest::tolerance(v, max_abs);
        let check = |status, max_abs_diff, reason| VariantCheck {
            name: v.name.clone(),
            precision: v.precision.name(),
            status,
            max_abs_diff,
            tolerance,
            reason,
        };
        if v.features.contains(&Feature::Cpu) && !cpu_adapter {
            let reason = "made for CPU adapters: a GPU runs it only when named (--variant cpu)";
            variants.push(check(Status::Skipped, None, Some(reason.into())));
            continue;
        }
        let opts = SessionOptions {
            variant: Some(v.name.clone()),
            precision: crate::PrecisionChoice::Auto,
            context: (!embedding).then_some(tokens),
            slots: 1,
            progress: None,
            ..base.clone()
        };
        let mut session = match Session::open(plan, &opts).await {
            Ok(s) => s,
            Err(RuntimeError::NoVariant { reasons, .. }) => {
                let off = v.features.contains(&Feature::CooperativeMatrix) && !base.tensor_cores;
                let reason = if off {
                    "tensor cores were turned off (--no-tensor-cores, GERBIL_TENSOR_CORES=0)"
                        .to_string()
                } else {
                    reasons
                };
                variants.push(check(Status::Skipped, None, Some(reason)));
                continue;
            }
            Err(e) => {
                variants.push(check(Status::Failed, None, Some(e.to_string())));
                continue;
            }
        };
        let mut worst = 0f32;
        let mut error = None;
        for (step, want) in test.steps.iter().zip(&want) {
            let got = if embedding {
                session.embed(&step.input_ids).await
            } else {
                session.forward(&step.input_ids).await
            };
            match got {
                Ok(got) => worst = worst.max(max_abs_diff(&got, want)),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        variants.push(match error {
            Some(e) => check(Status::Failed, None, Some(e)),
            None if worst <= tolerance => check(Status::Passed, Some(worst), None),
            // JSON has no infinity: a NaN, an infinity or a wrong length is
            // said in words.
            None if !worst.is_finite() => check(
                Status::Failed,
                None,
                Some("the output holds NaN or infinity, or has the wrong length".into()),
            ),
            None => check(Status::Failed, Some(worst), None),
        });
    }
    Ok(SelfTestReport {
        device,
        steps: test.steps.iter().map(|s| s.input_ids.clone()).collect(),
        max_abs,
        variants,
    })
}

/// The largest |a − b|, infinite where a value is not finite or the lengths
/// differ.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter().zip(b).fold(0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::max_abs_diff;

    #[test]
    fn a_nan_or_a_wrong_length_is_infinitely_far() {
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 2.0]), 0.5);
        assert_eq!(max_abs_diff(&[f32::NAN], &[0.0]), f32::INFINITY);
        assert_eq!(max_abs_diff(&[1.0], &[1.0, 2.0]), f32::INFINITY);
    }
}
