//! The on-disk execution plan: the only boundary between `gerbilc` and
//! `gerbil-run`.
//!
//! A plan file is a fixed 48-byte preamble, a JSON [`PlanHeader`], and a data
//! region of sections (weights, tokenizer) each aligned to [`SECTION_ALIGN`]
//! bytes so the runtime can map the file and upload weights without copying
//! or reshaping. Both the header and the data carry CRC-32 checksums. See
//! `docs/plan-format.md` for the byte layout.
//!
//! Write with [`write_plan`], read with [`PlanFile::open`] (or, for a plan
//! already in memory, [`PlanFile::from_bytes`]; for one behind positional
//! reads such as a browser worker's, [`PlanFile::from_source`]).
//! Reading never panics on bad input: a truncated file, a wrong magic, an
//! unsupported version or a checksum mismatch is a [`PlanError`].
//!
//! [`limits`] is the table of the largest sizes gerbil supports (context,
//! step, vocabulary, …), which [`PlanHeader::validate`] and `gerbilc` check.
//!
//! [`safe_file`] is how gerbil writes every file (a synced temporary file
//! renamed into place) and refuses special files as inputs and outputs.

mod file;
mod header;
pub mod limits;
pub mod safe_file;
pub mod sampling;
mod training;
mod validate;

pub use file::{
    write_plan, write_plan_streaming, write_plan_with_progress, DataLayout, PlanError, PlanFile,
    PlanSource, SectionData, FORMAT_VERSION, MAGIC, SECTION_ALIGN,
};
pub use header::*;
pub use training::{Parameter, TrainingBuffer, TrainingIo, TrainingPlan};
pub use validate::BINDING_OFFSET_ALIGN;
