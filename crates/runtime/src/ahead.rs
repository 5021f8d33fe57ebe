//! Decoding with no CPU in the loop: each step's `sample_token` kernel writes
//! the next token where the next step reads it, and the runtime encodes many
//! steps into one submission.
//!
//! [`Session::set_sampling`] writes how tokens are chosen (greedy unless set;
//! sampling hashes the token's position, so a batch size never changes the
//! draw); [`Session::decode_on_gpu`] continues from the last step (a
//! prefill): the plan's `next_token` output already holds the first new
//! token. A
//! *batch* of up to `batch` steps is one command buffer; per step it copies
//! the step's parameters (`T = 1`, its own position) from a ring written
//! once per batch into the step-parameter uniform, copies `next_token` into
//! `token_ids[0]`, records the decode schedule, and appends `next_token` to
//! the batch's token history. The history comes back in one small readback.
//! Two batches are in flight: while the CPU waits for one, the GPU runs the
//! next, so the GPU never idles on a round trip. In a browser, where a
//! readback's round trip is an event-loop wait far longer than a batch's GPU
//! work, batches double from [`DECODE_BATCH`] up to [`DECODE_BATCH_MOST`]
//! while they come back quickly.
//!
//! The surprise: the GPU may run past an end-of-sequence token, since it only
//! shows up in a readback. Those extra steps only wrote KV-cache rows past
//! the end, so the session's position is set back to just after the last
//! token kept, and the output is exactly what step-by-step decoding gives.

use crate::clock::Clock;
use crate::error::RuntimeError;
use crate::sampling::SamplingParams;
use crate::session::Session;
use gerbil_plan::STEP_PARAMS_BYTES;

/// Decode steps per submission when decoding on the GPU: enough that the
/// round trip of a readback hides behind the next batch, few enough that
/// tokens stream smoothly (a batch is ~10–30 ms on a fast GPU).
pub const DECODE_BATCH: usize = 8;

/// Most decode steps per submission once batches have grown from
/// [`DECODE_BATCH`]: natively they do not grow (a readback's round trip is
/// ~0.1 ms); in a browser every readback waits for the event loop to
/// deliver its mapping, and Deno's WebGPU delivered one batch of 8 SmolLM2
/// tokens every 26 ms on an H200 whose GPU needed 7 — tokens came in bursts
/// of 8 at 326 tok/s, the GPU busy a third of the time. Larger batches
/// amortize that wait; the first stays small, so the first tokens still
/// show at once.
pub const DECODE_BATCH_MOST: usize = if cfg!(target_arch = "wasm32") {
    64
} else {
    DECODE_BATCH
};

/// A batch doubles only while batches come back faster than this: on a
/// slow adapter (a CPU's WebGPU) a batch of 8 already takes seconds, and a
/// larger one would only make Stop wait longer.
const GROW_WHILE_UNDER: std::time::Duration = std::time::Duration::from_millis(100);

/// Buffers of one in-flight batch.
struct Slot {
    /// Step parameters of each step, `STEP_PARAMS_BYTES` apart.
    params: wgpu::Buffer,
    /// The tokens the batch produced, `u32` each.
    history: wgpu::Buffer,
    /// `MAP_READ` copy of `history`.
    readback: wgpu::Buffer,
}

/// A submitted batch.
struct InFlight {
    slot: usize,
    tokens: usize,
    submission: wgpu::SubmissionIndex,
}

/// A decode-ahead run in progress: [`AheadDecoder::next_batch`] returns the
/// tokens of one batch at a time, keeping two batches in flight, so a caller
/// can stream tokens and stop between batches. Borrowing the session only
/// for each call lets the caller hold the decoder beside it.
pub struct AheadDecoder {
    slots: [Slot; 2],
    next: gerbil_plan::BufferSlice,
    /// The session's position when decoding started.
    start: u64,
    max_new: usize,
    /// Steps of the next batch to encode: doubles after each batch that
    /// came back within [`GROW_WHILE_UNDER`], up to `most`.
    batch: usize,
    most: usize,
    /// Started when the last batch came back (or decoding started).
    since_back: Clock,
    /// Tokens encoded so far (returned or in flight).
    encoded: usize,
    queue: std::collections::VecDeque<InFlight>,
    next_slot: usize,
}

impl AheadDecoder {
    /// Starts decoding after the session's last step (see
    /// [`Session::decode_on_gpu`]): at most `max_new` tokens, `batch` steps
    /// in the first submission, twice as many after each batch that comes
    /// back within [`GROW_WHILE_UNDER`], up to `most` (`most ≤ batch`: every
    /// batch `batch` steps).
    pub fn new(
        session: &Session,
        max_new: usize,
        batch: usize,
        most: usize,
    ) -> Result<Self, RuntimeError> {
        let next = session
            .header
            .io
            .next_token
            .ok_or(RuntimeError::NoGpuSampler)?;
        if session.last_step_tokens == 0 {
            return Err(RuntimeError::EmptyInput);
        }
        let start = session.position;
        let max = session.context();
        // Saturating: `max_new` may be any usize a caller passes.
        let needed = start.saturating_add(max_new.saturating_sub(1) as u64);
        if needed > max {
            return Err(RuntimeError::ContextOverflow { needed, max });
        }
        // A batch larger than the tokens to make would only allocate
        // buffers (`most` × 16 bytes) that are never filled.
        let batch = batch.clamp(1, max_new.max(1));
        let most = most.clamp(batch, max_new.max(1));
        Ok(AheadDecoder {
            slots: [session.ahead_slot(most), session.ahead_slot(most)],
            next,
            start,
            max_new,
            batch,
            most,
            since_back: Clock::start(),
            encoded: 0,
            queue: Default::default(),
            next_slot: 0,
        })
    }

    /// The tokens of the next batch, in order; empty once `max_new` tokens
    /// have been returned. Keeps the next batch running on the GPU while it
    /// waits for this one.
    pub async fn next_batch(&mut self, session: &Session) -> Result<Vec<u32>, RuntimeError> {
        session.ensure_pipelines(&session.decode, 1).await?;
        while self.queue.len() < self.slots.len() && self.encoded < self.max_new {
            let slot = self.next_slot;
            self.next_slot = (self.next_slot + 1) % self.slots.len();
            let tokens = self.batch.min(self.max_new - self.encoded);
            let submission = session.encode_batch(
                &self.slots[slot],
                self.next,
                self.start,
                self.encoded,
                tokens,
            )?;
            self.encoded += tokens;
            self.queue.push_back(InFlight {
                slot,
                tokens,
                submission,
            });
        }
        let Some(b) = self.queue.pop_front() else {
            return Ok(Vec::new());
        };
        let tokens = session
            .gpu
            .read_mapped_after(&self.slots[b.slot].readback, b.submission, |bytes| {
                bytemuck::cast_slice::<u8, u32>(&bytes[..b.tokens * 4]).to_vec()
            })
            .await?;
        if self.since_back.elapsed() < GROW_WHILE_UNDER {
            self.batch = (2 * self.batch).min(self.most);
        }
        self.since_back = Clock::start();
        Ok(tokens)
    }

    /// Ends decoding with the first `kept` tokens returned as the output:
    /// the session's position follows the last of them (which is not yet in
    /// the KV cache), like step-by-step decoding. Steps still in flight only
    /// write KV-cache rows past that position, which later steps overwrite.
    pub fn finish(self, session: &mut Session, kept: usize) {
        session.position = self.start + kept.saturating_sub(1) as u64;
        session.last_step_tokens = 1;
    }
}

impl Session {
    /// Whether the plan chooses tokens on the GPU with `params`
    /// ([`Session::decode_on_gpu`] works): greedy needs the `next_token`
    /// output, sampling also its parameter uniform (plans compiled before
    /// either decode through the CPU). Never with penalties
    /// ([`SamplingParams::has_penalties`]): they need the tokens so far,
    /// which only the CPU sampler keeps.
    pub fn can_sample_on_gpu(&self, params: &SamplingParams) -> bool {
        let io = &self.header.io;
        io.next_token.is_some()
            && !params.has_penalties()
            && (params.is_greedy() || io.sampling_params.is_some())
    }

    /// Sets how every following step chooses its `next_token` (greedy until
    /// set). Validate `params` with [`crate::Sampler::new`] first. Ignored by
    /// plans without the sampling uniform.
    pub fn set_sampling(&self, params: &SamplingParams) {
        if let Some(i) = self.header.io.sampling_params {
            self.gpu.queue.write_buffer(
                self.buffer(i),
                0,
                bytemuck::cast_slice(&params.to_words()),
            );
        }
    }

    /// Decoding after [`Session::forward_no_readback`] (or
    /// [`Session::forward`]), choosing as [`Session::set_sampling`] said
    /// before that step: returns up to `max_new` tokens, the first one
    /// chosen by that step, stopping after the first token in `eos`.
    /// `on_token` sees each token as its batch comes back; returning `false`
    /// stops generation after that token. Steps are encoded `batch` at a
    /// time, doubling up to `most` ([`AheadDecoder::new`]). Afterwards the
    /// session's position follows the last token returned (that token
    /// itself is not yet in the KV cache), like step-by-step decoding.
    pub async fn decode_on_gpu(
        &mut self,
        max_new: usize,
        eos: &[u32],
        (batch, most): (usize, usize),
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>, RuntimeError> {
        let mut decoder = AheadDecoder::new(self, max_new, batch, most)?;
        let mut out: Vec<u32> = Vec::with_capacity(max_new.min(4096));
        'batches: loop {
            let tokens = decoder.next_batch(self).await?;
            if tokens.is_empty() {
                break;
            }
            for t in tokens {
                out.push(t);
                if !on_token(t) || eos.contains(&t) || out.len() >= max_new {
                    break 'batches;
                }
            }
        }
        decoder.finish(self, out.len());
        Ok(out)
    }

    /// Buffers for one batch of up to `batch` tokens.
    fn ahead_slot(&self, batch: usize) -> Slot {
        use wgpu::BufferUsages as U;
        let device = &self.gpu.device;
        let make = |label, size, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let tokens = batch as u64 * 4;
        Slot {
            params: make(
                "decode-ahead step parameters",
                batch as u64 * STEP_PARAMS_BYTES,
                U::COPY_SRC | U::COPY_DST,
            ),
            history: make("decode-ahead tokens", tokens, U::COPY_SRC | U::COPY_DST),
            readback: make("decode-ahead readback", tokens, U::MAP_READ | U::COPY_DST),
        }
    }

    /// Encodes and submits tokens `first..first + tokens` of a greedy run
    /// that started at position `start`: token 0 is the prefill's, token `i`
    /// comes from the decode step at position `start + i - 1`.
    fn encode_batch(
        &self,
        slot: &Slot,
        next: gerbil_plan::BufferSlice,
        start: u64,
        first: usize,
        tokens: usize,
    ) -> Result<wgpu::SubmissionIndex, RuntimeError> {
        let io = &self.header.io;
        let next_buf = self.buffer(next.buffer);
        let ids = self.buffer(io.token_ids);
        let params_buf = self.buffer(io.step_params);
        let words = (STEP_PARAMS_BYTES / 4) as usize;
        let mut params = vec![0u32; tokens * words];
        for (i, p) in params.chunks_mut(words).enumerate() {
            p[0] = 1;
            // ≤ the context (AheadDecoder::new checked), which fits u32.
            p[1] = (start + (first + i) as u64).saturating_sub(1) as u32;
        }
        self.gpu
            .queue
            .write_buffer(&slot.params, 0, bytemuck::cast_slice(&params));
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("decode ahead"),
            });
        for i in 0..tokens {
            if first + i > 0 {
                let p = i as u64 * STEP_PARAMS_BYTES;
                enc.copy_buffer_to_buffer(&slot.params, p, params_buf, 0, STEP_PARAMS_BYTES);
                enc.copy_buffer_to_buffer(next_buf, next.offset, ids, 0, 4);
                // The step at position start + first + i - 1 holds one more key.
                let keys = start + (first + i) as u64;
                self.record_pass(&mut enc, "decode", &self.decode, 1, keys)?;
            }
            enc.copy_buffer_to_buffer(next_buf, next.offset, &slot.history, i as u64 * 4, 4);
        }
        enc.copy_buffer_to_buffer(&slot.history, 0, &slot.readback, 0, tokens as u64 * 4);
        Ok(self.gpu.queue.submit([enc.finish()]))
    }
}
