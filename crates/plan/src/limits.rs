//! The largest sizes gerbil supports, in one table: context, tokens per
//! step, vocabulary, hidden size, layer count, binding and buffer bytes,
//! workgroup counts and sizes.
//!
//! Every size that comes from a flag, a checkpoint or a plan header is
//! checked against [`TABLE`] before anything multiplies it: `gerbilc`
//! refuses a `--max-context` or a model over a limit, and
//! [`PlanHeader::validate`](crate::PlanHeader::validate) refuses a plan
//! whose header exceeds one, so a product of two checked sizes never wraps
//! a `u64` and a position never wraps the kernels' `u32`. Use
//! [`Limit::check`] to check a value; its [`LimitError`] names the value,
//! where it came from and the limit, and says what to do.
//!
//! The surprise: most limits come from the kernels, not from the file
//! format — the file stores `u64`s, but a kernel dispatches one workgroup
//! per token along an axis (at most 65,535), keeps positions in `u32`, or
//! holds token ids in `f32` in the sampler. Each entry says which.
//! `docs/plan-format.md` prints the same table.

/// One supported maximum: what it bounds, the bound, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// What is bounded, as a sentence says it (`context`, `vocabulary`).
    pub name: &'static str,
    /// The largest value supported (inclusive).
    pub max: u64,
    /// The unit of `max` (`tokens`, `bytes`).
    pub unit: &'static str,
    /// Why the bound is where it is (what in the kernels or the format).
    pub why: &'static str,
}

/// A value over one of the [`TABLE`]'s limits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {value} exceeds the largest {} gerbil supports ({} {}: {}); {fix}",
    limit.name, limit.max, limit.unit, limit.why
)]
pub struct LimitError {
    /// Where the value came from, e.g. `--max-context` or `the model's vocab_size`.
    pub what: String,
    /// The value.
    pub value: u64,
    /// The limit it exceeds.
    pub limit: Limit,
    /// What to do instead.
    pub fix: String,
}

impl Limit {
    /// `Ok` when `value` is within the limit; else an error naming `what`
    /// (the flag or field the value came from) that tells the user to pick
    /// at most the limit.
    pub fn check(&self, value: u64, what: &str) -> Result<(), LimitError> {
        let fix = format!("pick at most {}", self.max);
        self.check_or(value, what, &fix)
    }

    /// Like [`Limit::check`], with `fix` as the advice (for a value the user
    /// did not pick, such as a model's vocabulary).
    pub fn check_or(&self, value: u64, what: &str, fix: &str) -> Result<(), LimitError> {
        if value <= self.max {
            Ok(())
        } else {
            Err(LimitError {
                what: what.to_string(),
                value,
                limit: *self,
                fix: fix.to_string(),
            })
        }
    }
}

/// Tokens the KV cache holds (`max_context`, `--max-context`, `--ctx`).
pub const CONTEXT: Limit = Limit {
    name: "context",
    max: 1 << 30,
    unit: "tokens",
    why: "each layer's KV cache is one storage binding of at most 2 GiB - 4 bytes \
          holding at least one 2-byte value per position, and kernels keep positions in u32",
};

/// Tokens of one prefill step (`max_tokens_per_step`, `--max-tokens-per-step`).
pub const TOKENS_PER_STEP: Limit = Limit {
    name: "step",
    max: 65_535,
    unit: "tokens",
    why: "the embedding, RMSNorm and GEMV kernels dispatch one workgroup per token along \
          one axis, and WebGPU allows at most 65535 workgroups per dimension",
};

/// Vocabulary size (`vocab_size`: logits per position).
pub const VOCABULARY: Limit = Limit {
    name: "vocabulary",
    max: 1 << 24,
    unit: "tokens",
    why: "the GPU sampler (`sample_token`) holds token ids in f32, exact up to 2^24",
};

/// Hidden size (`hidden_size`: the width of the residual stream).
pub const HIDDEN: Limit = Limit {
    name: "hidden size",
    max: 65_535 * 256,
    unit: "values",
    why: "elementwise kernels dispatch one 256-thread workgroup per 256 values of a row \
          along one axis, at most 65535 workgroups",
};

/// Transformer layers (`num_hidden_layers`).
pub const LAYERS: Limit = Limit {
    name: "layer count",
    max: 1 << 16,
    unit: "layers",
    why: "no kernel bounds it, but each layer adds dispatches and two KV-cache buffers to \
          u32-indexed plan tables; the largest published models have under 200",
};

/// Bytes of one storage binding (a weight shard, an activation, a KV cache).
pub const BINDING_BYTES: Limit = Limit {
    name: "storage binding",
    max: (2 << 30) - 4,
    unit: "bytes",
    why: "the desktop target's maxStorageBufferBindingSize, the largest gerbil compiles \
          for (drivers stop at 2 GiB); larger weights are split into row shards",
};

/// Bytes of one GPU buffer.
pub const BUFFER_BYTES: Limit = Limit {
    name: "buffer",
    max: 1 << 40,
    unit: "bytes",
    why: "no GPU has a terabyte of memory; a larger buffer can only come from a damaged \
          header, and is refused before the device is asked for it",
};

/// Workgroups of one dispatch along one axis, at `max_tokens_per_step`.
pub const WORKGROUPS_PER_DIMENSION: Limit = Limit {
    name: "dispatch",
    max: 65_535,
    unit: "workgroups per dimension",
    why: "WebGPU's maxComputeWorkgroupsPerDimension, which every adapter offers and no \
          kernel exceeds",
};

/// Invocations of one workgroup (the product of `@workgroup_size`).
pub const WORKGROUP_INVOCATIONS: Limit = Limit {
    name: "workgroup",
    max: 1024,
    unit: "invocations",
    why: "maxComputeInvocationsPerWorkgroup of the largest adapters (Vulkan, Metal and \
          D3D12 stop at 1024); gerbil's kernels use at most 256, WebGPU's default",
};

// Checked when gerbil is built: a position plus a step fits the kernels'
// u32, every-row logits and a KV cache of the widest rows fit a u64, and a
// step's per-token workgroups fit one dispatch dimension.
const _: () = {
    assert!(CONTEXT.max + TOKENS_PER_STEP.max < u32::MAX as u64);
    assert!((TOKENS_PER_STEP.max as u128) * (VOCABULARY.max as u128) * 4 < u64::MAX as u128);
    assert!((CONTEXT.max as u128) * (HIDDEN.max as u128) * 4 < u64::MAX as u128);
    assert!(TOKENS_PER_STEP.max <= WORKGROUPS_PER_DIMENSION.max);
};

/// Every limit, in the order `docs/plan-format.md` lists them.
pub const TABLE: [Limit; 9] = [
    CONTEXT,
    TOKENS_PER_STEP,
    VOCABULARY,
    HIDDEN,
    LAYERS,
    BINDING_BYTES,
    BUFFER_BYTES,
    WORKGROUPS_PER_DIMENSION,
    WORKGROUP_INVOCATIONS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_over_a_limit_names_itself_the_limit_and_the_fix() {
        assert!(CONTEXT.check(1 << 30, "--max-context").is_ok());
        let e = CONTEXT.check(4_294_967_296, "--max-context").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--max-context 4294967296 exceeds the largest context gerbil supports \
             (1073741824 tokens: each layer's KV cache is one storage binding of at most \
             2 GiB - 4 bytes holding at least one 2-byte value per position, and kernels \
             keep positions in u32); pick at most 1073741824"
        );
    }

    /// docs/plan-format.md prints every limit with its number.
    #[test]
    fn the_docs_list_every_limit() {
        let doc = include_str!("../../../docs/plan-format.md");
        for l in TABLE {
            let row = format!("| {} | {} {} |", l.name, l.max, l.unit);
            assert!(doc.contains(&row), "docs/plan-format.md lacks `{row}`");
        }
    }
}
