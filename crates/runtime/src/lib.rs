//! gerbil's runtime: loads a plan, uploads it to a wgpu device and runs it.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plan = gerbil_plan::PlanFile::open("model.plan".as_ref())?;
//! let mut session = gerbil_runtime::Session::new(&plan)?;
//! let logits = session.forward(&[1, 2, 3])?; // logits of the last position
//! # Ok(()) }
//! ```
//!
//! Everything that can be created ahead of time — buffers, pipelines, bind
//! groups — is created in [`Session::new`]; a step writes two small buffers
//! (token ids, `T`/`P`), records one compute pass and submits once. The
//! runtime never runs a compiler pass and knows nothing of HF configs.

pub mod device;
pub mod error;
pub mod generate;
pub mod pipeline;
pub mod profile;
pub mod sampling;
pub mod session;
pub mod text;

pub use device::Gpu;
pub use error::RuntimeError;
pub use generate::{generate, GenerateOptions, TokenEvent};
pub use profile::DispatchTime;
pub use sampling::{argmax, top_logits, Sampler, SamplingParams};
pub use session::{MemoryReport, Session};
