//! The optimizer state a checkpoint carries, so a run resumes exactly:
//! `optimizer.safetensors` beside the weights, holding the f32 master
//! weights (the parameter buffer), AdamW's moments (f32, or the 8-bit codes
//! and their block scales) and, in its metadata, the steps taken and the
//! parameter layout they belong to.
//!
//! [`OptimizerState::load`] refuses a file whose layout differs from the
//! run's — another model, or the same model trained with other weights
//! frozen — naming the first parameter that differs, and a file of the other
//! state kind (f32 against `--optimizer-state 8bit`).
//!
//! The surprise: the layout is compared whole (every label, shape and
//! offset), not by a hash, so the error can say what differs.

use crate::TrainError;
use gerbil_plan::{safe_file, Parameter, TrainingBuffer};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// The file's name in a checkpoint directory.
pub const STATE_FILE: &str = "optimizer.safetensors";

/// What the metadata's `format` says.
const FORMAT: &str = "gerbil-adamw-v1";

/// One optimizer state, as saved.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState {
    /// Optimizer steps taken (the next batch is this step's).
    pub step: u64,
    /// Steps applied (a skipped step does not count for bias correction).
    pub applied: u64,
    /// Whether the moments are 8-bit codes.
    pub eight_bit: bool,
    /// The parameter layout the buffers belong to.
    pub parameters: Vec<Parameter>,
    /// What made the batches: a resumed run must take the same ones.
    pub batches: Batches,
    /// Each training buffer's bytes: the parameters and the moments (and,
    /// in 8 bits, the scales).
    pub buffers: Vec<(TrainingBuffer, Vec<u8>)>,
}

/// What decides a run's batches ([`crate::Windows`]): resuming with other
/// values would train on other batches than the uninterrupted run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batches {
    /// `--seq-len`.
    pub seq_len: u32,
    /// `--batch`.
    pub batch: u32,
    /// `--shuffle`'s seed, if shuffled.
    pub shuffle: Option<u64>,
    /// Tokens of the training text.
    pub tokens: u64,
    /// The CRC-32 of the tokens' little-endian bytes.
    pub crc: u32,
}

impl Batches {
    /// The batches of `tokens` cut as the other fields say.
    pub fn of(tokens: &[u32], seq_len: u32, batch: u32, shuffle: Option<u64>) -> Batches {
        let mut crc = crc32fast::Hasher::new();
        for t in tokens {
            crc.update(&t.to_le_bytes());
        }
        Batches {
            seq_len,
            batch,
            shuffle,
            tokens: tokens.len() as u64,
            crc: crc.finalize(),
        }
    }

    /// The metadata entries that record it.
    fn entries(&self) -> [(&'static str, String); 5] {
        [
            ("seq_len", self.seq_len.to_string()),
            ("batch", self.batch.to_string()),
            (
                "shuffle",
                self.shuffle.map_or("none".to_string(), |s| s.to_string()),
            ),
            ("tokens", self.tokens.to_string()),
            ("data_crc32", self.crc.to_string()),
        ]
    }

    /// How `saved` (its metadata entries) differs from these batches, as
    /// the flag to change.
    fn difference(&self, saved: &HashMap<String, String>) -> Option<String> {
        let get = |k: &str| saved.get(k).map(String::as_str).unwrap_or("?");
        let e = self.entries();
        if get("seq_len") != e[0].1 {
            return Some(format!("it was made with --seq-len {}", get("seq_len")));
        }
        if get("batch") != e[1].1 {
            return Some(format!("it was made with --batch {}", get("batch")));
        }
        if get("shuffle") != e[2].1 {
            return Some(match get("shuffle") {
                "none" => "it was made without --shuffle".to_string(),
                seed => format!("it was made with --shuffle --seed {seed}"),
            });
        }
        if get("tokens") != e[3].1 || get("data_crc32") != e[4].1 {
            return Some(format!(
                "it was made from another training text ({} tokens, this one {}); give the \
                 same --data",
                get("tokens"),
                self.tokens
            ));
        }
        None
    }
}

/// The buffers a state of this kind holds, with their tensor names.
fn kinds(eight_bit: bool) -> Vec<(TrainingBuffer, &'static str, Dtype)> {
    let mut v = vec![(TrainingBuffer::Parameters, "master", Dtype::F32)];
    if eight_bit {
        v.push((TrainingBuffer::FirstMoment, "exp_avg_codes", Dtype::U8));
        v.push((TrainingBuffer::SecondMoment, "exp_avg_sq_codes", Dtype::U8));
        v.push((TrainingBuffer::Scales, "scales", Dtype::F32));
    } else {
        v.push((TrainingBuffer::FirstMoment, "exp_avg", Dtype::F32));
        v.push((TrainingBuffer::SecondMoment, "exp_avg_sq", Dtype::F32));
    }
    v
}

/// The training buffers a state of this kind saves.
pub fn saved_buffers(eight_bit: bool) -> Vec<TrainingBuffer> {
    kinds(eight_bit).into_iter().map(|(b, _, _)| b).collect()
}

impl OptimizerState {
    /// Writes it to `dir`/[`STATE_FILE`].
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        let layout = serde_json::to_string(&self.parameters)
            .map_err(|e| TrainError::State(e.to_string()))?;
        let metadata: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("step", self.step.to_string()),
            ("applied", self.applied.to_string()),
            ("state", if self.eight_bit { "8bit" } else { "f32" }.into()),
            ("parameters", layout),
        ]
        .into_iter()
        .chain(self.batches.entries())
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut views = Vec::new();
        for (holds, name, dtype) in kinds(self.eight_bit) {
            let bytes = self
                .buffers
                .iter()
                .find(|(b, _)| *b == holds)
                .map(|(_, bytes)| bytes.as_slice())
                .ok_or_else(|| TrainError::State(format!("no {holds:?} to save")))?;
            let len = bytes.len() * 8 / dtype.bitsize();
            let view = safetensors::tensor::TensorView::new(dtype, vec![len], bytes)
                .map_err(|e| TrainError::State(e.to_string()))?;
            views.push((name, view));
        }
        let bytes = safetensors::serialize(views, Some(metadata))
            .map_err(|e| TrainError::State(e.to_string()))?;
        safe_file::write_file(&dir.join(STATE_FILE), &bytes)?;
        Ok(())
    }

    /// Refuses a `dir` without [`STATE_FILE`] before anything is compiled
    /// (what [`OptimizerState::load`] would say, but at once).
    pub fn check_present(dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(STATE_FILE);
        if path.is_file() {
            return Ok(());
        }
        Err(TrainError::State(format!(
            "{}: no such file; --resume takes a checkpoint directory gerbil-train wrote (it \
             holds {STATE_FILE} beside the weights)",
            path.display()
        )))
    }

    /// Reads `dir`/[`STATE_FILE`] for a run whose parameters are laid out
    /// as `parameters`, with 8-bit moments if `eight_bit`, taking
    /// `batches`.
    pub fn load(
        dir: &Path,
        parameters: &[Parameter],
        eight_bit: bool,
        batches: &Batches,
    ) -> Result<OptimizerState, TrainError> {
        let path = dir.join(STATE_FILE);
        let bad = |why: String| TrainError::State(format!("{}: {why}", path.display()));
        let bytes = std::fs::read(&path).map_err(|e| {
            bad(format!(
                "{e}; --resume takes a checkpoint directory gerbil-train wrote (it holds \
                 {STATE_FILE} beside the weights)"
            ))
        })?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let field = |k: &str| {
            meta.get(k).cloned().ok_or_else(|| {
                bad(format!(
                    "no `{k}` in its metadata: not a gerbil-train state"
                ))
            })
        };
        if field("format")? != FORMAT {
            return Err(bad(format!("its format is not {FORMAT}")));
        }
        let number = |k: &str| {
            field(k)?
                .parse::<u64>()
                .map_err(|e| bad(format!("`{k}`: {e}")))
        };
        let saved: Vec<Parameter> =
            serde_json::from_str(&field("parameters")?).map_err(|e| bad(e.to_string()))?;
        if let Some(why) = layout_difference(&saved, parameters) {
            return Err(bad(why));
        }
        if let Some(why) = batches.difference(&meta) {
            return Err(bad(format!(
                "{why}, and a resumed run must take the batches the checkpoint's run would have"
            )));
        }
        let kind = field("state")?;
        if (kind == "8bit") != eight_bit {
            let asked = if eight_bit { "8bit" } else { "f32" };
            return Err(bad(format!(
                "it holds {kind} moments and the run asks for {asked}; resume with \
                 --optimizer-state {kind}"
            )));
        }
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        let mut buffers = Vec::new();
        for (holds, name, _) in kinds(eight_bit) {
            let t = tensors.tensor(name).map_err(|e| bad(e.to_string()))?;
            buffers.push((holds, t.data().to_vec()));
        }
        Ok(OptimizerState {
            step: number("step")?,
            applied: number("applied")?,
            eight_bit,
            parameters: saved,
            batches: *batches,
            buffers,
        })
    }
}

/// Why a state of layout `saved` cannot resume a run of layout `run`, if
/// it cannot.
fn layout_difference(saved: &[Parameter], run: &[Parameter]) -> Option<String> {
    let other_model = |why: String| {
        format!(
            "it is the state of another model ({why}); resume from a checkpoint of this model, \
             or start from the weights alone without --resume"
        )
    };
    for (i, (s, r)) in saved.iter().zip(run).enumerate() {
        if s.label != r.label || s.shape != r.shape {
            return Some(other_model(format!(
                "its parameter {i} is `{}` {:?}, this model's `{}` {:?}",
                s.label, s.shape, r.label, r.shape
            )));
        }
        if s.offset != r.offset {
            return Some(format!(
                "its parameter {i}, `{}`, lies at {} and here at {}: it was saved on a device \
                 with another storage-binding limit, which lays the weights out in other \
                 banks; resume on the same kind of GPU",
                s.label, s.offset, r.offset
            ));
        }
    }
    (saved.len() != run.len()).then(|| {
        other_model(format!(
            "it has {} trained tensors, this model {}",
            saved.len(),
            run.len()
        ))
    })
}
