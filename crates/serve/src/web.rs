//! The chat page at `/`, and the plan itself at `/v1/plan` for the page to run in the browser.
//!
//! [`WebPage::Embedded`] (the default) serves the page in the repository's `web/` folder
//! (`index.html`, `app.js`, `style.css`, `worker.js`), compiled into the binary: it chats with
//! this server's `/v1/chat/completions`. [`WebPage::Dir`] (`--web-dir DIR`) serves a folder
//! `scripts/web.sh` built instead, which adds the browser engine (`pkg/`, wasm with WebGPU), so
//! the page's "this browser" switch can download the plan from `/v1/plan` and run it on the
//! user's GPU. [`WebPage::Off`] (`--no-web`) serves neither the page nor the plan.
//!
//! Files go through tower-http's `ServeFile`/`ServeDir`: `Range` requests, `Last-Modified` and
//! `If-Modified-Since`, `HEAD`. `/v1/plan` adds a strong `ETag` made of the plan's two CRC-32s
//! and its length (a changed plan has a new one) with `If-None-Match` (a page that has the plan
//! cached gets a 304) and `If-Range` (a cut-off download resumes only while the plan is the same;
//! otherwise the whole plan comes back), which tower-http does not do. `/v1/plan` stays behind
//! the API key like every `/v1` route. The surprise: the page is served without the key (as
//! llama-server does); it asks the user for one when `/v1/models` answers 401.

use crate::openai::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::io::Read;
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

/// Adds the page's routes and `/v1/plan` (serving `plan`) to `router`, as `page` says. The
/// plan's preamble is read here, for its ETag.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    page: &WebPage,
    plan: &Path,
) -> anyhow::Result<Router<S>> {
    let router = match page {
        WebPage::Off => return Ok(router),
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
    let download = PlanDownload::new(plan)?;
    Ok(router.route(
        "/v1/plan",
        get(move |request| download.clone().serve(request)),
    ))
}

/// `/v1/plan`: the plan file, with its ETag.
#[derive(Clone)]
struct PlanDownload {
    file: PathBuf,
    etag: HeaderValue,
}

impl PlanDownload {
    /// The ETag of the plan at `file`: `"HHHHHHHH-DDDDDDDD-LEN"`, its header and data CRC-32s
    /// (preamble bytes 40..48) and its length.
    fn new(file: &Path) -> anyhow::Result<PlanDownload> {
        let mut preamble = [0u8; 48];
        let mut f = std::fs::File::open(file)?;
        f.read_exact(&mut preamble)?;
        let len = f.metadata()?.len();
        let crc = |at: usize| u32::from_le_bytes([0, 1, 2, 3].map(|i| preamble[at + i]));
        let etag = format!("\"{:08x}-{:08x}-{len}\"", crc(40), crc(44));
        Ok(PlanDownload {
            file: file.to_path_buf(),
            etag: HeaderValue::from_str(&etag)?,
        })
    }

    async fn serve(self, mut request: Request) -> Response {
        let etag = self.etag.to_str().unwrap_or_default();
        let headers = request.headers();
        let listed = |name| {
            headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(|v| {
                    v.split(',')
                        .map(|t| t.trim().trim_start_matches("W/"))
                        .any(|t| t == etag || t == "*")
                })
        };
        if listed(header::IF_NONE_MATCH) == Some(true) {
            return (StatusCode::NOT_MODIFIED, [(header::ETAG, self.etag)]).into_response();
        }
        if listed(header::IF_RANGE) == Some(false) {
            // Not the plan the client has part of (or a date, which tower-http would not check):
            // the whole plan.
            request.headers_mut().remove(header::RANGE);
        }
        match ServeFile::new(&self.file).try_call(request).await {
            Ok(response) => {
                let mut response = response.map(Body::new);
                response.headers_mut().insert(header::ETAG, self.etag);
                response
            }
            Err(e) => ApiError::server(format!("reading the plan: {e}")).into_response(),
        }
    }
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
