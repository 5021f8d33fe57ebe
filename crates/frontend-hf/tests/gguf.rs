//! The real GGUF files the fixtures were made from, opened as checkpoints,
//! against what transformers made of them (`scripts/build-fixtures.py`
//! writes `model.safetensors` exactly as transformers' GGUF loader does,
//! then rounds to bf16; the files are linked into `<fixture>/gguf/`).
//! Skipped without `GERBIL_FIXTURES` (scripts/test.sh sets it).

use gerbil_frontend_hf::{Checkpoint, HfConfig};
use gerbil_ir::DType;
use std::path::PathBuf;

const MODELS: [(&str, &str); 2] = [
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
];

/// (the fixture directory, its GGUF), or `None` when fixtures are not built.
fn fixture(name: &str, file: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(root) = std::env::var_os("GERBIL_FIXTURES") else {
        eprintln!("skipping: GERBIL_FIXTURES is not set (scripts/build-fixtures.py --out DIR all)");
        return None;
    };
    let dir = PathBuf::from(root).join(name);
    let gguf = dir.join("gguf").join(file);
    Some((dir, gguf))
}

/// The values of a tensor as f32, from F32 or BF16 bytes or ggml blocks.
fn values(dtype: DType, data: &[u8]) -> Vec<f32> {
    if dtype.is_quantized() {
        let (per, bytes) = dtype.block();
        let mut out = vec![0f32; data.len() / bytes as usize * per as usize];
        let ty = gerbil_gguf::TensorType::from_name(dtype.name()).unwrap();
        ty.dequantize(data, &mut out).unwrap();
        return out;
    }
    match dtype {
        DType::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => panic!("unexpected dtype {other}"),
    }
}

/// Each file opened once: its weights, dequantized, are transformers' bit
/// for bit (after its bf16 rounding), its configuration and graph are those of the
/// directory transformers wrote, and so are its end-of-sequence ids and
/// chat template.
#[test]
fn gguf_files_are_what_transformers_loads() {
    for (name, file) in MODELS {
        let Some((dir, gguf)) = fixture(name, file) else {
            return;
        };
        let hf = Checkpoint::open(&dir).unwrap();
        let g = Checkpoint::open(&gguf).unwrap();
        check_weights(name, &g, &hf);
        check_config(name, &g, &hf);
    }
}

fn check_weights(name: &str, g: &Checkpoint, hf: &Checkpoint) {
    assert_eq!(g.weights.names(), hf.weights.names(), "{name}");
    for tensor in hf.weights.names() {
        let want = hf.tensor(tensor).unwrap();
        let got = g.tensor(tensor).unwrap();
        assert_eq!(got.shape, want.shape, "{name} {tensor}");
        // transformers rounds the f32 it dequantized to bf16, nearest even.
        let got = values(got.dtype, &got.data);
        let want = values(want.dtype, &want.data);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = half::bf16::from_f32(*g).to_f32();
            assert_eq!(g.to_bits(), w.to_bits(), "{name} {tensor}[{i}]: {g} != {w}");
        }
    }
}

fn check_config(name: &str, g: &Checkpoint, hf: &Checkpoint) {
    // Only the file and the storage dtype may differ.
    let normalize = |c: &HfConfig| HfConfig {
        path: PathBuf::new(),
        dtype: None,
        hidden_act: None,
        ..c.clone()
    };
    assert_eq!(normalize(&g.config), normalize(&hf.config), "{name}");
    assert_eq!(g.text.eos_token_ids, hf.text.eos_token_ids, "{name}");
    assert_eq!(g.text.chat_template, hf.text.chat_template, "{name}");
    // The same graph but for its name and the weights' dtypes (the GGUF's
    // matrices keep their blocks).
    let body = |c: &Checkpoint| {
        let text = gerbil_ir::print::print(&gerbil_frontend_hf::lower(c).unwrap().graph);
        let (_, body) = text.split_once('\n').unwrap();
        gerbil_ir::QUANTIZED
            .iter()
            .fold(body.replace("bf16", "f32"), |b, q| {
                b.replace(&format!("{q}["), "f32[")
            })
    };
    assert_eq!(body(g), body(hf), "{name}: the graphs differ");
}
