//! Target `gguf`: bytes as a GGUF file, through the reader
//! ([`GgufFile::from_bytes`]) and the frontend's GGUF checkpoint (the
//! configuration, `tokenizer.json` and weight store written from its
//! metadata), then every tensor read, dequantized and fixed up as lowering
//! reads them.

use gerbil_gguf::GgufFile;
use std::path::Path;

/// Opens the input as a GGUF file and reads every tensor of its checkpoint.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(Path::new("/fuzz/model.gguf"), data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        if let Ok(values) = file.read_f32(t) {
            assert_eq!(values.len() as u64, t.values());
        }
    }
    let Ok(ckpt) = gerbil_frontend_hf::gguf::checkpoint(file) else {
        return;
    };
    for name in ckpt.weights.names() {
        if let Ok(view) = ckpt.tensor(name) {
            let values: u64 = view.shape.iter().product();
            assert_eq!(view.dtype.bytes_for(values), Some(view.data.len() as u64));
        }
    }
}
