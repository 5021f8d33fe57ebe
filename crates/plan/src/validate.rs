//! [`PlanHeader::validate`]: the header's cross-references and sizes, checked
//! before the runtime touches a device.
//!
//! Beyond indices in range, every dispatch is checked against its kernel's
//! binding contract ([`BindingDecl`]): the slice binds exactly the bytes the
//! kernel declares, at an aligned offset, in a buffer of a kind the binding
//! can hold (a uniform binds the step parameters; nothing writes a weight,
//! the token ids or the step parameters; only scratch ports bind the scratch
//! buffer, counters inside its counter region and working memory past it).
//! The writer runs the same check, so a plan `gerbilc` writes is one
//! `gerbil-run` accepts.
//!
//! It is also the runtime's guard: every size the runtime multiplies,
//! divides by, casts to `u32` or allocates is checked here against
//! [`crate::limits`] — the model's sizes, every buffer and binding, each KV
//! cache and the RoPE table holding `max_context` position rows (the table
//! bound whole), the I/O buffers' kinds and sizes, workgroup sizes and
//! counts (at `max_tokens_per_step`, in `u64`) —
//! so a header that passes cannot make the runtime panic, wrap or read out
//! of range, however it was edited.

use crate::header::{
    Access, BindingDecl, BufferKind, BufferSlice, Dispatch, EmbeddingInfo, Kernel, OutputKind,
    PlanHeader, Port, SectionRef, Variant, SAMPLING_PARAMS_BYTES, STEP_PARAMS_BYTES,
};
use crate::limits::{self, Limit};

/// Alignment of every storage-binding offset (WebGPU's default
/// `minStorageBufferOffsetAlignment`).
pub const BINDING_OFFSET_ALIGN: u64 = 256;

impl PlanHeader {
    /// Checks internal consistency against a data region of `data_len` bytes.
    pub fn validate(&self, data_len: u64) -> Result<(), String> {
        self.check_model()?;
        if let Some(t) = &self.text.tokenizer {
            section_ok(t, "tokenizer", data_len)?;
        }
        for (i, b) in self.buffers.iter().enumerate() {
            if b.size == 0 || !b.size.is_multiple_of(4) {
                return Err(format!(
                    "buffer {i} ({}) has size {}, not a positive multiple of 4",
                    b.kind.describe(),
                    b.size
                ));
            }
            within(
                limits::BUFFER_BYTES,
                b.size,
                &format!("buffer {i} ({}) size", b.kind.describe()),
            )?;
            if let BufferKind::KvCache { row_bytes, .. } = b.kind {
                self.check_kv_cache(i, b.size, row_bytes)?;
            }
            if let BufferKind::StepParams = b.kind {
                if b.size < STEP_PARAMS_BYTES {
                    return Err(format!(
                        "buffer {i} (step parameters) has {} bytes, less than the \
                         {STEP_PARAMS_BYTES} the runtime writes",
                        b.size
                    ));
                }
            }
            if let BufferKind::Weight { section, name, .. } = &b.kind {
                section_ok(section, name, data_len)?;
                if section.len != b.size {
                    return Err(format!(
                        "buffer {i} ({name}) size {} differs from its section {}",
                        b.size, section.len
                    ));
                }
            }
            if let BufferKind::Scratch { counter_bytes } = b.kind {
                if counter_bytes > b.size || !counter_bytes.is_multiple_of(BINDING_OFFSET_ALIGN) {
                    return Err(format!(
                        "buffer {i} (dispatch scratch) has {counter_bytes} bytes of counters, \
                         not a multiple of {BINDING_OFFSET_ALIGN} within its {} bytes",
                        b.size
                    ));
                }
            }
        }
        // After the KV caches, whose sizes say more about a wrong context.
        for (i, b) in self.buffers.iter().enumerate() {
            if let BufferKind::Weight {
                name,
                shape,
                position_rows: true,
                ..
            } = &b.kind
            {
                self.check_position_table(i, name, shape, b.size)?;
            }
        }
        self.check_io()?;
        if let Some(t) = &self.selftest {
            self.check_selftest(t, data_len)?;
        }
        for (i, k) in self.kernels.iter().enumerate() {
            check_kernel(i, k)?;
        }
        if self.variants.is_empty() {
            return Err("the plan has no variant to run".into());
        }
        for v in &self.variants {
            check_requirements(v)?;
            if v.batch.is_empty() != (self.io.max_batch == 0) {
                return Err(format!(
                    "variant `{}` has {} batch dispatches but the plan's max_batch is {}",
                    v.name,
                    v.batch.len(),
                    self.io.max_batch
                ));
            }
            for (i, d) in v.batch.iter().enumerate() {
                let what = format!("{} batch dispatch {i} ({})", v.name, d.label);
                self.check_dispatch(d, &what)?;
                only_prefill_is_split(d, &what)?;
            }
            for (phase, list) in [("prefill", &v.prefill), ("decode", &v.decode)] {
                if list.is_empty() {
                    return Err(format!(
                        "variant `{}` has an empty {phase} schedule",
                        v.name
                    ));
                }
                for (i, d) in list.iter().enumerate() {
                    let what = format!("{} {phase} dispatch {i} ({})", v.name, d.label);
                    self.check_dispatch(d, &what)?;
                    if phase == "decode" {
                        only_prefill_is_split(d, &what)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The model's sizes: positive where the runtime divides or chunks by
    /// them (`vocab_size` is checked with the logits), and within
    /// [`crate::limits`].
    fn check_model(&self) -> Result<(), String> {
        let m = &self.model;
        for (value, name) in [
            (m.max_context, "max_context"),
            (m.max_tokens_per_step, "max_tokens_per_step"),
        ] {
            if value == 0 {
                return Err(format!("model.{name} is 0; it must be at least 1"));
            }
        }
        within(limits::CONTEXT, m.max_context, "model.max_context")?;
        within(
            limits::TOKENS_PER_STEP,
            m.max_tokens_per_step,
            "model.max_tokens_per_step",
        )?;
        if m.max_tokens_per_step > m.max_context {
            return Err(format!(
                "model.max_tokens_per_step {} exceeds model.max_context {}",
                m.max_tokens_per_step, m.max_context
            ));
        }
        within(limits::VOCABULARY, m.vocab_size, "model.vocab_size")?;
        within(limits::HIDDEN, m.hidden_size, "model.hidden_size")?;
        within(limits::LAYERS, m.num_layers, "model.num_layers")
    }

    /// A KV cache is `max_context` rows of whole 2-byte (f16) or 4-byte
    /// (f32) values, rounded up to 4 bytes: the runtime sizes a smaller
    /// context's cache as `size / max_context` bytes a row. With the row's
    /// bytes recorded, the row must be exactly that (so an edited
    /// `max_context` cannot pass for a cache of narrower rows).
    fn check_kv_cache(&self, i: usize, size: u64, row_bytes: Option<u64>) -> Result<(), String> {
        let positions = self.model.max_context;
        let row = size / positions;
        if row < 2 || !row.is_multiple_of(2) || (row * positions).next_multiple_of(4) != size {
            return Err(format!(
                "buffer {i} (a KV cache) has {size} bytes, not {positions} (max_context) rows \
                 of 2-byte or 4-byte values"
            ));
        }
        if let Some(declared) = row_bytes.filter(|&r| r != row) {
            return Err(format!(
                "buffer {i} (a KV cache) has {size} bytes: {positions} (max_context) rows of \
                 {row} bytes, but its rows are {declared} bytes"
            ));
        }
        Ok(())
    }

    /// A table indexed by position (the RoPE table) holds exactly
    /// `max_context` rows of whole 4-byte values: kernels read row `p` for
    /// every position `p` the KV cache holds.
    fn check_position_table(
        &self,
        i: usize,
        name: &str,
        shape: &[u64],
        size: u64,
    ) -> Result<(), String> {
        let positions = self.model.max_context;
        let rows = shape.first().copied().unwrap_or(0);
        let values = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(4));
        if rows != positions || values != Some(size) {
            return Err(format!(
                "buffer {i} ({name}) is indexed by position with shape {shape:?} in {size} bytes, \
                 not {positions} (max_context) rows of 4-byte values"
            ));
        }
        Ok(())
    }

    fn buffer_kind(&self, index: u32, what: &str) -> Result<&BufferKind, String> {
        self.buffers
            .get(index as usize)
            .map(|b| &b.kind)
            .ok_or_else(|| format!("{what} names buffer {index} of {}", self.buffers.len()))
    }

    /// The self-test's steps fit the plan: tokens of the vocabulary, each
    /// step within a step's tokens and all within the context, each output
    /// the size the runtime reads back.
    fn check_selftest(&self, t: &crate::SelfTest, data_len: u64) -> Result<(), String> {
        let m = &self.model;
        let width = m.embedding.as_ref().map_or(m.vocab_size, |e| e.dimension);
        if t.steps.is_empty() {
            return Err("the self-test has no step".into());
        }
        let mut tokens = 0u64;
        for (i, step) in t.steps.iter().enumerate() {
            let what = format!("self-test step {i}");
            section_ok(&step.output, &what, data_len)?;
            let n = step.input_ids.len() as u64;
            // An embedding step is an input of its own; a language model's
            // steps share the context.
            let (most, context) = match &m.embedding {
                Some(e) => (e.max_tokens.min(m.max_tokens_per_step), n),
                None => {
                    tokens += n;
                    (m.max_tokens_per_step, tokens)
                }
            };
            if n == 0 || n > most || context > m.max_context {
                return Err(format!(
                    "{what} has {n} tokens ({context} in the context), not 1 to {most} within \
                     a context of {}",
                    m.max_context
                ));
            }
            if let Some(id) = step
                .input_ids
                .iter()
                .find(|&&id| u64::from(id) >= m.vocab_size)
            {
                return Err(format!(
                    "{what} has token {id}, past the vocabulary of {}",
                    m.vocab_size
                ));
            }
            if step.output.len != 4 * width {
                return Err(format!(
                    "{what}'s output has {} bytes, not {width} f32 values",
                    step.output.len
                ));
            }
        }
        Ok(())
    }

    fn check_io(&self) -> Result<(), String> {
        let io = &self.io;
        if !matches!(
            self.buffer_kind(io.step_params, "step params")?,
            BufferKind::StepParams
        ) {
            return Err("the step-params binding is not a step-params buffer".into());
        }
        if !matches!(
            self.buffer_kind(io.token_ids, "token ids")?,
            BufferKind::TokenIds
        ) {
            return Err("the token-ids binding is not a token-ids buffer".into());
        }
        let ids_bytes = self.buffers[io.token_ids as usize].size;
        if ids_bytes < self.model.max_tokens_per_step.saturating_mul(4) {
            return Err(format!(
                "the token-ids buffer holds {ids_bytes} bytes, less than {} u32 ids",
                self.model.max_tokens_per_step
            ));
        }
        self.slice_ok(&io.logits, "logits output")?;
        if let Some(e) = &self.model.embedding {
            return self.embedding_io_ok(e);
        }
        if !matches!(
            self.buffer_kind(io.logits.buffer, "logits")?,
            BufferKind::Output {
                output: OutputKind::Logits
            }
        ) {
            return Err("the logits binding is not a logits output buffer".into());
        }
        let rows = if io.logits_all_rows {
            self.model.max_tokens_per_step
        } else {
            u64::from(io.max_batch).max(1)
        };
        if io.max_batch > 0 {
            if u64::from(io.max_batch) > self.model.max_tokens_per_step {
                return Err(format!(
                    "max_batch {} is more rows than the token-ids buffer's {}",
                    io.max_batch, self.model.max_tokens_per_step
                ));
            }
            let table = io
                .step_rows
                .ok_or("a plan with a batch schedule has no step-rows buffer")?;
            if !matches!(self.buffer_kind(table, "step rows")?, BufferKind::StepRows)
                || self.buffers[table as usize].size < 8 * u64::from(io.max_batch)
            {
                return Err(format!(
                    "the step-rows binding is not a step-rows buffer of {} rows",
                    io.max_batch
                ));
            }
        }
        if !io.logits.offset.is_multiple_of(4) {
            return Err(format!(
                "the logits output starts at byte {}, not a multiple of 4",
                io.logits.offset
            ));
        }
        if self.model.vocab_size == 0
            || io.logits.size < rows.saturating_mul(self.model.vocab_size).saturating_mul(4)
        {
            return Err(format!(
                "logits output holds {} bytes, less than {rows} row(s) of {} f32 logits",
                io.logits.size, self.model.vocab_size
            ));
        }
        if let Some(next) = &io.next_token {
            self.slice_ok(next, "next-token output")?;
            if !matches!(
                self.buffer_kind(next.buffer, "next token")?,
                BufferKind::Output {
                    output: OutputKind::NextToken
                }
            ) || next.size < 4
                || !next.offset.is_multiple_of(4)
            {
                return Err("the next-token binding is not a u32 next-token output buffer".into());
            }
        }
        if let Some(tokens) = &io.batch_tokens {
            self.slice_ok(tokens, "batch tokens output")?;
            if !matches!(
                self.buffer_kind(tokens.buffer, "batch tokens")?,
                BufferKind::Output {
                    output: OutputKind::NextToken
                }
            ) || io.max_batch == 0
                || tokens.size < 4 * u64::from(io.max_batch)
                || !tokens.offset.is_multiple_of(4)
            {
                return Err(format!(
                    "the batch-tokens binding is not a next-token output buffer of {} u32 \
                     tokens (one per batch row)",
                    io.max_batch
                ));
            }
        }
        if let Some(i) = io.sampling_params {
            let kind = self.buffer_kind(i, "sampling parameters")?;
            if !matches!(kind, BufferKind::SamplingParams)
                || self.buffers[i as usize].size < SAMPLING_PARAMS_BYTES
            {
                return Err(format!(
                    "io.sampling_params names buffer {i}, which is not a {SAMPLING_PARAMS_BYTES}-byte \
                     sampling-parameter uniform"
                ));
            }
        }
        Ok(())
    }

    /// An embedding plan's outputs: the vector in an embedding output
    /// buffer, no next token, every input in one step, and a segment table
    /// for steps of up to `max_batch` sequences.
    fn embedding_io_ok(&self, e: &EmbeddingInfo) -> Result<(), String> {
        let io = &self.io;
        if !matches!(
            self.buffer_kind(io.logits.buffer, "embedding")?,
            BufferKind::Output {
                output: OutputKind::Embedding
            }
        ) {
            return Err("an embedding plan's output is not an embedding output buffer".into());
        }
        within(limits::VOCABULARY, e.dimension, "model.embedding.dimension")?;
        if e.dimension == 0
            || io.logits.size < e.dimension * 4
            || !io.logits.offset.is_multiple_of(4)
        {
            return Err(format!(
                "the embedding output ({} bytes at {}) does not hold {} aligned f32 values",
                io.logits.size, io.logits.offset, e.dimension
            ));
        }
        if io.next_token.is_some() || io.max_batch > 0 {
            return Err("an embedding plan has no next-token output and no batch schedule".into());
        }
        let (steps, seqs) = (self.model.max_tokens_per_step, u64::from(e.max_inputs));
        if seqs == 0 || seqs > steps {
            return Err(format!(
                "an embedding plan packs 1 to {steps} inputs a step, not max_inputs {seqs}"
            ));
        }
        if io.logits.size < seqs * e.dimension * 4 {
            return Err(format!(
                "the embedding output holds {} bytes, less than {seqs} vectors",
                io.logits.size
            ));
        }
        let table = io
            .step_rows
            .ok_or("an embedding plan has no segment table (step-rows buffer)")?;
        if !matches!(self.buffer_kind(table, "segments")?, BufferKind::StepRows)
            || self.buffers[table as usize].size < 8 * (steps + seqs)
        {
            return Err(format!(
                "the segment table is not a step-rows buffer of {} pairs",
                steps + seqs
            ));
        }
        if e.max_tokens == 0 || e.max_tokens > self.model.max_tokens_per_step {
            return Err(format!(
                "an embedding input of {} tokens does not fit one step of {}",
                e.max_tokens, self.model.max_tokens_per_step
            ));
        }
        Ok(())
    }

    fn slice_ok(&self, s: &BufferSlice, what: &str) -> Result<(), String> {
        let buf = self
            .buffers
            .get(s.buffer as usize)
            .ok_or_else(|| format!("{what} names buffer {} of {}", s.buffer, self.buffers.len()))?;
        if s.offset
            .checked_add(s.size)
            .is_some_and(|end| end <= buf.size)
        {
            Ok(())
        } else {
            Err(format!(
                "{what} binds bytes {}+{} of buffer {} ({} bytes)",
                s.offset, s.size, s.buffer, buf.size
            ))
        }
    }

    fn check_dispatch(&self, d: &Dispatch, what: &str) -> Result<(), String> {
        let k = self
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| format!("{what} names kernel {} of {}", d.kernel, self.kernels.len()))?;
        if k.bindings.len() != d.bindings.len() {
            return Err(format!(
                "{what} binds {} buffers, kernel {} declares {}",
                d.bindings.len(),
                k.name,
                k.bindings.len()
            ));
        }
        let max_t = self.model.max_tokens_per_step;
        if let Some(r) = d.tokens {
            if r.min == 0 || r.min > r.max || u64::from(r.max) > max_t {
                return Err(format!(
                    "{what} runs in steps of {}..={} tokens: not a range within 1..={max_t}",
                    r.min, r.max
                ));
            }
        }
        // The largest step it runs in.
        let max_t = d.tokens.map_or(max_t, |r| u64::from(r.max));
        for (axis, w) in d.workgroups.iter().enumerate() {
            if w.divisor == 0 {
                return Err(format!(
                    "{what} divides its workgroup count (axis {axis}) by 0"
                ));
            }
            // Counts grow with T, so the largest step has the most.
            let n = u64::from(w.per_token)
                .saturating_mul(max_t)
                .saturating_add(u64::from(w.constant))
                .div_ceil(u64::from(w.divisor));
            within(
                limits::WORKGROUPS_PER_DIMENSION,
                n,
                &format!("{what}: workgroups along axis {axis} at T={max_t}"),
            )?;
        }
        for (n, (s, decl)) in d.bindings.iter().zip(&k.bindings).enumerate() {
            let what = format!("{what}, binding {n} (`{}` of kernel {})", decl.name, k.name);
            self.slice_ok(s, &what)?;
            let kind = &self.buffers[s.buffer as usize].kind;
            check_binding(kind, s, decl, &what)?;
            if matches!(kind, BufferKind::KvCache { .. }) && s.offset != 0 {
                return Err(format!(
                    "{what} binds a KV cache from byte {}; caches are bound from their start",
                    s.offset
                ));
            }
            let size = self.buffers[s.buffer as usize].size;
            if matches!(
                kind,
                BufferKind::Weight {
                    position_rows: true,
                    ..
                }
            ) && (s.offset, s.size) != (0, size)
            {
                return Err(format!(
                    "{what} binds bytes {}+{} of the {}, a table indexed by position; it must \
                     bind all {size} bytes",
                    s.offset,
                    s.size,
                    kind.describe()
                ));
            }
        }
        // WebGPU refuses a buffer bound both read-only and writable in one
        // dispatch (a usage conflict), so the plan must never do it.
        for (s, decl) in d.bindings.iter().zip(&k.bindings) {
            let writable = |(t, e): (&BufferSlice, &BindingDecl)| {
                t.buffer == s.buffer && e.access == Access::ReadWrite
            };
            if decl.access == Access::Read && d.bindings.iter().zip(&k.bindings).any(writable) {
                return Err(format!(
                    "{what} binds buffer {} ({}) both read-only (`{}`) and writable",
                    s.buffer,
                    self.buffers[s.buffer as usize].kind.describe(),
                    decl.name
                ));
            }
        }
        Ok(())
    }
}

/// `Ok` when `value` is within `limit`; else an error naming `what`.
fn within(limit: Limit, value: u64, what: &str) -> Result<(), String> {
    limit
        .check_or(value, what, "the plan was edited or damaged")
        .map_err(|e| e.to_string())
}

/// A kernel's workgroup size: every axis at least 1, and at most
/// [`limits::WORKGROUP_INVOCATIONS`] invocations in all.
fn check_kernel(i: usize, k: &Kernel) -> Result<(), String> {
    if k.workgroup_size.contains(&0) {
        return Err(format!(
            "kernel {i} ({}) has workgroup size {:?}; every axis must be at least 1",
            k.name, k.workgroup_size
        ));
    }
    // Three u32 axes can multiply past u64: saturate, so an edited header fails the limit
    // instead of wrapping to a small count (or panicking in a debug build).
    let invocations = k
        .workgroup_size
        .iter()
        .fold(1u64, |acc, &n| acc.saturating_mul(u64::from(n)));
    within(
        limits::WORKGROUP_INVOCATIONS,
        invocations,
        &format!("kernel {i} ({}): invocations per workgroup", k.name),
    )
}

/// A variant's device requirements: none beyond what any device could offer.
fn check_requirements(v: &Variant) -> Result<(), String> {
    let r = &v.requirements;
    let what = |field: &str| format!("variant `{}` requirement {field}", v.name);
    within(
        limits::BINDING_BYTES,
        r.max_storage_buffer_binding_size,
        &what("max_storage_buffer_binding_size"),
    )?;
    within(
        limits::BUFFER_BYTES,
        r.max_buffer_size,
        &what("max_buffer_size"),
    )?;
    within(
        limits::WORKGROUP_INVOCATIONS,
        u64::from(r.max_compute_invocations_per_workgroup),
        &what("max_compute_invocations_per_workgroup"),
    )
}

fn section_ok(r: &SectionRef, what: &str, data_len: u64) -> Result<(), String> {
    if r.offset
        .checked_add(r.len)
        .is_some_and(|end| end <= data_len)
    {
        Ok(())
    } else {
        Err(format!(
            "{what} section {}+{} lies outside the data region ({data_len} bytes)",
            r.offset, r.len
        ))
    }
}

/// Whether a binding declared `decl` may bind slice `s` of a buffer of `kind`.
fn check_binding(
    kind: &BufferKind,
    s: &BufferSlice,
    decl: &BindingDecl,
    what: &str,
) -> Result<(), String> {
    if s.size != decl.bytes {
        return Err(format!(
            "{what} binds {} bytes; the kernel declares {}",
            s.size, decl.bytes
        ));
    }
    // A zero-sized binding would bind the rest of the buffer (WebGPU's
    // "whole size"), not nothing.
    if s.size == 0 || !s.size.is_multiple_of(4) {
        return Err(format!(
            "{what} binds {} bytes, not a positive multiple of 4",
            s.size
        ));
    }
    within(
        limits::BINDING_BYTES,
        s.size,
        &format!("{what}: bytes bound"),
    )?;
    if !s.offset.is_multiple_of(BINDING_OFFSET_ALIGN) {
        return Err(format!(
            "{what} binds at offset {}, not a multiple of {BINDING_OFFSET_ALIGN}",
            s.offset
        ));
    }
    let fits = match decl.access {
        Access::Uniform => match decl.port {
            Port::Sampling => {
                matches!(kind, BufferKind::SamplingParams) && decl.bytes == SAMPLING_PARAMS_BYTES
            }
            _ => matches!(kind, BufferKind::StepParams) && decl.bytes == STEP_PARAMS_BYTES,
        },
        Access::Read => match decl.port {
            Port::Rows => matches!(kind, BufferKind::StepRows),
            _ => !matches!(
                kind,
                BufferKind::StepParams | BufferKind::SamplingParams | BufferKind::StepRows
            ),
        },
        Access::ReadWrite => matches!(
            kind,
            BufferKind::Arena
                | BufferKind::KvCache { .. }
                | BufferKind::Output { .. }
                | BufferKind::Scratch { .. }
        ),
    };
    let scratch_port = matches!(decl.port, Port::Scratch | Port::Counters);
    if scratch_port && decl.access != Access::ReadWrite {
        return Err(format!(
            "{what} is a scratch binding declared {}; scratch is read_write",
            decl.access.name()
        ));
    }
    if let BufferKind::Scratch { counter_bytes } = *kind {
        let end = s.offset.saturating_add(s.size);
        let (ok, region) = match decl.port {
            Port::Counters => (end <= counter_bytes, "inside its counters"),
            Port::Scratch => (s.offset >= counter_bytes, "past its counters"),
            _ => (false, "only through a scratch port"),
        };
        if !ok {
            return Err(format!(
                "{what} ({:?}) binds bytes {}..{end} of the dispatch scratch, whose counters are \
                 bytes 0..{counter_bytes}; it may bind it {region}",
                decl.port, s.offset
            ));
        }
    } else if scratch_port {
        return Err(format!(
            "{what} is a scratch binding ({:?}) but binds the {}",
            decl.port,
            kind.describe()
        ));
    }
    if fits {
        Ok(())
    } else {
        Err(format!(
            "{what} is declared {} but binds the {}",
            decl.access.name(),
            kind.describe()
        ))
    }
}

/// A dispatch of a decode or batch schedule runs in every step of it: only
/// prefill steps, whose `T` varies, pick a matmul's form by their length.
fn only_prefill_is_split(d: &Dispatch, what: &str) -> Result<(), String> {
    match d.tokens {
        Some(r) => Err(format!(
            "{what} runs in steps of {}..={} tokens only; ranges are for prefill dispatches",
            r.min, r.max
        )),
        None => Ok(()),
    }
}
