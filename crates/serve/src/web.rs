//! The chat page at `/`, and the plan itself at `/v1/plan` for the page to run in the browser.
//!
//! [`WebPage::Embedded`] (the default) serves the page in the repository's `web/` folder
//! (`index.html`, `app.js`, `style.css`, `worker.js`), compiled into the binary: it chats with
//! this server's `/v1/chat/completions`. [`WebPage::Dir`] (`--web-dir DIR`) serves a folder
//! `scripts/web.sh` built instead, which adds the browser engine (`pkg/`, wasm with WebGPU), so
//! the page's "this browser" switch can download the plan from `/v1/plan` and run it on the
//! user's GPU. [`WebPage::Off`] (`--no-web`) serves neither the page nor the plan.
//!
//! Files go through tower-http's `ServeFile`/`ServeDir`: `Range` requests (a cut-off download
//! resumes), `Last-Modified` and `If-Modified-Since` (a browser that has the plan in its cache
//! gets a 304), `HEAD`. `/v1/plan` stays behind the API key like every `/v1` route. The
//! surprise: the page is served without the key (as llama-server does); it asks the user for
//! one when `/v1/models` answers 401.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::path::{Path, PathBuf};
use tower_http::services::{ServeDir, ServeFile};

/// Which page `serve` offers at `/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WebPage {
    /// No page and no `/v1/plan` (`--no-web`).
    Off,
    /// The page compiled into the binary: chat with the server.
    #[default]
    Embedded,
    /// A folder `scripts/web.sh` built: the page and the browser engine (`--web-dir DIR`).
    Dir(PathBuf),
}

/// The page's files compiled in: name, content type, text.
const EMBEDDED: [(&str, &str, &str); 4] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../../web/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../../web/style.css"),
    ),
    (
        "worker.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/worker.js"),
    ),
];

/// Adds the page's routes and `/v1/plan` (serving `plan`) to `router`, as `page` says.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    page: &WebPage,
    plan: &Path,
) -> Router<S> {
    let router = match page {
        WebPage::Off => return router,
        WebPage::Embedded => EMBEDDED
            .iter()
            .fold(router, |router, &(name, content_type, text)| {
                let handler = get(move || async move {
                    ([(header::CONTENT_TYPE, content_type)], text).into_response()
                });
                let router = router.route(&format!("/{name}"), handler.clone());
                if name == "index.html" {
                    router.route("/", handler)
                } else {
                    router
                }
            }),
        WebPage::Dir(dir) => router
            .route_service("/", ServeFile::new(dir.join("index.html")))
            .nest_service("/pkg", ServeDir::new(dir.join("pkg")))
            .route_service("/index.html", ServeFile::new(dir.join("index.html")))
            .route_service("/app.js", ServeFile::new(dir.join("app.js")))
            .route_service("/style.css", ServeFile::new(dir.join("style.css")))
            .route_service("/worker.js", ServeFile::new(dir.join("worker.js"))),
    };
    // `.plan` is no known type: `application/octet-stream`.
    router.route_service("/v1/plan", ServeFile::new(plan))
}

/// Checks that `dir` holds a page `scripts/web.sh` built, before the model loads: the error
/// names what is missing and how to build it.
pub fn check_dir(dir: &Path) -> anyhow::Result<()> {
    for file in [
        "index.html",
        "app.js",
        "worker.js",
        "pkg/gerbil_web.js",
        "pkg/gerbil_web_bg.wasm",
    ] {
        if !dir.join(file).is_file() {
            anyhow::bail!(
                "--web-dir {}: no {file} there; build the page with `scripts/web.sh {}`",
                dir.display(),
                dir.display()
            );
        }
    }
    Ok(())
}
