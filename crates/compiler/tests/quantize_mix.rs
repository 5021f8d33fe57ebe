//! `--quantize q4_k_m` chooses what llama.cpp chose: the Gemma 3 270M
//! fixture (transformers' weights of `gemma-3-270m-q4_k_m.gguf`), lowered and
//! retyped, gives every matrix the block type the real Q4_K_M file holds it
//! in — Q4_K, Q6_K for the down projections of the layers with more bits, and
//! the fallbacks of rows that are not whole super-blocks (Q5_0, Q8_0).
//! Skipped without `GERBIL_FIXTURES` (scripts/test.sh sets it).

use gerbil_compiler::quantize::{retype, Quantization};
use gerbil_frontend_hf::{lower, Checkpoint};
use gerbil_ir::{Op, WeightSource};
use std::path::PathBuf;

#[test]
fn q4_k_m_types_every_matrix_as_llama_cpp_did() {
    let Some(root) = std::env::var_os("GERBIL_FIXTURES") else {
        eprintln!("skipping: GERBIL_FIXTURES is not set (scripts/build-fixtures.py --out DIR all)");
        return;
    };
    let dir = PathBuf::from(root).join("gemma3-270m");
    let hf = Checkpoint::open(&dir).unwrap();
    let gguf = Checkpoint::open(&dir.join("gguf/gemma-3-270m-q4_k_m.gguf")).unwrap();
    let mut graph = lower(&hf).unwrap().graph;
    let retyped = retype(&mut graph, Quantization::Q4KM);
    let mut compared = 0;
    let mut types = std::collections::BTreeMap::new();
    for node in graph.g.node_weights() {
        let Op::Weight(w) = &node.op else { continue };
        let WeightSource::Checkpoint { tensor } = &w.source else {
            continue;
        };
        if w.ty.shape.len() != 2 {
            continue;
        }
        let (want, _) = gguf.weights.tensor_type(tensor).unwrap();
        assert_eq!(w.ty.dtype, want, "{tensor}");
        *types.entry(want.to_string()).or_insert(0) += 1;
        compared += 1;
    }
    assert_eq!(compared, retyped);
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        [
            ("q4_k".to_string(), 27),
            ("q5_0".to_string(), 81),
            ("q6_k".to_string(), 9),
            ("q8_0".to_string(), 10)
        ]
    );
}
