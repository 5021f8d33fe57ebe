//! What the hub (or a mirror) may name, checked before any name becomes a
//! path in the cache: commits ([`is_commit`]), blob ids ([`is_blob_id`]),
//! revisions ([`check_revision`]) and repository file names
//! ([`is_file_name`]).
//!
//! Every name that reaches the file system passes one of these first, so
//! an endpoint that answers `../../x` for a commit, a blob or a file cannot
//! write outside the cache. The surprise: revisions may hold `/`
//! (`refs/pr/1`, a branch `feature/x`), so they are checked per component,
//! as file names are.

use crate::HubError;

/// A git commit as the hub names it: 40 lowercase hex digits.
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && is_hex(s)
}

/// A blob's name in the cache: a git object id (40 hex digits) or an LFS
/// file's sha256 (64).
pub(crate) fn is_blob_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && is_hex(s)
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A relative path inside a repository: components of printable characters
/// other than `/` and `\`, none empty, `.` or `..`, at most 255 bytes each.
pub(crate) fn is_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 1024
        && s.split('/').all(|c| {
            !c.is_empty()
                && c.len() <= 255
                && c != "."
                && c != ".."
                && !c.contains('\\')
                && !c.chars().any(char::is_control)
        })
}

/// A branch, tag or commit to fetch: what [`is_file_name`] allows, made of
/// ASCII letters, digits, `-`, `_`, `.` and `/`, at most 255 bytes.
pub(crate) fn check_revision(revision: &str) -> Result<(), HubError> {
    let ok = revision.len() <= 255
        && is_file_name(revision)
        && revision
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(())
    } else {
        Err(HubError::BadRevision {
            revision: revision.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_the_cache_are_refused() {
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        for bad in [
            "../../x",
            "0123",
            "0123456789ABCDEF0123456789abcdef01234567",
            "",
        ] {
            assert!(!is_commit(bad), "{bad}");
            assert!(!is_blob_id(bad), "{bad}");
        }
        assert!(is_blob_id(&"a".repeat(64)));
        assert!(!is_blob_id(&"a".repeat(63)));
        for ok in ["config.json", "onnx/model.onnx", "a b.json"] {
            assert!(is_file_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a\\b",
            "./a",
            "a/",
            "a\nb",
        ] {
            assert!(!is_file_name(bad), "{bad:?}");
        }
        for ok in ["main", "v1.0", "refs/pr/1", "feature/x-y_z"] {
            assert!(check_revision(ok).is_ok(), "{ok}");
        }
        for bad in ["../../../file", "/abs", "a//b", "main:x", "a b", "", ".."] {
            assert!(check_revision(bad).is_err(), "{bad}");
        }
    }
}
