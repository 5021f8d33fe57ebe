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
//!
//! [`Model::shorten`] keeps a Matryoshka prefix of each vector (the first
//! `dimensions` values, renormalized when the model's vectors are unit
//! length), as `dimensions` does in OpenAI's API; [`shorten_embedding`] is
//! the same for one vector.

use crate::error::Error;
use crate::model::Model;
use gerbil_runtime::session::NOT_EMBEDDING;
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

    /// Keeps the first `dimensions` values of each vector, renormalized to
    /// unit length when the model's vectors are (a Matryoshka model's
    /// shorter embedding); an error when `dimensions` is 0 or more than the
    /// model makes.
    pub fn shorten(&self, vectors: &mut [Vec<f32>], dimensions: usize) -> Result<(), Error> {
        let Some(info) = &self.session.header().model.embedding else {
            return Err(Error::Runtime(RuntimeError::WrongModelKind(NOT_EMBEDDING)));
        };
        if dimensions == 0 || dimensions as u64 > info.dimension {
            return Err(Error::BadDimensions {
                asked: dimensions,
                model: info.dimension,
            });
        }
        for v in vectors {
            shorten_embedding(v, dimensions, info.normalized);
        }
        Ok(())
    }

    /// Most tokens one input may have, or why this plan makes no vectors.
    fn embedding_max_tokens(&self) -> Result<usize, Error> {
        match &self.session.header().model.embedding {
            Some(e) => Ok(usize::try_from(e.max_tokens).unwrap_or(usize::MAX)),
            None => Err(Error::Runtime(RuntimeError::WrongModelKind(NOT_EMBEDDING))),
        }
    }
}

/// Keeps the first `dimensions` values of `vector` (all when it has no
/// more), scaled back to unit length when `renormalize` and values were cut.
pub fn shorten_embedding(vector: &mut Vec<f32>, dimensions: usize, renormalize: bool) {
    if dimensions >= vector.len() {
        return;
    }
    vector.truncate(dimensions);
    if renormalize {
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::shorten_embedding;

    #[test]
    fn shorten_cuts_and_renormalizes_only_when_asked_and_needed() {
        let mut v = vec![0.6, 0.0, 0.8, 0.0];
        shorten_embedding(&mut v, 4, true);
        assert_eq!(v, [0.6, 0.0, 0.8, 0.0]);
        let mut cut = v.clone();
        shorten_embedding(&mut cut, 2, false);
        assert_eq!(cut, [0.6, 0.0]);
        shorten_embedding(&mut v, 2, true);
        assert!((v[0] - 1.0).abs() < 1e-6 && v[1] == 0.0, "{v:?}");
    }
}
