//! Several generations decoded together: each [`Batch::step`] feeds every
//! running sequence its last token in one batch step of the GPU (a plan
//! compiled with `gerbilc compile --max-batch N`) and chooses each one's next
//! token on the CPU.
//!
//! ```no_run
//! # async fn run(model: &mut gerbil::Model) -> Result<(), gerbil::Error> {
//! use gerbil::GenerationSettings;
//! let mut batch = model.batch()?;
//! let settings = GenerationSettings::default();
//! let a = batch.start(&[1, 2, 3], &settings, None)?;
//! let b = batch.start(&[4, 5], &settings, None)?;
//! while batch.running() > 0 {
//!     for (id, piece) in batch.step().await? {
//!         print!("[{id}] {}", piece.text);
//!     }
//! }
//! # let _ = (a, b); Ok(()) }
//! ```
//!
//! Each sequence runs in a KV-cache slot of its own (the session needs one
//! per sequence: `SessionOptions::slots`), chosen like a single
//! generation's ([`crate::slots`]): a prompt sharing a prefix with any slot,
//! a running sequence's too, starts from a copy of those rows.
//! [`Batch::start`] only checks the request and places it; its prompt runs
//! in later steps: as rows of batch steps beside the running sequences'
//! tokens, as many as the rows they leave (the plan's `--max-batch`), going
//! on in the next step where it does not fit — a batch step reads each
//! weight once whatever its rows, so a short prompt costs a few steps that
//! the running sequences take anyway; a prompt longer than
//! [`LONG_PROMPT_STEPS`] steps' rows runs one chunk of the plan's prefill
//! step per [`Batch::step`] instead, on its own, so it delays the running
//! sequences' next tokens by one chunk at a time, never by its whole length.
//! A sequence's first piece comes from the step that runs its prompt's last
//! token. A greedy answer (no penalties, constraint or top logits) takes
//! the token the batch step chose on the GPU for its row, the argmax of the
//! row's logits; any other reads its row back and chooses on the CPU by the
//! same rules as [`crate::Generation`]'s (sampling, penalties, stop strings,
//! constraints), so a sequence's tokens equal the ones it would get alone —
//! and a step of greedy rows reads back a word a row, not a row of logits
//! (8 MB for 16 rows of a 128,256-token vocabulary).
//! The surprise: the answers are the same, the arithmetic not always — a
//! batch step's matmuls sum in a single step's order only in variants with
//! subgroups (`gemv_batch`) and in `cpu` (one kernel whatever the rows);
//! the portable ones multiply through the prefill
//! GEMM, and the int8 variant's decode rounds `x` to int8 where a batch
//! step does not, so there logits differ in the last bits (int8: in the
//! second decimal) and a near-tie can go the other way.

use crate::constraint::TokenConstraint;
use crate::decoding::Decoding;
use crate::error::Error;
use crate::generation::{FinishReason, GenerationSettings, GenerationStats, Piece};
use crate::model::Model;
use gerbil_runtime::{Clock, RuntimeError};

/// A prompt longer than this many batch steps' rows runs through the
/// prefill step. Rows ride along the steps the running sequences take
/// anyway, and never stall them; but a step costs more with every row (an
/// H200's 16-row step of the Llama-3.2-1B shape takes 12.8 ms; a prefill
/// step of 16 tokens 4.6 ms, of 128 tokens 13 ms), so a long prompt is
/// done sooner by the prefill step. (8 is a first choice, not yet a
/// measured one.)
pub const LONG_PROMPT_STEPS: usize = 8;

/// One running (or ended, not yet removed) sequence.
struct Sequence {
    slot: usize,
    decoding: Decoding,
    /// Prompt tokens not yet run (the first to run comes first).
    prompt: Vec<u32>,
    /// The token chosen last and not yet fed to the model.
    pending: Option<u32>,
    clock: Clock,
}

/// Generations decoded together; see the [module docs](self).
pub struct Batch<'m> {
    model: &'m mut Model,
    /// By id; `None` once removed.
    sequences: Vec<Option<Sequence>>,
}

impl Model {
    /// Starts decoding several sequences together ([`Batch`]). Needs a plan
    /// with a batch schedule and a session with more than one slot.
    pub fn batch(&mut self) -> Result<Batch<'_>, Error> {
        if self.session.header().io.max_batch == 0 {
            return Err(RuntimeError::NoBatchSchedule.into());
        }
        Ok(Batch {
            model: self,
            sequences: Vec::new(),
        })
    }
}

impl Batch<'_> {
    /// Most sequences that run at once: the plan's batch size and the
    /// session's slots, whichever is smaller.
    pub fn capacity(&self) -> usize {
        let max = self.model.session.header().io.max_batch as usize;
        max.min(self.model.session.slots())
    }

    /// The model the batch runs on.
    pub fn model(&self) -> &Model {
        self.model
    }

    /// Sequences still generating.
    pub fn running(&self) -> usize {
        self.live().filter(|s| s.decoding.finish.is_none()).count()
    }

    fn live(&self) -> impl Iterator<Item = &Sequence> {
        self.sequences.iter().flatten()
    }

    /// Starts a sequence: checks `prompt` and `settings`, places it in a
    /// free slot (reusing any slot's rows of its prefix) and returns its id;
    /// its prompt runs in the following steps.
    pub fn start(
        &mut self,
        prompt: &[u32],
        settings: &GenerationSettings,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<usize, Error> {
        let mut decoding = Decoding::new(self.model, prompt, settings)?;
        decoding.constraint = constraint;
        let mut busy = vec![false; self.model.session.slots()];
        for s in self.live().filter(|s| s.decoding.finish.is_none()) {
            busy[s.slot] = true;
        }
        if busy.iter().filter(|&&b| b).count() >= self.capacity() {
            return Err(Error::BatchFull {
                running: self.capacity(),
            });
        }
        let model = &mut *self.model;
        let keep = model.place_prompt(prompt, &busy)?;
        decoding.stats.cached_tokens = keep;
        let id = self.sequences.len();
        self.sequences.push(Some(Sequence {
            slot: model.session.slot(),
            decoding,
            prompt: prompt[keep..].to_vec(),
            pending: None,
            clock: Clock::start(),
        }));
        Ok(id)
    }

    /// Runs the next chunk (the plan's prefill step) of sequence `id`'s
    /// prompt on its own; its first piece when that was the last chunk.
    async fn prefill_chunk(&mut self, id: usize) -> Result<Option<(usize, Piece)>, Error> {
        let chunk = usize::try_from(self.model.session.header().model.max_tokens_per_step)
            .unwrap_or(usize::MAX)
            .max(1);
        let Some(s) = self.sequences[id].as_mut() else {
            return Ok(None);
        };
        let model = &mut *self.model;
        model.switch_slot(s.slot)?;
        let n = chunk.min(s.prompt.len());
        let part: Vec<u32> = s.prompt.drain(..n).collect();
        let mut logits = model.session.forward(&part).await?;
        model.cached.extend_from_slice(&part);
        if !s.prompt.is_empty() {
            return Ok(None);
        }
        s.decoding.stats.prefill = s.clock.elapsed();
        let position = model.session.position().saturating_sub(1);
        let (token, top) = s.decoding.choose(&mut logits, position)?;
        let piece = s.decoding.piece(token, top)?;
        s.pending = s.decoding.finish.is_none().then_some(token);
        Ok(Some((id, piece)))
    }

    /// One step: every running sequence's next token, and the tokens of
    /// joining sequences' prompts while rows are left, in one batch step (a
    /// prompt longer than [`LONG_PROMPT_STEPS`] steps' rows runs a chunk of
    /// the plan's prefill step on its own first); every piece, by id — a joining sequence's
    /// first piece before its second. A failure ends every sequence (the KV
    /// cache may hold half a step).
    pub async fn step(&mut self) -> Result<Vec<(usize, Piece)>, Error> {
        match self.try_step().await {
            Ok(out) => Ok(out),
            Err(e) => {
                self.fail();
                Err(e)
            }
        }
    }

    async fn try_step(&mut self) -> Result<Vec<(usize, Piece)>, Error> {
        // A sequence at its limit ends before it is fed.
        for s in self.sequences.iter_mut().flatten() {
            if s.decoding.finish.is_none() && s.decoding.output.len() >= s.decoding.limit {
                s.decoding.finish = Some(FinishReason::Length);
                s.pending = None;
            }
        }
        let max_rows = self.model.session.header().io.max_batch as usize;
        let joining: Vec<usize> = (0..self.sequences.len())
            .filter(|&id| {
                self.sequences[id]
                    .as_ref()
                    .is_some_and(|s| s.decoding.finish.is_none() && !s.prompt.is_empty())
            })
            .collect();
        let prompt_len =
            |b: &Self, id: usize| b.sequences[id].as_ref().map_or(0, |s| s.prompt.len());
        // A long prompt runs a prefill chunk alone; short ones become rows.
        let mut out = Vec::new();
        let long = |n: usize| n > LONG_PROMPT_STEPS * max_rows;
        if let Some(&id) = joining.iter().find(|&&id| long(prompt_len(self, id))) {
            out.extend(self.prefill_chunk(id).await?);
        }
        // The batch: every pending token, then prompt tokens while rows are
        // left (a prompt that does not fit goes on in the next step).
        let mut rows: Vec<(usize, usize, u32)> = self
            .sequences
            .iter()
            .enumerate()
            .filter_map(|(id, s)| {
                let s = s.as_ref()?;
                Some((id, s.slot, s.pending?))
            })
            .collect();
        let decoding = rows.len();
        // Rows that run a prompt's last token, which choose its first.
        let mut completes = vec![false; decoding];
        for &id in &joining {
            let n = prompt_len(self, id);
            let room = max_rows.saturating_sub(rows.len());
            if n == 0 || room == 0 || long(n) {
                continue;
            }
            let Some(s) = self.sequences[id].as_mut() else {
                continue;
            };
            rows.extend(s.prompt.drain(..n.min(room)).map(|t| (id, s.slot, t)));
            completes.resize(rows.len(), false);
            if let Some(last) = completes.last_mut() {
                *last = s.prompt.is_empty();
            }
        }
        if rows.is_empty() {
            return Ok(out);
        }
        let feed: Vec<(usize, u32)> = rows.iter().map(|&(_, slot, t)| (slot, t)).collect();
        // Rows that choose a token, and those that need their logits for it.
        let chooses = |i: usize| i < decoding || completes[i];
        let on_cpu: Vec<bool> = rows
            .iter()
            .enumerate()
            .map(|(i, &(id, _, _))| {
                chooses(i)
                    && self.sequences[id]
                        .as_ref()
                        .is_some_and(|s| !s.decoding.greedy_on_gpu())
            })
            .collect();
        let mut out_rows = self
            .model
            .session
            .forward_batch_select(&feed, |i| on_cpu[i])
            .await?;
        for &(_, slot, token) in &rows {
            self.model.push_token(slot, token);
        }
        // Each row's position: the slot's position less the rows after it.
        let mut after = vec![0u64; self.model.session.slots()];
        let mut positions = vec![0u64; rows.len()];
        for (i, &(_, slot, _)) in rows.iter().enumerate().rev() {
            positions[i] = self.model.session.slot_position(slot) - 1 - after[slot];
            after[slot] += 1;
        }
        for (i, &(id, _, _)) in rows.iter().enumerate() {
            if !chooses(i) {
                continue;
            }
            let Some(s) = self.sequences[id].as_mut() else {
                continue;
            };
            if i >= decoding {
                s.decoding.stats.prefill = s.clock.elapsed();
            }
            let (next, top) = match (out_rows.tokens[i], out_rows.logits[i].as_mut()) {
                (Some(token), _) if !on_cpu[i] => s.decoding.chosen_on_gpu(token),
                (_, Some(logits)) => s.decoding.choose(logits, positions[i])?,
                _ => {
                    let gpu = self.model.session.gpu();
                    return Err(gpu
                        .device_lost("decoding", "the GPU returned no token".into())
                        .into());
                }
            };
            let piece = s.decoding.piece(next, top)?;
            let prefill = s.decoding.stats.prefill;
            s.decoding.stats.decode = s.clock.elapsed().saturating_sub(prefill);
            s.pending = s.decoding.finish.is_none().then_some(next);
            out.push((id, piece));
        }
        Ok(out)
    }

    /// Ends every sequence after a failure and forgets the KV cache.
    fn fail(&mut self) {
        for s in self.sequences.iter_mut().flatten() {
            if s.decoding.finish.is_none() {
                s.decoding.finish = Some(FinishReason::Cancelled);
            }
            s.pending = None;
        }
        self.model.clear_cache();
    }

    /// Why sequence `id` ended; `None` while it runs (or once removed).
    pub fn finish_reason(&self, id: usize) -> Option<FinishReason> {
        self.sequences.get(id)?.as_ref()?.decoding.finish
    }

    /// Counts and times of sequence `id`.
    pub fn stats(&self, id: usize) -> Option<GenerationStats> {
        Some(self.sequences.get(id)?.as_ref()?.decoding.stats)
    }

    /// The tokens sequence `id` generated.
    pub fn tokens(&self, id: usize) -> Option<&[u32]> {
        Some(&self.sequences.get(id)?.as_ref()?.decoding.output)
    }

    /// Ends sequence `id` (cancelled, if it still runs) and frees its slot,
    /// whose KV cache keeps every token fed; returns why it ended and its
    /// stats.
    pub fn remove(&mut self, id: usize) -> Option<(FinishReason, GenerationStats)> {
        let s = self.sequences.get_mut(id)?.take()?;
        let reason = s.decoding.finish.unwrap_or(FinishReason::Cancelled);
        Some((reason, s.decoding.stats))
    }
}
