//! Bad GGUF files: each is an error naming the key or tensor and what is
//! wrong, never a panic or an allocation of what the file claims.

use gerbil_gguf::{GgufError, GgufFile};
use std::path::Path;

/// Bytes of a GGUF file, written field by field.
#[derive(Default)]
struct Gguf(Vec<u8>);

impl Gguf {
    fn new(n_tensors: u64, n_kv: u64) -> Gguf {
        Gguf::default().raw(b"GGUF").u32(3).u64(n_tensors).u64(n_kv)
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, v: u32) -> Self {
        self.raw(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Self {
        self.raw(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    /// A tensor directory entry.
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        let mut g = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            g = g.u64(d);
        }
        g.u32(ty).u64(offset)
    }
    /// Pads to the default alignment and appends `n` data bytes.
    fn data(mut self, n: usize) -> Self {
        let pad = self.0.len().next_multiple_of(32) - self.0.len();
        self.0.resize(self.0.len() + pad + n, 0x11);
        self
    }
    fn open(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(Path::new("bad.gguf"), self.0)
    }
}

fn error(g: Gguf) -> String {
    g.open().unwrap_err().to_string()
}

#[test]
fn a_well_formed_file_opens() {
    let g = Gguf::new(1, 2)
        .str("general.architecture")
        .u32(8)
        .str("llama")
        .str("llama.block_count")
        .u32(4)
        .u32(30)
        .tensor("w", &[32, 2], 8, 0)
        .data(68);
    let gguf = g.open().unwrap();
    assert_eq!(gguf.str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(gguf.u64("llama.block_count").unwrap(), Some(30));
    let t = gguf.tensor("w").unwrap();
    assert_eq!((t.shape(), t.bytes), (vec![2, 32], 68));
    let values = gguf.read_f32(t).unwrap();
    assert_eq!(values.len(), 64);
    assert!(values.iter().all(|v| v.is_finite()));
}

#[test]
fn not_gguf() {
    let e = error(Gguf::default().raw(b"PK\x03\x04rest"));
    assert!(e.contains("not a GGUF file"), "{e}");
    let e = error(Gguf::default().raw(b"GGUF").u32(1).u64(0).u64(0));
    assert!(e.contains("GGUF version 1"), "{e}");
}

#[test]
fn a_string_longer_than_the_file() {
    let e = error(Gguf::new(0, 1).u64(u64::MAX).raw(b"general.name"));
    assert!(
        e.contains("metadata key #0") && e.contains("truncated"),
        "{e}"
    );
    let e = error(
        Gguf::new(0, 1)
            .str("general.name")
            .u32(8)
            .u64(1 << 40)
            .raw(b"x"),
    );
    assert!(
        e.contains("\"general.name\"") && e.contains("1099511627776 bytes"),
        "{e}"
    );
}

#[test]
fn an_array_longer_than_the_file() {
    let e = error(
        Gguf::new(0, 1)
            .str("tokenizer.ggml.tokens")
            .u32(9)
            .u32(8)
            .u64(u64::MAX / 2),
    );
    assert!(
        e.contains("\"tokenizer.ggml.tokens\"") && e.contains("elements"),
        "{e}"
    );
}

#[test]
fn unknown_value_and_element_types() {
    let e = error(Gguf::new(0, 1).str("k").u32(13));
    assert!(e.contains("\"k\": unknown value type 13"), "{e}");
    let e = error(Gguf::new(0, 1).str("k").u32(9).u32(77).u64(1));
    assert!(e.contains("\"k\": unknown array element type 77"), "{e}");
}

#[test]
fn metadata_of_the_wrong_type() {
    let gguf = Gguf::new(0, 1)
        .str("llama.block_count")
        .u32(8)
        .str("thirty")
        .open()
        .unwrap();
    let e = gguf.u64("llama.block_count").unwrap_err().to_string();
    assert!(
        e.contains("\"llama.block_count\": expected a non-negative integer, found string"),
        "{e}"
    );
    let e = gguf
        .require("llama.context_length", GgufFile::u64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"llama.context_length\": missing"), "{e}");
    let e = error(Gguf::new(0, 1).str("general.alignment").u32(4).u32(24));
    assert!(
        e.contains("general.alignment") && e.contains("power of two"),
        "{e}"
    );
}

#[test]
fn an_unknown_tensor_type() {
    let e = error(
        Gguf::new(1, 0)
            .tensor("blk.0.ffn_up.weight", &[32], 99, 0)
            .data(32),
    );
    assert!(
        e.contains("\"blk.0.ffn_up.weight\": unknown tensor type id 99") && e.contains("Q4_K"),
        "{e}"
    );
}

#[test]
fn a_tensor_past_the_end_of_the_file() {
    let e = error(
        Gguf::new(1, 0)
            .tensor("output.weight", &[32, 4], 2, 0)
            .data(71),
    );
    assert!(
        e.contains("tensor \"output.weight\" (Q4_0 [4, 32]) needs 72 bytes"),
        "{e}"
    );
    let e = error(Gguf::new(1, 0).tensor("w", &[256, 1 << 62], 12, 0).data(8));
    assert!(e.contains("\"w\"") && e.contains("overflow"), "{e}");
}

#[test]
fn a_size_that_disagrees_with_the_data() {
    // Two Q8_0 rows of 32 take 68 bytes, but the next tensor starts at 64.
    let e = error(
        Gguf::new(2, 0)
            .tensor("a", &[32, 2], 8, 0)
            .tensor("b", &[8], 0, 64)
            .data(96),
    );
    assert!(
        e.contains("\"a\"") && e.contains("run into tensor \"b\""),
        "{e}"
    );
    let e = error(Gguf::new(1, 0).tensor("c", &[33], 8, 0).data(64));
    assert!(
        e.contains("\"c\": rows of 33 values are not whole Q8_0 blocks"),
        "{e}"
    );
}

#[test]
fn every_truncation_of_a_real_file_is_an_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blocks.gguf");
    let bytes = std::fs::read(path).unwrap();
    let whole = GgufFile::from_bytes(Path::new("x"), bytes.clone()).unwrap();
    let data_start = whole.tensors().iter().map(|t| t.offset).min().unwrap() as usize;
    let cuts = (0..data_start).chain((data_start..bytes.len()).step_by(61));
    for cut in cuts {
        let r = GgufFile::from_bytes(Path::new("cut.gguf"), bytes[..cut].to_vec());
        let e = r.unwrap_err().to_string();
        assert!(e.contains("cut.gguf"), "cut at {cut}: {e}");
    }
}
