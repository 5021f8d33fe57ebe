//! One resolver for generation settings: what the caller asks for (`gerbil-run`'s flags, a
//! server request's fields), else the model's `generation_config.json` recommendation, else
//! transformers' default.
//!
//! ```
//! use gerbil::{GenerationDefaults, SettingsRequest};
//! let asked = SettingsRequest { temperature: Some(0.8), seed: Some(7), ..SettingsRequest::default() };
//! let resolved = asked.resolve(&GenerationDefaults::default(), 128, || unreachable!());
//! assert_eq!(resolved.settings.sampling.top_k, 50); // transformers' top_k whenever it samples
//! assert_eq!(resolved.seed, Some(7));
//! ```
//!
//! The command line and the server both call [`SettingsRequest::resolve`], so the same request
//! through either draws the same tokens. As in transformers, a model samples by default only
//! when its config says `do_sample: true`; a caller's temperature above 0 samples whatever the
//! config says. The surprise: the token budget's fallback differs by caller (`gerbil-run`
//! generates 128 tokens, the OpenAI API runs to the end of the context), so it is an argument;
//! range checks stay with the caller, whose error names its own flag or field.

use crate::generation::GenerationSettings;
use gerbil_plan::GenerationDefaults;
use gerbil_runtime::SamplingParams;

/// transformers' `top_k` when sampling and neither the caller nor the model sets one.
pub const HF_TOP_K: usize = 50;

/// Temperatures above 0 but below this decode greedily, as 0 does: dividing
/// the logits by them would overflow f32 (at 1e-40, `1 / T` is infinite and
/// the sampler would draw garbage), and well before that they pick the most
/// likely token anyway (at 1e-4 a logit 0.01 ahead is e^100 times likelier).
pub const GREEDY_BELOW: f32 = 1e-4;

/// `temperature` as generation runs it: 0 (greedy) for one below
/// [`GREEDY_BELOW`], else unchanged (a negative or non-finite one is the
/// caller's to refuse).
pub fn effective_temperature(temperature: f32) -> f32 {
    if temperature > 0.0 && temperature < GREEDY_BELOW {
        0.0
    } else {
        temperature
    }
}

/// What a caller asks of one generation; `None` leaves a setting to the model's defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SettingsRequest {
    /// Most tokens to generate.
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 decodes greedily.
    pub temperature: Option<f32>,
    /// When sampling: only the `k` most likely tokens (0: all).
    pub top_k: Option<usize>,
    /// When sampling: the most likely tokens holding this probability (1: all).
    pub top_p: Option<f32>,
    /// When sampling: tokens at least this fraction as likely as the best (0: all).
    pub min_p: Option<f32>,
    /// transformers' repetition penalty (1: off).
    pub repetition_penalty: Option<f32>,
    /// OpenAI's presence penalty (0: off).
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty (0: off).
    pub frequency_penalty: Option<f32>,
    /// When sampling: the random seed (default: one the caller draws).
    pub seed: Option<u64>,
    /// Strings that end the text.
    pub stop: Vec<String>,
    /// Keep going past the end-of-sequence tokens.
    pub ignore_eos: bool,
}

/// Settings ready to run, and the seed when they sample.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedSettings {
    /// What the generation uses.
    pub settings: GenerationSettings,
    /// `Some(seed)` when sampling, whether asked for or drawn; `None` when greedy.
    pub seed: Option<u64>,
}

impl SettingsRequest {
    /// The temperature the generation runs at: the caller's, else the model's when its config
    /// samples, else 0 (greedy); below [`GREEDY_BELOW`], 0.
    pub fn temperature(&self, defaults: &GenerationDefaults) -> f32 {
        effective_temperature(match self.temperature {
            Some(t) => t,
            None if defaults.do_sample == Some(true) => defaults.temperature.unwrap_or(1.0),
            None => 0.0,
        })
    }

    /// Fills what the request leaves out from `defaults` (the model's), then transformers'
    /// defaults; `max_new_tokens` falls back to the model's, then to `fallback_max_new_tokens`.
    /// `random_seed` is called once when the settings sample without a seed.
    pub fn resolve(
        &self,
        defaults: &GenerationDefaults,
        fallback_max_new_tokens: usize,
        random_seed: impl FnOnce() -> u64,
    ) -> ResolvedSettings {
        let temperature = self.temperature(defaults);
        let samples = temperature != 0.0;
        let seed = samples.then(|| self.seed.unwrap_or_else(random_seed));
        let model_top_k = defaults
            .top_k
            .map(|k| usize::try_from(k).unwrap_or(usize::MAX));
        let sampling = SamplingParams {
            temperature,
            top_k: self.top_k.or(model_top_k).unwrap_or(HF_TOP_K),
            top_p: self.top_p.or(defaults.top_p).unwrap_or(1.0),
            min_p: self.min_p.or(defaults.min_p).unwrap_or(0.0),
            // A seed asked for is kept even when greedy (it changes nothing there).
            seed: seed.or(self.seed).unwrap_or(0),
            repetition_penalty: self
                .repetition_penalty
                .or(defaults.repetition_penalty)
                .unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
        };
        let model_max = defaults
            .max_new_tokens
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        ResolvedSettings {
            settings: GenerationSettings {
                max_new_tokens: self
                    .max_new_tokens
                    .or(model_max)
                    .unwrap_or(fallback_max_new_tokens),
                sampling,
                stop: self.stop.clone(),
                ignore_eos: self.ignore_eos,
                top_logits: None,
            },
            seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling_model() -> GenerationDefaults {
        GenerationDefaults {
            do_sample: Some(true),
            temperature: Some(0.6),
            top_p: Some(0.9),
            ..GenerationDefaults::default()
        }
    }

    #[test]
    fn the_request_wins_then_the_model_then_transformers() {
        let r = SettingsRequest::default().resolve(&sampling_model(), 128, || 42);
        let s = r.settings.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p), (0.6, HF_TOP_K, 0.9));
        assert_eq!((r.seed, s.seed), (Some(42), 42), "a drawn seed is reported");
        let asked = SettingsRequest {
            top_k: Some(5),
            top_p: Some(0.5),
            max_new_tokens: Some(3),
            ..SettingsRequest::default()
        };
        let r = asked.resolve(&sampling_model(), 128, || 1);
        assert_eq!(
            (r.settings.sampling.top_k, r.settings.sampling.top_p),
            (5, 0.5)
        );
        assert_eq!(r.settings.max_new_tokens, 3);
    }

    #[test]
    fn a_model_without_do_sample_is_greedy_until_asked_and_then_samples_like_transformers() {
        let greedy_model = GenerationDefaults {
            temperature: Some(0.3), // ignored without do_sample, as in transformers
            max_new_tokens: Some(20),
            ..GenerationDefaults::default()
        };
        let r = SettingsRequest::default().resolve(&greedy_model, 128, || unreachable!());
        assert!(r.settings.sampling.is_greedy());
        assert_eq!((r.seed, r.settings.max_new_tokens), (None, 20));
        let asked = SettingsRequest {
            temperature: Some(0.8),
            seed: Some(7),
            ..SettingsRequest::default()
        };
        let r = asked.resolve(&greedy_model, usize::MAX, || unreachable!());
        let s = r.settings.sampling;
        assert_eq!((s.temperature, s.top_k, s.seed), (0.8, HF_TOP_K, 7));
        let r = SettingsRequest::default().resolve(&GenerationDefaults::default(), 99, || 0);
        assert_eq!(r.settings.max_new_tokens, 99, "the caller's fallback");
    }

    #[test]
    fn temperatures_too_small_to_divide_by_are_greedy() {
        for t in [1e-40, 1e-30, 5e-5] {
            let asked = SettingsRequest {
                temperature: Some(t),
                ..SettingsRequest::default()
            };
            let r = asked.resolve(&sampling_model(), 8, || unreachable!());
            assert!(r.settings.sampling.is_greedy(), "{t}");
            assert_eq!(r.seed, None);
        }
        assert_eq!(effective_temperature(GREEDY_BELOW), GREEDY_BELOW);
        assert_eq!(effective_temperature(-1.0), -1.0, "refused by the caller");
        assert!(effective_temperature(f32::NAN).is_nan());
    }

    #[test]
    fn temperature_zero_is_greedy_even_on_a_sampling_model() {
        let asked = SettingsRequest {
            temperature: Some(0.0),
            seed: Some(3),
            ..SettingsRequest::default()
        };
        let r = asked.resolve(&sampling_model(), 128, || unreachable!());
        assert!(r.settings.sampling.is_greedy());
        assert_eq!(r.seed, None);
    }
}
