//! LoRA adapters in PEFT's format: `adapter_config.json` and
//! `adapter_model.safetensors`, a pair of factors per adapted projection.
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_frontend_hf::FrontendError> {
//! use gerbil_frontend_hf::{adapter::Adapter, Checkpoint};
//! // A directory with an adapter opens as its base model with the adapter merged:
//! let ckpt = Checkpoint::open("smol-lora".as_ref())?;
//! let q = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")?; // W + (alpha/r)·B·A
//! # let _ = (q, Adapter::is_in("smol-lora".as_ref()));
//! # Ok(()) }
//! ```
//!
//! A projection `W` (`[out, in]`, a checkpoint tensor `….q_proj.weight`)
//! gets `A` (`[r, in]`, saved as `base_model.model.….q_proj.lora_A.weight`)
//! and `B` (`[out, r]`, `….lora_B.weight`), and the model computes
//! `x·Wᵀ + (alpha/r)·(x·Aᵀ)·Bᵀ`. [`Adapter::open`] reads a directory PEFT or
//! `gerbil-train --lora` wrote; [`Adapter::init`] starts a new one as PEFT
//! does (`B = 0`, `A` uniform in `±1/√in`) from a documented generator
//! ([`init_values`]) so a reference can make the same numbers.
//! [`crate::Checkpoint`] holds an opened adapter and, while
//! [`Adapter::merged`] is set, hands out every adapted weight as
//! `W + (alpha/r)·B·A` — which is how `gerbilc compile` takes an adapter
//! back; training clears the flag to read the base and the factors apart.
//!
//! The surprise: which projections an adapter covers is read from its
//! weights, not from `target_modules` (PEFT's list may be a pattern); the
//! list gerbil writes is the modules' names, for PEFT to read.

use crate::error::{FrontendError, Result};
use crate::weights::{TensorView, WeightStore};
use gerbil_ir::DType;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The adapter's configuration file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// What PEFT puts before a module's name in an adapter's tensor names.
const PREFIX: &str = "base_model.model.";

/// The projections `--lora` adapts unless told otherwise: every attention
/// and MLP projection of the decoder families that is a tensor of its own.
pub const DEFAULT_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// An adapter's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r`: rows of `A`, columns of `B`.
    pub rank: u32,
    /// `alpha`: the update is scaled by `alpha / r`.
    pub alpha: f32,
    /// The adapted modules' names (`q_proj`, …).
    pub targets: Vec<String>,
    /// The base model's directory (or hub id), as `base_model_name_or_path`.
    pub base: String,
}

impl LoraConfig {
    /// The factor the update `B·A` is multiplied by.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}

/// One factor: its shape and f32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Factor {
    /// `[r, in]` for `A`, `[out, r]` for `B`.
    pub shape: [u64; 2],
    /// Row-major values.
    pub values: Vec<f32>,
}

/// An adapter: its settings and its factors by tensor name.
#[derive(Clone, Debug)]
pub struct Adapter {
    /// Where it was read from (`None`: made by [`Adapter::init`]).
    pub dir: Option<PathBuf>,
    /// The settings.
    pub config: LoraConfig,
    /// Every factor, by its name in the adapter file.
    pub factors: BTreeMap<String, Factor>,
    /// Whether the checkpoint holding it hands out adapted weights merged.
    pub merged: bool,
}

/// The names of the `A` and `B` factors of checkpoint tensor `weight`
/// (`model.layers.0.self_attn.q_proj.weight`).
pub fn factor_names(weight: &str) -> (String, String) {
    let module = weight.strip_suffix(".weight").unwrap_or(weight);
    (
        format!("{PREFIX}{module}.lora_A.weight"),
        format!("{PREFIX}{module}.lora_B.weight"),
    )
}

/// The checkpoint tensor a factor named `name` adapts, and whether it is
/// the `A` factor; `None` for another name.
fn adapted_weight(name: &str) -> Option<(String, bool)> {
    let module = name.strip_prefix(PREFIX)?;
    if let Some(m) = module.strip_suffix(".lora_A.weight") {
        return Some((format!("{m}.weight"), true));
    }
    let m = module.strip_suffix(".lora_B.weight")?;
    Some((format!("{m}.weight"), false))
}

/// `count` values uniform in `±bound`, the `A` factors' start: SplitMix64
/// from `state` (advanced), each value `(2u − 1)·bound` with `u` the top 53
/// bits of a draw over 2⁵³, rounded to f32. [`Adapter::init`] draws the
/// factors in name order from one state seeded with the run's seed.
pub fn init_values(state: &mut u64, count: usize, bound: f64) -> Vec<f32> {
    (0..count)
        .map(|_| {
            *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            ((2.0 * u - 1.0) * bound) as f32
        })
        .collect()
}

impl Adapter {
    /// Whether `dir` holds an adapter.
    pub fn is_in(dir: &Path) -> bool {
        dir.join(ADAPTER_CONFIG).is_file()
    }

    /// Reads the adapter in `dir` (merged when a checkpoint holds it).
    pub fn open(dir: &Path) -> Result<Adapter> {
        let path = dir.join(ADAPTER_CONFIG);
        let text = std::fs::read_to_string(&path).map_err(|source| FrontendError::Io {
            path: path.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|source| FrontendError::Json {
            path: path.clone(),
            source,
        })?;
        let config = parse_config(&json, &path)?;
        let weights = dir.join(ADAPTER_WEIGHTS);
        if !weights.is_file() && dir.join("adapter_model.bin").is_file() {
            return Err(bad(
                &dir.join("adapter_model.bin"),
                "a pickled adapter cannot be read; save it as safetensors (PEFT's \
                 `save_pretrained(..., safe_serialization=True)`)"
                    .into(),
            ));
        }
        let store = WeightStore::open_files(std::slice::from_ref(&weights))?;
        let mut factors = BTreeMap::new();
        for name in store.names() {
            let view = store.tensor(name)?;
            let shape = match view.shape[..] {
                [rows, cols] => [rows, cols],
                _ => return Err(bad(&weights, format!("tensor `{name}` is not a matrix"))),
            };
            let values = view.to_f32().ok_or_else(|| {
                bad(
                    &weights,
                    format!("tensor `{name}` is {}, not a float", view.dtype),
                )
            })?;
            factors.insert(name.to_string(), Factor { shape, values });
        }
        let adapter = Adapter {
            dir: Some(dir.to_path_buf()),
            config,
            factors,
            merged: true,
        };
        adapter.check_pairs(&weights)?;
        if adapter.factors.is_empty() {
            return Err(bad(&weights, "it holds no LoRA factors".into()));
        }
        Ok(adapter)
    }

    /// A new adapter of `config` over `weights`: every 2-D tensor
    /// `….TARGET.weight` of a decoder layer (`.layers.`) gets `A` from
    /// [`init_values`] (seeded with `seed`) and `B = 0`. Not merged. A
    /// target no tensor has, or a rank past a projection's smaller side, is
    /// an error naming it.
    pub fn init(weights: &WeightStore, config: LoraConfig, seed: u64) -> Result<Adapter> {
        let option = FrontendError::Lora;
        if config.rank == 0 {
            return Err(option("the rank must be at least 1".into()));
        }
        let mut names: Vec<&str> = weights.names();
        names.sort_unstable();
        let mut factors = BTreeMap::new();
        let mut state = seed;
        for target in &config.targets {
            let suffix = format!(".{target}.weight");
            let adapted: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| n.ends_with(&suffix) && n.contains(".layers."))
                .collect();
            if adapted.is_empty() {
                return Err(option(format!(
                    "no projection called `{target}` in the model; its projections: {}",
                    projections(&names).join(", ")
                )));
            }
            for name in adapted {
                let (_, shape) = weights.tensor_type(name)?;
                let [out, inp] = shape[..] else {
                    return Err(option(format!("`{name}` is not a matrix")));
                };
                let r = u64::from(config.rank);
                if r > out.min(inp) {
                    return Err(option(format!(
                        "rank {r} is larger than projection `{name}` ({out}×{inp}): a rank \
                         goes up to the smaller side, {}; pass a smaller --lora",
                        out.min(inp)
                    )));
                }
                let (a, b) = factor_names(name);
                factors.insert(
                    b,
                    Factor {
                        shape: [out, r],
                        values: vec![0.0; (out * r) as usize],
                    },
                );
                factors.insert(
                    a,
                    Factor {
                        shape: [r, inp],
                        values: Vec::new(),
                    },
                );
            }
        }
        if factors.is_empty() {
            return Err(option(
                "no projection to adapt: name some with --lora-targets".into(),
            ));
        }
        // Drawn in name order, whatever order the targets came in.
        for (name, factor) in factors.iter_mut() {
            if name.ends_with(".lora_A.weight") {
                let [r, inp] = factor.shape;
                let bound = 1.0 / (inp as f64).sqrt();
                factor.values = init_values(&mut state, (r * inp) as usize, bound);
            }
        }
        Ok(Adapter {
            dir: None,
            config,
            factors,
            merged: false,
        })
    }

    /// Every factor pair fits the weight it adapts in `weights` (`B·A` has
    /// its `[out, in]`), which must be there: otherwise the adapter was
    /// made for another model.
    pub fn check_fits(&self, weights: &WeightStore, path: &Path) -> Result<()> {
        for w in self.adapted() {
            let other = || {
                bad(
                    path,
                    format!("it adapts `{w}`, which its base model does not have: it was trained for another model"),
                )
            };
            if !weights.contains(&w) {
                return Err(other());
            }
            let (_, shape) = weights.tensor_type(&w)?;
            let (a, b) = factor_names(&w);
            let (a, b) = (&self.factors[&a], &self.factors[&b]);
            if shape != [b.shape[0], a.shape[1]] {
                return Err(bad(
                    path,
                    format!(
                        "the factors of `{w}` ({}×{} and {}×{}) do not fit its shape {shape:?}: \
                         it was trained for another model",
                        b.shape[0], b.shape[1], a.shape[0], a.shape[1]
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every `(A, B)` pair has both factors, of shapes `[r, in]` and `[out, r]`.
    fn check_pairs(&self, path: &Path) -> Result<()> {
        let r = u64::from(self.config.rank);
        for (name, factor) in &self.factors {
            let Some((weight, is_a)) = adapted_weight(name) else {
                return Err(bad(path, format!("tensor `{name}` is not a LoRA factor")));
            };
            let (a, b) = factor_names(&weight);
            let other = if is_a { &b } else { &a };
            if !self.factors.contains_key(other) {
                return Err(bad(path, format!("`{name}` has no `{other}`")));
            }
            let rank = if is_a {
                factor.shape[0]
            } else {
                factor.shape[1]
            };
            if rank != r {
                return Err(bad(
                    path,
                    format!("`{name}` has rank {rank}, the config's `r` is {r}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether the adapter is merged and covers checkpoint tensor `name`.
    pub fn covers(&self, name: &str) -> bool {
        self.merged && self.factors.contains_key(&factor_names(name).0)
    }

    /// The checkpoint tensors the adapter covers, in name order.
    pub fn adapted(&self) -> Vec<String> {
        self.factors
            .keys()
            .filter_map(|n| adapted_weight(n))
            .filter_map(|(w, is_a)| is_a.then_some(w))
            .collect()
    }

    /// Factor `name` as a tensor view (f32).
    pub fn factor(&self, name: &str) -> Option<TensorView<'static>> {
        let f = self.factors.get(name)?;
        Some(TensorView {
            dtype: DType::F32,
            shape: f.shape.to_vec(),
            data: Cow::Owned(f.values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        })
    }

    /// `view` (checkpoint tensor `name`) with the update `(alpha/r)·B·A`
    /// added when the adapter is merged and covers it; otherwise as it is.
    pub fn apply<'a>(&self, name: &str, view: TensorView<'a>) -> Result<TensorView<'a>> {
        if !self.merged {
            return Ok(view);
        }
        let (a, b) = factor_names(name);
        let (Some(a), Some(b)) = (self.factors.get(&a), self.factors.get(&b)) else {
            return Ok(view);
        };
        let path = self.dir.clone().unwrap_or_default().join(ADAPTER_WEIGHTS);
        let (&[out, inp], [_, r]) = (&view.shape[..], b.shape) else {
            return Err(bad(&path, format!("`{name}` is not a matrix")));
        };
        if a.shape != [r, inp] || b.shape[0] != out {
            return Err(bad(
                &path,
                format!(
                    "the factors of `{name}` ({}×{} and {}×{}) do not fit its {out}×{inp}",
                    b.shape[0], b.shape[1], a.shape[0], a.shape[1]
                ),
            ));
        }
        let mut w = view.to_f32().ok_or_else(|| {
            bad(
                &path,
                format!(
                    "`{name}` is {}: only float weights take an adapter",
                    view.dtype
                ),
            )
        })?;
        let (r, inp) = (r as usize, inp as usize);
        if inp == 0 || r == 0 {
            return Ok(view);
        }
        let scale = self.config.scale();
        for (row, b_row) in w.chunks_exact_mut(inp).zip(b.values.chunks_exact(r)) {
            for (k, &bk) in b_row.iter().enumerate() {
                let s = scale * bk;
                if s != 0.0 {
                    let a_row = &a.values[k * inp..(k + 1) * inp];
                    for (x, &ak) in row.iter_mut().zip(a_row) {
                        *x += s * ak;
                    }
                }
            }
        }
        Ok(TensorView::from_f32(&w, view.dtype, view.shape))
    }

    /// The adapted modules' names (`q_proj`, …), sorted, once each.
    pub fn modules(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .adapted()
            .iter()
            .filter_map(|w| w.strip_suffix(".weight")?.rsplit('.').next())
            .map(str::to_string)
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// The adapter's files, `adapter_config.json` and
    /// `adapter_model.safetensors` (f32 factors), as (name, bytes).
    pub fn to_files(&self) -> Result<Vec<(&'static str, Vec<u8>)>> {
        let c = &self.config;
        let modules = self.modules();
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": c.base,
            "r": c.rank,
            "lora_alpha": c.alpha,
            "target_modules": modules,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": true,
            "modules_to_save": null,
        });
        let bytes: Vec<(String, [usize; 2], Vec<u8>)> = self
            .factors
            .iter()
            .map(|(n, f)| {
                let shape = [f.shape[0] as usize, f.shape[1] as usize];
                let data = f.values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (n.clone(), shape, data)
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(n, shape, data)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), data)
                    .map(|v| (n.as_str(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(Path::new(ADAPTER_WEIGHTS), e.to_string()))?;
        let metadata = [("format".to_string(), "pt".to_string())].into();
        let weights = safetensors::serialize(views, Some(metadata))
            .map_err(|e| bad(Path::new(ADAPTER_WEIGHTS), e.to_string()))?;
        let mut config = serde_json::to_vec_pretty(&config)
            .map_err(|e| bad(Path::new(ADAPTER_CONFIG), e.to_string()))?;
        config.push(b'\n');
        Ok(vec![(ADAPTER_CONFIG, config), (ADAPTER_WEIGHTS, weights)])
    }
}

/// The module names of the projections in `names` (`q_proj`, …), for an
/// error that lists what a target could be.
fn projections(names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = names
        .iter()
        .filter(|n| n.contains(".layers."))
        .filter_map(|n| n.strip_suffix(".weight")?.rsplit('.').next())
        .filter(|m| m.ends_with("proj"))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

fn bad(path: &Path, why: String) -> FrontendError {
    FrontendError::Adapter {
        path: path.to_path_buf(),
        why,
    }
}

/// The settings in `adapter_config.json`: a plain LoRA (no DoRA, biases,
/// extra trained modules, per-layer ranks or transposed factors).
fn parse_config(json: &Value, path: &Path) -> Result<LoraConfig> {
    let field = |key: &str| json.get(key).filter(|v| !v.is_null());
    let refuse = |key: &str, why: &str| FrontendError::Config {
        path: path.to_path_buf(),
        key: key.into(),
        why: why.into(),
    };
    if let Some(t) = field("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err(refuse(
                "peft_type",
                "only LoRA adapters (\"LORA\") are supported",
            ));
        }
    }
    let rank = field("r")
        .and_then(Value::as_u64)
        .and_then(|r| u32::try_from(r).ok())
        .filter(|&r| r > 0)
        .ok_or_else(|| refuse("r", "expected the rank, a positive integer"))?;
    // PEFT's default.
    let alpha = match field("lora_alpha") {
        None => 8.0,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| refuse("lora_alpha", "expected a number"))? as f32,
    };
    let flag = |key: &str| field(key).and_then(Value::as_bool).unwrap_or(false);
    for (key, why) in [
        (
            "use_dora",
            "DoRA adapters are not supported; merge it with PEFT first",
        ),
        (
            "fan_in_fan_out",
            "transposed (Conv1D) factors are not supported",
        ),
    ] {
        if flag(key) {
            return Err(refuse(key, why));
        }
    }
    if field("bias")
        .and_then(Value::as_str)
        .is_some_and(|b| b != "none")
    {
        return Err(refuse(
            "bias",
            "an adapter that trains biases is not supported",
        ));
    }
    if field("modules_to_save").is_some_and(|m| m.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(refuse(
            "modules_to_save",
            "an adapter with fully trained modules is not supported; merge it with PEFT first",
        ));
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if field(key).is_some_and(|m| m.as_object().is_none_or(|o| !o.is_empty())) {
            return Err(refuse(key, "per-module ranks and alphas are not supported"));
        }
    }
    // rsLoRA scales by alpha/√r: the same update as alpha' = alpha·√r over r.
    let alpha = if flag("use_rslora") {
        alpha * (rank as f32).sqrt()
    } else {
        alpha
    };
    let targets = match field("target_modules") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    let base = field("base_model_name_or_path")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(LoraConfig {
        rank,
        alpha,
        targets,
        base,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tensors: &[(&str, [usize; 2])]) -> WeightStore {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, [r, c])| (0..r * c).flat_map(|i| (i as f32).to_le_bytes()).collect())
            .collect();
        let views: Vec<_> = tensors
            .iter()
            .zip(&data)
            .map(|((n, s), d)| {
                let v =
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.to_vec(), d)
                        .unwrap_or_else(|e| panic!("{e}"));
                (*n, v)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap_or_else(|e| panic!("{e}"));
        WeightStore::from_bytes(&[(PathBuf::from("m.safetensors"), &bytes)])
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn config(rank: u32, targets: &[&str]) -> LoraConfig {
        LoraConfig {
            rank,
            alpha: 2.0 * rank as f32,
            targets: targets.iter().map(|t| t.to_string()).collect(),
            base: "base".into(),
        }
    }

    #[test]
    fn init_makes_peft_factors_and_merging_adds_the_scaled_product() {
        let weights = store(&[
            ("model.layers.0.self_attn.q_proj.weight", [3, 4]),
            ("model.layers.0.mlp.down_proj.weight", [4, 5]),
            ("model.embed_tokens.weight", [6, 4]),
        ]);
        let mut adapter =
            Adapter::init(&weights, config(2, &["q_proj"]), 7).unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = factor_names("model.layers.0.self_attn.q_proj.weight");
        assert_eq!(
            a,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        );
        assert_eq!(adapter.factors.len(), 2);
        assert_eq!(adapter.factors[&a].shape, [2, 4]);
        assert_eq!(adapter.factors[&b].values, vec![0.0; 6]);
        let bound = 0.5f32; // 1/√4
        let va = adapter.factors[&a].values.clone();
        assert!(va.iter().all(|v| v.abs() <= bound) && va.iter().any(|v| *v != 0.0));
        // The documented generator, from the seed, in name order.
        assert_eq!(*va, init_values(&mut 7u64.clone(), 8, 0.5));

        // Merged: W + (alpha/r)·B·A, here with B = [[1, 0], [0, 1], [1, 1]].
        adapter
            .factors
            .get_mut(&b)
            .unwrap_or_else(|| panic!("B"))
            .values = vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        adapter.merged = true;
        let name = "model.layers.0.self_attn.q_proj.weight";
        let w = weights.tensor(name).unwrap_or_else(|e| panic!("{e}"));
        let merged = adapter.apply(name, w).unwrap_or_else(|e| panic!("{e}"));
        let got = merged.to_f32().unwrap_or_else(|| panic!("f32"));
        for (i, g) in got.iter().enumerate() {
            let (row, col) = (i / 4, i % 4);
            let delta = match row {
                0 => va[col],
                1 => va[4 + col],
                _ => va[col] + va[4 + col],
            };
            let want = i as f32 + 2.0 * delta;
            assert!(
                (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                "element {i}: {g} != {want}"
            );
        }
        let other = weights
            .tensor("model.embed_tokens.weight")
            .unwrap_or_else(|e| panic!("{e}"));
        let same = adapter.apply("model.embed_tokens.weight", other.clone());
        assert_eq!(same.unwrap_or_else(|e| panic!("{e}")), other);
    }

    #[test]
    fn an_adapter_for_another_shape_is_refused_when_it_opens() {
        let weights = store(&[("model.layers.0.self_attn.q_proj.weight", [3, 4])]);
        let adapter =
            Adapter::init(&weights, config(2, &["q_proj"]), 1).unwrap_or_else(|e| panic!("{e}"));
        adapter
            .check_fits(&weights, Path::new("a"))
            .unwrap_or_else(|e| panic!("{e}"));
        let wider = store(&[("model.layers.0.self_attn.q_proj.weight", [3, 5])]);
        let err = adapter
            .check_fits(&wider, Path::new("a"))
            .err()
            .map(|e| e.to_string());
        assert!(err
            .unwrap_or_default()
            .contains("do not fit its shape [3, 5]"));
        let other = store(&[("model.layers.0.self_attn.k_proj.weight", [3, 4])]);
        let err = adapter
            .check_fits(&other, Path::new("a"))
            .err()
            .map(|e| e.to_string());
        assert!(err
            .unwrap_or_default()
            .contains("trained for another model"));
    }

    #[test]
    fn a_rank_past_a_projection_or_an_unknown_target_is_refused_with_the_fix() {
        let weights = store(&[("model.layers.0.self_attn.q_proj.weight", [3, 4])]);
        let err = Adapter::init(&weights, config(4, &["q_proj"]), 0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("rank 4 is larger than projection"), "{err}");
        assert!(err.contains("up to the smaller side, 3"), "{err}");
        let err = Adapter::init(&weights, config(1, &["qkv_proj"]), 0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("no projection called `qkv_proj`"), "{err}");
        assert!(err.contains("its projections: q_proj"), "{err}");
    }

    #[test]
    fn the_config_round_trips_and_unsupported_kinds_are_refused() {
        let weights = store(&[("model.layers.0.self_attn.q_proj.weight", [3, 4])]);
        let adapter =
            Adapter::init(&weights, config(2, &["q_proj"]), 1).unwrap_or_else(|e| panic!("{e}"));
        let files = adapter.to_files().unwrap_or_else(|e| panic!("{e}"));
        let json: Value = serde_json::from_slice(&files[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(json["target_modules"], json!(["q_proj"]));
        let parsed = parse_config(&json, Path::new("a.json")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed, adapter.config);
        let mut dora = json.clone();
        dora["use_dora"] = json!(true);
        let err = parse_config(&dora, Path::new("a.json"))
            .err()
            .map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("DoRA"));
        let mut rs = json;
        rs["use_rslora"] = json!(true);
        let parsed = parse_config(&rs, Path::new("a.json")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.scale(), 4.0 / 2f32.sqrt());
    }
}
