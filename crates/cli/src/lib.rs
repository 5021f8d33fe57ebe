//! The `gerbilc` and `gerbil-run` command-line tools.
//!
//! [`compile`] is the compiler driver (frontend → passes → codegen → plan
//! file); [`run`] executes plans (generation, JSON output, benchmarks);
//! [`inspect`] summarizes a plan. The binaries in `src/bin` only parse
//! arguments and call these.

pub mod compile;
pub mod inspect;
pub mod run;
