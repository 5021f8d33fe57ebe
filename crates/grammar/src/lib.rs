//! Grammar-constrained generation for gerbil: JSON that always parses, JSON
//! that follows a schema, text that follows a Lark grammar, and tool calls,
//! through llguidance (the library llama.cpp, vLLM and SGLang use).
//!
//! ```no_run
//! # async fn run(mut model: gerbil::Model, prompt: Vec<u32>) -> Result<(), Box<dyn std::error::Error>> {
//! use gerbil_grammar::{Grammar, Grammars};
//! let grammars = Grammars::new(&model)?; // once per model: the vocabulary's token trie
//! let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}});
//! let constraint = grammars.constraint(&Grammar::JsonSchema(schema))?; // a bad schema fails here
//! let mut g = model.generate(&prompt, &gerbil::GenerationSettings::default())?;
//! g.constrain(Box::new(constraint))?;
//! while let Some(piece) = g.next().await {
//!     print!("{}", piece?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! [`Grammars`] holds the model's vocabulary as llguidance sees it
//! ([`vocab`]); [`Grammars::constraint`] compiles one [`Grammar`] into a
//! [`GrammarConstraint`], which masks every step's logits
//! ([`gerbil::TokenConstraint`]). [`tools`] writes the grammar and reads
//! the output of tool calls in a model's own format. The surprise: JSON
//! comes out on one line with one space after `:` and `,`
//! (`{"a": 1, "b": [2, 3]}`) unless the schema asks otherwise through
//! llguidance's `x-guidance` options: free whitespace would let a model pad
//! forever, and a fixed layout is what models see most.

#![warn(missing_docs)]

mod constraint;
pub mod tools;
mod vocab;

pub use constraint::GrammarConstraint;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use toktrie::TokEnv;

/// What went wrong making a constraint.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The model has no tokenizer, so no text to constrain.
    #[error("this plan has no tokenizer, so its output cannot follow a grammar")]
    NoTokenizer,
    /// The vocabulary cannot become a token trie.
    #[error("the vocabulary cannot be used for constrained output: {0}")]
    Vocabulary(String),
    /// The schema or grammar does not compile (or uses what llguidance
    /// does not support).
    #[error("{0}")]
    Invalid(String),
}

/// What the output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this JSON schema.
    JsonSchema(Value),
    /// Text of this Lark grammar (llguidance's dialect: `%json {...}`,
    /// special tokens as `<|name|>`).
    Lark(String),
}

impl Grammar {
    /// llguidance's form of it.
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        }
    }
}

/// `schema` with gerbil's JSON layout (see the crate docs) unless it sets
/// `x-guidance` itself; a boolean schema stays as it is.
pub(crate) fn with_layout(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// `value` as JSON on one line with one space after `:` and `,`: the layout
/// of constrained JSON (see the crate docs).
pub fn one_line_json(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, OneLine);
    match serde::Serialize::serialize(value, &mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => value.to_string(),
    }
}

/// `, ` before every item but the first.
fn separator<W: ?Sized + std::io::Write>(writer: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

/// serde_json's compact layout with a space after `:` and `,`.
struct OneLine;

impl serde_json::ser::Formatter for OneLine {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// A model's grammar compiler: see the [crate docs](crate).
pub struct Grammars {
    factory: ParserFactory,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// The compiler for `model`'s vocabulary and end-of-sequence ids.
    pub fn new(model: &gerbil::Model) -> Result<Grammars, GrammarError> {
        let codec = model.shared_codec().ok_or(GrammarError::NoTokenizer)?;
        let logits = usize::try_from(model.session().vocab_size()).unwrap_or(usize::MAX);
        let eos = model.session().header().text.eos_token_ids.clone();
        Self::for_vocabulary(codec, logits, &eos)
    }

    /// The compiler for a tokenizer, a logits width and end-of-sequence ids.
    pub fn for_vocabulary(
        codec: Arc<gerbil::TextCodec>,
        logits: usize,
        eos: &[u32],
    ) -> Result<Grammars, GrammarError> {
        let vocabulary = vocab::Vocabulary::new(codec, logits, eos)?;
        let eos = vocabulary_eos(&vocabulary);
        let env: TokEnv = Arc::new(vocabulary);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory, eos })
    }

    /// A fresh constraint for one generation of `grammar`; a schema or
    /// grammar that does not compile fails here, before any token.
    pub fn constraint(&self, grammar: &Grammar) -> Result<GrammarConstraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(GrammarConstraint::new(matcher, self.eos.clone()))
    }
}

/// The end-of-sequence ids the trie was given.
fn vocabulary_eos(v: &vocab::Vocabulary) -> Vec<u32> {
    use toktrie::TokenizerEnv;
    v.tok_trie().eos_tokens().to_vec()
}
