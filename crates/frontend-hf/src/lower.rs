//! Lowering a checkpoint to an IR graph.
//!
//! [`lower`] looks up `architectures[0]` in the family registry
//! ([`supported_architectures`]), runs that family's builder and returns the
//! graph plus a few [`ModelFacts`] the later stages need. Builders work
//! through a `LowerCtx`, which checks every checkpoint weight against the
//! shape the config implies before it becomes a node, and hands out one node
//! per tensor (so tied embeddings share a node).
//!
//! [`lower_with`] takes [`LowerOptions`]: the context the plan is compiled
//! for matters to one RoPE variant (`longrope` picks its factors by it).
//! [`required_weights`] runs a builder without reading any weight and lists
//! the tensors, with shapes, that lowering would read.
//!
//! To add a family: write `families/<name>.rs` with a `build` function that
//! states what differs from the shared decoder in `families/decoder.rs`,
//! and add a row to `FAMILIES` below (docs/adding-a-model-family.md).

use crate::checkpoint::Checkpoint;
use crate::error::{FrontendError, Result};
use crate::families;
use crate::rope::{RopeContext, RopeFrequencies};
use crate::sentence::SentencePipeline;
use gerbil_ir::{DType, Dim, Graph, Op, Sym, TensorType, ValueRef, Weight, WeightSource};
use serde::de::DeserializeOwned;
use std::collections::HashMap;

/// Facts about the lowered model that later stages and the runtime need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    /// `architectures[0]` of the config, e.g. `LlamaForCausalLM`.
    pub architecture: String,
    /// The family builder that lowered it, e.g. `llama`.
    pub family: String,
    /// Model name (the checkpoint directory's name).
    pub name: String,
    /// Vocabulary size (width of the logits).
    pub vocab_size: u64,
    /// Width of the residual stream.
    pub hidden_size: u64,
    /// Number of decoder layers.
    pub num_layers: u64,
    /// Context length the model was trained for.
    pub max_position_embeddings: u64,
    /// For an encoder (its graph's output is [`gerbil_ir::EMBEDDING`]): the
    /// vector it makes; `None` for a language model.
    pub embedding: Option<EmbeddingFacts>,
}

/// What an embedding model's output vector is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingFacts {
    /// Length of the vector.
    pub dimension: u64,
    /// Most tokens one input may have: the rows of the position table it
    /// reads (RoBERTa's start after the padding id's).
    pub max_positions: u64,
    /// The sentence-transformers pipeline that makes it from the rows.
    pub pipeline: SentencePipeline,
}

/// The result of lowering: the graph and facts about the model.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The model's graph; its single output is `logits`.
    pub graph: Graph,
    /// Facts about the model.
    pub facts: ModelFacts,
}

/// A family builder: adds the model's nodes and outputs to `ctx.graph`.
pub(crate) type BuildFn = fn(&mut LowerCtx<'_>) -> Result<()>;

/// The registry: architecture (model class) → family name → builder.
static FAMILIES: &[(&str, &str, BuildFn)] = &[
    ("LlamaForCausalLM", "llama", families::llama::build),
    ("Qwen2ForCausalLM", "qwen2", families::qwen2::build),
    ("Qwen3ForCausalLM", "qwen3", families::qwen3::build),
    ("Qwen3Model", "qwen3", families::qwen3::build),
    ("MistralForCausalLM", "mistral", families::mistral::build),
    ("Gemma3ForCausalLM", "gemma3", families::gemma3::build),
    ("Gemma3TextModel", "gemma3", families::gemma3::build),
    ("Phi3ForCausalLM", "phi3", families::phi3::build),
    ("BertModel", "bert", families::bert::build),
    (
        "XLMRobertaModel",
        "xlm_roberta",
        families::bert::build_roberta,
    ),
    ("RobertaModel", "roberta", families::bert::build_roberta),
];

/// Settings of one lowering.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LowerOptions {
    /// The context the plan is compiled for (its KV-cache capacity); `None`
    /// means the model's `max_position_embeddings`. Only `longrope` RoPE
    /// reads it.
    pub max_context: Option<u64>,
}

/// A checkpoint tensor that lowering reads, with the shape the config implies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequiredWeight {
    /// Tensor name.
    pub name: String,
    /// Expected shape.
    pub shape: Vec<u64>,
}

/// Architectures [`lower`] accepts, in registry order.
pub fn supported_architectures() -> Vec<&'static str> {
    FAMILIES.iter().map(|(arch, _, _)| *arch).collect()
}

/// The family that lowers `architecture`, if any.
pub fn family_of(architecture: &str) -> Option<&'static str> {
    FAMILIES
        .iter()
        .find(|(arch, _, _)| *arch == architecture)
        .map(|(_, family, _)| *family)
}

/// The registry row of the checkpoint's architecture.
fn family_entry(ckpt: &Checkpoint) -> Result<(&str, &'static str, BuildFn)> {
    let architecture = ckpt.config.architecture()?;
    match FAMILIES.iter().find(|(arch, _, _)| *arch == architecture) {
        Some(&(_, family, build)) => Ok((architecture, family, build)),
        None => Err(FrontendError::UnsupportedArchitecture {
            found: architecture.to_string(),
            supported: supported_architectures()
                .into_iter()
                .map(String::from)
                .collect(),
        }),
    }
}

/// Lowers a checkpoint to a graph with one output, `logits` (`f32[T, vocab]`),
/// with default [`LowerOptions`].
pub fn lower(ckpt: &Checkpoint) -> Result<Lowered> {
    lower_with(ckpt, &LowerOptions::default())
}

/// Lowers a checkpoint to a graph with one output, `logits` (`f32[T, vocab]`).
pub fn lower_with(ckpt: &Checkpoint, options: &LowerOptions) -> Result<Lowered> {
    let (architecture, family, build) = family_entry(ckpt)?;
    if !ckpt.has_weights {
        return Err(FrontendError::NoWeights {
            dir: ckpt.dir.clone(),
        });
    }
    let mut ctx = LowerCtx::new(ckpt, options.clone());
    build(&mut ctx)?;
    let c = &ckpt.config;
    Ok(Lowered {
        graph: ctx.graph,
        facts: ModelFacts {
            architecture: architecture.to_string(),
            family: family.to_string(),
            name: ckpt.name.clone(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_layers: c.num_hidden_layers,
            max_position_embeddings: c.max_position_embeddings,
            embedding: ctx.embedding,
        },
    })
}

/// The checkpoint tensors (names and shapes the config implies) that
/// [`lower`] reads, in the order it first reads them, found without reading
/// any weight: the checkpoint needs no safetensors files. The LM head counts
/// as tied when the config ties it (there is no file to find a separate one
/// in). Lowering errors other than missing or mis-shaped tensors still occur.
pub fn required_weights(ckpt: &Checkpoint, options: &LowerOptions) -> Result<Vec<RequiredWeight>> {
    let (_, _, build) = family_entry(ckpt)?;
    let mut ctx = LowerCtx::new(ckpt, options.clone());
    ctx.dry_run = Some(Vec::new());
    build(&mut ctx)?;
    Ok(ctx.dry_run.unwrap_or_default())
}

/// What a family builder works with: the checkpoint and the graph being built.
pub(crate) struct LowerCtx<'a> {
    /// The checkpoint being lowered.
    pub ckpt: &'a Checkpoint,
    /// The graph under construction.
    pub graph: Graph,
    /// The lowering's settings.
    pub options: LowerOptions,
    /// Checkpoint weight nodes already created, by label (the tensor name,
    /// or `name[start..end]` for a row range).
    weights: HashMap<String, ValueRef>,
    /// In a dry run ([`required_weights`]): the tensors asked for so far;
    /// weights are then not read, only recorded (as f32).
    dry_run: Option<Vec<RequiredWeight>>,
    /// What an encoder family's output vector is (it sets this).
    pub embedding: Option<EmbeddingFacts>,
}

impl<'a> LowerCtx<'a> {
    /// An empty graph named after the checkpoint.
    pub fn new(ckpt: &'a Checkpoint, options: LowerOptions) -> Self {
        LowerCtx {
            ckpt,
            graph: Graph::new(ckpt.name.clone()),
            options,
            weights: HashMap::new(),
            dry_run: None,
            embedding: None,
        }
    }

    /// What RoPE variants need to know about the model and the plan.
    pub fn rope_context(&self) -> RopeContext {
        let max_position_embeddings = self.ckpt.config.max_position_embeddings;
        RopeContext {
            max_position_embeddings,
            context: self.options.max_context.unwrap_or(max_position_embeddings),
        }
    }

    /// Whether the checkpoint holds tensor `name` (never in a dry run).
    pub fn has_tensor(&self, name: &str) -> bool {
        self.dry_run.is_none() && self.ckpt.contains(name)
    }

    /// The family-specific keys of `config.json`, read into `T` (a struct of
    /// `#[serde(default)]` fields; unknown keys are ignored).
    pub fn family_keys<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.ckpt.config_json.clone()).map_err(|source| {
            FrontendError::Json {
                path: self.ckpt.config_path(),
                source,
            }
        })
    }

    /// Adds a node (the IR checks the inputs against the op's type rule).
    pub fn add(
        &mut self,
        op: Op,
        inputs: &[ValueRef],
        label: impl Into<String>,
    ) -> Result<ValueRef> {
        Ok(self.graph.add(op, inputs, label)?)
    }

    /// Checks that checkpoint tensor `name` exists, has a loadable dtype and
    /// has shape `expected`; returns its dtype. In a dry run, records it.
    fn check_tensor(&mut self, name: &str, expected: &[u64]) -> Result<DType> {
        if let Some(needed) = &mut self.dry_run {
            if !needed.iter().any(|w| w.name == name) {
                needed.push(RequiredWeight {
                    name: name.to_string(),
                    shape: expected.to_vec(),
                });
            }
            return Ok(DType::F32);
        }
        let (dtype, shape) = self.ckpt.weights.tensor_type(name)?;
        if shape != expected {
            return Err(FrontendError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: shape.to_vec(),
            });
        }
        Ok(dtype)
    }

    /// The node of a weight from `source` labelled `label`, created once per label.
    fn weight_node(
        &mut self,
        source: WeightSource,
        ty: TensorType,
        label: String,
    ) -> Result<ValueRef> {
        if let Some(&v) = self.weights.get(&label) {
            return Ok(v);
        }
        let v = self.add(Op::Weight(Weight { source, ty }), &[], label.clone())?;
        self.weights.insert(label, v);
        Ok(v)
    }

    /// The weight node of checkpoint tensor `name`, after checking that it
    /// exists, has a loadable dtype and has shape `expected`. Labelled with
    /// the tensor name; asking twice returns the same node.
    pub fn weight(&mut self, name: &str, expected: &[u64]) -> Result<ValueRef> {
        let dtype = self.check_tensor(name, expected)?;
        let source = WeightSource::Checkpoint {
            tensor: name.to_string(),
        };
        self.weight_node(source, TensorType::fixed(dtype, expected), name.to_string())
    }

    /// The weight node of rows `start..start + count` of checkpoint tensor
    /// `name` (a fused projection), after checking the whole tensor as
    /// [`Self::weight`] does against `shape`. Labelled `name[start..end]`.
    pub fn weight_rows(
        &mut self,
        name: &str,
        shape: &[u64],
        start: u64,
        count: u64,
    ) -> Result<ValueRef> {
        let dtype = self.check_tensor(name, shape)?;
        let rows = shape.first().copied().unwrap_or(0);
        if count == 0 || start + count > rows {
            return Err(FrontendError::TensorShape {
                name: format!("{name}[{start}..{}]", start + count),
                expected: vec![start + count],
                found: shape.to_vec(),
            });
        }
        let mut sliced = shape.to_vec();
        sliced[0] = count;
        let source = WeightSource::Rows {
            tensor: name.to_string(),
            start,
            count,
        };
        let label = format!("{name}[{start}..{}]", start + count);
        self.weight_node(source, TensorType::fixed(dtype, &sliced), label)
    }

    /// The weight node of row `row` of checkpoint tensor `name` (checked
    /// against `shape` as [`Self::weight`] does) as a vector of
    /// `shape[1..]`: BERT's token-type row. Labelled `name[row]`.
    pub fn weight_row(&mut self, name: &str, shape: &[u64], row: u64) -> Result<ValueRef> {
        let dtype = self.check_tensor(name, shape)?;
        if row >= shape.first().copied().unwrap_or(0) {
            return Err(FrontendError::TensorShape {
                name: format!("{name}[{row}]"),
                expected: vec![row + 1],
                found: shape.to_vec(),
            });
        }
        let source = WeightSource::Rows {
            tensor: name.to_string(),
            start: row,
            count: 1,
        };
        let ty = TensorType::fixed(dtype, &shape[1..]);
        self.weight_node(source, ty, format!("{name}[{row}]"))
    }

    /// A RoPE table node `f32[Lmax, 2·inv_freq.len()]`.
    pub fn rope_table(&mut self, freqs: &RopeFrequencies, label: &str) -> Result<ValueRef> {
        let width = 2 * freqs.inv_freq.len() as u64;
        let op = Op::Weight(Weight {
            source: WeightSource::RopeTable {
                inv_freq: freqs.inv_freq.clone(),
                attention_scaling: freqs.attention_scaling,
            },
            ty: TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(width)]),
        });
        self.add(op, &[], label)
    }

    /// A configuration error about `key` of `config.json`.
    pub fn config_err(&self, key: &str, why: impl Into<String>) -> FrontendError {
        FrontendError::Config {
            path: self.ckpt.config_path(),
            key: key.to_string(),
            why: why.into(),
        }
    }

    /// `value` of config key `key` as a `u32` (IR attributes are `u32`).
    pub fn u32_of(&self, key: &str, value: u64) -> Result<u32> {
        u32::try_from(value).map_err(|_| self.config_err(key, format!("{value} is too large")))
    }
}
