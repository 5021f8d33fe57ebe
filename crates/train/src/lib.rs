//! Training for gerbil: what a training run is made of before any GPU is
//! involved — the batches a token stream is cut into ([`data`]) and the
//! optimizer's hyper-parameters and learning-rate schedule
//! ([`schedule`]). The backward graph is the `autodiff` pass's
//! (`gerbil_passes::training_passes`), and the f64 oracle of a whole step
//! is the interpreter's (`gerbil_interp::optimizer`); `docs/training.md`
//! tells the whole story.
//!
//! The surprise: batches are a pure function of the step number, so a run
//! restarted from a checkpoint at step `i` sees exactly the batches an
//! uninterrupted run would have.

pub mod data;
pub mod schedule;

pub use data::{DataError, Windows};
pub use schedule::{HyperError, Hyperparameters};
