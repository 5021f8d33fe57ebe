//! `gerbil-run ORG/NAME[:QUANT] …`: a hub model compiled on first use into
//! a plan cache and reused afterwards, as `ollama run` and `llama-cli -hf`
//! feel.
//!
//! [`plan_for`] resolves the model through the hub client (downloading it,
//! or taking it from the hub cache when the hub cannot be reached), then
//! looks for `plans/<NAME>-<key>.plan` under the gerbil cache
//! ([`crate::env::cache_root`]). The key hashes what decides the plan's
//! bytes: gerbil's version, the resolved snapshot (its path holds the
//! commit, and the GGUF file a quantization name chose) and the compile
//! options (the default `universal` target, whose plans carry the desktop
//! and the portable variants, so one plan serves any adapter). A miss compiles and writes the
//! plan through a temporary file renamed into place, so an interrupted
//! compile never leaves a partial plan to be found later.
//!
//! The surprise: the hash is std's SipHash with fixed keys, not a
//! cryptographic one. Its output may change with the Rust release that
//! builds gerbil, which only costs one recompile, and a collision would need
//! two different models of the same name and version in one cache.

use crate::progress::Progress;
use anyhow::{Context, Result};
use gerbil_compiler::Checkpoint;
use gerbil_compiler::{check_text_assets, compile, CompileOptions};
use gerbil_hub::{resolve, HubOptions};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Whether `arg` names a hub model rather than a plan file: it is no
/// existing path, does not end in `.plan` (a missing plan file stays an
/// error about that file) and has the shape `ORG/NAME` or `ORG/NAME:QUANT`.
pub fn is_hub_model(arg: &Path) -> bool {
    if arg.exists() || arg.extension().is_some_and(|e| e == "plan") {
        return false;
    }
    let Some(s) = arg.to_str() else { return false };
    let id = s.rsplit_once(':').map_or(s, |(id, _)| id);
    gerbil_hub::is_repo_id(id)
}

/// The options every cached plan is compiled with: the defaults.
fn options() -> CompileOptions {
    CompileOptions::default()
}

/// The cached plan of hub model `arg` (`ORG/NAME[:QUANT]`), compiled and
/// written first if the cache lacks it. `progress` draws the download bars
/// and reports the compile on standard error.
pub fn plan_for(arg: &Path, progress: Progress) -> Result<PathBuf> {
    let hub: HubOptions = crate::hub_env::hub_options(None, None, progress, false);
    let model = resolve(arg, &hub)?;
    let root = crate::env::cache_root().context(
        "no cache directory for compiled plans: set GERBIL_CACHE_DIR (or HOME), or compile \
         with `gerbilc compile ORG/NAME -o model.plan` and run that file",
    )?;
    let dir = root.join("plans");
    let name = model
        .repo
        .as_deref()
        .and_then(|r| r.rsplit('/').next())
        .unwrap_or("model");
    let opts = options();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    model.dir.hash(&mut h);
    opts.target.name.hash(&mut h);
    let plan = dir.join(format!("{name}-{:016x}.plan", h.finish()));
    if plan.is_file() {
        return Ok(plan);
    }
    crate::console::note(&format!(
        "compiling {} for the first time into {} (later runs reuse it)",
        arg.display(),
        plan.display()
    ));
    let mut ckpt = Checkpoint::open(&model.dir)?;
    ckpt.name = name.to_string();
    check_text_assets(&ckpt, crate::env::template_sandbox())?;
    let compiled = compile(&ckpt, &opts, &mut ())?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = dir.join(format!(".{}.{}.partial", name, std::process::id()));
    compiled
        .plan
        .write(&partial)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &plan)
        .with_context(|| format!("moving the plan to {}", plan.display()))?;
    Ok(plan)
}
