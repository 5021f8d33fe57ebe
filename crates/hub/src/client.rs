//! The hub's HTTP side, on `ureq`: the revision's file list
//! ([`Client::info`]) and one file's bytes into a `.part` file, resumed
//! with `Range` requests ([`Client::download`]); failures become the
//! [`HubError`]s that say what to do ([`Client::explain`], from the hub's
//! `X-Error-Code` and the status).
//!
//! Nothing the endpoint sends is trusted further than it must be:
//! redirects are followed at most [`MAX_REDIRECTS`] times (a missing
//! `Location` is an error, not a panic; the token never follows a redirect
//! to another host), every request has connect and read timeouts, a body
//! is read no further than the size the listing gave, and a `206` must
//! start where the `.part` file ends. The surprise: the first request
//! asks for `bytes=0-` too, so the hub's CDN answers every attempt the
//! same way (`206`), and a `200` — a server that ignores ranges — simply
//! starts the file over.

use crate::{HubError, HubEvent, HubHook};
use serde::Deserialize;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// Redirects followed per request (the hub sends one, to its CDN).
pub(crate) const MAX_REDIRECTS: u32 = 5;
/// Times a dropped download is retried, each from where it stopped.
const RETRIES: usize = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest silence while reading a response.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes copied between progress reports.
const CHUNK: usize = 1 << 16;

/// The hub's description of one revision of a repository
/// (`/api/models/{repo}/revision/{rev}?blobs=true`).
#[derive(Debug, Deserialize)]
pub(crate) struct RepoInfo {
    /// The commit the revision resolves to.
    pub(crate) sha: String,
    pub(crate) siblings: Vec<Sibling>,
}

/// One file of a [`RepoInfo`].
#[derive(Debug, Deserialize)]
pub(crate) struct Sibling {
    pub(crate) rfilename: String,
    /// Present with `blobs=true`.
    pub(crate) size: Option<u64>,
    /// The git object id (present with `blobs=true`).
    #[serde(rename = "blobId")]
    pub(crate) blob_id: Option<String>,
    /// An LFS file's sha256 and size.
    pub(crate) lfs: Option<Lfs>,
}

/// An LFS pointer: the file's sha256 and size.
#[derive(Debug, Deserialize)]
pub(crate) struct Lfs {
    pub(crate) sha256: String,
    pub(crate) size: u64,
}

impl RepoInfo {
    pub(crate) fn file(&self, name: &str) -> Option<&Sibling> {
        self.siblings.iter().find(|s| s.rfilename == name)
    }
}

/// An HTTP client of one hub endpoint.
pub(crate) struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
    /// Where the token came from (`HF_TOKEN` or the token file), if any.
    pub(crate) token_source: Option<String>,
}

impl Client {
    pub(crate) fn new(
        endpoint: String,
        token: Option<String>,
        token_source: Option<String>,
    ) -> Client {
        let agent = ureq::AgentBuilder::new()
            .redirects(MAX_REDIRECTS)
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout_read(READ_TIMEOUT)
            .try_proxy_from_env(true)
            .user_agent(&format!("gerbil/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent,
            endpoint,
            token,
            token_source,
        }
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn get(&self, url: &str) -> ureq::Request {
        let request = self.agent.get(url);
        match &self.token {
            Some(t) => request.set("Authorization", &format!("Bearer {t}")),
            None => request,
        }
    }

    /// The file list of `repo` at `revision`, with sizes and blob ids.
    pub(crate) fn info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HubError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.endpoint,
            revision.replace('/', "%2F")
        );
        let response = self
            .get(&url)
            .call()
            .map_err(|e| self.explain(e, repo, revision, None))?;
        let bad = |detail: String| HubError::BadListing {
            repo: repo.to_string(),
            url: url.clone(),
            detail,
        };
        if response.status() != 200 {
            return Err(bad(format!(
                "HTTP {} instead of the list",
                response.status()
            )));
        }
        let text = response.into_string().map_err(|e| bad(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
    }

    /// Downloads `file` of `repo` at `commit` (`size` bytes) into `part`,
    /// resuming from the bytes it holds and retrying a dropped connection
    /// [`RETRIES`] times.
    pub(crate) fn download(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        size: u64,
        part: &Path,
        hook: Option<&HubHook>,
    ) -> Result<(), HubError> {
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            file.split('/')
                .map(encode_segment)
                .collect::<Vec<_>>()
                .join("/")
        );
        let report = |event: HubEvent<'_>| {
            if let Some(hook) = hook {
                hook(event);
            }
        };
        let interrupted = |detail: String| HubError::Interrupted {
            repo: repo.to_string(),
            file: file.to_string(),
            detail,
        };
        let mut last = String::new();
        for _ in 0..=RETRIES {
            let have = std::fs::metadata(part).map_or(0, |m| m.len()).min(size);
            report(HubEvent::FileStart { file, size });
            if have == size {
                // Complete but never checked (an earlier run stopped there).
                report(HubEvent::Bytes { file, bytes: size });
                report(HubEvent::FileDone { file });
                return Ok(());
            }
            let response = match self
                .get(&url)
                .set("Range", &format!("bytes={have}-"))
                .call()
            {
                Ok(r) => r,
                Err(ureq::Error::Transport(t)) if t.kind() != ureq::ErrorKind::TooManyRedirects => {
                    last = t.to_string();
                    continue;
                }
                Err(e) => return Err(self.explain(e, repo, commit, Some(file))),
            };
            let from = match response.status() {
                206 if content_range_start(response.header("content-range")) == Some(have) => have,
                206 => {
                    // A range that does not start where the file stopped:
                    // start the file over.
                    let _ = std::fs::remove_file(part);
                    last = "the hub answered a range other than the one asked for".into();
                    continue;
                }
                200 => 0,
                status => {
                    return Err(HubError::Http {
                        url: response.get_url().to_string(),
                        status,
                        message: "expected the file's bytes".into(),
                    })
                }
            };
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(from > 0)
                .write(true)
                .truncate(from == 0)
                .open(part)
                .map_err(|e| crate::cache::cache_error(part, e))?;
            if from > 0 {
                report(HubEvent::Bytes { file, bytes: from });
            }
            // One byte past the size, to notice a body that is too long.
            let mut body = response.into_reader().take(size - from + 1);
            let mut buf = vec![0u8; CHUNK];
            let mut got = from;
            let read = loop {
                match body.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        out.write_all(&buf[..n])
                            .map_err(|e| crate::cache::cache_error(part, e))?;
                        got += n as u64;
                        report(HubEvent::Bytes {
                            file,
                            bytes: n as u64,
                        });
                    }
                    Err(e) => break Err(e),
                }
            };
            out.flush()
                .map_err(|e| crate::cache::cache_error(part, e))?;
            match read {
                Ok(()) if got == size => {
                    report(HubEvent::FileDone { file });
                    return Ok(());
                }
                Ok(()) if got > size => {
                    return Err(HubError::SizeMismatch {
                        repo: repo.to_string(),
                        file: file.to_string(),
                        got,
                        want: size,
                    })
                }
                Ok(()) => last = format!("the connection closed after {got} of {size} bytes"),
                Err(e) => last = e.to_string(),
            }
        }
        Err(interrupted(last))
    }

    /// Turns a failed request into the error that says what to do, from the
    /// hub's `X-Error-Code` and the status.
    pub(crate) fn explain(
        &self,
        error: ureq::Error,
        repo: &str,
        revision: &str,
        file: Option<&str>,
    ) -> HubError {
        let response = match error {
            ureq::Error::Status(_, response) => response,
            ureq::Error::Transport(t) if t.kind() == ureq::ErrorKind::TooManyRedirects => {
                return HubError::Redirects {
                    url: t.url().map_or_else(String::new, ToString::to_string),
                    max: MAX_REDIRECTS,
                }
            }
            ureq::Error::Transport(t) => {
                return match file {
                    // A connection that drops between requests of a download.
                    Some(file) => HubError::Interrupted {
                        repo: repo.to_string(),
                        file: file.to_string(),
                        detail: t.to_string(),
                    },
                    None => HubError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        detail: t.to_string(),
                    },
                };
            }
        };
        let status = response.status();
        let code = response.header("x-error-code").unwrap_or("").to_string();
        let message = response.header("x-error-message").unwrap_or("").to_string();
        let url = response.get_url().to_string();
        let (repo, endpoint) = (repo.to_string(), self.endpoint.clone());
        match (code.as_str(), status) {
            ("RepoNotFound", _) => HubError::RepoNotFound {
                repo,
                endpoint,
                has_token: self.token_source.is_some(),
            },
            ("RevisionNotFound", _) => HubError::RevisionNotFound {
                repo,
                revision: revision.to_string(),
            },
            ("EntryNotFound", _) => HubError::FileNotFound {
                repo,
                file: file.unwrap_or("").to_string(),
                revision: revision.to_string(),
                why: "the hub lists it but answered 404 for it: try again, or give --revision a commit",
            },
            ("GatedRepo", _) => match &self.token_source {
                None => HubError::Gated { repo, endpoint },
                Some(source) => HubError::GatedDenied {
                    repo,
                    endpoint,
                    token_source: source.clone(),
                },
            },
            (_, 401 | 403) => match &self.token_source {
                None => HubError::AuthRequired {
                    repo,
                    endpoint,
                    status,
                    message,
                },
                Some(source) => HubError::TokenRefused {
                    repo,
                    endpoint,
                    token_source: source.clone(),
                    status,
                    message,
                },
            },
            (_, 404) if file.is_none() => HubError::RepoNotFound {
                repo,
                endpoint,
                has_token: self.token_source.is_some(),
            },
            _ => HubError::Http {
                url,
                status,
                message,
            },
        }
    }
}

/// The first byte a `Content-Range: bytes FROM-TO/SIZE` header names.
fn content_range_start(header: Option<&str>) -> Option<u64> {
    header?
        .strip_prefix("bytes ")?
        .split_once('-')?
        .0
        .trim()
        .parse()
        .ok()
}

/// A path segment percent-encoded (everything but RFC 3986's unreserved
/// characters).
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
