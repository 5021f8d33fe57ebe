//! The reference a plan's self-test checks every variant against
//! (`gerbil-run PLAN selftest`): a short prompt run through the graph as
//! lowered (after `--quantize` retyped its weights, before any pass) by the
//! CPU interpreter, in f64.
//!
//! [`fn@reference`] runs a language model's prompt as a prefill of all but its
//! last token and then one decode step, keeping the output the runtime
//! reads after each (the last row's logits), so a self-test covers both
//! schedules; an embedding model's prompt is one input, its vector kept.
//! [`attach`] stores the outputs as f32 sections of the plan.
//!
//! The surprise: the interpreter streams the weights
//! (`Interpreter::streaming`): each is made from the checkpoint when the
//! step reaches it and dropped after its last reader, so the reference of a
//! model costs one weight in f64 at a time, not the model eight times over;
//! its time is what a few tokens of f64 arithmetic take in the plain loops
//! of `gerbil_interp::reference` (matmuls on every core): on two cores
//! 0.95 s for SmolLM2-135M, 2.5 s for Gemma 3 270M (whose 262144-row LM
//! head runs on every prompt row).

use crate::assemble::Plan;
use crate::error::CompileError;
use crate::materialize::{Materializer, TensorSource, WeightOptions};
use gerbil_interp::Interpreter;
use gerbil_ir::Graph;
use gerbil_plan::{SelfTest, SelfTestStep};
use std::borrow::Cow;

/// One step of the reference: its token ids and the interpreter's output.
pub type Step = (Vec<u32>, Vec<f32>);

/// Tokens of the self-test's prompt, at most.
pub const PROMPT_TOKENS: u64 = 8;

/// The prompt: up to [`PROMPT_TOKENS`] ids spread over the vocabulary
/// (`(1 + 7919·i) mod vocab`), at most `most` of them.
pub fn prompt(vocab: u64, most: u64) -> Vec<u32> {
    (0..PROMPT_TOKENS.min(most).max(1))
        .map(|i| ((1 + 7919 * i) % vocab.max(1)) as u32)
        .collect()
}

/// The interpreter's outputs for `prompt` on `lowered` (the graph before the
/// passes), one per step: for a language model the prefill of all but the
/// last token, then the last token alone; for an embedding model the whole
/// prompt as one input.
pub fn reference(
    lowered: &Graph,
    tensors: &dyn TensorSource,
    options: WeightOptions,
    prompt: &[u32],
    embedding: bool,
) -> Result<Vec<Step>, CompileError> {
    let weights = Materializer {
        tensors,
        options: WeightOptions {
            allow_non_finite: true,
            ..options
        },
    };
    let failed = |e: gerbil_interp::InterpretError| CompileError::SelfTest(e.to_string());
    let mut it = Interpreter::streaming(lowered, &weights, prompt.len()).map_err(failed)?;
    let output = if embedding {
        gerbil_ir::EMBEDDING
    } else {
        gerbil_ir::LOGITS
    };
    let index = lowered
        .outputs
        .iter()
        .position(|(name, _)| name == output)
        .ok_or_else(|| CompileError::SelfTest(format!("the graph has no `{output}` output")))?;
    let steps: Vec<&[u32]> = match prompt.split_last() {
        Some((last, first)) if !embedding && !first.is_empty() => {
            vec![first, std::slice::from_ref(last)]
        }
        _ => vec![prompt],
    };
    steps
        .into_iter()
        .map(|ids| {
            let outs = it.step(ids).map_err(failed)?;
            let row = outs[index].last_row().iter().map(|&v| v as f32).collect();
            Ok((ids.to_vec(), row))
        })
        .collect()
}

/// Stores `steps` (from [`fn@reference`]) in `plan` as its self-test.
pub fn attach(plan: &mut Plan<'_>, steps: Vec<Step>) -> Result<(), CompileError> {
    let steps = steps
        .into_iter()
        .map(|(input_ids, output)| {
            let bytes: Vec<u8> = output.iter().flat_map(|v| v.to_le_bytes()).collect();
            SelfTestStep {
                input_ids,
                output: plan.push_section(Cow::Owned(bytes)),
            }
        })
        .collect();
    plan.set_selftest(SelfTest { steps })
}
