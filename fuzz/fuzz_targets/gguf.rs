#![no_main]
//! cargo-fuzz harness of `gerbil_fuzz::gguf::gguf` (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| gerbil_fuzz::gguf::gguf(data));
