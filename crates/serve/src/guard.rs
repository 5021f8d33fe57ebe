//! Who may use the server: the API key, the `Host` a request names, the
//! origin of a browser's request, and the content type of a JSON body.
//!
//! [`gate`] runs before every route (`axum::middleware::from_fn_with_state`
//! with an [`Access`]), in this order:
//!
//! 1. `Host` must be an IP literal, `localhost`, or a name given with
//!    `--allowed-host`: a web page on `evil.example` that rebinds its name to
//!    127.0.0.1 (DNS rebinding) sends `Host: evil.example` and gets a 403.
//! 2. A request with an `Origin` other than the server's own is a browser's
//!    cross-origin request: allowed only from an origin given with
//!    `--cors-origin` (`*`: any), which then gets the CORS headers (and a
//!    preflight `OPTIONS` its 204); any other origin gets a 403, so a page the
//!    user visits cannot drive the model.
//! 3. With an API key, every `/v1` route, `/metrics` and `/slots` need
//!    `Authorization: Bearer KEY` (compared in constant time), as
//!    llama-server and vLLM do; a 401 otherwise. `/health` stays open for
//!    load balancers.
//! 4. A `POST` must say `Content-Type: application/json`: a 415 otherwise,
//!    which also closes the "simple request" door (`text/plain` and form
//!    posts, which browsers send cross-origin without a preflight).
//!
//! The surprise: the Host check is what protects a server on 127.0.0.1
//! without a key. Browsers may send requests to any address the user's
//! machine can reach, and an attacker's page can make its own name point
//! at 127.0.0.1; only the `Host` header still says whose page it is.

use crate::openai::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Who may use the server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// The key every `/v1` request must bear (`None`: no key).
    pub api_key: Option<String>,
    /// Host names accepted besides IP literals and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Origins whose cross-origin requests are allowed (`*`: any).
    pub cors_origins: Vec<String>,
}

/// The middleware (see the module documentation).
pub async fn gate(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Some(host) = header_str(headers, header::HOST) {
        if !host_allowed(host, &access.allowed_hosts) {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "this server does not answer for the host `{host}`: use its address, or \
                     start it with --allowed-host NAME"
                ),
            );
        }
    }
    let cross_origin = header_str(headers, header::ORIGIN)
        .filter(|origin| !same_origin(origin, header_str(headers, header::HOST)))
        .map(str::to_string);
    if let Some(origin) = &cross_origin {
        if !origin_allowed(origin, &access.cors_origins) {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "requests from the web page origin `{origin}` are not allowed: start the \
                     server with --cors-origin {origin} to allow them"
                ),
            );
        }
        if request.method() == Method::OPTIONS {
            let mut response = StatusCode::NO_CONTENT.into_response();
            cors_headers(response.headers_mut(), origin, true);
            return response;
        }
    }
    if let Err(e) = authorized(&access, &request) {
        return with_cors(e.into_response(), cross_origin.as_deref());
    }
    if request.method() == Method::POST
        && !is_json(header_str(request.headers(), header::CONTENT_TYPE))
    {
        let e = ApiError::invalid(
            "the request body must be JSON sent with `Content-Type: application/json`",
            None,
        )
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        return with_cors(e.into_response(), cross_origin.as_deref());
    }
    with_cors(next.run(request).await, cross_origin.as_deref())
}

/// A header's value as text, if it is there and ASCII.
fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// An OpenAI error object with `status`.
fn refuse(status: StatusCode, message: String) -> Response {
    ApiError::invalid(message, None)
        .with_status(status)
        .into_response()
}

/// The key check of `/v1` routes, `/metrics` and `/slots`.
fn authorized(access: &Access, request: &Request) -> Result<(), ApiError> {
    let Some(key) = &access.api_key else {
        return Ok(());
    };
    let path = request.uri().path();
    if !path.starts_with("/v1") && path != "/metrics" && path != "/slots" {
        return Ok(());
    }
    let given = header_str(request.headers(), header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(given) if bool::from(given.as_bytes().ct_eq(key.as_bytes())) => Ok(()),
        Some(_) => Err(unauthorized("the API key is not this server's")),
        None => Err(unauthorized(
            "this server needs an API key: send `Authorization: Bearer KEY`",
        )),
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::invalid(message, None)
        .with_status(StatusCode::UNAUTHORIZED)
        .with_code("invalid_api_key")
}

/// `host` (a `Host` header: a name or address and maybe a port) without its port.
fn host_name(host: &str) -> &str {
    if host.parse::<IpAddr>().is_ok() {
        return host; // an IPv6 address without brackets or port (a --host value)
    }
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(host, |(name, _)| name);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether a `Host` header names this server: an IP literal, `localhost`,
/// or one of `allowed` (any case).
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host);
    name.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Whether `origin` (`scheme://host[:port]`) is the page the server itself
/// serves: its authority is the request's `Host`.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
    host.is_some_and(|h| h.eq_ignore_ascii_case(authority))
}

fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
}

/// `response` with the CORS headers for an allowed cross-origin request.
fn with_cors(mut response: Response, origin: Option<&str>) -> Response {
    if let Some(origin) = origin {
        cors_headers(response.headers_mut(), origin, false);
    }
    response
}

/// The CORS headers for `origin`; a preflight's also say what may follow.
fn cors_headers(headers: &mut HeaderMap, origin: &str, preflight: bool) {
    if let Ok(value) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    if preflight {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type"),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
}

/// Whether a `Content-Type` says JSON (`application/json`, any case, any parameters).
fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Whether binding `host` exposes the server beyond this machine: anything
/// but a loopback address or `localhost`.
pub fn exposes(host: &str) -> bool {
    let name = host_name(host);
    !(name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_addresses_localhost_or_allowed_names() {
        let allowed = vec!["gerbil.lan".to_string()];
        for host in [
            "127.0.0.1:8080",
            "[::1]:80",
            "localhost",
            "LOCALHOST:1",
            "10.0.0.2",
        ] {
            assert!(host_allowed(host, &[]), "{host}");
        }
        assert!(host_allowed("Gerbil.LAN:8080", &allowed));
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::1",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
        assert!(!exposes("127.0.0.1") && !exposes("::1") && !exposes("localhost"));
        assert!(exposes("0.0.0.0") && exposes("192.168.1.5") && exposes("example.com"));
    }

    #[test]
    fn origins_and_content_types() {
        assert!(same_origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://evil.example", Some("127.0.0.1:8080")));
        assert!(!same_origin("null", Some("127.0.0.1:8080")));
        let any = vec!["*".to_string()];
        let one = vec!["https://app.example".to_string()];
        assert!(origin_allowed("https://x", &any));
        assert!(origin_allowed("https://app.example", &one));
        assert!(!origin_allowed("https://x", &one) && !origin_allowed("https://x", &[]));
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        for ct in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            assert!(!is_json(ct), "{ct:?}");
        }
    }
}
