//! Targets `safetensors` and `shard_index`: bytes as a `model.safetensors`
//! file, and as a `model.safetensors.index.json` with its shards, through the
//! frontend's readers ([`WeightStore::from_bytes`] and
//! [`WeightStore::from_index_json`], the checks `Checkpoint::open` runs
//! on files), then every tensor looked up as lowering looks them up.
//!
//! `shard_index` splits its input at the first NUL byte: the index JSON,
//! then the bytes every shard it names holds (so an index naming one shard
//! can succeed, and one naming two fails on the repeated tensors).

use gerbil_frontend_hf::WeightStore;
use std::path::{Path, PathBuf};

/// Opens the input as a safetensors file and reads every tensor in it.
pub fn safetensors(data: &[u8]) {
    let file = (PathBuf::from("/fuzz/model.safetensors"), data);
    if let Ok(store) = WeightStore::from_bytes(&[file]) {
        read_all(&store);
    }
}

/// Opens the input as a shard index followed by the bytes of its shards.
pub fn shard_index(data: &[u8]) {
    let (index, shard) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(index) = std::str::from_utf8(index) else {
        return;
    };
    let path = Path::new("/fuzz/model.safetensors.index.json");
    let store = WeightStore::from_index_json(path, index, |paths| {
        let files: Vec<(PathBuf, &[u8])> = paths.iter().map(|p| (p.clone(), shard)).collect();
        WeightStore::from_bytes(&files)
    });
    if let Ok(store) = store {
        read_all(&store);
    }
}

/// Looks up every tensor: shape, dtype and bytes.
fn read_all(store: &WeightStore) {
    for name in store.names() {
        let _ = store.shape(name);
        if let Ok(view) = store.tensor(name) {
            let product = view.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let size = product.and_then(|n| n.checked_mul(view.dtype.size_bytes()));
            assert_eq!(
                size,
                Some(view.data.len() as u64),
                "tensor `{name}`: its bytes do not match its shape"
            );
        }
    }
}
