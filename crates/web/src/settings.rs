//! What the page asks of one answer, as JSON in the OpenAI API's names (`max_tokens`,
//! `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, and the server's extension
//! `ignore_eos`), resolved by the same
//! [`SettingsRequest::resolve`] as `gerbil-run` and the server, so a greedy request gives the
//! same text in the browser as there. An unknown field is an error naming it: a typo must not
//! silently fall back to the defaults.

use gerbil::SettingsRequest;
use serde::Deserialize;

/// The page's settings (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageSettings {
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
    #[serde(default)]
    ignore_eos: bool,
}

impl PageSettings {
    /// Parses `json`; the error names the field.
    pub(crate) fn parse(json: &str) -> Result<PageSettings, String> {
        serde_json::from_str(json).map_err(|e| format!("generation settings: {e}"))
    }

    /// The request the resolver takes.
    pub(crate) fn request(self) -> SettingsRequest {
        SettingsRequest {
            max_new_tokens: self.max_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            stop: self.stop,
            ignore_eos: self.ignore_eos,
            ..SettingsRequest::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_map_to_the_request_and_typos_are_refused() {
        let s = PageSettings::parse(
            r#"{"max_tokens": 9, "temperature": 0.5, "seed": 3, "ignore_eos": true}"#,
        );
        let r = s.unwrap().request();
        assert_eq!(
            (r.max_new_tokens, r.temperature, r.seed, r.ignore_eos),
            (Some(9), Some(0.5), Some(3), true)
        );
        let err = PageSettings::parse(r#"{"temprature": 1}"#).unwrap_err();
        assert!(err.contains("unknown field `temprature`"), "{err}");
    }
}
