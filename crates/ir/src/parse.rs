//! Reads the text form that [`crate::print`] writes back into a [`Graph`].
//!
//! ```
//! let text = "graph g\n  %ids = input.token_ids : u32[T]\n  output ids = %ids\n";
//! let graph = gerbil_ir::parse(text).unwrap();
//! assert_eq!(gerbil_ir::print::print(&graph), text);
//! ```
//!
//! One statement per line: `graph NAME` first, then value lines
//! `%name = op{attrs}(%operands) : types` and `output NAME = %value` lines;
//! `//` starts a comment. A value must be defined before it is read. Every
//! node goes through [`Graph::add`], so the op's type rule checks its
//! operands, and the declared types must equal what the op infers — except
//! for `weight` and `kv_cache`, whose declared type *is* their shape. The
//! label of `%name~k` is `name` (the suffix only tells duplicates apart).
//!
//! Errors carry a 1-based line and column and say what was expected; the
//! parser never panics, whatever the input.

use crate::graph::{Graph, NodeId, ValueRef};
use crate::op::{
    Attention, BinaryOp, Embedding, Input, KvKind, MatMul, MatMulGlu, Op, QkNorm, QkvRope, RmsNorm,
    Rope, UnaryOp, Weight, WeightSource,
};
use crate::print::is_bare_char;
use crate::types::{DType, Dim, Sym, TensorType};
use std::collections::HashMap;

/// Why a text could not be read as a graph, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What was expected, or what is wrong.
    pub message: String,
}

/// Parses a graph from its text form (see the module docs).
pub fn parse(text: &str) -> Result<Graph, ParseError> {
    let mut p = GraphParser::default();
    let mut last_line = 0;
    for (i, line) in text.lines().enumerate() {
        last_line = i + 1;
        let mut cur = Cursor::new(line, i + 1);
        cur.skip_ws();
        if cur.at_end() {
            continue;
        }
        p.statement(&mut cur)?;
    }
    let Some(graph) = p.graph else {
        return Err(ParseError {
            line: last_line.max(1),
            column: 1,
            message: "expected a header `graph NAME`, found end of input".into(),
        });
    };
    crate::verify(&graph).map_err(|e| ParseError {
        line: last_line,
        column: 1,
        message: format!("the parsed graph is invalid: {e}"),
    })?;
    Ok(graph)
}

/// A value reference as written: label, `~k` suffix, `#port`.
#[derive(Clone, Debug)]
struct Name {
    label: String,
    suffix: Option<u32>,
    port: u32,
    column: usize,
}

impl Name {
    fn key(&self) -> (String, Option<u32>) {
        (self.label.clone(), self.suffix)
    }

    fn show(&self) -> String {
        let mut s = format!("%{}", crate::print::word(&self.label));
        if self.label.is_empty() && self.suffix.is_none() {
            s = "%".into();
        }
        if let Some(k) = self.suffix {
            s.push_str(&format!("~{k}"));
        }
        s
    }
}

/// The graph being built and the names defined so far.
#[derive(Default)]
struct GraphParser {
    graph: Option<Graph>,
    values: HashMap<(String, Option<u32>), (NodeId, usize)>,
}

impl GraphParser {
    fn statement(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        if cur.peek() == Some('%') {
            return self.value_line(cur);
        }
        let col = cur.col();
        let found = cur.found();
        let line = cur.line;
        let expected = |what: &str| ParseError {
            line,
            column: col,
            message: format!("expected {what}, found {found}"),
        };
        let kw = cur.ident();
        match (kw.as_str(), &mut self.graph) {
            ("graph", None) => {
                let name = cur.word("a graph name")?;
                cur.end()?;
                self.graph = Some(Graph::new(name));
                Ok(())
            }
            ("graph", Some(_)) => Err(cur.err_at(
                col,
                "a second `graph` header: a file holds one graph".into(),
            )),
            ("output", Some(_)) => {
                let name = cur.word("an output name")?;
                cur.expect('=')?;
                let v = self.operand(cur)?;
                cur.end()?;
                if let Some(g) = &mut self.graph {
                    g.outputs.push((name, v));
                }
                Ok(())
            }
            (_, None) => Err(expected("a header `graph NAME`")),
            (_, Some(_)) => Err(expected(
                "a value line `%name = …` or `output NAME = %value`",
            )),
        }
    }

    fn value_line(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        if self.graph.is_none() {
            return Err(
                cur.err_here("expected a header `graph NAME` before the first value".into())
            );
        }
        let name = cur.name()?;
        if name.port != 0 {
            return Err(cur.err_at(
                name.column,
                format!(
                    "`{}#{}` names an output port; define the value as `{}`",
                    name.show(),
                    name.port,
                    name.show()
                ),
            ));
        }
        if let Some((_, line)) = self.values.get(&name.key()) {
            return Err(cur.err_at(
                name.column,
                format!("`{}` is already defined on line {line}", name.show()),
            ));
        }
        cur.expect('=')?;
        cur.skip_ws();
        let op_col = cur.col();
        let syntax = OpSyntax::parse(cur)?;
        let mut args = Vec::new();
        cur.skip_ws();
        if cur.eat('(') {
            cur.skip_ws();
            if !cur.eat(')') {
                loop {
                    args.push(self.operand(cur)?);
                    cur.skip_ws();
                    if cur.eat(')') {
                        break;
                    }
                    cur.expect(',')?;
                }
            }
        }
        cur.expect(':')?;
        cur.skip_ws();
        let ty_col = cur.col();
        let mut tys = vec![cur.tensor_type()?];
        cur.skip_ws();
        while cur.eat(',') {
            tys.push(cur.tensor_type()?);
            cur.skip_ws();
        }
        cur.end()?;
        let op = syntax.build(cur, &tys, ty_col)?;
        let Some(graph) = self.graph.as_mut() else {
            return Err(cur.err_at(1, "expected a header `graph NAME`".into()));
        };
        let v = graph
            .add(op, &args, name.label.clone())
            .map_err(|e| ParseError {
                line: cur.line,
                column: op_col,
                message: format!("{}: {}", e.op, e.reason),
            })?;
        let inferred = &graph.node(v.node).outputs;
        if inferred != &tys {
            let show = |ts: &[TensorType]| {
                ts.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(cur.err_at(
                ty_col,
                format!(
                    "declared type `{}` differs from the type the op produces, `{}`",
                    show(&tys),
                    show(inferred)
                ),
            ));
        }
        self.values.insert(name.key(), (v.node, cur.line));
        Ok(())
    }

    /// A reference `%name[~k][#port]` to a value defined earlier.
    fn operand(&self, cur: &mut Cursor) -> Result<ValueRef, ParseError> {
        cur.skip_ws();
        let name = cur.name()?;
        let Some(&(node, _)) = self.values.get(&name.key()) else {
            return Err(cur.err_at(
                name.column,
                format!(
                    "`{}` is not defined (a value must be defined before it is read)",
                    name.show()
                ),
            ));
        };
        let outputs = self
            .graph
            .as_ref()
            .map_or(0, |g| g.node(node).outputs.len());
        if name.port as usize >= outputs {
            return Err(cur.err_at(
                name.column,
                format!(
                    "`{}` has {outputs} output(s); `#{}` does not exist",
                    name.show(),
                    name.port
                ),
            ));
        }
        Ok(ValueRef {
            node,
            port: name.port,
        })
    }
}

/// One attribute value as written.
#[derive(Clone, Debug)]
enum AttrValue {
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
struct Attrs {
    /// Column of the attribute list (for a missing attribute).
    at: usize,
    items: Vec<(String, usize, AttrValue)>,
}

/// What is between `=` and the operands, before the types are known.
enum OpSyntax {
    /// `weight SOURCE`.
    Weight(WeightSource),
    /// `mnemonic{attrs}`.
    Op(String, usize, Attrs),
}

impl OpSyntax {
    fn parse(cur: &mut Cursor) -> Result<Self, ParseError> {
        let col = cur.col();
        let mnemonic = cur.ident();
        if mnemonic.is_empty() {
            return Err(cur.err_at(col, cur.expected_msg("an op name")));
        }
        if mnemonic == "weight" {
            return Ok(OpSyntax::Weight(weight_source(cur)?));
        }
        let attrs = if cur.eat('{') {
            cur.attrs('}')?
        } else {
            Attrs {
                at: col,
                items: Vec::new(),
            }
        };
        Ok(OpSyntax::Op(mnemonic, col, attrs))
    }

    /// The op, given the declared output types (the shape of weights and caches).
    fn build(self, cur: &Cursor, tys: &[TensorType], ty_col: usize) -> Result<Op, ParseError> {
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
        let norm = |a: &mut Attrs| -> Result<RmsNorm, ParseError> {
            Ok(RmsNorm {
                eps: a.f32(cur, "eps")?,
                weight_offset: a.f32(cur, "offset")?,
                groups: a.opt_u32(cur, "groups")?.unwrap_or(1),
            })
        };
        let op = match mnemonic.as_str() {
            "input.token_ids" => Op::Input(Input::TokenIds),
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
            }),
            "embedding_rms_norm" => {
                let n = norm(&mut a)?;
                let scale = a.opt_f32(cur, "scale")?;
                Op::EmbeddingRmsNorm(Embedding { scale }, n)
            }
            "rms_norm" => Op::RmsNorm(norm(&mut a)?),
            "add_rms_norm" => Op::AddRmsNorm(norm(&mut a)?),
            "add_rms_norm_last_row" => Op::AddRmsNormLastRow(norm(&mut a)?),
            "matmul" => Op::MatMul(MatMul {
                has_bias: a.flag("bias"),
            }),
            "matmul_swiglu" | "matmul_geglu" | "matmul_glu" => {
                let act = match mnemonic.as_str() {
                    "matmul_swiglu" => UnaryOp::Silu,
                    "matmul_geglu" => UnaryOp::GeluTanh,
                    _ => UnaryOp::Softcap(a.f32(cur, "cap")?),
                };
                Op::MatMulGlu(MatMulGlu {
                    act,
                    has_bias: a.flag("bias"),
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
            }),
            "silu" => Op::Unary(UnaryOp::Silu),
            "gelu_tanh" => Op::Unary(UnaryOp::GeluTanh),
            "softcap" => Op::Unary(UnaryOp::Softcap(a.f32(cur, "cap")?)),
            "add" => Op::Binary(BinaryOp::Add),
            "mul" => Op::Binary(BinaryOp::Mul),
            "add_bias" => Op::AddBias,
            "slice_last_row" => Op::SliceLastRow,
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
            other => {
                return Err(cur.err_at(
                    col,
                    format!("unknown op `{other}`; ops are: {}", OP_NAMES.join(", ")),
                ))
            }
        };
        a.finish(cur, &mnemonic)?;
        Ok(op)
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
    "softcap",
    "add",
    "mul",
    "add_bias",
    "slice_last_row",
    "slice_cols",
    "qkv_rope",
];

/// `"tensor"`, `"tensor"[a..b]`, `concat["a", "b"]` or
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
        "rope_table" => {
            cur.expect('(')?;
            let mut a = cur.attrs(')')?;
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
            "expected a weight source: \"tensor\", \"tensor\"[a..b], concat[…] or rope_table(…)"
                .into(),
        )),
    }
}

fn parse_f32(cur: &Cursor, s: &str, col: usize) -> Result<f32, ParseError> {
    s.parse()
        .map_err(|_| cur.err_at(col, format!("expected a number, found `{s}`")))
}

fn parse_int<T: std::str::FromStr>(cur: &Cursor, s: &str, col: usize) -> Result<T, ParseError> {
    s.parse()
        .map_err(|_| cur.err_at(col, format!("expected an unsigned integer, found `{s}`")))
}

/// `a..b` with `a <= b`.
fn parse_range(cur: &Cursor, s: &str, col: usize) -> Result<(u64, u64), ParseError> {
    let Some((a, b)) = s.split_once("..") else {
        return Err(cur.err_at(col, format!("expected a range `start..end`, found `{s}`")));
    };
    let (a, b): (u64, u64) = (parse_int(cur, a, col)?, parse_int(cur, b, col)?);
    if b < a {
        return Err(cur.err_at(col, format!("range {a}..{b} ends before it starts")));
    }
    Ok((a, b))
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

/// A position in one line of the input.
struct Cursor {
    chars: Vec<char>,
    pos: usize,
    line: usize,
}

impl Cursor {
    fn new(text: &str, line: usize) -> Self {
        Cursor {
            chars: text.chars().collect(),
            pos: 0,
            line,
        }
    }

    fn col(&self) -> usize {
        self.pos + 1
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    fn at_end(&self) -> bool {
        self.peek().is_none() || (self.peek() == Some('/') && self.peek_at(1) == Some('/'))
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        let hit = self.peek() == Some(c);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn err_at(&self, column: usize, message: String) -> ParseError {
        ParseError {
            line: self.line,
            column,
            message,
        }
    }

    fn err_here(&self, message: String) -> ParseError {
        self.err_at(self.col(), message)
    }

    /// What stands at the cursor, for messages.
    fn found(&self) -> String {
        if self.at_end() {
            return "end of line".into();
        }
        let s: String = self.chars[self.pos..]
            .iter()
            .take_while(|c| !c.is_whitespace())
            .take(24)
            .collect();
        format!("`{s}`")
    }

    fn expected_msg(&self, what: &str) -> String {
        format!("expected {what}, found {}", self.found())
    }

    fn expect(&mut self, c: char) -> Result<(), ParseError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err_here(self.expected_msg(&format!("`{c}`"))))
        }
    }

    /// Nothing but whitespace or a comment up to the end of the line.
    fn end(&mut self) -> Result<(), ParseError> {
        self.skip_ws();
        if self.at_end() {
            Ok(())
        } else {
            Err(self.err_here(self.expected_msg("end of line")))
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    /// `[A-Za-z0-9_.]*` after whitespace (op names, keywords, dtypes).
    fn ident(&mut self) -> String {
        self.skip_ws();
        self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }

    /// A number, word or range as one run of `[A-Za-z0-9_.+-]`.
    fn scalar_text(&mut self) -> String {
        self.skip_ws();
        self.take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-'))
    }

    /// A quoted string with Rust escapes.
    fn string(&mut self) -> Result<String, ParseError> {
        self.skip_ws();
        if self.peek() != Some('"') {
            return Err(self.err_here(self.expected_msg("a quoted string")));
        }
        let open = self.col();
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(
                    self.err_at(open, "unterminated string: expected a closing `\"`".into())
                );
            };
            self.pos += 1;
            match c {
                '"' => return Ok(out),
                '\\' => out.push(self.escape()?),
                c => out.push(c),
            }
        }
    }

    /// The character of an escape after its `\`.
    fn escape(&mut self) -> Result<char, ParseError> {
        let col = self.col();
        let c = self.peek();
        self.pos += 1;
        Ok(match c {
            Some('n') => '\n',
            Some('t') => '\t',
            Some('r') => '\r',
            Some('0') => '\0',
            Some('\\') => '\\',
            Some('"') => '"',
            Some('\'') => '\'',
            Some('u') if self.peek() == Some('{') => {
                self.pos += 1;
                let hex = self.take_while(|c| c.is_ascii_hexdigit());
                let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                match (ch, self.peek()) {
                    (Some(ch), Some('}')) => {
                        self.pos += 1;
                        ch
                    }
                    _ => {
                        return Err(self.err_at(col, "expected a unicode escape `\\u{HEX}`".into()))
                    }
                }
            }
            _ => {
                return Err(self.err_at(
                    col,
                    "expected an escape: \\n, \\t, \\r, \\0, \\\\, \\\", \\' or \\u{HEX}".into(),
                ))
            }
        })
    }

    /// A graph or output name: a bare word or a quoted string.
    fn word(&mut self, what: &str) -> Result<String, ParseError> {
        self.skip_ws();
        if self.peek() == Some('"') {
            return self.string();
        }
        let w = self.take_while(is_bare_char);
        if w.is_empty() {
            return Err(self.err_here(self.expected_msg(what)));
        }
        Ok(w)
    }

    /// `%label[~k][#port]` with a bare or quoted label.
    fn name(&mut self) -> Result<Name, ParseError> {
        self.skip_ws();
        let column = self.col();
        if self.peek() != Some('%') {
            return Err(self.err_here(self.expected_msg("a value name `%name`")));
        }
        self.pos += 1;
        let label = if self.peek() == Some('"') {
            self.string()?
        } else {
            self.take_while(is_bare_char)
        };
        let suffix = self.numbered('~')?;
        let port = self.numbered('#')?.unwrap_or(0);
        if label.is_empty() && suffix.is_none() {
            return Err(self.err_at(column, "expected a value name after `%`".into()));
        }
        Ok(Name {
            label,
            suffix,
            port,
            column,
        })
    }

    /// `N` after a `sigil` (`~`, `#`) at the cursor, if the sigil is there.
    fn numbered(&mut self, sigil: char) -> Result<Option<u32>, ParseError> {
        if self.peek() != Some(sigil) {
            return Ok(None);
        }
        self.pos += 1;
        let col = self.col();
        let digits = self.take_while(|c| c.is_ascii_digit());
        parse_int(self, &digits, col).map(Some)
    }

    /// `key=value, flag, key(…), key=[…]` up to and including `close`.
    fn attrs(&mut self, close: char) -> Result<Attrs, ParseError> {
        let mut attrs = Attrs {
            at: self.col(),
            items: Vec::new(),
        };
        if self.eat(close) {
            return Ok(attrs);
        }
        loop {
            self.skip_ws();
            let col = self.col();
            let key = self.ident();
            if key.is_empty() {
                return Err(self.err_here(self.expected_msg("an attribute name")));
            }
            let value = if self.eat('=') {
                if self.eat('[') {
                    let mut items = Vec::new();
                    if !self.eat(']') {
                        loop {
                            let s = self.scalar_text();
                            if s.is_empty() {
                                return Err(self.err_here(self.expected_msg("a number")));
                            }
                            items.push(s);
                            if self.eat(']') {
                                break;
                            }
                            self.expect(',')?;
                        }
                    }
                    AttrValue::List(items)
                } else {
                    let s = self.scalar_text();
                    if s.is_empty() {
                        return Err(
                            self.err_here(self.expected_msg(&format!("a value for `{key}`")))
                        );
                    }
                    AttrValue::Scalar(s)
                }
            } else if self.eat('(') {
                AttrValue::Group(self.attrs(')')?)
            } else {
                AttrValue::Flag
            };
            attrs.items.push((key, col, value));
            if self.eat(close) {
                return Ok(attrs);
            }
            self.expect(',')?;
        }
    }

    /// `dtype[dim, …]` with dims a constant, `T` or `Lmax`.
    fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        self.skip_ws();
        let col = self.col();
        let dtype = match self.ident().as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "u32" => DType::U32,
            _ => {
                self.pos = col - 1;
                return Err(self.err_here(
                    self.expected_msg("a type such as f32[T,64] (dtypes: f32, f16, bf16, u32)"),
                ));
            }
        };
        self.expect('[')?;
        let mut shape = Vec::new();
        if self.eat(']') {
            return Ok(TensorType::new(dtype, shape));
        }
        loop {
            self.skip_ws();
            let col = self.col();
            let d = self.ident();
            shape.push(match d.as_str() {
                "T" => Dim::Sym(Sym::T),
                "Lmax" => Dim::Sym(Sym::Lmax),
                _ => match d.parse() {
                    Ok(n) => Dim::Const(n),
                    Err(_) => {
                        self.pos = col - 1;
                        return Err(
                            self.err_here(self.expected_msg("a dimension (an integer, T or Lmax)"))
                        );
                    }
                },
            });
            if self.eat(']') {
                return Ok(TensorType::new(dtype, shape));
            }
            self.expect(',')?;
        }
    }
}
