//! Sentence embeddings through the facade: [`Model::embed`] turns texts
//! into vectors with an embedding plan (an encoder compiled by `gerbilc`,
//! e.g. all-MiniLM-L6-v2).
//!
//! ```no_run
//! # async fn run() -> Result<(), gerbil::Error> {
//! use gerbil::{LongInputs, Model, ModelOptions};
//! let mut model = Model::open("minilm.plan".as_ref(), &ModelOptions::default()).await?;
//! let vectors = model.embed(&["A cat sat.", "Un chat s'assit."], LongInputs::Refuse).await?;
//! let cosine: f32 = vectors[0].iter().zip(&vectors[1]).map(|(a, b)| a * b).sum();
//! # Ok(()) }
//! ```
//!
//! Each text is tokenized as sentence-transformers does (`[CLS] … [SEP]`),
//! and the inputs are packed end to end into as few GPU steps as the plan
//! allows (`Session::embed_batch`). The surprise: inputs longer than the
//! model takes are refused unless asked to be truncated
//! ([`LongInputs::Truncate`]), where sentence-transformers truncates
//! silently — a cut input's vector describes only its start.

use crate::error::Error;
use crate::model::Model;
use gerbil_runtime::RuntimeError;

/// What [`Model::embed`] does with a text longer than the model takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongInputs {
    /// Fail with [`RuntimeError::InputTooLong`].
    Refuse,
    /// Keep the first tokens (and the closing special token), as
    /// sentence-transformers does.
    Truncate,
}

impl Model {
    /// The vector of each text, in order (none for no texts). Needs an
    /// embedding plan with a tokenizer.
    pub async fn embed(
        &mut self,
        texts: &[&str],
        long: LongInputs,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let max = self.embedding_max_tokens()?;
        let codec = self.text_codec()?;
        let ids = texts
            .iter()
            .map(|text| match long {
                LongInputs::Truncate => codec.encode_truncated(text, max),
                LongInputs::Refuse => codec.encode(text),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        self.embed_ids(&ids).await
    }

    /// The vector of each input given as token ids, special tokens included;
    /// inputs are packed into as few GPU steps as the plan allows.
    pub async fn embed_ids(&mut self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>, Error> {
        Ok(self.session_mut().embed_batch(inputs).await?)
    }

    /// Most tokens one input may have, or why this plan makes no vectors.
    fn embedding_max_tokens(&self) -> Result<usize, Error> {
        match &self.session.header().model.embedding {
            Some(e) => Ok(usize::try_from(e.max_tokens).unwrap_or(usize::MAX)),
            None => Err(Error::Runtime(RuntimeError::WrongModelKind(
                "this plan is a language model, not an embedding model: it makes logits, not vectors",
            ))),
        }
    }
}
