#![no_main]
//! cargo-fuzz harness of `gerbil_fuzz::template::template` (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| gerbil_fuzz::template::template(data));
