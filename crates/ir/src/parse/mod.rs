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
//!
//! This module reads statements and builds the graph; `cursor` scans
//! characters (names, numbers, strings, types) and `ops` reads op syntax
//! (attributes, weight sources) and builds each [`crate::Op`].

mod cursor;
mod ops;

use crate::graph::{Graph, NodeId, ValueRef};
use crate::types::TensorType;
use cursor::Cursor;
use ops::OpSyntax;
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
