//! How long and how many: the server's accept loop with a connection cap
//! and a header read timeout ([`serve_connections`]), and the body read
//! deadline in front of every route ([`read_body`]).
//!
//! [`serve_connections`] accepts connections until the shutdown signal,
//! each served by hyper's HTTP/1 connection with [`Limits::header_timeout`]
//! as its header read timeout — which also closes an idle keep-alive
//! connection, since hyper starts that clock whenever it waits for a
//! request's head. At most [`Limits::max_connections`] are open at once; one
//! past the cap gets a `503` with `Retry-After` and is closed, so clients
//! that never finish a request can delay others by at most the timeout and
//! never exhaust the process's file descriptors. [`read_body`] reads a whole
//! request body within [`Limits::body_timeout`] and `--max-body-bytes`
//! (408, 413) before any handler sees it.
//!
//! The surprise: the cap's refusal is written by hand, not by hyper — a
//! connection over the cap is refused before any of it is read, with a
//! bounded write, so a client that does not read cannot hold the accept
//! loop.

use crate::openai::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The server's bounds on connections and request reads.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once; one more is refused with a 503.
    pub max_connections: usize,
    /// Longest wait for a request's head (and between requests on a
    /// keep-alive connection) before the connection is closed.
    pub header_timeout: Duration,
    /// Longest wait for a whole request body (408 after it).
    pub body_timeout: Duration,
    /// Largest request body accepted (413 over it).
    pub max_body_bytes: usize,
}

/// How long a refusal over the cap may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);
/// How long to wait before accepting again after `accept` failed (out of
/// file descriptors, say), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Accepts and serves connections with `router` until `shutdown` resolves,
/// then waits up to `drain` for the connections in flight (asking each to
/// close once its current request is answered). Returns whether they all
/// finished within it.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> bool {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok()
}

/// Answers a connection over the cap with a 503 and closes it.
async fn refuse(mut stream: tokio::net::TcpStream, max: usize) {
    let body = ApiError::server(format!(
        "this server already has {max} connections open; try again shortly (the limit is \
         --max-connections)"
    ))
    .body()
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    if let Ok(Err(e)) = tokio::time::timeout(REFUSAL_WRITE, write).await {
        tracing::debug!("refusing a connection over the cap: {e}");
    }
}

/// Middleware: reads the whole request body within the body timeout and
/// the size limit, and hands the route the bytes read.
pub async fn read_body(
    State(limits): State<Arc<Limits>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let read = Limited::new(body, limits.max_body_bytes).collect();
    let bytes = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return ApiError::invalid(
                "the request body is larger than this server accepts; shorten it, or start the \
                 server with a larger --max-body-bytes",
                None,
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            .into_response()
        }
        Ok(Err(e)) => {
            return ApiError::invalid(format!("could not read the request body: {e}"), None)
                .into_response()
        }
        Err(_) => {
            return ApiError::invalid(
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    limits.body_timeout.as_secs_f32()
                ),
                None,
            )
            .with_status(StatusCode::REQUEST_TIMEOUT)
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
