//! The Hugging Face environment variables, read once for the hub client:
//! `HF_ENDPOINT`, `HF_HUB_CACHE`, `HF_HOME` and `HF_TOKEN`, as Python's
//! `huggingface_hub` reads them, and download bars for its events.
//!
//! `gerbilc compile ORG/NAME` and `gerbilc tune ORG/NAME` call
//! [`hub_options`]; the `gerbil-hub` library itself reads no environment, so
//! a program embedding it decides where its settings come from. The
//! surprise: an empty variable counts as unset, as in `huggingface_hub`.

use crate::progress::Progress;
use gerbil_hub::{HubEvent, HubHook, HubOptions, HubSettings};
use indicatif::ProgressBar;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The hub's settings from the environment.
pub fn hub_settings() -> HubSettings {
    use crate::env::var;
    HubSettings {
        endpoint: var("HF_ENDPOINT").map(|v| v.to_string_lossy().into_owned()),
        cache_dir: var("HF_HUB_CACHE").map(Into::into),
        // `huggingface_hub`'s default home, `~/.cache/huggingface`.
        home: var("HF_HOME")
            .map(Into::into)
            .or_else(|| std::env::home_dir().map(|h| h.join(".cache").join("huggingface"))),
        token: var("HF_TOKEN").map(|v| v.to_string_lossy().into_owned()),
    }
}

/// Options to fetch `revision` (and the GGUF file `gguf` chooses) with the
/// environment's settings, drawing a bar per downloaded file (hidden when
/// `progress` is quiet) and printing the hub's notes; a local checkpoint
/// may link outside its directory only with `allow_outside_links`.
pub fn hub_options(
    revision: Option<String>,
    gguf: Option<String>,
    progress: Progress,
    allow_outside_links: bool,
) -> HubOptions {
    HubOptions {
        revision,
        gguf,
        settings: hub_settings(),
        hook: Some(download_bars(progress)),
        allow_outside_links,
    }
}

/// A hook that draws one bar per file: made at its first attempt, reset at
/// a retry, cleared when it completes.
fn download_bars(progress: Progress) -> HubHook {
    let bars: Mutex<HashMap<String, ProgressBar>> = Mutex::default();
    Arc::new(move |event| {
        let mut bars = bars.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            HubEvent::FileStart { file, size } => {
                let bar = bars
                    .entry(file.to_string())
                    .or_insert_with(|| progress.bytes(file, size));
                bar.set_length(size);
                bar.set_position(0);
            }
            HubEvent::Bytes { file, bytes } => {
                if let Some(bar) = bars.get(file) {
                    bar.inc(bytes);
                }
            }
            HubEvent::FileDone { file } => {
                if let Some(bar) = bars.remove(file) {
                    bar.finish_and_clear();
                }
            }
            HubEvent::Note(text) => crate::console::note(text),
        }
    })
}
