//! The generation flags `gerbil-run` shares between a plain run and `chat`
//! (`--temperature`, `--top-k`, `--stop`, `--seed`, …), and how they combine
//! with the model's own recommendations into `GenerationSettings` (through
//! the resolver the server uses too, [`SettingsRequest::resolve`]).
//!
//! A flag wins; a flag not given takes the plan's `generation_config.json`
//! value; a value neither sets takes transformers' default — so a model
//! whose config says `do_sample: true` samples by default, as
//! `model.generate()` does. The surprise: flags that would change nothing are
//! errors, not silently dropped — `--top-p` while decoding greedily, for
//! instance, says to add `--temperature`.

use crate::numbers::{whole_u64, whole_usize};
use anyhow::{bail, Result};
use clap::Args;
use gerbil::{ResolvedSettings, SettingsRequest};
use gerbil_plan::GenerationDefaults;

/// Tokens generated when neither `--max-new-tokens` nor the model's
/// generation config says how many.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 128;

/// How tokens are chosen and when generation ends.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct SamplingArgs {
    /// Most tokens to generate [default: the model's generation config, else
    /// 128]; fewer when the context ends first (finish reason `length`).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole_usize)]
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature; 0 (or anything below 1e-4) is greedy [default:
    /// the model's generation config: its temperature when it samples
    /// (`do_sample`), else greedy].
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// When sampling: only the K most likely tokens (0: all) [default: the
    /// model's, else 50 as in transformers].
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = whole_usize)]
    pub top_k: Option<usize>,
    /// When sampling: the most likely tokens holding probability P (1: all).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// When sampling: tokens at least M times as likely as the best (0: all).
    #[arg(long, value_name = "M", allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// transformers' repetition penalty (1: off): logits of tokens already in
    /// the context are divided by it (multiplied when negative).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// OpenAI's presence penalty in [-2, 2]: subtracted from the logit of
    /// every token generated so far.
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty in [-2, 2]: subtracted once per time a
    /// token was generated.
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// When sampling: the random seed (the same seed gives the same text)
    /// [default: a random one, shown with -v].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = whole_u64)]
    pub seed: Option<u64>,
    /// End the text where this string appears (left out); repeatable.
    #[arg(long = "stop", value_name = "STR")]
    pub stop: Vec<String>,
    /// Do not stop at the model's end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// Whether any flag was given (they do not apply to some commands).
    pub fn any_given(&self) -> bool {
        *self != SamplingArgs::default()
    }

    /// The flags as a request to the one settings resolver.
    fn request(&self) -> SettingsRequest {
        SettingsRequest {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        }
    }

    /// Combines the flags with the model's `defaults`
    /// ([`SettingsRequest::resolve`], as the server does); errors name a flag
    /// that would change nothing.
    pub fn resolve(&self, defaults: &GenerationDefaults) -> Result<ResolvedSettings> {
        let request = self.request();
        if request.temperature(defaults) == 0.0 {
            let only_when_sampling = [
                ("--top-k", self.top_k.is_some()),
                ("--top-p", self.top_p.is_some()),
                ("--min-p", self.min_p.is_some()),
                ("--seed", self.seed.is_some()),
            ];
            if let Some((flag, _)) = only_when_sampling.iter().find(|(_, given)| *given) {
                let why = match self.temperature {
                    Some(t) => format!(
                        "--temperature {t} decodes greedily (as any below {})",
                        gerbil::GREEDY_BELOW
                    ),
                    None => "the model's generation config does not sample, so decoding is greedy"
                        .to_string(),
                };
                bail!("{flag} only applies when sampling, and {why}: add --temperature T (T > 0), or drop {flag}");
            }
        }
        Ok(request.resolve(defaults, DEFAULT_MAX_NEW_TOKENS, rand::random))
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
    fn the_model_config_fills_what_flags_leave_out() {
        let r = SamplingArgs::default().resolve(&sampling_model()).unwrap();
        let s = r.settings.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p), (0.6, 50, 0.9));
        assert_eq!(Some(s.seed), r.seed, "a drawn seed is reported");
        let args = SamplingArgs {
            temperature: Some(0.0),
            ..SamplingArgs::default()
        };
        let r = args.resolve(&sampling_model()).unwrap();
        assert!(r.settings.sampling.is_greedy());
        assert_eq!(r.seed, None);
        let greedy_model = GenerationDefaults::default();
        let r = SamplingArgs::default().resolve(&greedy_model).unwrap();
        assert!(r.settings.sampling.is_greedy());
        assert_eq!(r.settings.max_new_tokens, DEFAULT_MAX_NEW_TOKENS);
        let args = SamplingArgs {
            temperature: Some(0.8),
            seed: Some(7),
            max_new_tokens: Some(3),
            ..SamplingArgs::default()
        };
        let r = args.resolve(&greedy_model).unwrap();
        assert_eq!(r.settings.sampling.seed, 7);
        assert_eq!(r.settings.sampling.top_k, 50);
        assert_eq!(r.settings.max_new_tokens, 3);
    }

    #[test]
    fn sampling_flags_while_greedy_are_errors() {
        let args = SamplingArgs {
            top_p: Some(0.9),
            ..SamplingArgs::default()
        };
        let e = args.resolve(&GenerationDefaults::default()).unwrap_err();
        assert!(
            e.to_string().contains("--top-p only applies when sampling"),
            "{e}"
        );
        assert!(e.to_string().contains("add --temperature"), "{e}");
        let args = SamplingArgs {
            seed: Some(1),
            temperature: Some(0.0),
            ..SamplingArgs::default()
        };
        let e = args.resolve(&sampling_model()).unwrap_err();
        assert!(
            e.to_string().contains("--temperature 0 decodes greedily"),
            "{e}"
        );
    }
}
