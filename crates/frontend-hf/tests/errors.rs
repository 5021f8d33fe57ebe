//! Every way a checkpoint can be wrong gives an error whose message names the
//! file, key or tensor to fix.

mod common;

use common::*;
use gerbil_frontend_hf::{lower, Checkpoint, FrontendError, WeightStore};
use serde_json::json;
use std::path::Path;

/// The error of opening and lowering `dir`.
fn error_of(dir: &Path) -> FrontendError {
    match Checkpoint::open(dir).and_then(|c| lower(&c)) {
        Ok(_) => panic!("{} lowered without error", dir.display()),
        Err(e) => e,
    }
}

/// Asserts that lowering `dir` fails with a message containing every needle.
fn check(dir: &Path, needles: &[&str]) -> FrontendError {
    let err = error_of(dir);
    let msg = err.to_string();
    eprintln!("{msg}");
    for n in needles {
        assert!(msg.contains(n), "message lacks {n:?}: {msg}");
    }
    err
}

/// A writable copy of the tiny llama with its config edited by `f`.
fn llama_with(
    tmp: &TempDir,
    f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> std::path::PathBuf {
    let dir = copy_model(tmp, "tiny/llama", "llama");
    edit_config(&dir, f);
    dir
}

#[test]
fn missing_directory() {
    let tmp = TempDir::new("nodir");
    let err = check(&tmp.path().join("nope"), &["cannot read", "nope"]);
    assert!(matches!(err, FrontendError::Io { .. }));
}

#[test]
fn missing_config() {
    let tmp = TempDir::new("noconfig");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let err = check(&dir, &["config.json", "cannot read"]);
    assert!(matches!(err, FrontendError::Io { .. }));
}

#[test]
fn malformed_config() {
    let tmp = TempDir::new("badjson");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 64,,}").unwrap();
    let err = check(&dir, &["config.json", "line 1"]);
    assert!(matches!(err, FrontendError::Json { .. }));
}

#[test]
fn missing_required_keys() {
    for key in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "intermediate_size",
        "rms_norm_eps",
        "max_position_embeddings",
    ] {
        let tmp = TempDir::new("missingkey");
        let dir = llama_with(&tmp, |c| {
            c.remove(key);
        });
        check(&dir, &["config.json", &format!("missing field `{key}`")]);
    }
}

#[test]
fn mistyped_key_points_at_the_line() {
    let tmp = TempDir::new("mistyped");
    let dir = llama_with(&tmp, |c| {
        c.insert("hidden_size".into(), json!("sixty-four"));
    });
    check(&dir, &["config.json", "invalid type", "line"]);
}

#[test]
fn inconsistent_heads() {
    let tmp = TempDir::new("heads");
    let dir = llama_with(&tmp, |c| {
        c.insert("num_key_value_heads".into(), json!(3));
    });
    check(
        &dir,
        &["config.json", "num_key_value_heads", "does not divide"],
    );
}

#[test]
fn unknown_architecture() {
    let tmp = TempDir::new("arch");
    let dir = llama_with(&tmp, |c| {
        c.insert("architectures".into(), json!(["FrobnicatorForCausalLM"]));
    });
    // The checkpoint itself opens; lowering names the class and the supported ones.
    assert!(Checkpoint::open(&dir).is_ok());
    let err = check(
        &dir,
        &["FrobnicatorForCausalLM", "supported: LlamaForCausalLM"],
    );
    assert!(matches!(err, FrontendError::UnsupportedArchitecture { .. }));
}

#[test]
fn missing_architectures() {
    let tmp = TempDir::new("noarch");
    let dir = llama_with(&tmp, |c| {
        c.remove("architectures");
    });
    check(&dir, &["config.json", "`architectures`"]);
}

#[test]
fn missing_tensor() {
    let tmp = TempDir::new("layers");
    let dir = llama_with(&tmp, |c| {
        c.insert("num_hidden_layers".into(), json!(3));
    });
    let err = check(&dir, &["model.layers.2.input_layernorm.weight", "missing"]);
    assert!(matches!(err, FrontendError::MissingTensor { .. }));
}

#[test]
fn missing_untied_lm_head() {
    let tmp = TempDir::new("untied");
    let dir = llama_with(&tmp, |c| {
        c.insert("tie_word_embeddings".into(), json!(false));
    });
    check(&dir, &["`lm_head.weight`", "missing"]);
}

#[test]
fn mis_shaped_tensor() {
    let tmp = TempDir::new("shape");
    let dir = llama_with(&tmp, |c| {
        c.insert("intermediate_size".into(), json!(100));
    });
    let err = check(
        &dir,
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "[176, 64]",
            "[100, 64]",
        ],
    );
    assert!(matches!(err, FrontendError::TensorShape { .. }));
}

#[test]
fn missing_bias() {
    let tmp = TempDir::new("bias");
    let dir = llama_with(&tmp, |c| {
        c.insert("attention_bias".into(), json!(true));
    });
    check(&dir, &["model.layers.0.self_attn.q_proj.bias", "missing"]);
}

#[test]
fn corrupt_safetensors() {
    let tmp = TempDir::new("corrupt");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // Truncated anywhere (in the length, the header, the data), or garbage.
    for len in [0, 5, 8, 20, 8 + header, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let err = check(&dir, &["invalid safetensors file", "model.safetensors"]);
        assert!(
            matches!(err, FrontendError::Safetensors { .. }),
            "{len}: {err}"
        );
    }
    let mut garbage = bytes.clone();
    garbage[8..16].copy_from_slice(b"notjson!");
    std::fs::write(&path, &garbage).unwrap();
    check(&dir, &["invalid safetensors file", "model.safetensors"]);
}

/// A file's header is checked from the header alone exactly as the whole
/// file is checked in memory: the same verdict and message for every cut
/// and for garbage.
#[test]
fn safetensors_files_and_bytes_are_checked_alike() {
    let tmp = TempDir::new("alike");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut garbage = bytes.clone();
    garbage[8..16].copy_from_slice(b"notjson!");
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 16]);
    let mut cases: Vec<Vec<u8>> = [0, 5, 8, 20, 8 + header, bytes.len() / 2, bytes.len() - 1]
        .iter()
        .map(|&len| bytes[..len].to_vec())
        .collect();
    cases.extend([garbage, longer, bytes.clone()]);
    for case in cases {
        std::fs::write(&path, &case).unwrap();
        let from_file = WeightStore::open_files(std::slice::from_ref(&path));
        let from_bytes = WeightStore::from_bytes(&[(path.clone(), &case[..])]);
        let verdict = |r: &Result<WeightStore, FrontendError>| match r {
            Ok(store) => Ok(store.names().len()),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(
            verdict(&from_file),
            verdict(&from_bytes),
            "{} bytes",
            case.len()
        );
    }
}

/// A safetensors file truncated by another program after the checkpoint
/// was opened: reading a tensor past the new end is an error naming the
/// file (the tensors are read, not mapped, so nothing can fault), and the
/// tensors still inside the file read their bytes as stored.
#[test]
fn checkpoint_truncated_while_open_is_an_error_not_a_fault() {
    let tmp = TempDir::new("shrunk");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let stored = read_tensors(&path);
    let ckpt = Checkpoint::open(&dir).unwrap();
    // The header gives each tensor's place: cut the file inside the last one.
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header]).unwrap();
    let places: Vec<(&str, u64, u64)> = meta
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, info)| {
            let offsets = info["data_offsets"].as_array().unwrap();
            let at = |i: usize| offsets[i].as_u64().unwrap() + 8 + header as u64;
            (name.as_str(), at(0), at(1))
        })
        .collect();
    let &(last, last_start, _) = places.iter().max_by_key(|p| p.1).unwrap();
    let cut = last_start + 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let err = ckpt.tensor(last).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the checkpoint file changed while it was being read (now {cut} bytes, was {}); \
             do not rewrite a checkpoint while gerbilc compiles it: rerun the command",
            path.display(),
            bytes.len()
        )
    );
    let inside: Vec<&str> = places.iter().filter(|p| p.2 <= cut).map(|p| p.0).collect();
    assert!(inside.len() > 3, "{places:?}");
    for name in inside {
        let view = ckpt.tensor(name).unwrap();
        let (_, t) = stored.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(view.data, &t.data[..], "{name}");
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        assert_eq!(view.shape, shape, "{name}");
    }
}

/// The store keeps no tensor: each read hands its bytes over (owned) and a
/// tensor asked for again is read from the file again, so a compiler that
/// drops each tensor after use holds one at a time. (A store that cached the
/// first read would return the old bytes here.) Rows can be read alone.
#[test]
fn a_tensor_is_read_from_its_file_each_time_and_handed_over() {
    let tmp = TempDir::new("no-cache");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let path = dir.join("model.safetensors");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let name = "model.norm.weight";
    let first = ckpt.tensor(name).unwrap();
    assert!(matches!(first.data, std::borrow::Cow::Owned(_)));
    // Rewrite the tensor's bytes in place (the open file sees them).
    let mut bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header]).unwrap();
    let at = |i: usize| 8 + header + meta[name]["data_offsets"][i].as_u64().unwrap() as usize;
    let (start, end) = (at(0), at(1));
    bytes[start..end].iter_mut().for_each(|b| *b ^= 0x55);
    let changed = bytes[start..end].to_vec();
    std::fs::write(&path, &bytes).unwrap();
    let again = ckpt.tensor(name).unwrap();
    assert_eq!(again.data, &changed[..]);
    assert_ne!(again.data, first.data);
    // Some rows alone: the bytes of those rows of the whole.
    let emb = "model.embed_tokens.weight";
    let whole = ckpt.tensor(emb).unwrap();
    let rows = ckpt.tensor_rows(emb, 3, 5).unwrap();
    assert_eq!(rows.shape, [5, 64]);
    assert_eq!(rows.data, &whole.data[3 * 256..8 * 256]);
    let err = ckpt.tensor_rows(emb, 510, 5).unwrap_err().to_string();
    assert!(
        err.contains("has shape [512, 64] but the config implies [515, 64]"),
        "{err}"
    );
}

#[test]
fn unsupported_dtype() {
    let tmp = TempDir::new("dtype");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let path = dir.join("model.safetensors");
    let mut tensors = read_tensors(&path);
    for (name, t) in tensors.iter_mut() {
        if name == "model.norm.weight" {
            t.dtype = safetensors::Dtype::I32;
        }
    }
    write_tensors(&path, &tensors);
    // Opening is fine (unused odd tensors are common); asking for it is not.
    let err = check(&dir, &["model.norm.weight", "I32", "BF16, F16 and F32"]);
    assert!(matches!(err, FrontendError::UnsupportedDtype { .. }));
}

#[test]
fn unknown_rope_type() {
    let tmp = TempDir::new("rope");
    let dir = llama_with(&tmp, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "proportional", "rope_theta": 10000.0, "factor": 4.0}),
        );
    });
    let err = check(
        &dir,
        &["`proportional`", "default, linear, llama3, yarn, longrope"],
    );
    assert!(matches!(err, FrontendError::UnsupportedRope { .. }));

    // v4 spelling, same verdict.
    let tmp = TempDir::new("rope4");
    let dir = llama_with(&tmp, |c| {
        c.remove("rope_parameters");
        c.insert("rope_theta".into(), json!(10000.0));
        c.insert(
            "rope_scaling".into(),
            json!({"type": "dynamic", "factor": 2.0}),
        );
    });
    check(
        &dir,
        &["`dynamic`", "default, linear, llama3, yarn, longrope"],
    );
}

#[test]
fn incomplete_llama3_rope() {
    // (A missing `original_max_position_embeddings` defaults to
    // `max_position_embeddings`, as in transformers.)
    let tmp = TempDir::new("llama3");
    let dir = llama_with(&tmp, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                   "low_freq_factor": 1.0}),
        );
    });
    check(&dir, &["config.json", "rope_parameters.high_freq_factor"]);
}

#[test]
fn incomplete_yarn_and_longrope() {
    let tmp = TempDir::new("longrope");
    let dir = llama_with(&tmp, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "longrope", "rope_theta": 10000.0,
                   "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}),
        );
    });
    // Compiled for the full 128 positions = original: the short factors,
    // which are fine; a longer original would not change that.
    Checkpoint::open(&dir).and_then(|c| lower(&c)).unwrap();
    edit_config(&dir, |c| {
        c.insert("max_position_embeddings".into(), json!(256));
        c.insert("original_max_position_embeddings".into(), json!(128));
    });
    check(
        &dir,
        &["config.json", "rope_parameters.long_factor", "missing"],
    );
    edit_config(&dir, |c| {
        c["rope_parameters"]["long_factor"] = json!([1.0, 2.0, 3.0]);
    });
    check(
        &dir,
        &["rope_parameters.long_factor", "has 3 factors", "needs 8"],
    );

    let dir = llama_with(&tmp, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": -2.0}),
        );
    });
    check(&dir, &["rope_parameters.factor", "not a positive number"]);
}

#[test]
fn per_layer_rope_for_llama() {
    let tmp = TempDir::new("perlayer");
    let dir = llama_with(&tmp, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        );
    });
    check(&dir, &["rope_parameters", "per layer type"]);
}

#[test]
fn unsupported_activation() {
    let tmp = TempDir::new("act");
    let dir = llama_with(&tmp, |c| {
        c.insert("hidden_act".into(), json!("gelu"));
    });
    check(&dir, &["hidden_act", "`gelu`", "LlamaForCausalLM", "silu"]);
}

#[test]
fn no_weights() {
    let err = check(&model("smollm2-135m"), &["no weights", "smollm2-135m"]);
    assert!(matches!(err, FrontendError::NoWeights { .. }));
}

#[test]
fn broken_index() {
    let tmp = TempDir::new("index");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    std::fs::rename(
        dir.join("model.safetensors"),
        dir.join("model-00001-of-00001.safetensors"),
    )
    .unwrap();
    let index = |map: serde_json::Value| {
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            json!({"weight_map": map}).to_string(),
        )
        .unwrap();
    };
    // A shard that does not exist.
    index(json!({"model.norm.weight": "model-00002-of-00002.safetensors"}));
    check(&dir, &["cannot read", "model-00002-of-00002.safetensors"]);
    // A tensor the named shard does not hold.
    index(json!({"model.nonexistent.weight": "model-00001-of-00001.safetensors"}));
    check(
        &dir,
        &["model.safetensors.index.json", "model.nonexistent.weight"],
    );
    // A path outside the directory.
    index(json!({"model.norm.weight": "../model-00001-of-00001.safetensors"}));
    check(&dir, &["model.safetensors.index.json", "not a file name"]);
    // Malformed index.
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        "{\"weight_map\": 3}",
    )
    .unwrap();
    check(&dir, &["model.safetensors.index.json", "invalid type"]);
}

#[test]
fn malformed_optional_files_are_errors() {
    for file in ["generation_config.json", "tokenizer_config.json"] {
        let tmp = TempDir::new("optional");
        let dir = copy_model(&tmp, "tiny/llama", "llama");
        std::fs::write(dir.join(file), "{oops").unwrap();
        check(&dir, &[file]);
    }
}
