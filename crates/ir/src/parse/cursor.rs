//! Character-level scanning of one line: words, numbers, strings with
//! escapes, value names, types, and errors that point at a column.
//!
//! Columns count characters, not bytes, from 1; a `//` outside a string
//! ends the line.

use super::ParseError;
use crate::print::is_bare_char;
use crate::types::{DType, Dim, Sym, TensorType};

/// A value reference as written: label, `~k` suffix, `#port`.
#[derive(Clone, Debug)]
pub(super) struct Name {
    pub(super) label: String,
    pub(super) suffix: Option<u32>,
    pub(super) port: u32,
    pub(super) column: usize,
}

impl Name {
    pub(super) fn key(&self) -> (String, Option<u32>) {
        (self.label.clone(), self.suffix)
    }

    pub(super) fn show(&self) -> String {
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

/// A position in one line of the input.
pub(super) struct Cursor {
    chars: Vec<char>,
    pos: usize,
    pub(super) line: usize,
}

impl Cursor {
    pub(super) fn new(text: &str, line: usize) -> Self {
        Cursor {
            chars: text.chars().collect(),
            pos: 0,
            line,
        }
    }

    pub(super) fn col(&self) -> usize {
        self.pos + 1
    }

    pub(super) fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    pub(super) fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    pub(super) fn at_end(&self) -> bool {
        self.peek().is_none() || (self.peek() == Some('/') && self.peek_at(1) == Some('/'))
    }

    pub(super) fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    pub(super) fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        let hit = self.peek() == Some(c);
        if hit {
            self.pos += 1;
        }
        hit
    }

    pub(super) fn err_at(&self, column: usize, message: String) -> ParseError {
        ParseError {
            line: self.line,
            column,
            message,
        }
    }

    pub(super) fn err_here(&self, message: String) -> ParseError {
        self.err_at(self.col(), message)
    }

    /// What stands at the cursor, for messages.
    pub(super) fn found(&self) -> String {
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

    pub(super) fn expected_msg(&self, what: &str) -> String {
        format!("expected {what}, found {}", self.found())
    }

    pub(super) fn expect(&mut self, c: char) -> Result<(), ParseError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err_here(self.expected_msg(&format!("`{c}`"))))
        }
    }

    /// Nothing but whitespace or a comment up to the end of the line.
    pub(super) fn end(&mut self) -> Result<(), ParseError> {
        self.skip_ws();
        if self.at_end() {
            Ok(())
        } else {
            Err(self.err_here(self.expected_msg("end of line")))
        }
    }

    pub(super) fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    /// `[A-Za-z0-9_.]*` after whitespace (op names, keywords, dtypes).
    pub(super) fn ident(&mut self) -> String {
        self.skip_ws();
        self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }

    /// A number, word or range as one run of `[A-Za-z0-9_.+-]`.
    pub(super) fn scalar_text(&mut self) -> String {
        self.skip_ws();
        self.take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-'))
    }

    /// A quoted string with Rust escapes.
    pub(super) fn string(&mut self) -> Result<String, ParseError> {
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
    pub(super) fn escape(&mut self) -> Result<char, ParseError> {
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
    pub(super) fn word(&mut self, what: &str) -> Result<String, ParseError> {
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
    pub(super) fn name(&mut self) -> Result<Name, ParseError> {
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
    pub(super) fn numbered(&mut self, sigil: char) -> Result<Option<u32>, ParseError> {
        if self.peek() != Some(sigil) {
            return Ok(None);
        }
        self.pos += 1;
        let col = self.col();
        let digits = self.take_while(|c| c.is_ascii_digit());
        parse_int(self, &digits, col).map(Some)
    }
    /// `dtype[dim, …]` with dims a constant, `T` or `Lmax`.
    pub(super) fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        self.skip_ws();
        let col = self.col();
        let Some(dtype) = DType::from_name(&self.ident()) else {
            self.pos = col - 1;
            return Err(self.err_here(self.expected_msg(&format!(
                "a type such as f32[T,64] (dtypes: {})",
                DType::NAMES.join(", ")
            ))));
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

pub(super) fn parse_f32(cur: &Cursor, s: &str, col: usize) -> Result<f32, ParseError> {
    s.parse()
        .map_err(|_| cur.err_at(col, format!("expected a number, found `{s}`")))
}

pub(super) fn parse_int<T: std::str::FromStr>(
    cur: &Cursor,
    s: &str,
    col: usize,
) -> Result<T, ParseError> {
    s.parse()
        .map_err(|_| cur.err_at(col, format!("expected an unsigned integer, found `{s}`")))
}

/// `a..b` with `a <= b`.
pub(super) fn parse_range(cur: &Cursor, s: &str, col: usize) -> Result<(u64, u64), ParseError> {
    let Some((a, b)) = s.split_once("..") else {
        return Err(cur.err_at(col, format!("expected a range `start..end`, found `{s}`")));
    };
    let (a, b): (u64, u64) = (parse_int(cur, a, col)?, parse_int(cur, b, col)?);
    if b < a {
        return Err(cur.err_at(col, format!("range {a}..{b} ends before it starts")));
    }
    Ok((a, b))
}
