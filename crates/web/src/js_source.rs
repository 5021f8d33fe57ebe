//! A plan read through a JavaScript function, and load progress told to one.
//!
//! [`JsSource`] is a [`PlanSource`] whose reads call `read(at, len)`, a JavaScript function that
//! returns a `Uint8Array` of exactly `len` bytes (a worker's `FileSystemSyncAccessHandle.read`
//! or `FileReaderSync` over a `File`); a thrown exception or a short array is an I/O error that
//! names the plan. [`progress_hook`] forwards the weight upload's progress to `progress(done,
//! total)`. Both keep their JavaScript function in a thread-local slot (JavaScript values are
//! not `Send`, the runtime's hooks must be; a worker is one thread), freed when the Rust side
//! is dropped.

use gerbil_plan::PlanSource;
use gerbil_runtime::{Progress, ProgressHook};
use js_sys::{Function, Uint8Array};
use std::cell::RefCell;
use std::io;
use wasm_bindgen::{JsCast, JsValue};

thread_local! {
    /// The `read` functions of the live [`JsSource`]s, by slot.
    static READERS: RefCell<Vec<Option<Function>>> = const { RefCell::new(Vec::new()) };
    /// Where [`progress_hook`] reports, while a load runs.
    static PROGRESS: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// A plan of `size` bytes behind a JavaScript `read(at, len)` (see the module docs).
pub(crate) struct JsSource {
    slot: usize,
    size: u64,
}

impl JsSource {
    /// Keeps `read` until the source is dropped.
    pub(crate) fn new(size: u64, read: Function) -> JsSource {
        let slot = READERS.with(|readers| {
            let mut readers = readers.borrow_mut();
            match readers.iter().position(Option::is_none) {
                Some(free) => {
                    readers[free] = Some(read);
                    free
                }
                None => {
                    readers.push(Some(read));
                    readers.len() - 1
                }
            }
        });
        JsSource { slot, size }
    }
}

impl Drop for JsSource {
    fn drop(&mut self) {
        READERS.with(|readers| readers.borrow_mut()[self.slot] = None);
    }
}

impl PlanSource for JsSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, at: u64, buf: &mut [u8]) -> io::Result<()> {
        let read = READERS.with(|readers| readers.borrow()[self.slot].clone());
        let read = read.ok_or_else(|| io::Error::other("the plan's reader was closed"))?;
        let bytes = read
            .call2(
                &JsValue::NULL,
                &JsValue::from_f64(at as f64),
                &JsValue::from_f64(buf.len() as f64),
            )
            .map_err(|e| io::Error::other(format!("reading the plan: {}", describe(&e))))?;
        let bytes: Uint8Array = bytes
            .dyn_into()
            .map_err(|_| io::Error::other("the plan's reader returned no Uint8Array"))?;
        if bytes.length() as usize != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the plan's reader gave {} bytes at {at}, not {}",
                    bytes.length(),
                    buf.len()
                ),
            ));
        }
        bytes.copy_to(buf);
        Ok(())
    }
}

/// A progress hook calling `progress(done, total)` with the weight bytes uploaded, while
/// [`ProgressGuard`] lives.
pub(crate) fn progress_hook(progress: Function) -> (ProgressHook, ProgressGuard) {
    PROGRESS.with(|slot| *slot.borrow_mut() = Some(progress));
    let hook = ProgressHook::new(|p| {
        if let Progress::Weights { done, total } = p {
            PROGRESS.with(|slot| {
                if let Some(f) = &*slot.borrow() {
                    // A throwing progress callback must not stop the load.
                    let _ = f.call2(
                        &JsValue::NULL,
                        &JsValue::from_f64(done as f64),
                        &JsValue::from_f64(total as f64),
                    );
                }
            });
        }
    });
    (hook, ProgressGuard)
}

/// Forgets the progress function when dropped.
pub(crate) struct ProgressGuard;

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        PROGRESS.with(|slot| *slot.borrow_mut() = None);
    }
}

/// A JavaScript exception as text: an `Error`'s message, else the value's string form.
pub(crate) fn describe(e: &JsValue) -> String {
    if let Some(e) = e.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    e.as_string().unwrap_or_else(|| format!("{e:?}"))
}
