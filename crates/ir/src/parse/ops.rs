//! Op syntax: attribute lists (`{eps=1e-6, offset=0}`, flags, nested
//! groups, lists), weight sources, and building an [`Op`] from them once
//! the declared types are known (a weight's type and a cache's width come
//! from its declared type).
//!
//! An attribute an op does not take, or one written twice, is an error at
//! its column; a missing one points at the attribute list.

use super::cursor::{parse_f32, parse_int, parse_range, Cursor};
use super::ParseError;
use crate::op::{
    Attention, BinaryOp, Embedding, Input, KvKind, LayerNorm, MatMul, MatMulGlu, NormPrologue, Op,
    Pooling, QkNorm, QkvRope, RmsNorm, Rope, UnaryOp, Weight, WeightSource,
};
use crate::train::TrainOp;
use crate::types::TensorType;

/// One attribute value as written.
#[derive(Clone, Debug)]
pub(super) enum AttrValue {
    /// A bare key (`bias`).
    Flag,
    /// A number or word (`1e-6`, `K`).
    Scalar(String),
    /// `[a, b, …]`.
    List(Vec<String>),
    /// `key(k=v, …)`.
    Group(Attrs),
}

/// Attributes `key=value` of an op, consumed by the op builders.
#[derive(Clone, Debug)]
pub(super) struct Attrs {
    /// Column of the attribute list (for a missing attribute).
    at: usize,
    items: Vec<(String, usize, AttrValue)>,
}

/// What is between `=` and the operands, before the types are known.
pub(super) enum OpSyntax {
    /// `weight SOURCE`.
    Weight(WeightSource),
    /// `mnemonic{attrs}`.
    Op(String, usize, Attrs),
}

impl OpSyntax {
    pub(super) fn parse(cur: &mut Cursor) -> Result<Self, ParseError> {
        let col = cur.col();
        let mnemonic = cur.ident();
        if mnemonic.is_empty() {
            return Err(cur.err_at(col, cur.expected_msg("an op name")));
        }
        if mnemonic == "weight" {
            return Ok(OpSyntax::Weight(weight_source(cur)?));
        }
        let attrs = if cur.eat('{') {
            attrs(cur, '}')?
        } else {
            Attrs {
                at: col,
                items: Vec::new(),
            }
        };
        Ok(OpSyntax::Op(mnemonic, col, attrs))
    }

    /// The op, given the declared output types (the shape of weights and caches).
    pub(super) fn build(
        self,
        cur: &Cursor,
        tys: &[TensorType],
        ty_col: usize,
    ) -> Result<Op, ParseError> {
        let one_type = || match tys {
            [t] => Ok(t.clone()),
            _ => Err(cur.err_at(ty_col, format!("expected one type, found {}", tys.len()))),
        };
        let (mnemonic, col, mut a) = match self {
            OpSyntax::Weight(source) => {
                return Ok(Op::Weight(Weight {
                    source,
                    ty: one_type()?,
                }))
            }
            OpSyntax::Op(m, col, a) => (m, col, a),
        };
        if let Some(t) = TrainOp::plain(&mnemonic) {
            a.finish(cur, &mnemonic)?;
            return Ok(Op::Train(t));
        }
        // `X_grad` is the backward of `X`, with `X`'s attributes (and an
        // embedding table's `rows`); `attention_lse` is attention's too.
        let suffix = ["_grad", "_lse"]
            .into_iter()
            .find(|s| mnemonic.ends_with(s));
        let forward = suffix.map(|s| &mnemonic[..mnemonic.len() - s.len()]);
        let rows = match forward {
            Some("embedding") => {
                let (s, at) = a
                    .opt_scalar(cur, "rows")?
                    .ok_or_else(|| cur.err_at(a.at, "expected attribute `rows=INTEGER`".into()))?;
                Some(parse_int::<u64>(cur, &s, at)?)
            }
            _ => None,
        };
        let norm = |a: &mut Attrs| -> Result<RmsNorm, ParseError> {
            Ok(RmsNorm {
                eps: a.f32(cur, "eps")?,
                weight_offset: a.f32(cur, "offset")?,
                groups: a.opt_u32(cur, "groups")?.unwrap_or(1),
            })
        };
        // `norm(eps=…, offset=…)` of the matmuls.
        let norm_prologue = |a: &mut Attrs| -> Result<Option<NormPrologue>, ParseError> {
            let Some(mut g) = a.group(cur, "norm")? else {
                return Ok(None);
            };
            let n = NormPrologue {
                eps: g.f32(cur, "eps")?,
                weight_offset: g.f32(cur, "offset")?,
            };
            g.finish(cur, "norm")?;
            Ok(Some(n))
        };
        let op = match forward.unwrap_or(&mnemonic) {
            "input.token_ids" => Op::Input(Input::TokenIds),
            "input.target_ids" => Op::Input(Input::TargetIds),
            "kv_cache" => {
                let layer = a.u32(cur, "layer")?;
                let kind = match a.scalar(cur, "kind")?.as_str() {
                    "K" => KvKind::K,
                    "V" => KvKind::V,
                    other => {
                        return Err(cur.err_at(
                            col,
                            format!("expected kind=K or kind=V, found kind={other}"),
                        ))
                    }
                };
                let ty = one_type()?;
                let Some(width) = ty.last_const() else {
                    return Err(cur.err_at(
                        ty_col,
                        format!("expected a cache type f32[Lmax,WIDTH], found {ty}"),
                    ));
                };
                Op::KvCache { layer, kind, width }
            }
            "embedding" => Op::Embedding(Embedding {
                scale: a.opt_f32(cur, "scale")?,
                padding: a.opt_u32(cur, "padding")?,
            }),
            "embedding_rms_norm" => {
                let n = norm(&mut a)?;
                let scale = a.opt_f32(cur, "scale")?;
                let padding = a.opt_u32(cur, "padding")?;
                Op::EmbeddingRmsNorm(Embedding { scale, padding }, n)
            }
            "rms_norm" => Op::RmsNorm(norm(&mut a)?),
            "add_rms_norm" => Op::AddRmsNorm(norm(&mut a)?),
            "rms_norm_add" => Op::RmsNormAdd(norm(&mut a)?),
            "add_rms_norm_last_row" => Op::AddRmsNormLastRow(norm(&mut a)?),
            "matmul" => Op::MatMul(MatMul {
                has_bias: a.flag("bias"),
                norm: norm_prologue(&mut a)?,
                last_row: a.flag("last_row"),
                residual: a.flag("residual"),
                act: match a.opt_scalar(cur, "act")? {
                    None => None,
                    Some((act, _)) if act == "silu" => Some(UnaryOp::Silu),
                    Some((act, _)) if act == "gelu" => Some(UnaryOp::Gelu),
                    Some((act, _)) if act == "gelu_tanh" => Some(UnaryOp::GeluTanh),
                    Some((act, col)) => {
                        return Err(cur.err_at(
                            col,
                            format!(
                                "expected act=silu, act=gelu or act=gelu_tanh, found act={act}"
                            ),
                        ))
                    }
                },
            }),
            "matmul_swiglu" | "matmul_geglu" | "matmul_glu" => {
                let act = match mnemonic.as_str() {
                    "matmul_swiglu" => UnaryOp::Silu,
                    "matmul_geglu" => UnaryOp::GeluTanh,
                    _ => match a.opt_scalar(cur, "act")? {
                        Some((act, _)) if act == "gelu" => UnaryOp::Gelu,
                        Some((act, col)) => {
                            return Err(
                                cur.err_at(col, format!("expected act=gelu, found act={act}"))
                            )
                        }
                        None => UnaryOp::Softcap(a.f32(cur, "cap")?),
                    },
                };
                Op::MatMulGlu(MatMulGlu {
                    act,
                    has_bias: a.flag("bias"),
                    norm: norm_prologue(&mut a)?,
                })
            }
            "rope" => Op::Rope(Rope {
                n_heads: a.u32(cur, "heads")?,
                head_dim: a.u32(cur, "head_dim")?,
                rotary_dim: a.u32(cur, "rotary_dim")?,
            }),
            "cache_write" => Op::CacheWrite,
            "attention" => Op::Attention(Attention {
                n_heads: a.u32(cur, "heads")?,
                n_kv_heads: a.u32(cur, "kv_heads")?,
                head_dim: a.u32(cur, "head_dim")?,
                scale: a.f32(cur, "scale")?,
                window: a.opt_u32(cur, "window")?,
                causal: !a.flag("bidirectional"),
            }),
            "silu" => Op::Unary(UnaryOp::Silu),
            "gelu_tanh" => Op::Unary(UnaryOp::GeluTanh),
            "gelu" => Op::Unary(UnaryOp::Gelu),
            "layer_norm" => Op::LayerNorm(LayerNorm {
                eps: a.f32(cur, "eps")?,
            }),
            "add_positions" => Op::AddPositions,
            "l2_normalize" => Op::L2Normalize,
            "pool" => {
                let kinds = [Pooling::Mean, Pooling::Cls, Pooling::Max, Pooling::Last];
                match kinds.into_iter().find(|k| a.flag(k.name())) {
                    Some(k) => Op::Pool(k),
                    None => {
                        return Err(cur.err_at(
                            col,
                            "expected pool{mean}, pool{cls}, pool{max} or pool{last}".into(),
                        ))
                    }
                }
            }
            "softcap" => Op::Unary(UnaryOp::Softcap(a.f32(cur, "cap")?)),
            "scale" => Op::Unary(UnaryOp::Scale(a.f32(cur, "by")?)),
            "add" => Op::Binary(BinaryOp::Add),
            "mul" => Op::Binary(BinaryOp::Mul),
            "add_bias" => Op::AddBias,
            "slice_last_row" => Op::SliceLastRow,
            "sample_token" => Op::SampleToken,
            "slice_cols" => {
                let (start, end) = a.range(cur, "cols")?;
                Op::SliceCols {
                    start,
                    len: end - start,
                }
            }
            "qkv_rope" => {
                let mut r = QkvRope {
                    n_heads: a.u32(cur, "heads")?,
                    n_kv_heads: a.u32(cur, "kv_heads")?,
                    head_dim: a.u32(cur, "head_dim")?,
                    rotary_dim: a.u32(cur, "rotary_dim")?,
                    qk_norm: None,
                };
                if let Some(mut g) = a.group(cur, "qk_norm")? {
                    r.qk_norm = Some(QkNorm {
                        eps: g.f32(cur, "eps")?,
                        weight_offset: g.f32(cur, "offset")?,
                    });
                    g.finish(cur, "qk_norm")?;
                }
                Op::QkvRope(r)
            }
            _ => {
                return Err(cur.err_at(
                    col,
                    format!("unknown op `{mnemonic}`; ops are: {}", OP_NAMES.join(", ")),
                ))
            }
        };
        a.finish(cur, &mnemonic)?;
        match forward {
            None => Ok(op),
            Some(_) => TrainOp::of_forward(&suffix.unwrap_or_default()[1..], op, rows)
                .map(Op::Train)
                .ok_or_else(|| cur.err_at(col, format!("`{mnemonic}` has no backward op"))),
        }
    }
}

/// Every op mnemonic the parser knows, for the unknown-op message.
const OP_NAMES: &[&str] = &[
    "input.token_ids",
    "weight",
    "kv_cache",
    "embedding",
    "embedding_rms_norm",
    "rms_norm",
    "add_rms_norm",
    "add_rms_norm_last_row",
    "matmul",
    "matmul_swiglu",
    "matmul_geglu",
    "matmul_glu",
    "rope",
    "cache_write",
    "attention",
    "silu",
    "gelu_tanh",
    "gelu",
    "layer_norm",
    "add_positions",
    "pool",
    "l2_normalize",
    "softcap",
    "scale",
    "add",
    "mul",
    "add_bias",
    "slice_last_row",
    "slice_cols",
    "qkv_rope",
    "input.target_ids",
    "cross_entropy",
    "cross_entropy_grad",
    "matmul_grad_x",
    "matmul_grad_w",
    "sum_rows",
    "cache_rows",
    "attention_lse",
    "X_grad (the backward of X: rms_norm, rope, attention, silu, gelu_tanh, gelu, softcap, scale, embedding)",
];

/// `"tensor"`, `"tensor"[a..b]`, `concat["a", "b"]`, `adapter("tensor")` or
/// `rope_table(inv_freq=[…], scaling=s)`.
fn weight_source(cur: &mut Cursor) -> Result<WeightSource, ParseError> {
    cur.skip_ws();
    if cur.peek() == Some('"') {
        let tensor = cur.string()?;
        if !cur.eat('[') {
            return Ok(WeightSource::Checkpoint { tensor });
        }
        let col = cur.col();
        let text = cur.scalar_text();
        let (start, end) = parse_range(cur, &text, col)?;
        cur.expect(']')?;
        return Ok(WeightSource::Rows {
            tensor,
            start,
            count: end - start,
        });
    }
    let col = cur.col();
    match cur.ident().as_str() {
        "concat" => {
            cur.expect('[')?;
            let mut tensors = Vec::new();
            loop {
                cur.skip_ws();
                tensors.push(cur.string()?);
                cur.skip_ws();
                if cur.eat(']') {
                    return Ok(WeightSource::Concat { tensors });
                }
                cur.expect(',')?;
            }
        }
        "adapter" => {
            cur.expect('(')?;
            cur.skip_ws();
            let tensor = cur.string()?;
            cur.skip_ws();
            cur.expect(')')?;
            Ok(WeightSource::Adapter { tensor })
        }
        "rope_table" => {
            cur.expect('(')?;
            let mut a = attrs(cur, ')')?;
            let inv_freq = a
                .list(cur, "inv_freq")?
                .iter()
                .map(|(s, col)| parse_f32(cur, s, *col))
                .collect::<Result<_, _>>()?;
            let attention_scaling = a.f32(cur, "scaling")?;
            a.finish(cur, "rope_table")?;
            Ok(WeightSource::RopeTable {
                inv_freq,
                attention_scaling,
            })
        }
        _ => Err(cur.err_at(
            col,
            "expected a weight source: \"tensor\", \"tensor\"[a..b], concat[…], adapter(…) or \
             rope_table(…)"
                .into(),
        )),
    }
}

impl Attrs {
    fn take(&mut self, key: &str) -> Option<(usize, AttrValue)> {
        let i = self.items.iter().position(|(k, _, _)| k == key)?;
        let (_, col, v) = self.items.remove(i);
        Some((col, v))
    }

    fn opt_scalar(
        &mut self,
        cur: &Cursor,
        key: &str,
    ) -> Result<Option<(String, usize)>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some((col, AttrValue::Scalar(s))) => Ok(Some((s, col))),
            Some((col, _)) => Err(cur.err_at(col, format!("expected `{key}=VALUE`"))),
        }
    }

    fn scalar(&mut self, cur: &Cursor, key: &str) -> Result<String, ParseError> {
        self.opt_scalar(cur, key)?
            .map(|(s, _)| s)
            .ok_or_else(|| cur.err_at(self.at, format!("expected attribute `{key}=…`")))
    }

    fn opt_f32(&mut self, cur: &Cursor, key: &str) -> Result<Option<f32>, ParseError> {
        self.opt_scalar(cur, key)?
            .map(|(s, col)| parse_f32(cur, &s, col))
            .transpose()
    }

    fn f32(&mut self, cur: &Cursor, key: &str) -> Result<f32, ParseError> {
        self.opt_f32(cur, key)?
            .ok_or_else(|| cur.err_at(self.at, format!("expected attribute `{key}=NUMBER`")))
    }

    fn opt_u32(&mut self, cur: &Cursor, key: &str) -> Result<Option<u32>, ParseError> {
        self.opt_scalar(cur, key)?
            .map(|(s, col)| parse_int(cur, &s, col))
            .transpose()
    }

    fn u32(&mut self, cur: &Cursor, key: &str) -> Result<u32, ParseError> {
        self.opt_u32(cur, key)?
            .ok_or_else(|| cur.err_at(self.at, format!("expected attribute `{key}=INTEGER`")))
    }

    fn range(&mut self, cur: &Cursor, key: &str) -> Result<(u64, u64), ParseError> {
        let (s, col) = self
            .opt_scalar(cur, key)?
            .ok_or_else(|| cur.err_at(self.at, format!("expected attribute `{key}=START..END`")))?;
        parse_range(cur, &s, col)
    }

    fn list(&mut self, cur: &Cursor, key: &str) -> Result<Vec<(String, usize)>, ParseError> {
        match self.take(key) {
            Some((col, AttrValue::List(items))) => {
                Ok(items.into_iter().map(|s| (s, col)).collect())
            }
            Some((col, _)) => Err(cur.err_at(col, format!("expected `{key}=[…]`"))),
            None => Err(cur.err_at(self.at, format!("expected attribute `{key}=[…]`"))),
        }
    }

    fn group(&mut self, cur: &Cursor, key: &str) -> Result<Option<Attrs>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some((_, AttrValue::Group(g))) => Ok(Some(g)),
            Some((col, _)) => Err(cur.err_at(col, format!("expected `{key}(…)`"))),
        }
    }

    fn flag(&mut self, key: &str) -> bool {
        let i = self
            .items
            .iter()
            .position(|(k, _, v)| k == key && matches!(v, AttrValue::Flag));
        i.map(|i| self.items.remove(i)).is_some()
    }

    /// Fails on any attribute no builder took.
    fn finish(self, cur: &Cursor, op: &str) -> Result<(), ParseError> {
        match self.items.first() {
            None => Ok(()),
            Some((k, col, _)) => Err(cur.err_at(
                *col,
                format!("`{op}` has no attribute `{k}` (or it is written twice)"),
            )),
        }
    }
}

/// `key=value, flag, key(…), key=[…]` up to and including `close`.
pub(super) fn attrs(cur: &mut Cursor, close: char) -> Result<Attrs, ParseError> {
    let mut out = Attrs {
        at: cur.col(),
        items: Vec::new(),
    };
    if cur.eat(close) {
        return Ok(out);
    }
    loop {
        cur.skip_ws();
        let col = cur.col();
        let key = cur.ident();
        if key.is_empty() {
            return Err(cur.err_here(cur.expected_msg("an attribute name")));
        }
        let value = if cur.eat('=') {
            if cur.eat('[') {
                let mut items = Vec::new();
                if !cur.eat(']') {
                    loop {
                        let s = cur.scalar_text();
                        if s.is_empty() {
                            return Err(cur.err_here(cur.expected_msg("a number")));
                        }
                        items.push(s);
                        if cur.eat(']') {
                            break;
                        }
                        cur.expect(',')?;
                    }
                }
                AttrValue::List(items)
            } else {
                let s = cur.scalar_text();
                if s.is_empty() {
                    return Err(cur.err_here(cur.expected_msg(&format!("a value for `{key}`"))));
                }
                AttrValue::Scalar(s)
            }
        } else if cur.eat('(') {
            AttrValue::Group(attrs(cur, ')')?)
        } else {
            AttrValue::Flag
        };
        out.items.push((key, col, value));
        if cur.eat(close) {
            return Ok(out);
        }
        cur.expect(',')?;
    }
}
