//! A CPU interpreter of a `gerbil_ir::Graph`, in f64: what every op
//! computes ([`mod@reference`], written as plainly as possible), a graph run
//! step by step on it ([`interpreter`]), the gradients of the ops a
//! decoder trains through ([`gradient`]) and the optimizer step after them
//! ([`optimizer`]).
//!
//! It is the oracle twice: the tests check every kernel, pass and family
//! against it, and `gerbilc compile` runs a short prompt through the lowered
//! graph to store the reference output a plan's self-test compares every
//! variant with (`gerbil-run PLAN selftest`). Weights come through the
//! [`Weights`] trait, so this crate does not depend on
//! the compiler that materializes them.
//!
//! The surprise: f64 throughout. The GPU computes in f32 (or stores f16), so
//! the interpreter is not what the kernels do but what they approximate;
//! every comparison with it carries a tolerance.

pub mod gradient;
pub mod interpreter;
pub mod optimizer;
pub mod reference;

pub use interpreter::{InterpretError, Interpreter, Tensor, Weights};
