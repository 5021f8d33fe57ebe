#![no_main]
//! cargo-fuzz harness of `gerbil_fuzz::compile::compile` (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| gerbil_fuzz::compile::compile(data));
