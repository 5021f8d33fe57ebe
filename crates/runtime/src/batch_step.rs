//! Batch steps: several sequences, a row each, through the plan's batch
//! schedule in one submit ([`Session::forward_batch_select`]), and what
//! comes back — each row's greedy token, chosen on the GPU, and the logits
//! of the rows that need them (sampling, penalties, a constraint).
//!
//! ```no_run
//! # async fn run(session: &mut gerbil_runtime::Session) -> Result<(), gerbil_runtime::RuntimeError> {
//! // Slot 0 and slot 1 each take one token; only row 1 samples on the CPU.
//! let out = session.forward_batch_select(&[(0, 17), (1, 42)], |row| row == 1).await?;
//! let greedy_token_of_row_0 = out.tokens[0];
//! let logits_of_row_1 = out.logits[1].as_deref();
//! # let _ = (greedy_token_of_row_0, logits_of_row_1); Ok(()) }
//! ```
//!
//! The surprise is what reading back costs: a 16-row step of a
//! 128,256-token vocabulary has 8 MB of logits, whose copy and scan on the
//! CPU took 4 of an H200's 13.6 ms per step; a step of greedy rows reads 64
//! bytes. The tokens are the plan's `batch_tokens` (the batch schedule
//! lowers `next_token` to every row's argmax); plans compiled before they
//! existed read every row's logits, as [`Session::forward_batch`] does.

use crate::error::RuntimeError;
use crate::session::Session;
use gerbil_plan::{PlanHeader, NOT_FINITE_TOKEN};

/// What a batch step gives back, by row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchOutput {
    /// Each row's greedy token — its logits' argmax, the lowest column
    /// among equals, as [`crate::argmax`] — chosen on the GPU; `None` for
    /// a plan compiled without batch tokens, and for a row whose logits
    /// hold a NaN or an infinity (its logits are then in `logits`, for the
    /// CPU's check to name).
    pub tokens: Vec<Option<u32>>,
    /// The logits of every row asked for, and of every row without a token.
    pub logits: Vec<Option<Vec<f32>>>,
}

/// Bytes of the batch readback buffer of a plan: the tokens region (a word
/// per row), then up to `max_batch` rows of logits.
pub(crate) fn readback_bytes(header: &PlanHeader) -> u64 {
    let rows = u64::from(header.io.max_batch);
    4 * rows + rows * header.model.vocab_size * 4
}

/// Fills `logits[rows[i]]` with the `i`-th row of `vocab` f32 values in
/// `bytes`.
fn unpack_rows(bytes: &[u8], rows: &[usize], vocab: usize, logits: &mut [Option<Vec<f32>>]) {
    let values: &[f32] = bytemuck::cast_slice(bytes);
    for (&row, chunk) in rows.iter().zip(values.chunks(vocab)) {
        logits[row] = Some(chunk.to_vec());
    }
}

impl Session {
    /// Copies the logits `rows` (ascending) of the last step into
    /// `readback`, packed from byte `at`: a run of consecutive rows is one
    /// copy.
    fn copy_logit_rows(
        &self,
        enc: &mut wgpu::CommandEncoder,
        rows: &[usize],
        readback: &wgpu::Buffer,
        at: u64,
    ) {
        let logits = self.header.io.logits;
        let row_bytes = self.vocab_size() * 4;
        let mut k = 0;
        while k < rows.len() {
            let run = rows[k..]
                .iter()
                .enumerate()
                .take_while(|&(j, &row)| row == rows[k] + j)
                .count();
            enc.copy_buffer_to_buffer(
                self.buffer(logits.buffer),
                logits.offset + rows[k] as u64 * row_bytes,
                readback,
                at + k as u64 * row_bytes,
                run as u64 * row_bytes,
            );
            k += run;
        }
    }

    /// One step of several sequences: `rows[i] = (slot, token)` feeds
    /// `token` to the sequence in `slot` at that slot's next position, all in
    /// one batch step, and returns each row's logits. A slot named several
    /// times takes its next positions in row order (a prompt's tokens fed
    /// beside other sequences' single tokens); every slot moves on by the
    /// rows it was given. Needs a plan with a batch schedule (`gerbilc
    /// compile --max-batch N`, at least `rows.len()` rows).
    pub async fn forward_batch(
        &mut self,
        rows: &[(usize, u32)],
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let out = self.forward_batch_select(rows, |_| true).await?;
        Ok(out
            .logits
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect())
    }

    /// [`Session::forward_batch`], reading back the logits only of the rows
    /// `want_logits` names (and of any row the GPU gave no token); every
    /// row's greedy token comes back as well, where the plan has them.
    pub async fn forward_batch_select(
        &mut self,
        rows: &[(usize, u32)],
        want_logits: impl Fn(usize) -> bool,
    ) -> Result<BatchOutput, RuntimeError> {
        let (t, taken) = self.prepare_batch(rows)?;
        self.ensure_pipelines(&self.batch, t).await?;
        // A handle (wgpu buffers are shared references), so the session
        // can move its slots on while the copy is in flight.
        let readback = self
            .batch_readback
            .clone()
            .ok_or(RuntimeError::NoBatchSchedule)?;
        let io = &self.header.io;
        let tokens_at = io.batch_tokens;
        let token_region = 4 * u64::from(io.max_batch);
        let row_bytes = self.vocab_size() * 4;
        let wanted: Vec<usize> = (0..rows.len())
            .filter(|&i| tokens_at.is_none() || want_logits(i))
            .collect();
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("batch step"),
            });
        self.record_pass(&mut enc, "batch", &self.batch, t, self.batch_keys(&taken))?;
        if let Some(tokens) = tokens_at {
            enc.copy_buffer_to_buffer(
                self.buffer(tokens.buffer),
                tokens.offset,
                &readback,
                0,
                4 * u64::from(t),
            );
        }
        self.copy_logit_rows(&mut enc, &wanted, &readback, token_region);
        self.gpu.queue.submit([enc.finish()]);
        self.advance_batch(&taken);
        let vocab = self.vocab_size() as usize;
        let len = token_region + wanted.len() as u64 * row_bytes;
        let n = rows.len();
        let (tokens, mut logits) = self
            .gpu
            .read_mapped_prefix(&readback, len, |bytes| {
                let (words, values) = bytes.split_at(token_region as usize);
                let words: &[u32] = bytemuck::cast_slice(words);
                let tokens: Vec<Option<u32>> = words[..n]
                    .iter()
                    .map(|&w| tokens_at.map(|_| w).filter(|&w| w != NOT_FINITE_TOKEN))
                    .collect();
                let mut logits = vec![None; n];
                unpack_rows(values, &wanted, vocab, &mut logits);
                (tokens, logits)
            })
            .await?;
        // A row without a token comes back whole, for the CPU's check (one
        // more copy of every such row, which only NaN or ±Inf causes).
        let flagged: Vec<usize> = (0..n)
            .filter(|&row| tokens[row].is_none() && logits[row].is_none())
            .collect();
        if !flagged.is_empty() {
            let mut enc = self
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("non-finite rows"),
                });
            self.copy_logit_rows(&mut enc, &flagged, &readback, 0);
            self.gpu.queue.submit([enc.finish()]);
            let len = flagged.len() as u64 * row_bytes;
            self.gpu
                .read_mapped_prefix(&readback, len, |bytes| {
                    unpack_rows(bytes, &flagged, vocab, &mut logits)
                })
                .await?;
        }
        Ok(BatchOutput { tokens, logits })
    }
}
