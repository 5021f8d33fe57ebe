//! Targets `compile` and `codegen`: bytes as a `config.json` and the size
//! flags of `gerbilc compile` (`--max-context`, `--max-tokens-per-step`,
//! `--target`, which picks the precisions the plan's variants use), through
//! the compiler's real entry point [`gerbil_compiler::compile`] on an
//! in-memory checkpoint whose weights are the shapes the config implies,
//! filled with small random numbers.
//!
//! Input layout: one byte of flags (bit 0: the `desktop` target, bit 4: the
//! `universal` one, both or neither: `portable`; bit 1: give `--max-context`; bit 2:
//! give `--max-tokens-per-step`; bit 3: `--quantize q4_0`), the two sizes as little-endian `u64`s, then the
//! config. `compile` stops after the passes (an observer error ends it
//! before codegen); `codegen` goes on to the prefill chunk choice, kernels,
//! naga validation and the plan, which is ~100× slower per input (60–190 ms
//! for a tiny model in release), so it runs far fewer inputs.
//!
//! Configs whose weights would exceed [`MAX_WEIGHT_ELEMENTS`] are skipped: a
//! fuzzer with a 2 GB memory limit cannot tell a real checkpoint's size
//! from a leak.

use crate::frame::{take_u64, take_u8};
use gerbil_compiler::{CompileError, CompileOptions, Observer, Target};
use gerbil_frontend_hf::{
    required_weights, Checkpoint, HfConfig, LowerOptions, TextAssets, WeightStore,
};
use gerbil_ir::Graph;
use std::collections::HashSet;
use std::path::PathBuf;

/// Most weight elements a fuzzed config may ask for (4 MiB of f32).
pub const MAX_WEIGHT_ELEMENTS: u64 = 1 << 20;

/// Lowering and passes, stopping before codegen.
pub fn compile(data: &[u8]) {
    let _ = run(data, false);
}

/// The whole compilation: lowering, passes, chunk choice, codegen with naga, the plan.
pub fn codegen(data: &[u8]) {
    let _ = run(data, true);
}

/// Ends a compilation after its passes.
struct StopAfterPasses;

impl Observer for StopAfterPasses {
    fn finished(&mut self, _graph: &Graph) -> Result<(), CompileError> {
        Err(CompileError::Option {
            option: "fuzz",
            value: String::new(),
            reason: "stopped after the passes".into(),
        })
    }
}

/// The compilation's outcome, or `None` when the input is not a config
/// with weights to generate (not JSON, not a known config shape, too big).
fn run(mut data: &[u8], codegen: bool) -> Option<Result<(), CompileError>> {
    let flags = take_u8(&mut data);
    let max_context = take_u64(&mut data);
    let max_tokens_per_step = take_u64(&mut data);
    let options = CompileOptions {
        max_context: (flags & 2 != 0).then_some(max_context),
        max_tokens_per_step: (flags & 4 != 0).then_some(max_tokens_per_step),
        quantize: (flags & 8 != 0).then_some(gerbil_compiler::Quantization::Q4_0),
        target: match flags & 17 {
            1 => Target::desktop(),
            16 => Target::universal(),
            _ => Target::portable(),
        },
        // The f64 interpreter's reference is not what these targets probe.
        selftest: false,
        ..CompileOptions::default()
    };
    let mut ckpt = checkpoint(data)?;
    let lower = LowerOptions {
        max_context: options.max_context,
    };
    let required = required_weights(&ckpt, &lower).ok()?;
    let weights = random_weights(&required, data)?;
    let file = (ckpt.dir.join("model.safetensors"), weights.as_slice());
    ckpt.weights = WeightStore::from_bytes(&[file]).expect("generated weights are valid");
    let compiled = if codegen {
        gerbil_compiler::compile(&ckpt, &options, &mut ())
    } else {
        gerbil_compiler::compile(&ckpt, &options, &mut StopAfterPasses)
    };
    // Writing the plan would materialize every weight: so does this.
    Some(compiled.and_then(|c| c.plan.check_weights()))
}

/// A checkpoint of the input's config, without weights yet.
fn checkpoint(config: &[u8]) -> Option<Checkpoint> {
    let text = std::str::from_utf8(config).ok()?;
    let dir = PathBuf::from("/fuzz/model");
    let config_json = serde_json::from_str(text).ok()?;
    let config = HfConfig::from_json_str(text, &dir.join("config.json")).ok()?;
    Some(Checkpoint {
        dir,
        name: "fuzz".into(),
        config_json,
        config,
        weights: WeightStore::empty(),
        has_weights: true,
        text: TextAssets::default(),
        adapter: None,
    })
}

/// A safetensors file holding `required`, f32 in [-0.125, 0.125) from a
/// generator seeded by the config; `None` past [`MAX_WEIGHT_ELEMENTS`].
fn random_weights(required: &[gerbil_frontend_hf::RequiredWeight], seed: &[u8]) -> Option<Vec<u8>> {
    let mut total = 0u64;
    for w in required {
        let n = w.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        total = total.checked_add(n)?;
    }
    if total > MAX_WEIGHT_ELEMENTS {
        return None;
    }
    let mut state = crc32fast::hash(seed) as u64 | 1;
    let mut tensors = Vec::with_capacity(required.len());
    let mut seen = HashSet::new();
    for w in required.iter().filter(|w| seen.insert(&w.name)) {
        let n: u64 = w.shape.iter().product();
        let mut bytes = Vec::with_capacity(n as usize * 4);
        for _ in 0..n {
            // xorshift64: deterministic, and never zero.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            bytes.extend_from_slice(&(x * 0.25).to_le_bytes());
        }
        let shape: Vec<usize> = w.shape.iter().map(|&d| d as usize).collect();
        tensors.push((w.name.clone(), shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .expect("the bytes match the shape");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_config(flags: u8, max_context: u64, step: u64) -> Vec<u8> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/models/tiny/llama"
        );
        let config = std::fs::read(format!("{dir}/config.json")).expect("the tiny Llama");
        let mut input = vec![flags];
        input.extend_from_slice(&max_context.to_le_bytes());
        input.extend_from_slice(&step.to_le_bytes());
        input.extend_from_slice(&config);
        input
    }

    /// The harness reaches what it claims to: a real config stops after the
    /// passes in `compile` and compiles whole in `codegen`, with the flags.
    #[test]
    fn a_real_config_reaches_the_end_of_each_target() {
        for input in [tiny_config(0, 0, 0), tiny_config(7, 96, 3)] {
            match run(&input, false) {
                Some(Err(CompileError::Option { option: "fuzz", .. })) => {}
                other => panic!("compile did not stop after the passes: {other:?}"),
            }
            assert!(matches!(run(&input, true), Some(Ok(()))));
        }
        assert!(run(b"\0not json", false).is_none());
    }
}
