//! Models from the Hugging Face hub: `gerbilc compile ORG/NAME` and `gerbilc
//! tune ORG/NAME` download the checkpoint into the standard hub cache and
//! compile it from there; any program can do the same through this crate.
//!
//! [`open_checkpoint`] takes what the user typed. An existing path is a local
//! checkpoint directory, used as it is (unless one of its files links
//! outside it: see [`HubOptions::allow_outside_links`]); otherwise a hub id
//! (`org/name`) is fetched: the repository's file list comes from the hub's
//! API (`/api/models/{repo}/revision/{rev}?blobs=true`), then `config.json`,
//! the weights (`model.safetensors`, or `model.safetensors.index.json` and
//! every shard it names) and whichever text assets the repository has are
//! downloaded by the crate's own client on `ureq`. The cache is
//! [`HubSettings::cache_dir`], else `HOME/hub` for [`HubSettings::home`]
//! (`gerbilc` passes `~/.cache/huggingface` when `HF_HOME` is unset), laid
//! out as Python's `huggingface_hub` lays it out, so either can reuse the
//! other's downloads;
//! [`HubSettings::endpoint`] names another hub and [`HubSettings::token`]
//! (else the token file, `HOME/token`) authenticates. The library reads no
//! environment variable: `gerbilc` fills [`HubSettings`] from
//! `HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT` and `HF_TOKEN`, as
//! `huggingface_hub` does. Downloads report their bytes and notes to an
//! optional [`HubHook`] ([`HubEvent`]); the library draws nothing.
//!
//! The surprising things: the revision is resolved to a commit once, and
//! every file is then fetched at that commit, so a branch that moves during
//! a download cannot mix two commits in one snapshot. The endpoint is not
//! trusted: every commit, blob id, file name and revision is checked before
//! it becomes a path (`names`), redirects and reads are bounded, and every
//! file is checked against the listing's size and (LFS files) sha256
//! before it takes its final name, and again when it is reused (`fetch`).
//! When the hub cannot be reached, a revision fetched completely before is
//! used from the cache (with a note). Errors the hub explains
//! (`X-Error-Code`: a missing repo, revision or file, a gated repo, a
//! refused token) become [`HubError`]s that say what to do.

mod cache;
mod client;
mod fetch;
mod names;

use gerbil_frontend_hf::{Checkpoint, FrontendError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The revision fetched when none is given.
pub const DEFAULT_REVISION: &str = "main";

/// Files a checkpoint may have beside its config and weights; fetched when
/// the repository lists them.
const OPTIONAL_FILES: [&str; 5] = [
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];
const CONFIG_FILE: &str = "config.json";
const SINGLE_WEIGHTS: &str = "model.safetensors";
const WEIGHTS_INDEX: &str = "model.safetensors.index.json";

/// How to fetch a hub model.
#[derive(Clone, Default)]
pub struct HubOptions {
    /// Branch, tag or commit (default: `main`); an error for a local directory.
    pub revision: Option<String>,
    /// Which GGUF file of a repository or directory to compile: its file
    /// name, or a quantization name (`Q4_K_M`) that names exactly one (see
    /// [`select_gguf`]). `ORG/NAME:QUANT` sets it too.
    pub gguf: Option<String>,
    /// Which hub, which cache, which token.
    pub settings: HubSettings,
    /// Told of each file's bytes and of notes (`None`: nothing is reported).
    pub hook: Option<HubHook>,
    /// Use a local checkpoint whose files link outside its directory
    /// (refused by default: see [`resolve`]).
    pub allow_outside_links: bool,
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("revision", &self.revision)
            .field("gguf", &self.gguf)
            .field("settings", &self.settings)
            .field("hook", &self.hook.is_some())
            .field("allow_outside_links", &self.allow_outside_links)
            .finish()
    }
}

/// Where the hub and its cache are: what `huggingface_hub` reads from `HF_ENDPOINT`,
/// `HF_HUB_CACHE`, `HF_HOME` and `HF_TOKEN` (empty values count as unset).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HubSettings {
    /// The hub's address (default: [`DEFAULT_ENDPOINT`]).
    pub endpoint: Option<String>,
    /// The cache directory itself (default: `HOME/hub`).
    pub cache_dir: Option<PathBuf>,
    /// The Hugging Face home: the cache's parent and the token file's directory
    /// (`huggingface_hub`'s default is `~/.cache/huggingface`; `gerbilc` passes it when
    /// `HF_HOME` is unset). Without it, `cache_dir` must be given, and no token file is read.
    pub home: Option<PathBuf>,
    /// The access token (default: the token file `HOME/token`, if there is one).
    pub token: Option<String>,
}

impl std::fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSettings")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("home", &self.home)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

/// What a fetch reports as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HubEvent<'a> {
    /// A file's download starts, or starts again after a dropped connection (a resumed
    /// attempt then reports the bytes it already has as its first [`HubEvent::Bytes`]).
    FileStart {
        /// The file's name in the repository.
        file: &'a str,
        /// Its size in bytes.
        size: u64,
    },
    /// More bytes of the file arrived.
    Bytes {
        /// The file's name in the repository.
        file: &'a str,
        /// Bytes since the last event.
        bytes: u64,
    },
    /// The file is complete.
    FileDone {
        /// The file's name in the repository.
        file: &'a str,
    },
    /// Something the user should read (the hub was unreachable and the cache served).
    Note(&'a str),
}

/// Receives a fetch's [`HubEvent`]s.
pub type HubHook = Arc<dyn Fn(HubEvent<'_>) + Send + Sync>;

/// Why [`open_checkpoint`] failed: finding or fetching the directory, or reading it.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be found or fetched.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The directory is not a checkpoint gerbil reads.
    #[error(transparent)]
    Checkpoint(#[from] FrontendError),
}

/// Why a model could not be found or fetched.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{arg}` is neither a directory nor a hub model id (ORG/NAME): check the path, or give an id such as HuggingFaceTB/SmolLM2-135M-Instruct")]
    NotFound { arg: String },
    #[error("--revision selects a revision of a hub model, but `{}` is a local directory: leave --revision out", dir.display())]
    RevisionOfLocalDir { dir: PathBuf },
    #[error("repository `{repo}` was not found on {endpoint} (nor is it a local directory): check the name{}", token_hint(*.has_token))]
    RepoNotFound {
        repo: String,
        endpoint: String,
        has_token: bool,
    },
    #[error("revision `{revision}` was not found in `{repo}`: check the branch, tag or commit name given to --revision")]
    RevisionNotFound { repo: String, revision: String },
    #[error("`{repo}` has no `{file}` at revision `{revision}`: {why}")]
    FileNotFound {
        repo: String,
        file: String,
        revision: String,
        why: &'static str,
    },
    #[error("`{repo}` has neither {SINGLE_WEIGHTS} nor {WEIGHTS_INDEX} at revision `{revision}`: gerbil reads safetensors checkpoints{}", found_weights(others))]
    NoSafetensors {
        repo: String,
        revision: String,
        others: Vec<String>,
    },
    #[error("{}", gguf_choice(repo, want.as_deref(), found, *several))]
    GgufChoice {
        /// The repository or directory.
        repo: String,
        /// What was asked for (`None`: nothing, and there is no other checkpoint).
        want: Option<String>,
        /// The GGUF files that match (several) or that there are (none match).
        found: Vec<String>,
        /// Whether several files matched (else none did).
        several: bool,
    },
    #[error("`{file}` of `{repo}` is one part of a split GGUF model; gerbil reads single-file GGUF models (merge the parts with llama.cpp's `llama-gguf-split --merge`)")]
    SplitGguf { repo: String, file: String },
    #[error("--gguf chooses a GGUF file of a directory or repository, but `{}` is a file: leave --gguf out", path.display())]
    GgufOfFile { path: PathBuf },
    #[error("`{repo}` is a gated model: accept its terms at {endpoint}/{repo} while logged in, then set HF_TOKEN to a read token of that account ({endpoint}/settings/tokens)")]
    Gated { repo: String, endpoint: String },
    #[error("`{repo}` is a gated model and the token ({token_source}) has no access to it: accept its terms at {endpoint}/{repo} with the token's account, or set HF_TOKEN to a token of an account that has")]
    GatedDenied {
        repo: String,
        endpoint: String,
        token_source: String,
    },
    #[error("the hub refused the token ({token_source}) for `{repo}` (HTTP {status}{}): check HF_TOKEN, or create a new read token at {endpoint}/settings/tokens", message_suffix(message))]
    TokenRefused {
        repo: String,
        endpoint: String,
        token_source: String,
        status: u16,
        message: String,
    },
    #[error("`{repo}` needs authentication (HTTP {status}{}): set HF_TOKEN to a read token ({endpoint}/settings/tokens)", message_suffix(message))]
    AuthRequired {
        repo: String,
        endpoint: String,
        status: u16,
        message: String,
    },
    #[error("the hub answered HTTP {status} for {url}{}", message_suffix(message))]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("could not reach the hub at {endpoint} ({detail}): check the network connection, or HF_ENDPOINT")]
    Unreachable { endpoint: String, detail: String },
    #[error("the hub's file list for `{repo}` ({url}) is not what the hub sends: {detail}")]
    BadListing {
        repo: String,
        url: String,
        detail: String,
    },
    #[error("downloading `{file}` of `{repo}` failed ({detail}): run the command again to resume it (the partial download is kept in the cache as blobs/*.part and is never used as the file)")]
    Interrupted {
        repo: String,
        file: String,
        detail: String,
    },
    #[error("downloaded `{file}` of `{repo}` has {got} bytes, but the hub lists {want}: the file was deleted from the cache; run the command again")]
    SizeMismatch {
        repo: String,
        file: String,
        got: u64,
        want: u64,
    },
    #[error("downloaded `{file}` of `{repo}` does not have the sha256 the hub lists (it names the blob {}): the file was deleted from the cache; run the command again, and if it fails the same way, the hub or HF_ENDPOINT serves wrong bytes", path.display())]
    HashMismatch {
        repo: String,
        file: String,
        path: PathBuf,
    },
    #[error("`{revision}` is not a revision name (letters, digits, `-`, `_`, `.` and `/` between non-empty parts, no `..`): check --revision")]
    BadRevision { revision: String },
    #[error("`{}` links to {}, outside the checkpoint's directory: copy the file into the directory, or pass --allow-outside-links if the link is meant", link.display(), target.display())]
    OutsideLink { link: PathBuf, target: PathBuf },
    #[error(
        "the hub redirected {url} more than {max} times (a redirect loop?): check HF_ENDPOINT"
    )]
    Redirects { url: String, max: u32 },
    #[error("`{}` in the hub cache links to {}, outside the cache: delete that snapshot directory and run the command again", link.display(), target.display())]
    CacheLink { link: PathBuf, target: PathBuf },
    #[error("no hub cache directory: set HF_HOME or HF_HUB_CACHE")]
    NoHome,
    #[error("the hub cache at {}: {source}", path.display())]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn gguf_choice(repo: &str, want: Option<&str>, found: &[String], several: bool) -> String {
    let list = found.join(", ");
    match want {
        Some(w) if several => format!(
            "`{w}` matches several GGUF files of `{repo}` ({list}): give the whole file name with --gguf"
        ),
        Some(w) if found.is_empty() => format!("`{repo}` has no GGUF file matching `{w}`"),
        Some(w) => format!("`{repo}` has no GGUF file matching `{w}`; it has {list}"),
        None => format!(
            "`{repo}` has no config.json and {} GGUF files ({list}): choose one with `{repo}:QUANT` (e.g. Q4_K_M) or --gguf FILE",
            found.len()
        ),
    }
}

fn token_hint(has_token: bool) -> &'static str {
    if has_token {
        "; if it is private, HF_TOKEN must be a token of an account that can read it"
    } else {
        ", or set HF_TOKEN if it is a private repository"
    }
}

fn found_weights(others: &[String]) -> String {
    if others.is_empty() {
        String::new()
    } else if others
        .iter()
        .any(|f| f.to_ascii_lowercase().ends_with(".gguf"))
    {
        format!(
            " (the repository has: {}; choose a GGUF file with ORG/NAME:QUANT or --gguf)",
            others.join(", ")
        )
    } else {
        format!(" (the repository has: {})", others.join(", "))
    }
}

fn message_suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// Opens the checkpoint `arg` names: a local directory, or a hub id fetched
/// into the cache first (see the module docs). A hub checkpoint is named
/// after the repository (`NAME` of `ORG/NAME`), as its directory would be.
pub fn open_checkpoint(arg: &Path, opts: &HubOptions) -> Result<Checkpoint, OpenError> {
    let model = resolve(arg, opts)?;
    let mut ckpt = Checkpoint::open(&model.dir)?;
    if let Some(name) = model.repo.as_deref().and_then(|r| r.rsplit('/').next()) {
        ckpt.name = name.to_string();
    }
    Ok(ckpt)
}

/// The GGUF file of `files` (names in a repository or directory) that
/// `want` chooses: the file called `want`, else the one whose name holds
/// `want` as a quantization name (`Q4_K_M` in `model-q4_k_m.gguf` or
/// `Model.Q4_K_M.gguf`: any case, after `-`, `.` or `_` and before `-` or
/// `.`, so `Q4_K` does not choose `q4_k_m`). With no `want`, the only GGUF
/// file. Parts of split models (`-00001-of-00003.gguf`) are refused.
pub fn select_gguf(repo: &str, files: &[String], want: Option<&str>) -> Result<String, HubError> {
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let matches: Vec<&String> = match want {
        Some(w) => match ggufs
            .iter()
            .find(|f| f.as_str() == w || f.rsplit('/').next() == Some(w))
        {
            Some(exact) => vec![*exact],
            None => ggufs
                .iter()
                .copied()
                .filter(|f| names_quant(f, w))
                .collect(),
        },
        None => ggufs.clone(),
    };
    match matches.as_slice() {
        [one] if is_split_part(one) => Err(HubError::SplitGguf {
            repo: repo.to_string(),
            file: one.to_string(),
        }),
        [one] => Ok(one.to_string()),
        _ => {
            let several = matches.len() > 1;
            let found = if several { &matches } else { &ggufs };
            Err(HubError::GgufChoice {
                repo: repo.to_string(),
                want: want.map(str::to_string),
                found: found.iter().map(|f| f.to_string()).collect(),
                several,
            })
        }
    }
}

/// Whether file name `f` holds quantization name `q` (see [`select_gguf`]).
fn names_quant(f: &str, q: &str) -> bool {
    let (f, q) = (f.to_ascii_lowercase(), q.to_ascii_lowercase());
    let name = f.rsplit('/').next().unwrap_or(&f);
    name.match_indices(&q).any(|(at, _)| {
        let before = name[..at].chars().next_back();
        let after = name[at + q.len()..].chars().next();
        matches!(before, Some('-' | '.' | '_')) && matches!(after, Some('-' | '.'))
    })
}

/// Whether `f` is one part of a split GGUF (`…-00001-of-00003.gguf`).
fn is_split_part(f: &str) -> bool {
    let stem = f.trim_end_matches(".gguf");
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    matches!(parts.as_slice(), [total, "of", part, _]
        if total.len() == 5 && part.len() == 5
            && total.bytes().chain(part.bytes()).all(|b| b.is_ascii_digit()))
}

/// `org/name:QUANT` split into the id and the quantization name.
fn split_quant(arg: &str) -> (&str, Option<&str>) {
    match arg.rsplit_once(':') {
        Some((repo, quant)) if is_repo_id(repo) && !quant.is_empty() => (repo, Some(quant)),
        _ => (arg, None),
    }
}

/// A checkpoint directory on disk.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The directory: the argument itself, or the snapshot in the hub cache.
    pub dir: PathBuf,
    /// The hub id it was fetched from (`None` for a local directory).
    pub repo: Option<String>,
}

/// Finds the checkpoint directory `arg` names, downloading a hub model that
/// is not in the cache yet: an existing path is used as it is, an `org/name`
/// that is not a path is a hub id.
pub fn resolve(arg: &Path, opts: &HubOptions) -> Result<ModelDir, HubError> {
    if arg.exists() {
        if opts.revision.is_some() {
            return Err(HubError::RevisionOfLocalDir {
                dir: arg.to_path_buf(),
            });
        }
        let dir = match opts.gguf.as_deref() {
            Some(_) if !arg.is_dir() => {
                return Err(HubError::GgufOfFile {
                    path: arg.to_path_buf(),
                })
            }
            Some(want) => arg.join(select_gguf(
                &arg.display().to_string(),
                &dir_files(arg)?,
                Some(want),
            )?),
            None => arg.to_path_buf(),
        };
        if !opts.allow_outside_links && arg.is_dir() {
            check_links(arg, arg, false)?;
        }
        return Ok(ModelDir { dir, repo: None });
    }
    let (id, quant) = arg.to_str().map_or((None, None), |s| {
        let (id, quant) = split_quant(s);
        (Some(id), quant)
    });
    let Some(repo) = id.filter(|s| is_repo_id(s)) else {
        return Err(HubError::NotFound {
            arg: arg.display().to_string(),
        });
    };
    let revision = opts.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    let want = opts.gguf.as_deref().or(quant);
    let dir = fetch::Hub::new(&opts.settings, opts.hook.clone())?.fetch(repo, revision, want)?;
    Ok(ModelDir {
        dir,
        repo: Some(repo.to_string()),
    })
}

/// Refuses a file of checkpoint directory `dir` that is a link resolving
/// outside `root` (a checkpoint someone else prepared could otherwise make
/// gerbil read any file the user can): `root` is `dir` itself for a local
/// checkpoint, the cache for a hub snapshot.
fn check_links(dir: &Path, root: &Path, in_cache: bool) -> Result<(), HubError> {
    let cache_error = |source| HubError::Cache {
        path: dir.to_path_buf(),
        source,
    };
    let root = std::fs::canonicalize(root).map_err(cache_error)?;
    for entry in std::fs::read_dir(dir).map_err(cache_error)?.flatten() {
        let link = entry.path();
        if !link.is_symlink() {
            continue;
        }
        // A dangling link is left to whoever reads it to report.
        if let Ok(target) = std::fs::canonicalize(&link) {
            if !target.starts_with(&root) {
                return Err(if in_cache {
                    HubError::CacheLink { link, target }
                } else {
                    HubError::OutsideLink { link, target }
                });
            }
        }
    }
    Ok(())
}

/// The names of the files in directory `dir`.
fn dir_files(dir: &Path) -> Result<Vec<String>, HubError> {
    let entries = std::fs::read_dir(dir).map_err(|source| HubError::Cache {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// Whether `s` has the shape of a hub model id: `org/name`, each part made
/// of ASCII letters, digits, `-`, `_` and `.`, neither starting nor ending
/// with `-` or `.`, and no `..` or `--`.
pub fn is_repo_id(s: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("..")
            && !p.contains("--")
    };
    matches!(s.split_once('/'), Some((org, name)) if part_ok(org) && part_ok(name))
}

#[cfg(test)]
mod tests {
    use super::{is_repo_id, select_gguf, split_quant, HubError};

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_quantization_name_chooses_one_gguf_file() {
        let repo = files(&[
            "README.md",
            "smollm2-135m-instruct-q4_k_m.gguf",
            "smollm2-135m-instruct-q4_k_s.gguf",
            "SmolLM2.Q8_0.gguf",
            "model-q5_1-00001-of-00002.gguf",
            "model-q5_1-00002-of-00002.gguf",
        ]);
        let pick = |w: Option<&str>| select_gguf("r", &repo, w);
        assert_eq!(pick(Some("Q4_K_M")).unwrap(), repo[1]);
        assert_eq!(pick(Some("q8_0")).unwrap(), repo[3]);
        assert_eq!(pick(Some("SmolLM2.Q8_0.gguf")).unwrap(), repo[3]);
        // `Q4_K` is not `q4_k_m` or `q4_k_s`.
        let e = pick(Some("Q4_K")).unwrap_err().to_string();
        assert!(e.contains("no GGUF file matching `Q4_K`"), "{e}");
        let e = pick(None).unwrap_err().to_string();
        assert!(e.contains("5 GGUF files") && e.contains(":QUANT"), "{e}");
        let e = pick(Some("q5_1")).unwrap_err().to_string();
        assert!(e.contains("`q5_1` matches several GGUF files"), "{e}");
        assert!(matches!(
            select_gguf("r", &repo[4..5], None),
            Err(HubError::SplitGguf { .. })
        ));
        assert_eq!(
            select_gguf("r", &files(&["config.json", "m.gguf"]), None).unwrap(),
            "m.gguf"
        );
    }

    #[test]
    fn a_quantization_after_the_id() {
        assert_eq!(split_quant("org/m:Q4_K_M"), ("org/m", Some("Q4_K_M")));
        assert_eq!(split_quant("org/m"), ("org/m", None));
        assert_eq!(split_quant("c:/dir"), ("c:/dir", None));
    }

    #[test]
    fn repo_ids_have_one_slash_and_hub_characters() {
        for ok in ["HuggingFaceTB/SmolLM2-135M-Instruct", "a/b", "org_1/m.v2"] {
            assert!(is_repo_id(ok), "{ok}");
        }
        for bad in [
            "gpt2",
            "a/b/c",
            "/abs",
            "org/",
            "./dir",
            "../x",
            "org/.hidden",
            "org/name-",
            "org/a..b",
            "org/a--b",
            "org/na me",
        ] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }
}
