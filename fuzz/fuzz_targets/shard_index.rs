#![no_main]
//! cargo-fuzz harness of `gerbil_fuzz::safetensors::shard_index` (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| gerbil_fuzz::safetensors::shard_index(data));
