//! The hub cache on disk, laid out as Python's `huggingface_hub` lays it
//! out so either can reuse the other's downloads:
//! `models--ORG--NAME/blobs/{blob id}` holds each file's bytes once,
//! `snapshots/{commit}/{file}` links to its blob, `refs/{revision}` holds
//! the commit a branch or tag named when it was fetched.
//!
//! [`CacheDir`] only joins names [`crate::names`] has checked (commits,
//! blob ids, revisions, file names), so no path it makes leaves the cache.
//! The surprise: a download goes to `blobs/{id}.part` and is renamed to its
//! final name only once complete and checked, so a blob under its final
//! name is always whole — which is also why a `.part` file can be resumed.

use crate::HubError;
use std::path::{Path, PathBuf};

/// One hub cache directory.
#[derive(Clone, Debug)]
pub(crate) struct CacheDir {
    root: PathBuf,
}

impl CacheDir {
    pub(crate) fn new(root: PathBuf) -> CacheDir {
        CacheDir { root }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// `snapshots/{commit}` of `repo`.
    pub(crate) fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// `blobs/{blob}` of `repo`.
    pub(crate) fn blob(&self, repo: &str, blob: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(blob)
    }

    /// Where `blob` downloads until it is complete.
    pub(crate) fn part(&self, repo: &str, blob: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{blob}.part"))
    }

    /// The commit `refs/{revision}` recorded, if it holds one.
    pub(crate) fn read_ref(&self, repo: &str, revision: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.repo_dir(repo).join("refs").join(revision)).ok()?;
        let commit = text.trim();
        crate::names::is_commit(commit).then(|| commit.to_string())
    }

    /// Records that `revision` of `repo` is `commit`.
    pub(crate) fn write_ref(
        &self,
        repo: &str,
        revision: &str,
        commit: &str,
    ) -> Result<(), HubError> {
        let path = self.repo_dir(repo).join("refs").join(revision);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| cache_error(parent, e))?;
        }
        std::fs::write(&path, commit).map_err(|e| cache_error(&path, e))
    }

    /// Links `snapshots/{commit}/{file}` to `blobs/{blob}` (relatively, as
    /// `huggingface_hub` does) and returns the link's path.
    pub(crate) fn link(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        blob: &str,
    ) -> Result<PathBuf, HubError> {
        let link = self.snapshot(repo, commit).join(file);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(|e| cache_error(parent, e))?;
        }
        // `snapshots/{commit}/` plus one level per directory of `file`.
        let up = "../".repeat(2 + file.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{blob}"));
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(cache_error(&link, e)),
        }
        symlink(&target, &link).map_err(|e| cache_error(&link, e))?;
        Ok(link)
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_file(target, link)
}

/// A failed file operation in the cache.
pub(crate) fn cache_error(path: &Path, source: std::io::Error) -> HubError {
    HubError::Cache {
        path: path.to_path_buf(),
        source,
    }
}
