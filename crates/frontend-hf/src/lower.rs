//! Lowering a checkpoint to an IR graph.
//!
//! [`lower`] looks up `architectures[0]` in the family registry
//! ([`supported_architectures`]), runs that family's builder and returns the
//! graph plus a few [`ModelFacts`] the later stages need. Builders work
//! through a `LowerCtx`, which checks every checkpoint weight against the
//! shape the config implies before it becomes a node, and hands out one node
//! per tensor (so tied embeddings share a node).
//!
//! To add a family: write `families/<name>.rs` with a `build` function that
//! states what differs from the shared decoder in `families/decoder.rs`,
//! and add a row to `FAMILIES` below.

use crate::checkpoint::Checkpoint;
use crate::error::{FrontendError, Result};
use crate::families;
use crate::rope::RopeFrequencies;
use gerbil_ir::{DType, Dim, Graph, Op, Sym, TensorType, ValueRef, Weight, WeightSource};
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
static FAMILIES: &[(&str, &str, BuildFn)] =
    &[("LlamaForCausalLM", "llama", families::llama::build)];

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

/// Lowers a checkpoint to a graph with one output, `logits` (`f32[T, vocab]`).
pub fn lower(ckpt: &Checkpoint) -> Result<Lowered> {
    let architecture = ckpt.config.architecture()?;
    let Some(&(_, family, build)) = FAMILIES.iter().find(|(arch, _, _)| *arch == architecture)
    else {
        return Err(FrontendError::UnsupportedArchitecture {
            found: architecture.to_string(),
            supported: supported_architectures()
                .into_iter()
                .map(String::from)
                .collect(),
        });
    };
    if !ckpt.has_weights {
        return Err(FrontendError::NoWeights {
            dir: ckpt.dir.clone(),
        });
    }
    let mut ctx = LowerCtx::new(ckpt);
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
        },
    })
}

/// What a family builder works with: the checkpoint and the graph being built.
pub(crate) struct LowerCtx<'a> {
    /// The checkpoint being lowered.
    pub ckpt: &'a Checkpoint,
    /// The graph under construction.
    pub graph: Graph,
    /// Checkpoint weight nodes already created, by tensor name.
    weights: HashMap<String, ValueRef>,
}

impl<'a> LowerCtx<'a> {
    /// An empty graph named after the checkpoint.
    pub fn new(ckpt: &'a Checkpoint) -> Self {
        LowerCtx {
            ckpt,
            graph: Graph::new(ckpt.name.clone()),
            weights: HashMap::new(),
        }
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

    /// The weight node of checkpoint tensor `name`, after checking that it
    /// exists, has a loadable dtype and has shape `expected`. Labelled with
    /// the tensor name; asking twice returns the same node.
    pub fn weight(&mut self, name: &str, expected: &[u64]) -> Result<ValueRef> {
        let view = self.ckpt.tensor(name)?;
        if view.shape != expected {
            return Err(FrontendError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: view.shape,
            });
        }
        if let Some(&v) = self.weights.get(name) {
            return Ok(v);
        }
        let op = Op::Weight(Weight {
            source: WeightSource::Checkpoint {
                tensor: name.to_string(),
            },
            ty: TensorType::fixed(view.dtype, expected),
        });
        let v = self.add(op, &[], name)?;
        self.weights.insert(name.to_string(), v);
        Ok(v)
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
