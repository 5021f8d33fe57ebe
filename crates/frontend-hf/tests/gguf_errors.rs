//! Bad GGUF models: each is an error naming the key or tensor and what to
//! do, never a panic. (Malformed files are `gerbil-gguf`'s tests; these are
//! well-formed files gerbil cannot run.)

use gerbil_frontend_hf::Checkpoint;

/// A GGUF file, written field by field.
#[derive(Default)]
struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, usize)>,
}

impl Gguf {
    /// A one-layer Llama's hyper-parameters (`arch` as its architecture)
    /// and an f32 embedding.
    fn model(arch: &str) -> Gguf {
        Self::embedded(arch, 32, 0, 32 * 6 * 4)
    }
    /// [`Self::model`], `hidden` wide, the embedding of ggml type `ty`.
    fn embedded(arch: &str, hidden: u32, ty: u32, bytes: usize) -> Gguf {
        let mut g = Gguf::default().str("general.architecture", arch);
        for (k, v) in [
            ("embedding_length", hidden),
            ("block_count", 1),
            ("feed_forward_length", 32),
            ("context_length", 32),
            ("attention.head_count", 2),
        ] {
            g = g.u32(&format!("{arch}.{k}"), v);
        }
        g.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6)
            .tensor("token_embd.weight", &[u64::from(hidden), 6], ty, bytes)
    }
    fn key(mut self, k: &str, ty: u32) -> Self {
        self.kv.extend((k.len() as u64).to_le_bytes());
        self.kv.extend(k.as_bytes());
        self.kv.extend(ty.to_le_bytes());
        self.n_kv += 1;
        self
    }
    fn str(self, k: &str, v: &str) -> Self {
        let mut g = self.key(k, 8);
        g.kv.extend((v.len() as u64).to_le_bytes());
        g.kv.extend(v.as_bytes());
        g
    }
    fn u32(self, k: &str, v: u32) -> Self {
        let mut g = self.key(k, 4);
        g.kv.extend(v.to_le_bytes());
        g
    }
    fn f32(self, k: &str, v: f32) -> Self {
        let mut g = self.key(k, 6);
        g.kv.extend(v.to_le_bytes());
        g
    }
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, bytes: usize) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, bytes));
        self
    }
    /// Writes the file into a temporary directory and opens it: the error
    /// of opening or lowering it, or of reading `tensor` when given.
    fn open(self) -> String {
        self.read(None)
    }
    fn read(self, tensor: Option<&str>) -> String {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, dims, ty, bytes) in &self.tensors {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (*bytes as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        for (.., bytes) in &self.tensors {
            out.resize(out.len() + bytes.next_multiple_of(32), 0x3c);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, out).unwrap();
        match (Checkpoint::open(&path), tensor) {
            (Ok(ckpt), Some(t)) => ckpt.tensor(t).unwrap_err().to_string(),
            (Ok(ckpt), None) => match gerbil_frontend_hf::lower(&ckpt) {
                Ok(_) => panic!("lowered"),
                Err(e) => e.to_string(),
            },
            (Err(e), _) => e.to_string(),
        }
    }
}

#[test]
fn an_unsupported_architecture_is_named() {
    let e = Gguf::model("mamba").open();
    assert!(
        e.contains("GGUF architecture `mamba`") && e.contains("llama, qwen2, qwen3, gemma3, phi3"),
        "{e}"
    );
}

#[test]
fn a_missing_hyper_parameter_is_named() {
    let e = Gguf::default()
        .str("general.architecture", "qwen2")
        .u32("qwen2.block_count", 1)
        .open();
    assert!(e.contains("\"qwen2.embedding_length\": missing"), "{e}");
}

#[test]
fn metadata_of_the_wrong_type_is_named() {
    let e = Gguf::model("llama")
        .str("llama.attention.head_count_kv", "two")
        .open();
    assert!(
        e.contains(
            "\"llama.attention.head_count_kv\": expected a non-negative integer, found string"
        ),
        "{e}"
    );
}

#[test]
fn an_unsupported_tensor_type_is_named_when_read() {
    // Q2_K: 84 bytes a block of 256.
    let e = Gguf::embedded("llama", 256, 10, 84 * 6).read(Some("model.embed_tokens.weight"));
    assert!(
        e.contains("\"token_embd.weight\"") && e.contains("Q2_K is not supported"),
        "{e}"
    );
}

#[test]
fn rope_frequency_factors_are_refused_by_name() {
    let e = Gguf::model("llama")
        .tensor("rope_freqs.weight", &[8], 0, 32)
        .open();
    assert!(
        e.contains("tensor \"rope_freqs.weight\"") && e.contains("are not Llama 3's"),
        "{e}"
    );
}

#[test]
fn a_directory_with_several_gguf_files_asks_which() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["a.Q4_0.gguf", "a.Q8_0.gguf"] {
        std::fs::write(dir.path().join(f), b"GGUF").unwrap();
    }
    let e = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("2 GGUF files (a.Q4_0.gguf, a.Q8_0.gguf)"), "{e}");
}
