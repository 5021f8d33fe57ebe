//! GGUF tensor names to HuggingFace names, and what llama.cpp's converter
//! did to a tensor that loading must undo.
//!
//! `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`; the
//! table is llama.cpp's `tensor_mapping.py` read backwards for the families
//! gerbil lowers, with Gemma 3's four norms per layer and Phi-3's fused
//! projections. Two transforms are undone as transformers undoes them:
//! llama.cpp permutes the rows of Llama's query and key projections
//! (interleaving each head's two rotary halves) — [`Fixup::Unpermute`] puts
//! them back — and stores Gemma's norm weights as `1 + w`
//! ([`Fixup::SubtractOne`]). A name outside the table is not a weight any
//! family reads (`rope_freqs.weight` is folded into the configuration).

/// What loading a tensor must undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixup {
    /// Nothing.
    None,
    /// Rows were permuted per head for interleaved RoPE: `heads` groups.
    Unpermute {
        /// Heads the rows are grouped in (key/value heads for the key).
        heads: u64,
    },
    /// The values are `1 + w`.
    SubtractOne,
}

/// The HuggingFace name of GGUF tensor `name` in architecture `arch`, or
/// `None` for a tensor no family reads.
pub fn hf_name(arch: &str, name: &str) -> Option<String> {
    let global = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<u64>().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let gemma = arch == "gemma3";
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// What loading GGUF tensor `name` must undo, given the query and key/value
/// head counts.
pub fn fixup(arch: &str, name: &str, heads: u64, kv_heads: u64) -> Fixup {
    match arch {
        "llama" if name.contains(".attn_q.") => Fixup::Unpermute { heads },
        "llama" if name.contains(".attn_k.") => Fixup::Unpermute { heads: kv_heads },
        "gemma3" if name.ends_with("norm.weight") => Fixup::SubtractOne,
        _ => Fixup::None,
    }
}

/// Undoes llama.cpp's per-head row permutation of `rows` rows of
/// `row_bytes` bytes: within each head's block of `d` rows, GGUF row
/// `2i + j` is HuggingFace row `j·d/2 + i`.
pub fn unpermute_rows(data: &[u8], rows: usize, row_bytes: usize, heads: usize) -> Vec<u8> {
    let d = rows / heads;
    let mut out = vec![0u8; data.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                let from = h * d + 2 * i + j;
                let to = h * d + j * (d / 2) + i;
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&data[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            hf_name("llama", "blk.12.attn_q.weight").as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            hf_name("qwen2", "blk.0.attn_k.bias").as_deref(),
            Some("model.layers.0.self_attn.k_proj.bias")
        );
        assert_eq!(
            hf_name("gemma3", "blk.1.ffn_norm.weight").as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            hf_name("llama", "blk.1.ffn_norm.weight").as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name("phi3", "blk.0.ffn_up.weight").as_deref(),
            Some("model.layers.0.mlp.gate_up_proj.weight")
        );
        assert_eq!(hf_name("llama", "rope_freqs.weight"), None);
        assert_eq!(hf_name("llama", "blk.x.attn_q.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2): HF row
        // j·d/2 + i goes to GGUF row 2i + j.
        let (heads, d) = (3usize, 8usize);
        let rows = heads * d;
        let hf: Vec<u8> = (0..rows as u8).collect();
        let mut gguf = vec![0u8; rows];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..d / 2 {
                    gguf[h * d + 2 * i + j] = hf[h * d + j * d / 2 + i];
                }
            }
        }
        assert_eq!(unpermute_rows(&gguf, rows, 1, heads), hf);
    }
}
