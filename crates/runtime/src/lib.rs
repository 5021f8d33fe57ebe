//! gerbil's runtime: loads a plan, uploads it to a wgpu device and runs it.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let plan = gerbil_plan::PlanFile::open("model.plan".as_ref())?;
//! let mut session = gerbil_runtime::Session::new(&plan).await?;
//! let logits = session.forward(&[1, 2, 3]).await?; // logits of the last position
//! # Ok(()) }
//! ```
//!
//! Everything that waits for the GPU is `async` and the library never blocks
//! a thread, so it runs in a browser (wasm32 with WebGPU; load the plan with
//! `PlanFile::from_bytes`) and inside an async server; a command-line tool
//! blocks at the top with `pollster::block_on(...)`.
//!
//! Everything that can be created ahead of time — buffers, bind groups — is
//! created in [`Session::new`]; pipelines are created when a step first
//! needs them ([`variant_pipelines`]), so a load compiles nothing. A step
//! writes two small buffers (token ids, `T`/`P`), records one compute pass
//! and submits once. The
//! runtime never runs a compiler pass and knows nothing of HF configs.
//!
//! This is the GPU half only: device, session, residency, pipelines and their cache,
//! decode-ahead, profiling and the kernel timer. Text (tokenizer, chat templates) is
//! `gerbil-text`; the `gerbil` crate puts both behind `Model`, `Generation` and `Chat`.

#![warn(missing_docs)]

pub mod ahead;
pub mod batch_step;
pub mod clock;
pub mod device;
pub mod error;
pub mod kernel_timer;
pub mod pipeline;
pub mod pipeline_cache;
pub mod profile;
pub mod progress;
mod residency;
pub mod sampling;
pub mod selftest;
pub mod session;
pub mod training;
pub mod variant;
pub mod variant_pipelines;

pub use ahead::{AheadDecoder, DECODE_BATCH, DECODE_BATCH_MOST};
pub use batch_step::BatchOutput;
pub use clock::Clock;
pub use device::{AdapterSummary, Gpu};
pub use error::RuntimeError;
pub use pipeline_cache::{PipelineCacheOptions, PipelineCacheState};
pub use profile::DispatchTime;
pub use progress::{Progress, ProgressHook};
pub use sampling::{argmax, top_logits, Sampler, SamplingParams, TokenHistory};
pub use session::{LoadReport, MemoryReport, PrefillFallback, Session, SessionOptions};
pub use training::{StepReport, Trainer};
pub use variant::PrecisionChoice;
pub use variant_pipelines::PipelineStats;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use gerbil_plan::PlanFile;

    /// A server runs sessions on a multi-threaded executor, which moves futures between
    /// threads: on native targets every future the runtime returns must be `Send`.
    /// (This is checked when the test compiles; the futures are never polled.)
    #[test]
    fn runtime_futures_are_send() {
        fn send<T: Send>(_: T) {}
        fn futures(plan: &PlanFile, session: &mut Session) {
            send(Gpu::open(&plan.header.variants[0].requirements));
            send(Session::new(plan));
            send(Session::new_profiling(plan));
            send(session.forward(&[1]));
            send(session.read_logits());
            send(session.sync());
            send(session.profile(&[1]));
            send(session.decode_on_gpu(1, &[], (DECODE_BATCH, DECODE_BATCH), |_| true));
        }
        let _ = futures as fn(&PlanFile, &mut Session);
    }
}
