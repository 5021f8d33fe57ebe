//! gerbil in a web page: the engine `scripts/web.sh` builds for `wasm32-unknown-unknown` and the
//! page in `web/` runs in a Web Worker.
//!
//! ```js
//! import init, { Engine } from "./pkg/gerbil_web.js";
//! await init();
//! const engine = await Engine.load("m.plan", size, (at, len) => readBytes(at, len),
//!                                  (done, total) => showProgress(done, total));
//! const info = JSON.parse(engine.info());            // adapter, variant, model
//! const stats = JSON.parse(await engine.generate(
//!     JSON.stringify([{ role: "user", content: "Hello" }]),
//!     JSON.stringify({ max_tokens: 64 }),
//!     (text) => print(text)));                        // streamed pieces
//! ```
//!
//! The plan never sits in wasm memory whole: [`Engine::load`] reads it through a JavaScript
//! function of positional reads ([`js_source`]), which the worker serves synchronously from a
//! file in the Origin Private File System or from the `File` a user picked, so the checksum pass
//! and the weight upload go window by window, as `gerbil-run` reads a file. The surprise: the
//! runtime's plan source and progress hook must be `Send + Sync`, and JavaScript values are
//! neither; a worker is one thread, so the JavaScript functions wait in thread-locals and the
//! Rust side holds only their slot.

mod engine;
mod js_source;
mod settings;

pub use engine::Engine;
