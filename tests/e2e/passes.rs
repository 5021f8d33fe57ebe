//! Every pass preserves results: random small graphs — chains and diamonds
//! of the ops the passes rewrite (attention blocks, gated MLPs, parallel
//! matmuls with and without bias adds, residual adds and norms, with and
//! without Gemma's `(1 + w)` offset), random and odd shapes — are compiled
//! with all passes, with each pass disabled in turn, and with every optional
//! pass disabled.
//!
//! Without a GPU, the f64 CPU interpreter (`gerbil_e2e::interpreter`) runs
//! each optimized graph and the graph as built, before any pass, through a
//! prefill in two chunks and two decode steps; their logits agree to f64
//! rounding. On the GPU (lavapipe), every variant's plan gives the logits of
//! a prefill and of two decode steps that agree within f32 tolerance, and
//! with the interpreter's.

use gerbil_codegen_wgsl::CodegenOptions;
use gerbil_compiler::{build_plan, TensorSource, WeightOptions};
use gerbil_e2e::interpreter::Interpreter;
use gerbil_e2e::{gpu_lock, interpreter_weights, proptest_config, temp_dir};
use gerbil_frontend_hf::{FrontendError, TensorView, TextAssets};
use gerbil_ir::op::KvKind;
use gerbil_ir::{
    Attention, BinaryOp, DType, Dim, Embedding, Graph, MatMul, Op, RmsNorm, Rope, Sym, TensorType,
    UnaryOp, ValueRef, Weight, WeightSource,
};
use gerbil_passes::{default_pipeline, PassManager};
use gerbil_plan::{CompileInfo, ModelInfo, PlanFile};
use gerbil_runtime::Session;
use pollster::block_on;
use proptest::prelude::*;
use std::collections::HashMap;

/// Tensors made in memory, f32.
#[derive(Default)]
struct Tensors(HashMap<String, (Vec<u64>, Vec<u8>)>);

impl TensorSource for Tensors {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError> {
        let (shape, data) = self
            .0
            .get(name)
            .ok_or_else(|| FrontendError::MissingTensor { name: name.into() })?;
        Ok(TensorView {
            dtype: DType::F32,
            shape: shape.clone(),
            data: data.into(),
        })
    }
}

/// A block of the random graph.
#[derive(Clone, Copy, Debug)]
enum Block {
    /// Pre-norm attention with RoPE, GQA and a KV cache, plus the residual add.
    Attention {
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        window: u32,
    },
    /// Pre-norm gated MLP (SwiGLU or GeGLU), plus the residual add; with
    /// `post_norm`, its output normalized before the add (Gemma 3's
    /// sandwich layers).
    Mlp {
        inter: u64,
        gelu: bool,
        post_norm: bool,
    },
    /// Two matmuls of one input added: a diamond; with biases (add_bias).
    Diamond { bias: bool },
}

/// Builds graphs and their random weights.
struct Builder {
    g: Graph,
    tensors: Tensors,
    seed: u64,
    next: u32,
}

impl Builder {
    fn rand(&mut self) -> f32 {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// A weight of `shape` with values `offset + scale · U(-1, 1)`.
    fn weight(&mut self, shape: &[u64], scale: f32, offset: f32) -> ValueRef {
        let name = format!("w{}", self.next);
        self.next += 1;
        let n: u64 = shape.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| (offset + scale * self.rand()).to_le_bytes())
            .collect();
        self.tensors.0.insert(name.clone(), (shape.to_vec(), bytes));
        let op = Op::Weight(Weight {
            source: WeightSource::Checkpoint {
                tensor: name.clone(),
            },
            ty: TensorType::fixed(DType::F32, shape),
        });
        self.g.add(op, &[], name).expect("weight")
    }

    fn add(&mut self, op: Op, ins: &[ValueRef], label: &str) -> ValueRef {
        self.g.add(op, ins, label).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An RMSNorm with gains around 1: either the weight itself or, half
    /// the time, Gemma's `(1 + w)` with the weight around 0.
    fn norm(&mut self, x: ValueRef, width: u64) -> ValueRef {
        let weight_offset = if self.rand() < 0.0 { 1.0 } else { 0.0 };
        let w = self.weight(&[width], 0.3, 1.0 - weight_offset);
        self.add(
            Op::RmsNorm(RmsNorm {
                eps: 1e-5,
                weight_offset,
                groups: 1,
            }),
            &[x, w],
            "norm",
        )
    }

    fn linear(&mut self, x: ValueRef, n: u64, k: u64, label: &str) -> ValueRef {
        let w = self.weight(&[n, k], 1.0 / (k as f32).sqrt(), 0.0);
        self.add(Op::MatMul(MatMul::linear(false)), &[x, w], label)
    }

    fn block(
        &mut self,
        b: Block,
        x: ValueRef,
        hidden: u64,
        layer: u32,
        table: &mut HashMap<u32, ValueRef>,
    ) -> ValueRef {
        let p = format!("layers.{layer}");
        match b {
            Block::Attention {
                heads,
                kv_heads,
                head_dim,
                window,
            } => {
                let h = self.norm(x, hidden);
                let (qw, kw) = (u64::from(heads * head_dim), u64::from(kv_heads * head_dim));
                let q = self.linear(h, qw, hidden, &format!("{p}.attn.q_proj"));
                let k = self.linear(h, kw, hidden, &format!("{p}.attn.k_proj"));
                let v = self.linear(h, kw, hidden, &format!("{p}.attn.v_proj"));
                let t = *table.entry(head_dim).or_insert_with(|| {
                    let inv_freq = (0..head_dim / 2)
                        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / head_dim as f32))
                        .collect();
                    self.g
                        .add(
                            Op::Weight(Weight {
                                source: WeightSource::RopeTable {
                                    inv_freq,
                                    attention_scaling: 1.0,
                                },
                                ty: TensorType::new(
                                    DType::F32,
                                    [Dim::Sym(Sym::Lmax), Dim::Const(u64::from(head_dim))],
                                ),
                            }),
                            &[],
                            "rope_table",
                        )
                        .expect("table")
                });
                let rope = |n| {
                    Op::Rope(Rope {
                        n_heads: n,
                        head_dim,
                        rotary_dim: head_dim,
                    })
                };
                let q = self.add(rope(heads), &[q, t], &format!("{p}.attn.q_rope"));
                let k = self.add(rope(kv_heads), &[k, t], &format!("{p}.attn.k_rope"));
                let kc = self.add(
                    Op::KvCache {
                        layer,
                        kind: KvKind::K,
                        width: kw,
                    },
                    &[],
                    &format!("{p}.k_cache"),
                );
                let vc = self.add(
                    Op::KvCache {
                        layer,
                        kind: KvKind::V,
                        width: kw,
                    },
                    &[],
                    &format!("{p}.v_cache"),
                );
                let kc = self.add(Op::CacheWrite, &[kc, k], &format!("{p}.attn.k_cache_write"));
                let vc = self.add(Op::CacheWrite, &[vc, v], &format!("{p}.attn.v_cache_write"));
                let a = self.add(
                    Op::Attention(Attention {
                        n_heads: heads,
                        n_kv_heads: kv_heads,
                        head_dim,
                        scale: (head_dim as f32).powf(-0.5),
                        window: (window > 0).then_some(window),
                        causal: true,
                    }),
                    &[q, kc, vc],
                    &format!("{p}.attn.sdpa"),
                );
                let o = self.linear(a, hidden, qw, &format!("{p}.attn.o_proj"));
                self.add(
                    Op::Binary(BinaryOp::Add),
                    &[x, o],
                    &format!("{p}.attn.residual"),
                )
            }
            Block::Mlp {
                inter,
                gelu,
                post_norm,
            } => {
                let h = self.norm(x, hidden);
                let g = self.linear(h, inter, hidden, &format!("{p}.mlp.gate_proj"));
                let u = self.linear(h, inter, hidden, &format!("{p}.mlp.up_proj"));
                let act = if gelu {
                    UnaryOp::GeluTanh
                } else {
                    UnaryOp::Silu
                };
                let s = self.add(Op::Unary(act), &[g], &format!("{p}.mlp.act"));
                let m = self.add(
                    Op::Binary(BinaryOp::Mul),
                    &[s, u],
                    &format!("{p}.mlp.gate_mul"),
                );
                let mut d = self.linear(m, hidden, inter, &format!("{p}.mlp.down_proj"));
                if post_norm {
                    d = self.norm(d, hidden);
                }
                self.add(
                    Op::Binary(BinaryOp::Add),
                    &[x, d],
                    &format!("{p}.mlp.residual"),
                )
            }
            Block::Diamond { bias } => {
                let mut a = self.linear(x, hidden, hidden, &format!("{p}.a"));
                let mut b = self.linear(x, hidden, hidden, &format!("{p}.b"));
                if bias {
                    let (ba, bb) = (
                        self.weight(&[hidden], 0.5, 0.0),
                        self.weight(&[hidden], 0.5, 0.0),
                    );
                    a = self.add(Op::AddBias, &[a, ba], &format!("{p}.a.bias"));
                    b = self.add(Op::AddBias, &[b, bb], &format!("{p}.b.bias"));
                }
                self.add(Op::Binary(BinaryOp::Add), &[a, b], &format!("{p}.sum"))
            }
        }
    }
}

/// A random model: embedding, blocks, final norm, LM head.
fn build(blocks: &[Block], hidden: u64, vocab: u64, seed: u64) -> (Graph, Tensors) {
    let mut b = Builder {
        g: Graph::new("random"),
        tensors: Tensors::default(),
        seed,
        next: 0,
    };
    let ids = b.add(Op::Input(gerbil_ir::Input::TokenIds), &[], "input_ids");
    let table = b.weight(&[vocab, hidden], 1.0, 0.0);
    let mut x = b.add(
        Op::Embedding(Embedding {
            scale: None,
            padding: None,
        }),
        &[table, ids],
        "embed",
    );
    let mut tables = HashMap::new();
    for (i, &blk) in blocks.iter().enumerate() {
        x = b.block(blk, x, hidden, i as u32, &mut tables);
    }
    let h = b.norm(x, hidden);
    let logits = b.linear(h, vocab, hidden, "lm_head");
    b.g.outputs.push((gerbil_ir::LOGITS.into(), logits));
    (b.g, b.tensors)
}

/// KV-cache capacity of the random graphs' runs.
const MAX_CONTEXT: u64 = 32;

/// `graph` after the default pipeline without the passes in `disabled`.
fn optimized(graph: &Graph, disabled: &[&str]) -> Graph {
    let mut g = graph.clone();
    let mut pm = PassManager::new(default_pipeline());
    for d in disabled {
        pm.disable(d).expect("pass name");
    }
    pm.run(&mut g, |_, _| {})
        .unwrap_or_else(|e| panic!("passes (disabled {disabled:?}): {e}"));
    g
}

/// The CPU interpreter's logits (each step's last row, as the runtime reads
/// them back) of `graph` over consecutive `steps`.
fn interpret(graph: &Graph, tensors: &Tensors, steps: &[&[u32]]) -> Vec<Vec<f64>> {
    let mut it = Interpreter::new(graph, &interpreter_weights(tensors), MAX_CONTEXT as usize)
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    steps
        .iter()
        .map(|s| {
            let outputs = it.step(s).unwrap_or_else(|e| panic!("interpreter: {e}"));
            outputs[0].last_row().to_vec()
        })
        .collect()
}

/// The passes disabled in each variant: each pass alone, then all of them.
fn variants() -> Vec<Vec<&'static str>> {
    let names = PassManager::new(default_pipeline()).names();
    let mut variants: Vec<Vec<&str>> = names.iter().map(|n| vec![*n]).collect();
    variants.push(names.clone());
    variants
}

/// Runs the passes except `disabled`, builds and loads the plan, and returns
/// the logits of a prefill of `prompt` followed by decode steps of `decode`.
fn run(
    graph: &Graph,
    tensors: &Tensors,
    vocab: u64,
    hidden: u64,
    disabled: &[&str],
    prompt: &[u32],
    decode: &[u32],
) -> Vec<Vec<f32>> {
    let g = optimized(graph, disabled);
    let model = ModelInfo {
        architecture: "Random".into(),
        family: "random".into(),
        name: "random".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers: 0,
        max_context: 0,
        max_tokens_per_step: 0,
        config: serde_json::Value::Null,
        embedding: None,
    };
    let codegen = CodegenOptions {
        max_context: MAX_CONTEXT,
        max_tokens_per_step: 8,
        ..CodegenOptions::default()
    };
    let text = TextAssets::default();
    let built = build_plan(
        &g,
        tensors,
        model,
        &text,
        CompileInfo::default(),
        &codegen,
        WeightOptions::default(),
    )
    .unwrap_or_else(|e| panic!("build (disabled {disabled:?}): {e:#}"));
    let dir = temp_dir("passes");
    let path = dir.path().join("random.plan");
    built.write(&path).expect("write plan");
    let plan = PlanFile::open(&path).expect("open plan");
    let _gpu = gpu_lock();
    let mut session = block_on(Session::new(&plan)).expect("session");
    let mut out = vec![block_on(session.forward(prompt)).expect("prefill")];
    for &t in decode {
        out.push(block_on(session.forward(&[t])).expect("decode"));
    }
    out
}

fn block_strategy() -> impl Strategy<Value = Block> {
    prop_oneof![
        (
            1u32..4,
            prop::sample::select(vec![1u32, 2]),
            prop::sample::select(vec![6u32, 8, 10, 16]),
            prop::sample::select(vec![0u32, 3])
        )
            .prop_map(|(kv, group, head_dim, window)| Block::Attention {
                heads: kv * group,
                kv_heads: kv,
                head_dim,
                window
            }),
        (
            prop::sample::select(vec![17u64, 40, 63]),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(inter, gelu, post_norm)| Block::Mlp {
                inter,
                gelu,
                post_norm
            }),
        any::<bool>().prop_map(|bias| Block::Diamond { bias }),
    ]
}

proptest! {
    #![proptest_config(proptest_config(6, 16))]

    #[test]
    fn every_pass_preserves_results(
        blocks in prop::collection::vec(block_strategy(), 1..4),
        hidden in prop::sample::select(vec![12u64, 24, 31, 48]),
        vocab in prop::sample::select(vec![33u64, 64]),
        seed in any::<u64>(),
        prompt_len in 1usize..7,
    ) {
        let (graph, tensors) = build(&blocks, hidden, vocab, seed);
        let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7 + 3) % vocab as u32).collect();
        let decode = [5u32 % vocab as u32, 11 % vocab as u32];
        let reference = run(&graph, &tensors, vocab, hidden, &[], &prompt, &decode);
        let steps: Vec<&[u32]> = [&prompt[..], &decode[..1], &decode[1..]].into();
        let cpu = interpret(&graph, &tensors, &steps);
        for (step, (a, b)) in reference.iter().zip(&cpu).enumerate() {
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                let tol = 1e-3 * y.abs().max(1.0);
                prop_assert!((f64::from(x) - y).abs() <= tol, "GPU vs interpreter: step {} logit {} = {} vs {} (blocks {:?})", step, i, x, y, blocks);
            }
        }
        for disabled in variants() {
            let got = run(&graph, &tensors, vocab, hidden, &disabled, &prompt, &decode);
            for (step, (a, b)) in got.iter().zip(&reference).enumerate() {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let tol = 1e-4 * y.abs().max(1.0);
                    prop_assert!((x - y).abs() <= tol, "disabled {:?}: step {} logit {} = {} vs {} (blocks {:?})", disabled, step, i, x, y, blocks);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(proptest_config(96, 32))]

    /// The same graphs without a GPU: the interpreter runs each optimized
    /// graph and the graph as built; a prefill split in two chunks (the
    /// second at `P > 0`) and two decode steps give the same logits.
    #[test]
    fn every_pass_preserves_interpreted_results(
        blocks in prop::collection::vec(block_strategy(), 1..4),
        hidden in prop::sample::select(vec![12u64, 24, 31, 48]),
        vocab in prop::sample::select(vec![33u64, 64]),
        seed in any::<u64>(),
        prompt_len in 1usize..9,
        split in 0usize..9,
    ) {
        let (graph, tensors) = build(&blocks, hidden, vocab, seed);
        let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7 + 3) % vocab as u32).collect();
        let (first, second) = prompt.split_at(split.clamp(1, prompt_len));
        let decode = [5u32 % vocab as u32, 11 % vocab as u32];
        let mut steps: Vec<&[u32]> = vec![first];
        if !second.is_empty() {
            steps.push(second);
        }
        steps.extend([&decode[..1], &decode[1..]]);
        let reference = interpret(&graph, &tensors, &steps);
        let mut all = variants();
        all.push(Vec::new());
        for disabled in all {
            let got = interpret(&optimized(&graph, &disabled), &tensors, &steps);
            for (step, (a, b)) in got.iter().zip(&reference).enumerate() {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let tol = 1e-10 * y.abs().max(1.0);
                    prop_assert!((x - y).abs() <= tol, "disabled {:?}: step {} logit {} = {} vs {} (blocks {:?})", disabled, step, i, x, y, blocks);
                }
            }
        }
    }
}
