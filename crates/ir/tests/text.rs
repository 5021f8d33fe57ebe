//! The text form: every op and attribute prints losslessly and parses back,
//! odd labels get stable names, and bad input is a located, explained error.

use gerbil_ir::op::KvKind;
use gerbil_ir::print::print;
use gerbil_ir::{
    parse, Attention, BinaryOp, DType, Dim, Embedding, Graph, Input, MatMul, MatMulGlu,
    NormPrologue, Op, QkNorm, QkvRope, RmsNorm, Rope, Sym, TensorType, UnaryOp, ValueRef, Weight,
    WeightSource,
};

fn weight(g: &mut Graph, source: WeightSource, ty: TensorType, label: &str) -> ValueRef {
    g.add(Op::Weight(Weight { source, ty }), &[], label)
        .unwrap()
}

fn ckpt(name: &str) -> WeightSource {
    WeightSource::Checkpoint {
        tensor: name.into(),
    }
}

fn norm(eps: f32, weight_offset: f32, groups: u32) -> RmsNorm {
    RmsNorm {
        eps,
        weight_offset,
        groups,
    }
}

fn port(v: ValueRef, port: u32) -> ValueRef {
    ValueRef { node: v.node, port }
}

/// A graph with every op, every optional attribute, duplicate, empty and
/// quoted labels, multi-output reads, floats that need all their digits, and
/// dead nodes.
fn every_op() -> Graph {
    let mut g = Graph::new("tiny-llama");
    let f = |dims: &[u64]| TensorType::fixed(DType::F32, dims);
    let ids = g.add(Op::Input(Input::TokenIds), &[], "input_ids").unwrap();
    let table = weight(&mut g, ckpt("embed"), f(&[32, 16]), "embed.weight");
    let w16 = weight(
        &mut g,
        ckpt("w16"),
        TensorType::fixed(DType::BF16, &[16]),
        "",
    );
    let w8 = weight(&mut g, ckpt("we\"ird\\name\n"), f(&[8]), "");
    let b16 = weight(
        &mut g,
        ckpt("b16"),
        TensorType::fixed(DType::F16, &[16]),
        "a b",
    );
    let x = g
        .add(
            Op::Embedding(Embedding {
                scale: Some(4.0),
                padding: Some(3),
            }),
            &[table, ids],
            "embed",
        )
        .unwrap();
    let n = g
        .add(Op::RmsNorm(norm(1e-5, 1.0, 1)), &[x, w16], "dup")
        .unwrap();
    let wqkv = weight(
        &mut g,
        WeightSource::Concat {
            tensors: vec!["q".into(), "k".into(), "v".into()],
        },
        f(&[32, 16]),
        "x~1",
    );
    let qkv = g
        .add(Op::MatMul(MatMul::linear(false)), &[n, wqkv], "qkv")
        .unwrap();
    let slice = |g: &mut Graph, start, len, label: &str| {
        g.add(Op::SliceCols { start, len }, &[qkv], label).unwrap()
    };
    let q = slice(&mut g, 0, 16, "größe");
    let k = slice(&mut g, 16, 8, "#hash");
    let v = slice(&mut g, 24, 8, "layers.0.v");
    let q = g
        .add(
            Op::RmsNorm(norm(1.1920929e-7, 0.0, 2)),
            &[q, w8],
            "layers.0.q_norm",
        )
        .unwrap();
    let rope_table = WeightSource::RopeTable {
        inv_freq: vec![1.0, 1e-45, 0.1, -0.0],
        attention_scaling: 1.234_567_9,
    };
    let lmax8 = TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(8)]);
    let rt = weight(&mut g, rope_table, lmax8, "rope_table");
    let rope = |heads| {
        Op::Rope(Rope {
            n_heads: heads,
            head_dim: 8,
            rotary_dim: 8,
        })
    };
    let qr = g.add(rope(2), &[q, rt], "layers.0.q_rope").unwrap();
    let kr = g.add(rope(1), &[k, rt], "layers.0.k_rope").unwrap();
    let cache = |g: &mut Graph, layer, kind| {
        g.add(
            Op::KvCache {
                layer,
                kind,
                width: 8,
            },
            &[],
            format!("layers.{layer}.cache"),
        )
        .unwrap()
    };
    let (kc, vc) = (cache(&mut g, 0, KvKind::K), cache(&mut g, 0, KvKind::V));
    let kw = g.add(Op::CacheWrite, &[kc, kr], "").unwrap();
    let vw = g.add(Op::CacheWrite, &[vc, v], "").unwrap();
    let attn = |window| {
        Op::Attention(Attention {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 8,
            scale: 0.353_553_38,
            window,
            causal: true,
        })
    };
    let a0 = g
        .add(attn(Some(4)), &[qr, kw, vw], "layers.0.sdpa")
        .unwrap();
    let qkv_rope = |qk_norm| {
        Op::QkvRope(QkvRope {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 8,
            rotary_dim: 6,
            qk_norm,
        })
    };
    let rt6 = TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(6)]);
    let rt6 = weight(
        &mut g,
        WeightSource::RopeTable {
            inv_freq: vec![1.0, 0.5, 0.25],
            attention_scaling: 1.0,
        },
        rt6,
        "rope_table",
    );
    let (kc1, vc1) = (cache(&mut g, 1, KvKind::K), cache(&mut g, 1, KvKind::V));
    let qn = QkNorm {
        eps: 1e-6,
        weight_offset: 1.0,
    };
    let f1 = g
        .add(
            qkv_rope(Some(qn)),
            &[qkv, rt6, kc1, vc1, w8, w8],
            "layers.1.qkv_rope",
        )
        .unwrap();
    let a1 = g
        .add(attn(None), &[f1, port(f1, 1), port(f1, 2)], "layers.1.sdpa")
        .unwrap();
    let (kc2, vc2) = (cache(&mut g, 2, KvKind::K), cache(&mut g, 2, KvKind::V));
    let f2 = g
        .add(qkv_rope(None), &[qkv, rt6, kc2, vc2], "layers.2.qkv_rope")
        .unwrap();
    let a2 = g
        .add(attn(None), &[f2, port(f2, 1), port(f2, 2)], "layers.2.sdpa")
        .unwrap();
    let wo = weight(
        &mut g,
        WeightSource::Rows {
            tensor: "o".into(),
            start: 16,
            count: 16,
        },
        f(&[16, 16]),
        "o.weight[16..32]",
    );
    let mm = |bias| Op::MatMul(MatMul::linear(bias));
    let o0 = g.add(mm(true), &[a0, wo, b16], "dup").unwrap();
    // Matmuls with a norm prologue and a residual epilogue (read by nothing).
    let prologue = |weight_offset| NormPrologue {
        eps: 1e-5,
        weight_offset,
    };
    let fused = |has_bias, norm, residual| {
        Op::MatMul(MatMul {
            has_bias,
            norm,
            last_row: false,
            residual,
            act: None,
        })
    };
    g.add(
        fused(true, Some(prologue(1.0)), true),
        &[a0, wo, b16, w16, o0],
        "fused",
    )
    .unwrap();
    g.add(fused(false, None, true), &[a0, wo, o0], "fused")
        .unwrap();
    // Activation epilogues (BERT's `gelu(x·W₁ + b₁)`), one with a residual.
    for (act, residual) in [(UnaryOp::Gelu, false), (UnaryOp::Silu, true)] {
        let op = Op::MatMul(MatMul {
            act: Some(act),
            residual,
            ..MatMul::linear(true)
        });
        let ins: &[_] = if residual {
            &[a0, wo, b16, o0]
        } else {
            &[a0, wo, b16]
        };
        g.add(op, ins, "act").unwrap();
    }
    g.add(
        fused(false, Some(prologue(0.0)), false),
        &[a0, wo, w16],
        "fused",
    )
    .unwrap();
    // The LM head's form: the last row of `x`, normed.
    let last_row = MatMul {
        last_row: true,
        ..MatMul::linear(false)
    };
    g.add(
        Op::MatMul(MatMul {
            norm: Some(prologue(0.0)),
            ..last_row.clone()
        }),
        &[a0, wo, w16],
        "head",
    )
    .unwrap();
    g.add(Op::MatMul(last_row), &[a0, wo], "head").unwrap();
    let o1 = g.add(mm(false), &[a1, wo], "dup").unwrap();
    let o1 = g.add(Op::AddBias, &[o1, b16], "dup").unwrap();
    let s = g.add(Op::Binary(BinaryOp::Add), &[x, o0], "s").unwrap();
    let s = g.add(Op::Binary(BinaryOp::Mul), &[s, o1], "s").unwrap();
    let s = g.add(Op::Binary(BinaryOp::Add), &[s, a2], "s").unwrap();
    g.add(
        Op::RmsNormAdd(norm(1e-5, 1.0, 1)),
        &[s, w16, x],
        "post_norm",
    )
    .unwrap();
    let arn = g
        .add(Op::AddRmsNorm(norm(1e-6, 0.0, 1)), &[s, x, w16], "arn")
        .unwrap();
    let wgu = weight(&mut g, ckpt("gu"), f(&[64, 16]), "gu");
    let b64 = weight(&mut g, ckpt("b64"), f(&[64]), "b64");
    let glu = |act, has_bias| {
        Op::MatMulGlu(MatMulGlu {
            act,
            has_bias,
            norm: None,
        })
    };
    let h = port(arn, 1);
    let g1 = g
        .add(glu(UnaryOp::Silu, true), &[h, wgu, b64], "glu")
        .unwrap();
    let g2 = g
        .add(glu(UnaryOp::GeluTanh, false), &[h, wgu], "glu")
        .unwrap();
    let g3 = g
        .add(glu(UnaryOp::Softcap(30.0), true), &[h, wgu, b64], "glu")
        .unwrap();
    g.add(glu(UnaryOp::Softcap(0.1), false), &[h, wgu], "dead")
        .unwrap();
    let normed_glu = |act, has_bias| {
        Op::MatMulGlu(MatMulGlu {
            act,
            has_bias,
            norm: Some(prologue(1.0)),
        })
    };
    g.add(normed_glu(UnaryOp::Silu, true), &[s, wgu, b64, w16], "dead")
        .unwrap();
    g.add(
        normed_glu(UnaryOp::Softcap(2.0), false),
        &[s, wgu, w16],
        "dead",
    )
    .unwrap();
    let sum = g.add(Op::Binary(BinaryOp::Add), &[g1, g2], "").unwrap();
    let sum = g.add(Op::Binary(BinaryOp::Add), &[sum, g3], "").unwrap();
    let wd = weight(&mut g, ckpt("down"), f(&[16, 32]), "down");
    let d = g.add(mm(false), &[sum, wd], "down").unwrap();
    let d = g.add(Op::Unary(UnaryOp::Silu), &[d], "act").unwrap();
    let d = g.add(Op::Unary(UnaryOp::GeluTanh), &[d], "act").unwrap();
    let lr = g
        .add(
            Op::AddRmsNormLastRow(norm(1e-6, 1.0, 1)),
            &[arn, d, w16],
            "final",
        )
        .unwrap();
    let er = g
        .add(
            Op::EmbeddingRmsNorm(
                Embedding {
                    scale: None,
                    padding: None,
                },
                norm(3e-7, 0.0, 1),
            ),
            &[table, ids, w16],
            "embed+norm",
        )
        .unwrap();
    let last = g.add(Op::SliceLastRow, &[port(er, 1)], "last").unwrap();
    let sum = g
        .add(Op::Binary(BinaryOp::Add), &[port(lr, 1), last], "")
        .unwrap();
    let logits = g.add(mm(false), &[sum, table], "lm_head").unwrap();
    let capped = g
        .add(Op::Unary(UnaryOp::Softcap(f32::MAX)), &[logits], "softcap")
        .unwrap();
    // A LoRA branch: an adapter factor and the update's scale.
    let lora_name = "base_model.model.lm_head.lora_B.weight";
    let lora = WeightSource::Adapter {
        tensor: lora_name.into(),
    };
    let b = weight(&mut g, lora, f(&[32, 16]), lora_name);
    let update = g.add(mm(false), &[sum, b], "lm_head.lora_b").unwrap();
    let update = g
        .add(
            Op::Unary(UnaryOp::Scale(-1.5e-3)),
            &[update],
            "lm_head.lora_scale",
        )
        .unwrap();
    let capped = g
        .add(Op::Binary(BinaryOp::Add), &[capped, update], "lm_head.lora")
        .unwrap();
    g.outputs.push(("logits".into(), capped));
    g.outputs.push(("the stream".into(), port(lr, 0)));
    encoder_ops(&mut g, port(er, 0), (qr, kw, vw), (table, w16));
    g
}

/// The encoders' ops, on values of [`every_op`]: `x` `[T, 16]`, the
/// attention operands, the embedding table and a `[16]` weight.
fn encoder_ops(
    g: &mut Graph,
    x: ValueRef,
    (q, k, v): (ValueRef, ValueRef, ValueRef),
    (table, w16): (ValueRef, ValueRef),
) {
    let f = |dims: &[u64]| TensorType::fixed(DType::F32, dims);
    let positions = weight(g, ckpt("positions"), f(&[8, 16]), "positions");
    let types = WeightSource::Rows {
        tensor: "token_types".into(),
        start: 0,
        count: 1,
    };
    let type_row = weight(g, types, f(&[16]), "type row");
    let x = g.add(Op::AddPositions, &[x, positions], "pos").unwrap();
    let x = g.add(Op::AddBias, &[x, type_row], "type").unwrap();
    let ln = Op::LayerNorm(gerbil_ir::LayerNorm { eps: 1e-12 });
    let x = g.add(ln, &[x, w16, type_row], "ln").unwrap();
    let x = g.add(Op::Unary(UnaryOp::Gelu), &[x], "act").unwrap();
    let gelu_glu = Op::MatMulGlu(MatMulGlu {
        act: UnaryOp::Gelu,
        has_bias: false,
        norm: None,
    });
    g.add(gelu_glu, &[x, table], "dead").unwrap();
    let bidirectional = Op::Attention(Attention {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        scale: 0.25,
        window: None,
        causal: false,
    });
    g.add(bidirectional, &[q, k, v], "dead").unwrap();
    use gerbil_ir::Pooling;
    let mean = g.add(Op::Pool(Pooling::Mean), &[x], "mean").unwrap();
    for kind in [Pooling::Cls, Pooling::Max, Pooling::Last] {
        g.add(Op::Pool(kind), &[x], "dead").unwrap();
    }
    let e = g.add(Op::L2Normalize, &[mean], "normalize").unwrap();
    g.outputs.push((gerbil_ir::EMBEDDING.into(), e));
}

#[test]
fn every_op_and_attribute_round_trips() {
    let g = every_op();
    gerbil_ir::verify(&g).unwrap();
    let text = print(&g);
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&parsed), text);
    // Node by node, in printing order: same op (every attribute), types and
    // label, so nothing is lost even where the text would not show it.
    let order = |g: &Graph| gerbil_ir::print::print_order(g);
    let (a, b) = (order(&g), order(&parsed));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(g.node(*x), parsed.node(*y));
    }
    assert_eq!(parsed.name, "tiny-llama");
    let tables: Vec<Vec<u32>> = b
        .iter()
        .filter_map(|&id| match &parsed.node(id).op {
            Op::Weight(Weight {
                source: WeightSource::RopeTable { inv_freq, .. },
                ..
            }) => Some(inv_freq.iter().map(|x| x.to_bits()).collect()),
            _ => None,
        })
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(tables.contains(&bits(&[1.0, 1e-45, 0.1, -0.0])), "{text}");
}

#[test]
fn odd_labels_get_stable_unambiguous_names() {
    let text = print(&every_op());
    for expected in [
        "graph tiny-llama\n",
        "  %~0 = weight \"w16\" : bf16[16]\n",
        "  %~1 = weight \"we\\\"ird\\\\name\\n\" : f32[8]\n",
        "  %\"a b\" = weight \"b16\" : f16[16]\n",
        "  %\"x~1\" = weight concat[\"q\", \"k\", \"v\"] : f32[32,16]\n",
        "  %\"größe\" = slice_cols{cols=0..16}(%qkv) : f32[T,16]\n",
        "  %o.weight[16..32] = weight \"o\"[16..32] : f32[16,16]\n",
        "  %rope_table = weight rope_table(inv_freq=[1e0, 1e-45, 1e-1, -0e0], scaling=1.2345679) : f32[Lmax,8]\n",
        "  %rope_table~1 = weight rope_table(inv_freq=[1e0, 5e-1, 2.5e-1], scaling=1) : f32[Lmax,6]\n",
        "%dup~1 = matmul{bias}(%layers.0.sdpa, %o.weight[16..32], %\"a b\")",
        "(%layers.1.qkv_rope, %layers.1.qkv_rope#1, %layers.1.qkv_rope#2)",
        "qkv_rope{heads=2, kv_heads=1, head_dim=8, rotary_dim=6, qk_norm(eps=1e-6, offset=1)}",
        "matmul_glu{cap=30, bias}(%arn#1, %gu, %b64) : f32[T,32]",
        "  %dead = matmul_glu{cap=0.1}(%arn#1, %gu) : f32[T,32]\n",
        "matmul{bias, norm(eps=1e-5, offset=1), residual}(%layers.0.sdpa, %o.weight[16..32], %\"a b\", %~0, %dup~1)",
        "matmul{residual}(%layers.0.sdpa, %o.weight[16..32], %dup~1)",
        "matmul{norm(eps=1e-5, offset=0)}(%layers.0.sdpa, %o.weight[16..32], %~0)",
        "matmul_swiglu{bias, norm(eps=1e-5, offset=1)}(%s~2, %gu, %b64, %~0)",
        "matmul_glu{cap=2, norm(eps=1e-5, offset=1)}(%s~2, %gu, %~0)",
        "embedding_rms_norm{eps=3e-7, offset=0}(%embed.weight, %input_ids, %~0)",
        "softcap{cap=340282350000000000000000000000000000000}",
        "  output \"the stream\" = %final\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

/// `(text, line, column, part of the message)`.
const BAD: &[(&str, usize, usize, &str)] = &[
    ("", 1, 1, "expected a header `graph NAME`, found end of input"),
    ("// only a comment\n", 1, 1, "expected a header `graph NAME`"),
    ("%x = input.token_ids : u32[T]", 1, 1, "before the first value"),
    ("graf g", 1, 1, "expected a header `graph NAME`, found `graf`"),
    ("graph", 1, 6, "expected a graph name, found end of line"),
    ("graph g\ngraph h", 2, 1, "a second `graph` header"),
    ("graph g\n  frob", 2, 3, "expected a value line"),
    ("graph g\n  % = silu(%x) : f32[T]", 2, 3, "expected a value name after `%`"),
    ("graph g\n  %x input.token_ids : u32[T]", 2, 6, "expected `=`, found `input.token_ids`"),
    ("graph g\n  %x = : u32[T]", 2, 8, "expected an op name, found `:`"),
    ("graph g\n  %x = frobnicate : u32[T]", 2, 8, "unknown op `frobnicate`; ops are: input.token_ids"),
    ("graph g\n  %x = input.token_ids", 2, 23, "expected `:`, found end of line"),
    ("graph g\n  %x = input.token_ids : u33[T]", 2, 26, "expected a type such as f32[T,64]"),
    ("graph g\n  %x = input.token_ids : u32[Q]", 2, 30, "expected a dimension (an integer, T or Lmax), found `Q]`"),
    ("graph g\n  %x = input.token_ids : u32[T", 2, 31, "expected `,`, found end of line"),
    ("graph g\n  %x = input.token_ids : u32[4]", 2, 26, "declared type `u32[4]` differs from the type the op produces, `u32[T]`"),
    ("graph g\n  %x = input.token_ids : u32[T] junk", 2, 33, "expected end of line, found `junk`"),
    ("graph g\n  %x = input.token_ids : u32[T]\n  %x = input.token_ids : u32[T]", 3, 3, "`%x` is already defined on line 2"),
    ("graph g\n  %x#1 = input.token_ids : u32[T]", 2, 3, "names an output port"),
    ("graph g\n  %y = silu(%x) : f32[T,4]", 2, 13, "`%x` is not defined (a value must be defined before it is read)"),
    ("graph g\n  %x = input.token_ids : u32[T]\n  %y = silu(%x#2) : f32[T]", 3, 13, "`%x` has 1 output(s); `#2` does not exist"),
    ("graph g\n  %x = input.token_ids : u32[T]\n  %y = silu(%x) : f32[T]", 3, 8, "silu: input must be f32"),
    ("graph g\n  %x = input.token_ids : u32[T]\n  %y = silu(%x %x) : f32[T]", 3, 16, "expected `,`, found `%x)`"),
    ("graph g\n  %w = weight \"w\" : f32[4]\n  %y = rms_norm{offset=0}(%w, %w) : f32[4]", 3, 17, "expected attribute `eps=NUMBER`"),
    ("graph g\n  %w = weight \"w\" : f32[4]\n  %y = rms_norm{eps=x, offset=0}(%w, %w) : f32[4]", 3, 17, "expected a number, found `x`"),
    ("graph g\n  %x = input.token_ids{color=red} : u32[T]", 2, 24, "`input.token_ids` has no attribute `color`"),
    ("graph g\n  %w = weight \"w\" : f32[4]\n  %y = rms_norm{eps=1, eps=1, offset=0}(%w, %w) : f32[4]", 3, 24, "(or it is written twice)"),
    ("graph g\n  %w = weight \"w : f32[4]", 2, 15, "unterminated string"),
    ("graph g\n  %w = weight \"w\\q\" : f32[4]", 2, 18, "expected an escape"),
    ("graph g\n  %w = weight \"w\\u{zz}\" : f32[4]", 2, 18, "expected a unicode escape"),
    ("graph g\n  %w = weight tensor : f32[4]", 2, 15, "expected a weight source"),
    ("graph g\n  %w = weight \"w\" : f32[4], f32[4]", 2, 21, "expected one type, found 2"),
    ("graph g\n  %w = weight \"w\"[8..4] : f32[4]", 2, 19, "range 8..4 ends before it starts"),
    ("graph g\n  %w = weight \"w\"[8] : f32[4]", 2, 19, "expected a range `start..end`, found `8`"),
    ("graph g\n  %w = weight concat[\"a\" \"b\"] : f32[4]", 2, 26, "expected `,`"),
    ("graph g\n  %w = weight rope_table(scaling=1) : f32[Lmax,2]", 2, 26, "expected attribute `inv_freq=[…]`"),
    ("graph g\n  %c = kv_cache{layer=0, kind=Q} : f32[Lmax,4]", 2, 8, "expected kind=K or kind=V, found kind=Q"),
    ("graph g\n  %c = kv_cache{layer=-1, kind=K} : f32[Lmax,4]", 2, 17, "expected an unsigned integer, found `-1`"),
    ("graph g\n  %c = kv_cache{layer=0, kind=K} : f32[Lmax]", 2, 36, "expected a cache type f32[Lmax,WIDTH], found f32[Lmax]"),
    ("graph g\n  output logits = %nope", 2, 19, "`%nope` is not defined"),
    ("graph g\n  %w = weight \"w\" : f32[4,4]\n  %y = matmul{norm(eps=1)}(%w, %w, %w) : f32[4,4]", 3, 20, "expected attribute `offset=NUMBER`"),
    ("graph g\n  %w = weight \"w\" : f32[4,4]\n  %y = matmul{norm=1}(%w, %w) : f32[4,4]", 3, 15, "expected `norm(…)`"),
    ("graph g\n  %w = weight \"w\" : f32[4,4]\n  %y = matmul{norm(eps=1, offset=0, scale=2)}(%w, %w, %w) : f32[4,4]", 3, 37, "`norm` has no attribute `scale`"),
    (
        // Widths near u64::MAX: an error, not an overflow.
        "graph g\n  %w = weight \"w\" : f32[8,4]\n  %x = input.token_ids : u32[T]\n  %q = embedding(%w, %x) : f32[T,4]\n  %c = weight \"c\" : f32[Lmax,4]\n  %b = qkv_rope{heads=4294967295, kv_heads=4294967295, head_dim=4294967295, rotary_dim=2}(%q, %c, %c, %c) : f32[T,4]",
        6,
        8,
        "qkv_rope: qkv width 4 is not (4294967295 + 2·4294967295) heads × 4294967295",
    ),
    ("graph g\n  output = %x", 2, 10, "expected an output name, found `=`"),
];

#[test]
fn bad_text_is_a_located_explained_error() {
    let mut wrong = Vec::new();
    for &(text, line, column, message) in BAD {
        match parse(text) {
            Ok(g) => wrong.push(format!("{text:?} parsed as\n{}", print(&g))),
            Err(e) if e.line == line && e.column == column && e.message.contains(message) => {}
            Err(e) => wrong.push(format!(
                "{text:?}:\n  got      {e}\n  expected line {line}, column {column}: …{message}…"
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn comments_and_blank_lines_are_ignored() {
    let text = "// IR as lowered\n\ngraph g // a model\n  %ids = input.token_ids : u32[T]   // the prompt\n\n  output ids = %ids\n";
    let g = parse(text).unwrap();
    assert_eq!(
        print(&g),
        "graph g\n  %ids = input.token_ids : u32[T]\n  output ids = %ids\n"
    );
}
