//! `POST /v1/embeddings` in OpenAI's shape, for an embedding plan.
//!
//! [`EmbeddingsRequest::parse`] reads the body (`input` a string, an array
//! of strings, an array of token ids or an array of such arrays; `model`,
//! `encoding_format` `float` or `base64`, `dimensions`, `user`; and the
//! extension `truncate`, as Hugging Face's TEI spells it) and refuses what
//! it cannot embed with a 400 naming the field. [`inputs`] tokenizes the
//! texts as sentence-transformers does; [`response`] shapes the vectors,
//! cut to `dimensions` (Matryoshka) and renormalized when the model's are
//! unit length. The surprise: OpenAI's client asks for `base64` unless told
//! otherwise, so that form — the vector's little-endian f32 bytes — is the
//! one most requests get.

use crate::openai::ApiError;
use base64::Engine;
use gerbil::TextCodec;
use gerbil_plan::EmbeddingInfo;
use serde_json::{json, Value};

/// Most inputs of one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// One input: a text, or token ids as they are.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Text through the tokenizer.
    Text(String),
    /// Token ids, special tokens included.
    Ids(Vec<u32>),
}

/// A parsed `/v1/embeddings` request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingsRequest {
    /// The inputs, in order (at least one).
    pub inputs: Vec<Input>,
    /// `base64` instead of arrays of numbers.
    pub base64: bool,
    /// Keep only the first `dimensions` values of each vector.
    pub dimensions: Option<usize>,
    /// Cut long inputs instead of refusing them.
    pub truncate: bool,
}

fn invalid(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// Token ids from a JSON array, or why it is not one.
fn ids_of(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// The inputs of `input`.
fn inputs_of(input: &Value) -> Result<Vec<Input>, ApiError> {
    let bad = || {
        invalid(
            "`input` must be a string, an array of strings, an array of token ids, or an array \
             of arrays of token ids",
            "input",
        )
    };
    let items = match input {
        Value::String(s) => return Ok(vec![Input::Text(s.clone())]),
        Value::Array(items) => items,
        _ => return Err(bad()),
    };
    if items.is_empty() {
        return Err(invalid(
            "`input` is an empty array: give at least one input",
            "input",
        ));
    }
    if items.iter().all(Value::is_number) {
        return ids_of(items)
            .map(|ids| vec![Input::Ids(ids)])
            .ok_or_else(bad);
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(ids) if !ids.is_empty() => ids_of(ids).map(Input::Ids).ok_or_else(bad),
            _ => Err(invalid(
                format!("`input[{i}]` must be a string or a non-empty array of token ids"),
                "input",
            )),
        })
        .collect()
}

impl EmbeddingsRequest {
    /// Parses a request body (a JSON object).
    pub fn parse(body: &Value) -> Result<EmbeddingsRequest, ApiError> {
        let input = body
            .get("input")
            .ok_or_else(|| invalid("the request has no `input`", "input"))?;
        let inputs = inputs_of(input)?;
        if inputs.len() > MAX_INPUTS {
            return Err(invalid(
                format!("{} inputs: at most {MAX_INPUTS} per request", inputs.len()),
                "input",
            ));
        }
        let base64 = match body.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(other) => {
                return Err(invalid(
                    format!("`encoding_format` must be \"float\" or \"base64\", got {other}"),
                    "encoding_format",
                ))
            }
        };
        let dimensions = match body.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Some(n),
                _ => {
                    return Err(invalid(
                        format!("`dimensions` must be a positive integer, got {v}"),
                        "dimensions",
                    ))
                }
            },
        };
        let truncate = match body.get("truncate") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(invalid(
                    format!("`truncate` must be true or false, got {other}"),
                    "truncate",
                ))
            }
        };
        Ok(EmbeddingsRequest {
            inputs,
            base64,
            dimensions,
            truncate,
        })
    }
}

/// Each input's token ids: texts through `codec` (cut to the model's
/// maximum when `truncate`, keeping the closing special token), ids as given
/// (cut as given); a 400 for an input too long, or for `dimensions` past the
/// model's, before any GPU work.
pub fn inputs(
    request: &EmbeddingsRequest,
    codec: Option<&TextCodec>,
    info: &EmbeddingInfo,
) -> Result<Vec<Vec<u32>>, ApiError> {
    if let Some(d) = request.dimensions.filter(|&d| d as u64 > info.dimension) {
        return Err(invalid(
            format!(
                "`dimensions` {d} is more than the model's {}",
                info.dimension
            ),
            "dimensions",
        ));
    }
    let max = usize::try_from(info.max_tokens).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(request.inputs.len());
    for (i, input) in request.inputs.iter().enumerate() {
        let mut ids = match input {
            Input::Ids(ids) => ids.clone(),
            Input::Text(text) => {
                let codec = codec.ok_or_else(|| {
                    invalid("this model has no tokenizer: give token ids", "input")
                })?;
                let encoded = match request.truncate {
                    true => codec.encode_truncated(text, max),
                    false => codec.encode(text),
                };
                encoded.map_err(|e| invalid(format!("`input[{i}]`: {e}"), "input"))?
            }
        };
        if ids.len() > max {
            if !request.truncate {
                return Err(invalid(
                    format!(
                        "`input[{i}]` has {} tokens, more than the {max} this model takes: \
                         shorten it, or send \"truncate\": true to keep its first {max}",
                        ids.len()
                    ),
                    "input",
                ));
            }
            ids.truncate(max);
        }
        if ids.is_empty() {
            return Err(invalid(format!("`input[{i}]` has no tokens"), "input"));
        }
        out.push(ids);
    }
    Ok(out)
}

/// The response body for `vectors` made from inputs of `tokens` tokens in all.
pub fn response(
    request: &EmbeddingsRequest,
    info: &EmbeddingInfo,
    model: &str,
    vectors: Vec<Vec<f32>>,
    tokens: usize,
) -> Result<Value, ApiError> {
    let keep = match request.dimensions {
        Some(d) if d as u64 > info.dimension => {
            return Err(invalid(
                format!(
                    "`dimensions` {d} is more than the model's {}",
                    info.dimension
                ),
                "dimensions",
            ))
        }
        Some(d) => d,
        None => info.dimension as usize,
    };
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            gerbil::shorten_embedding(&mut v, keep, info.normalized);
            let embedding = if request.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<EmbeddingsRequest, String> {
        EmbeddingsRequest::parse(&body).map_err(|e| e.message)
    }

    #[test]
    fn every_input_shape_parses() {
        let texts = |v: &[&str]| {
            v.iter()
                .map(|s| Input::Text(s.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(parse(json!({"input": "a"})).unwrap().inputs, texts(&["a"]));
        assert_eq!(
            parse(json!({"input": ["a", "b"]})).unwrap().inputs,
            texts(&["a", "b"])
        );
        assert_eq!(
            parse(json!({"input": [1, 2]})).unwrap().inputs,
            vec![Input::Ids(vec![1, 2])]
        );
        assert_eq!(
            parse(json!({"input": [[1], [2, 3]]})).unwrap().inputs,
            vec![Input::Ids(vec![1]), Input::Ids(vec![2, 3])]
        );
        let r = parse(json!({"input": "a", "encoding_format": "base64", "dimensions": 8})).unwrap();
        assert!(r.base64 && r.dimensions == Some(8) && !r.truncate);
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, needle) in [
            (json!({}), "no `input`"),
            (json!({"input": []}), "empty array"),
            (json!({"input": ["a", 3]}), "`input[1]`"),
            (json!({"input": [-1]}), "array of token ids"),
            (json!({"input": {"a": 1}}), "must be a string"),
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "encoding_format",
            ),
            (json!({"input": "a", "dimensions": 0}), "positive integer"),
            (json!({"input": "a", "truncate": "yes"}), "true or false"),
        ] {
            let err = parse(body.clone()).expect_err("refused");
            assert!(err.contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn dimensions_cut_and_renormalize_and_base64_is_little_endian_f32() {
        let info = EmbeddingInfo {
            dimension: 4,
            pooling: "mean".into(),
            normalized: true,
            max_tokens: 8,
            max_inputs: 1,
        };
        let request = parse(json!({"input": "a", "dimensions": 2})).unwrap();
        let body = response(&request, &info, "m", vec![vec![0.6, 0.0, 0.8, 0.0]], 3).unwrap();
        assert_eq!(body["data"][0]["embedding"], json!([1.0, 0.0]));
        assert_eq!(body["usage"]["prompt_tokens"], 3);
        let request = parse(json!({"input": "a", "encoding_format": "base64"})).unwrap();
        let body = response(&request, &info, "m", vec![vec![1.0, 2.0, 0.5, -1.0]], 3).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body["data"][0]["embedding"].as_str().unwrap())
            .unwrap();
        let back: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, vec![1.0, 2.0, 0.5, -1.0]);
        let request = parse(json!({"input": "a", "dimensions": 5})).unwrap();
        let err = response(&request, &info, "m", vec![vec![0.0; 4]], 1).expect_err("too many");
        assert!(err.message.contains("more than the model's 4"));
    }
}
