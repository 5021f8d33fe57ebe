//! Fetching one revision of a hub repository into the cache ([`Hub`]):
//! the file list at the commit the revision names, then each file the
//! checkpoint needs — found in the cache and checked, or downloaded through
//! [`Client`] and checked before it takes its final name.
//!
//! A file's blob is named by the listing: an LFS file's sha256, else its
//! git object id ([`crate::names::is_blob_id`]). A blob named by a sha256 is
//! hashed whenever it is used — downloaded, found in the cache, or served
//! offline — so a blob corrupted in place (same size) is caught and fetched
//! again; every blob's size must be the listing's. The surprise: the
//! commit, blob ids and file names all come from the endpoint, and each is
//! checked before it becomes a path, since a mirror can answer anything.

use crate::cache::{cache_error, CacheDir};
use crate::client::{Client, RepoInfo};
use crate::names::{is_blob_id, is_commit, is_file_name};
use crate::{
    check_links, dir_files, select_gguf, HubError, HubEvent, HubHook, HubSettings, CONFIG_FILE,
    DEFAULT_ENDPOINT, OPTIONAL_FILES, SINGLE_WEIGHTS, WEIGHTS_INDEX,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The shard names of a `model.safetensors.index.json`.
#[derive(Debug, Deserialize)]
struct WeightIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The hub as [`HubSettings`] configure it.
pub(crate) struct Hub {
    client: Client,
    cache: CacheDir,
    hook: Option<HubHook>,
}

impl Hub {
    pub(crate) fn new(settings: &HubSettings, hook: Option<HubHook>) -> Result<Hub, HubError> {
        let endpoint = settings
            .endpoint
            .as_deref()
            .filter(|e| !e.is_empty())
            .unwrap_or(DEFAULT_ENDPOINT)
            .trim_end_matches('/')
            .to_string();
        let home = settings.home.as_ref().filter(|h| !h.as_os_str().is_empty());
        let root = match (settings.cache_dir.as_ref(), home) {
            (Some(dir), _) if !dir.as_os_str().is_empty() => dir.clone(),
            (_, Some(home)) => home.join("hub"),
            _ => return Err(HubError::NoHome),
        };
        let token_file = home.map(|h| h.join("token"));
        let (token, token_source) = match settings.token.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => (Some(t.to_string()), Some("HF_TOKEN".into())),
            _ => match token_file.as_ref().map(std::fs::read_to_string) {
                Some(Ok(t)) if !t.trim().is_empty() => (
                    Some(t.trim().to_string()),
                    token_file.map(|f| format!("the token file {}", f.display())),
                ),
                _ => (None, None),
            },
        };
        Ok(Hub {
            client: Client::new(endpoint, token, token_source),
            cache: CacheDir::new(root),
            hook,
        })
    }

    fn note(&self, text: &str) {
        if let Some(hook) = &self.hook {
            hook(HubEvent::Note(text));
        }
    }

    /// Downloads what a checkpoint needs from `repo` at `revision` (files
    /// already in the cache are checked and kept) and returns the snapshot
    /// directory, or the GGUF file `gguf` chooses ([`select_gguf`]; also the
    /// only GGUF file of a repository without `config.json`).
    pub(crate) fn fetch(
        &self,
        repo: &str,
        revision: &str,
        gguf: Option<&str>,
    ) -> Result<PathBuf, HubError> {
        crate::names::check_revision(revision)?;
        let found = self.fetch_files(repo, revision, gguf)?;
        // Every link of the snapshot stays in the cache, also one this run
        // did not make.
        let snapshot = if found.is_dir() {
            found.as_path()
        } else {
            found.parent().unwrap_or(&found)
        };
        check_links(snapshot, self.cache.root(), true)?;
        Ok(found)
    }

    /// [`Hub::fetch`]'s downloads (or the cache's copy when the hub is
    /// unreachable).
    fn fetch_files(
        &self,
        repo: &str,
        revision: &str,
        gguf: Option<&str>,
    ) -> Result<PathBuf, HubError> {
        let info = match self.client.info(repo, revision) {
            Ok(info) => info,
            Err(HubError::Unreachable { endpoint, detail }) => {
                let Some(dir) = self.cached(repo, revision, gguf)? else {
                    return Err(HubError::Unreachable { endpoint, detail });
                };
                self.note(&format!(
                    "note: the hub at {endpoint} is unreachable ({detail}); using the cached {repo} at `{revision}` ({})",
                    dir.display()
                ));
                return Ok(dir);
            }
            Err(e) => return Err(e),
        };
        if !is_commit(&info.sha) {
            return Err(self.bad_listing(
                repo,
                revision,
                format!(
                    "`{}` is not a commit (40 hex digits)",
                    info.sha.escape_debug()
                ),
            ));
        }
        let names: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
        let has_gguf = names
            .iter()
            .any(|f| f.to_ascii_lowercase().ends_with(".gguf"));
        let snapshot = self.cache.snapshot(repo, &info.sha);
        if gguf.is_some() || (info.file(CONFIG_FILE).is_none() && has_gguf) {
            let file = select_gguf(repo, &names, gguf)?;
            self.download(repo, revision, &info, &file)?;
            self.cache.write_ref(repo, revision, &info.sha)?;
            return Ok(snapshot.join(file));
        }
        let mut files = vec![CONFIG_FILE];
        if info.file(CONFIG_FILE).is_none() {
            return Err(HubError::FileNotFound {
                repo: repo.to_string(),
                file: CONFIG_FILE.to_string(),
                revision: revision.to_string(),
                why:
                    "gerbil compiles transformers checkpoints (config.json and safetensors weights)",
            });
        }
        let index = if info.file(SINGLE_WEIGHTS).is_some() {
            files.push(SINGLE_WEIGHTS);
            false
        } else if info.file(WEIGHTS_INDEX).is_some() {
            files.push(WEIGHTS_INDEX);
            true
        } else {
            let others = names
                .iter()
                .filter(|f| {
                    [".bin", ".gguf", ".pt", ".pth", ".h5"]
                        .iter()
                        .any(|e| f.ends_with(e))
                })
                .cloned()
                .collect();
            return Err(HubError::NoSafetensors {
                repo: repo.to_string(),
                revision: revision.to_string(),
                others,
            });
        };
        files.extend(OPTIONAL_FILES.iter().filter(|f| info.file(f).is_some()));
        tracing::info!(repo, revision, commit = %info.sha, snapshot = %snapshot.display(), "hub model");
        for file in &files {
            self.download(repo, revision, &info, file)?;
        }
        if index {
            for shard in self.shards(repo, revision, &info, &snapshot.join(WEIGHTS_INDEX))? {
                self.download(repo, revision, &info, &shard)?;
            }
        }
        self.cache.write_ref(repo, revision, &info.sha)?;
        Ok(snapshot)
    }

    fn bad_listing(&self, repo: &str, revision: &str, detail: String) -> HubError {
        HubError::BadListing {
            repo: repo.to_string(),
            url: format!(
                "{}/api/models/{repo}/revision/{revision}",
                self.client.endpoint()
            ),
            detail,
        }
    }

    /// What an earlier complete fetch of `repo` at `revision` left: the
    /// snapshot with its `config.json`, or the GGUF file `gguf` chooses in
    /// it, each of its blobs named by a sha256 checked against it.
    fn cached(
        &self,
        repo: &str,
        revision: &str,
        gguf: Option<&str>,
    ) -> Result<Option<PathBuf>, HubError> {
        let Some(commit) = self.cache.read_ref(repo, revision) else {
            return Ok(None);
        };
        let snapshot = self.cache.snapshot(repo, &commit);
        let found = if gguf.is_none() && snapshot.join(CONFIG_FILE).is_file() {
            Some(snapshot.clone())
        } else {
            dir_files(&snapshot)
                .ok()
                .and_then(|files| select_gguf(repo, &files, gguf).ok())
                .map(|f| snapshot.join(f))
        };
        let Some(found) = found else {
            return Ok(None);
        };
        for entry in std::fs::read_dir(&snapshot)
            .map_err(|e| cache_error(&snapshot, e))?
            .flatten()
        {
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let blob = target.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if blob.len() == 64 && is_blob_id(blob) {
                let file = entry.file_name().to_string_lossy().into_owned();
                if !matches_blob(&entry.path(), blob, None)? {
                    return Err(HubError::HashMismatch {
                        repo: repo.to_string(),
                        file,
                        path: entry.path(),
                    });
                }
            }
        }
        Ok(Some(found))
    }

    /// The shard files a downloaded index names; each must be a plain file
    /// name the repository lists.
    fn shards(
        &self,
        repo: &str,
        revision: &str,
        info: &RepoInfo,
        index: &Path,
    ) -> Result<Vec<String>, HubError> {
        let text = std::fs::read_to_string(index).map_err(|e| cache_error(index, e))?;
        let bad = |detail: String| HubError::BadListing {
            repo: repo.to_string(),
            url: index.display().to_string(),
            detail,
        };
        let parsed: WeightIndex = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let mut shards: Vec<String> = parsed.weight_map.into_values().collect();
        shards.sort_unstable();
        shards.dedup();
        for shard in &shards {
            if info.file(shard).is_none() || shard.contains(['/', '\\']) {
                return Err(HubError::FileNotFound {
                    repo: repo.to_string(),
                    file: shard.clone(),
                    revision: revision.to_string(),
                    why: "model.safetensors.index.json names it as a shard, but the repository does not list it",
                });
            }
        }
        Ok(shards)
    }

    /// Puts `file` of `repo` at the listing's commit into its snapshot: the
    /// cached blob if it checks out, else a download checked before it is
    /// renamed into place.
    fn download(
        &self,
        repo: &str,
        revision: &str,
        info: &RepoInfo,
        file: &str,
    ) -> Result<(), HubError> {
        let listed = info.file(file).ok_or_else(|| HubError::FileNotFound {
            repo: repo.to_string(),
            file: file.to_string(),
            revision: revision.to_string(),
            why: "the repository does not list it",
        })?;
        let bad = |detail: String| self.bad_listing(repo, revision, detail);
        if !is_file_name(file) {
            return Err(bad(format!("`{}` is not a file name", file.escape_debug())));
        }
        let (blob, size) = match (&listed.lfs, &listed.blob_id, listed.size) {
            (Some(lfs), _, _) => (lfs.sha256.as_str(), lfs.size),
            (None, Some(id), Some(size)) => (id.as_str(), size),
            _ => {
                return Err(bad(format!(
                    "no blob id and size for `{file}` (the endpoint must answer `?blobs=true`)"
                )))
            }
        };
        if !is_blob_id(blob) {
            return Err(bad(format!(
                "`{}` is not a blob id (40 or 64 hex digits) for `{file}`",
                blob.escape_debug()
            )));
        }
        let commit = &info.sha;
        let final_blob = self.cache.blob(repo, blob);
        if final_blob.is_file() {
            if matches_blob(&final_blob, blob, Some(size))? {
                tracing::debug!(file, "in the hub cache");
                self.cache.link(repo, commit, file, blob)?;
                return Ok(());
            }
            self.note(&format!(
                "note: the cached `{file}` of {repo} does not match the hub's {}; downloading it again",
                if blob.len() == 64 { "sha256" } else { "size" }
            ));
            std::fs::remove_file(&final_blob).map_err(|e| cache_error(&final_blob, e))?;
        }
        let part = self.cache.part(repo, blob);
        if let Some(parent) = part.parent() {
            std::fs::create_dir_all(parent).map_err(|e| cache_error(parent, e))?;
        }
        self.client
            .download(repo, commit, file, size, &part, self.hook.as_ref())?;
        if !matches_blob(&part, blob, Some(size))? {
            let got = std::fs::metadata(&part).map_or(0, |m| m.len());
            let _ = std::fs::remove_file(&part);
            return Err(if got != size {
                HubError::SizeMismatch {
                    repo: repo.to_string(),
                    file: file.to_string(),
                    got,
                    want: size,
                }
            } else {
                HubError::HashMismatch {
                    repo: repo.to_string(),
                    file: file.to_string(),
                    path: final_blob,
                }
            });
        }
        std::fs::rename(&part, &final_blob).map_err(|e| cache_error(&final_blob, e))?;
        self.cache.link(repo, commit, file, blob)?;
        tracing::info!(file, bytes = size, "downloaded");
        Ok(())
    }
}

/// Whether the file at `path` is blob `blob`: `size` bytes where given,
/// and, for a blob named by a sha256, bytes of that hash.
fn matches_blob(path: &Path, blob: &str, size: Option<u64>) -> Result<bool, HubError> {
    let len = std::fs::metadata(path)
        .map_err(|e| cache_error(path, e))?
        .len();
    if size.is_some_and(|s| s != len) {
        return Ok(false);
    }
    if blob.len() != 64 {
        return Ok(true);
    }
    let mut file = std::fs::File::open(path).map_err(|e| cache_error(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| cache_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(hex == blob)
}
