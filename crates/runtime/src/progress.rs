//! Progress of the slow parts of a session — uploading the weights and
//! prefilling a long prompt — reported to a callback, for progress bars.
//!
//! Give a [`ProgressHook`] in [`SessionOptions::progress`](crate::SessionOptions)
//! to hear about the load, or set one on an open session with
//! [`Session::set_progress`](crate::Session::set_progress) to hear about
//! prompts longer than one step:
//!
//! ```
//! use gerbil_runtime::progress::{Progress, ProgressHook};
//! let hook = ProgressHook::new(|p: Progress| match p {
//!     Progress::Weights { done, total } => eprintln!("weights {done}/{total} bytes"),
//!     Progress::Prefill { done, total } => eprintln!("prompt {done}/{total} tokens"),
//! });
//! let opts = gerbil_runtime::SessionOptions {
//!     progress: Some(hook),
//!     ..Default::default()
//! };
//! # let _ = opts;
//! ```
//!
//! Each kind of event counts up to its `total` and ends with `done ==
//! total`. The surprise: reporting prefill progress costs a wait for the
//! GPU after every chunk (a submitted chunk is not a finished one), so the
//! session waits only while a hook is set and only for prompts of more than
//! one chunk.

use std::sync::Arc;

/// What a slow operation has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Weight bytes written to the GPU, of `total`, while a session loads.
    Weights {
        /// Bytes the GPU has received.
        done: u64,
        /// Bytes of weights the session's variant uses.
        total: u64,
    },
    /// Prompt tokens the GPU has run, of `total`, in one call of
    /// [`Session::forward`](crate::Session::forward) (reported only for
    /// prompts longer than the plan's `max_tokens_per_step`).
    Prefill {
        /// Tokens run so far.
        done: u64,
        /// Tokens of the call.
        total: u64,
    },
}

/// A callback that receives [`Progress`]; cheap to clone (shared).
///
/// Two hooks are equal when they are the same callback (one `Arc`), so
/// options holding one still compare and print.
#[derive(Clone)]
pub struct ProgressHook(Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressHook {
    /// Wraps `f`.
    pub fn new(f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        ProgressHook(Arc::new(f))
    }

    /// Calls the callback.
    pub fn report(&self, p: Progress) {
        (self.0)(p)
    }
}

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressHook(..)")
    }
}

impl PartialEq for ProgressHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ProgressHook {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_hook_is_equal_to_its_clones_only_and_reports_what_it_is_given() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let a = ProgressHook::new(move |p| s.lock().unwrap().push(p));
        let b = ProgressHook::new(|_| {});
        assert_eq!(a, a.clone());
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "ProgressHook(..)");
        a.report(Progress::Prefill { done: 3, total: 7 });
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Progress::Prefill { done: 3, total: 7 }]
        );
    }
}
