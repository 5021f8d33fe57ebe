//! Every block type gerbil decodes, against gguf-py's dequantization of the
//! same random blocks (`tests/data/blocks.gguf`, made by
//! `scripts/make-gguf-blocks.py`): equal bit for bit; and every type gerbil
//! quantizes to, against gguf-py's quantization of the same rows: the same
//! bytes.

use gerbil_gguf::{GgufFile, TensorType};
use std::path::Path;

fn blocks() -> GgufFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blocks.gguf");
    GgufFile::open(&path).unwrap()
}

#[test]
fn every_quantizable_type_quantizes_like_gguf_py() {
    let gguf = blocks();
    // The K types have their own reference (below): gguf-py has no quantizer for them.
    for ty in TensorType::QUANTIZABLE
        .into_iter()
        .filter(|t| t.block_len() == 32)
    {
        let src = gguf.tensor(&format!("{ty}.src")).unwrap();
        let want = gguf.tensor(&format!("{ty}.quantized")).unwrap();
        assert_eq!(want.ty, ty);
        let got = ty.quantize(&gguf.read_f32(src).unwrap()).unwrap();
        let want = gguf.read(want).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        let block = ty.block_bytes() as usize;
        for (i, (g, w)) in got.chunks(block).zip(want.chunks(block)).enumerate() {
            assert_eq!(g, w, "{ty} block {i}");
        }
    }
    assert!(TensorType::Q8_0.quantize(&[0.0; 31]).is_err());
    assert!(TensorType::Q4_K.quantize(&[0.0; 255]).is_err());
    assert!(TensorType::from_name("IQ4_NL")
        .unwrap()
        .quantize(&[0.0; 32])
        .is_err());
}

/// Q4_K, Q5_K and Q6_K against llama.cpp's own reference quantizers on the
/// same rows (`tests/data/kquants.gguf`, made by
/// `scripts/make-kquant-refs.sh`): the same bytes, super-block by
/// super-block, zero, constant, tiny and outlier ones included.
#[test]
fn k_types_quantize_like_llama_cpp() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kquants.gguf");
    let gguf = GgufFile::open(&path).unwrap();
    let src = gguf.read_f32(gguf.tensor("src").unwrap()).unwrap();
    for ty in [TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K] {
        let want = gguf
            .read(gguf.tensor(&format!("{ty}.quantized")).unwrap())
            .unwrap();
        let got = ty.quantize(&src).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        let block = ty.block_bytes() as usize;
        for (i, (g, w)) in got.chunks(block).zip(want.chunks(block)).enumerate() {
            assert_eq!(g, w, "{ty} super-block {i}");
        }
    }
}

#[test]
fn every_supported_type_decodes_like_gguf_py() {
    let gguf = blocks();
    for ty in TensorType::SUPPORTED {
        if ty == TensorType::F32 {
            continue; // the references are F32 themselves
        }
        let q = gguf.tensor(&format!("{ty}.q")).unwrap();
        let want = gguf.tensor(&format!("{ty}.want")).unwrap();
        assert_eq!(q.ty, ty);
        assert_eq!(q.shape(), want.shape(), "{ty}");
        let (got, want) = (gguf.read_f32(q).unwrap(), gguf.read_f32(want).unwrap());
        assert!(want.iter().any(|&v| v != 0.0), "{ty}: a reference of zeros");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} value {i}: {g} != {w}");
        }
    }
}

#[test]
fn unsupported_types_are_named() {
    let q2k = TensorType::from_name("q2_k").unwrap();
    let err = q2k.dequantize(&[0; 84], &mut [0.0; 256]).unwrap_err();
    assert!(
        err.contains("Q2_K is not supported") && err.contains("Q4_K"),
        "{err}"
    );
}

#[test]
fn lengths_that_are_not_whole_blocks_are_refused() {
    let err = TensorType::Q4_0
        .dequantize(&[0; 19], &mut [0.0; 32])
        .unwrap_err();
    assert!(err.contains("19 bytes"), "{err}");
}
