#![no_main]
//! cargo-fuzz harness of `gerbil_fuzz::request::request` (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| gerbil_fuzz::request::request(data));
