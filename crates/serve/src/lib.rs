//! An OpenAI-compatible HTTP server (axum on tokio) for editors, web UIs and
//! scripts: the library behind `gerbil-run PLAN serve`.
//!
//! Routes: `POST /v1/chat/completions` (messages through the model's chat
//! template), `POST /v1/completions` (a prompt string through the
//! tokenizer), each answering with one JSON object or, with `"stream":
//! true`, server-sent events ending in `data: [DONE]`; `GET /v1/models` (the
//! one model), `GET /v1/models/{id}` and `GET /health`. Every error is OpenAI's error object
//! (`{"error": {"message", "type", "param", "code"}}`): 400 for a bad body,
//! wrong field types, a field it cannot honour (`n` above 1, `logprobs`,
//! the deprecated `functions`), a schema or tool it cannot follow
//! ([`structured`]: `response_format` and `tools` constrain every token) or
//! a prompt over the context, 404 for an unknown path or model,
//! 405 for a wrong method, 413 for a body over `--max-body-bytes`, 408 for
//! a body that does not arrive in time; in front of every route, [`guard`]
//! checks the API key, the `Host`, a browser's origin and the content type
//! (401, 403, 415). Connections are accepted by [`limits`]: a header read
//! timeout and a connection cap (503 past it). The port is bound before the
//! model loads, so a busy one fails at once.
//!
//! Call [`serve`]; it returns after Ctrl-C (or SIGTERM), once the requests
//! in flight are answered. The model lives on one thread
//! ([`worker`]); requests queue for it in arrival order, so concurrent
//! clients are answered one after another, each exactly as if it were
//! alone — except embedding requests, which the model thread runs together
//! when they queue behind one another (`embedding_batches`; a vector packed
//! with others may differ from a lone one's in its last bits), and a plan's
//! batch schedule (`--max-batch`) — and past [`ServeOptions::max_queue`] waiting ones a request gets
//! a 503 with `Retry-After`. Prompts are tokenized (and chat templates rendered) by the
//! handlers on tokio's blocking pool first, so a long prompt, or one refused
//! for the context, never holds the model thread. The surprise: a streamed request's status is decided before the
//! stream begins — the handler waits for the worker's first event, so a
//! prompt over the context is a 400 even with `"stream": true`.

mod batching;
mod embedding_batches;
pub mod embeddings;
pub mod guard;
pub mod limits;
pub mod metrics;
pub mod openai;
pub mod structured;
pub mod web;
pub mod worker;

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::{self, Stream, StreamExt};
use gerbil::{Error as ModelError, FinishReason, ModelOptions, RuntimeError};
use gerbil_grammar::tools::ToolFormat;
use gerbil_grammar::GrammarConstraint;
pub use guard::Access;
pub use limits::Limits;
use openai::{parse_request, ApiError, ChunkPiece, Endpoint, Envelope, PromptInput, Request};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use structured::{call_id, Structured, ToolStream};
use tokio::sync::mpsc::UnboundedReceiver;
pub use web::WebPage;
use worker::{Event, ModelInfo, Queue, Submit, Worker};

/// Settings of `gerbil-run PLAN serve`.
#[derive(Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free port; the one chosen is printed).
    pub port: u16,
    /// The model's id in responses and `/v1/models` (default: the plan's
    /// file stem).
    pub model_name: Option<String>,
    /// Connections, timeouts and the largest body ([`limits`]).
    pub limits: Limits,
    /// How the plan is loaded.
    pub model: ModelOptions,
    /// Requests that may wait for the model while it runs another; more get
    /// a 503 with `Retry-After`.
    pub max_queue: usize,
    /// Who may use it: API key, host names, browser origins ([`guard`]).
    pub access: Access,
    /// How long a shutdown waits for the requests in flight before it
    /// closes their connections.
    pub shutdown_timeout: std::time::Duration,
    /// The chat page at `/` and the plan at `/v1/plan` ([`web`]).
    pub web: WebPage,
    /// Where the server's notes go (`listening on http://…`, shutting down).
    pub notes: NoteHook,
}

/// Receives the server's notes for its user, one line each.
pub type NoteHook = Arc<dyn Fn(&str) + Send + Sync>;

/// The error when a job's events end early (a bug: see the server's log).
const STOPPED: &str = "the generation stopped unexpectedly; the server's log says why";

/// What every handler shares.
struct App {
    queue: Queue,
    metrics: Arc<metrics::Metrics>,
    info: ModelInfo,
    model_name: String,
    /// When the model was loaded (Unix seconds): `/v1/models`' `created`.
    loaded_at: u64,
}

/// Loads the plan, listens, and serves until Ctrl-C. Prints `listening on
/// http://HOST:PORT` to stderr once the socket is bound.
pub fn serve(plan: &Path, opts: &ServeOptions) -> Result<()> {
    let model_name = match &opts.model_name {
        Some(n) => n.clone(),
        None => plan
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned()),
    };
    // Bound before the model loads, so a busy port fails at once.
    let listener = std::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .with_context(|| format!("cannot listen on {}:{}", opts.host, opts.port))?;
    listener.set_nonblocking(true)?;
    if guard::exposes(&opts.host) && opts.access.api_key.is_none() {
        (opts.notes)(&format!(
            "warning: listening on {} without --api-key: anyone who can reach this port can use \
             the model",
            opts.host
        ));
    }
    let metrics = Arc::new(metrics::Metrics::default());
    let (worker, info) = Worker::start(
        plan.to_path_buf(),
        opts.model.clone(),
        opts.max_queue,
        Arc::clone(&metrics),
    )?;
    match (info.max_batch, info.slots) {
        (0, _) => (opts.notes)(
            "requests run one at a time: this plan has no batch schedule (compile it with \
             `gerbilc compile --max-batch N` to answer up to N together)",
        ),
        (_, 1) => (opts.notes)(
            "requests run one at a time: one slot (--slots N answers up to N together)",
        ),
        (max, slots) => (opts.notes)(&format!(
            "answering up to {} requests together",
            (max as usize).min(slots)
        )),
    }
    let app = Arc::new(App {
        queue: worker.queue(),
        metrics,
        info,
        model_name,
        loaded_at: openai::unix_now(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(listen(app, listener, plan, opts));
    drop(runtime);
    worker.join();
    served
}

/// Prints the bound address and serves until a shutdown signal.
async fn listen(
    app: Arc<App>,
    listener: std::net::TcpListener,
    plan: &Path,
    opts: &ServeOptions,
) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener).context("listening")?;
    let signals = Signals::catch()?;
    let bound = listener.local_addr()?;
    (opts.notes)(&format!("listening on http://{bound}"));
    let router = router(
        app,
        Arc::new(opts.limits.clone()),
        Arc::new(opts.access.clone()),
        (&opts.web, plan),
    )
    .with_context(|| format!("{}: reading the plan to serve it", plan.display()))?;
    let drain = opts.shutdown_timeout;
    let shutdown = shutdown_signal(signals, opts.notes.clone(), drain);
    // After the signal, requests in flight get `shutdown_timeout` to
    // finish: a client that never completes its request (or never reads
    // its answer) does not keep the process alive.
    if !limits::serve_connections(listener, router, &opts.limits, shutdown, drain).await {
        (opts.notes)(&format!(
            "connections still open after {} s: closing them",
            drain.as_secs_f32()
        ));
    }
    (opts.notes)("shut down");
    Ok(())
}

/// The routes (the page's and the plan's as `web` says), JSON answers for unknown paths and
/// methods, the body read ([`limits::read_body`]) and the [`guard`] in front of them all.
fn router(
    app: Arc<App>,
    limits: Arc<Limits>,
    access: Arc<Access>,
    (page, plan): (&WebPage, &Path),
) -> Result<Router> {
    let router = web::routes(Router::new(), page, plan)?;
    let router = router
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics_text))
        .route("/slots", get(slots))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings_endpoint))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            limits,
            limits::read_body,
        ))
        .layer(axum::middleware::from_fn_with_state(access, guard::gate))
        .with_state(app);
    Ok(router)
}

/// Ctrl-C and (on Unix) SIGTERM, caught from when this is made: a signal
/// that arrives between the `listening on` line and the first wait for one
/// is neither lost nor fatal.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts catching the signals (inside the async runtime).
    fn catch() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Resolves on the next signal.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves on the first signal; a second one ends the process at once.
async fn shutdown_signal(mut signals: Signals, notes: NoteHook, drain: std::time::Duration) {
    signals.next().await;
    notes(&format!(
        "shutting down: finishing the requests in flight for up to {} s (Ctrl-C or SIGTERM again \
         to stop now)",
        drain.as_secs_f32()
    ));
    tokio::spawn(async move {
        signals.next().await;
        notes("stopped");
        std::process::exit(130);
    });
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::invalid(
        format!("no route {method} {uri}; this server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/models/{{id}}, GET /metrics, GET /slots and GET /health"),
        None,
    )
    .with_status(StatusCode::NOT_FOUND)
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::invalid(format!("{uri} does not take {method}"), None)
        .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [model_object(&app)],
    }))
}

/// `GET /v1/models/{id}` (the OpenAI client's `models.retrieve`): the model
/// of that id, or a 404 naming the one this server has.
async fn model(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    if id == app.model_name {
        return Json(model_object(&app)).into_response();
    }
    ApiError::invalid(
        format!("no model `{id}`; this server has `{}`", app.model_name),
        Some("model"),
    )
    .with_status(StatusCode::NOT_FOUND)
    .into_response()
}

/// The model object of `/v1/models`.
fn model_object(app: &App) -> Value {
    json!({
        "id": app.model_name,
        "object": "model",
        "created": app.loaded_at,
        "owned_by": "gerbil",
        "context_length": app.info.context,
    })
}

async fn chat_completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    counted(&app, Endpoint::Chat, body).await
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    counted(&app, Endpoint::Completion, body).await
}

/// [`complete`], counted in the [`metrics`].
async fn counted(app: &App, endpoint: Endpoint, body: Bytes) -> Response {
    app.metrics.request(endpoint);
    complete(app, endpoint, body).await.unwrap_or_else(|e| {
        app.metrics.error(endpoint);
        e.into_response()
    })
}

/// `GET /slots` (llama-server's name): the model's sequence slots —
/// whether each is answering, its context and how much of it its KV cache
/// holds — and the requests waiting for the model.
async fn slots(State(app): State<Arc<App>>) -> Json<Value> {
    let list: Vec<Value> = (0..app.info.slots)
        .map(|id| {
            json!({
                "id": id,
                "is_processing": app.metrics.is_processing(id),
                "n_ctx": app.info.context,
                "kv_cache_tokens": app.metrics.kv_tokens(id),
                "queue_waiting": app.queue.waiting(),
            })
        })
        .collect();
    Json(Value::Array(list))
}

/// `GET /metrics`: Prometheus' text format ([`metrics`]).
async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    let capacity = app.info.context.saturating_mul(app.info.slots as u64);
    let text = app.metrics.render(app.queue.waiting(), capacity);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `POST /v1/embeddings`: tokenize, queue, answer the vectors.
async fn embeddings_endpoint(State(app): State<Arc<App>>, body: Bytes) -> Response {
    embed(&app, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn embed(app: &App, body: Bytes) -> Result<Response, ApiError> {
    let Some(info) = &app.info.embedding else {
        return Err(ApiError::invalid(
            "this server runs a language model, not an embedding model: /v1/embeddings needs a \
             plan compiled from an encoder (e.g. sentence-transformers/all-MiniLM-L6-v2); use \
             /v1/chat/completions or /v1/completions here",
            None,
        ));
    };
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}"), None))?;
    let request = embeddings::EmbeddingsRequest::parse(&value)?;
    // Up to 2048 texts: tokenized off the async executor.
    let (codec, shared_info, asked) = (app.info.codec.clone(), info.clone(), request.clone());
    let inputs = tokio::task::spawn_blocking(move || {
        embeddings::inputs(&asked, codec.as_deref(), &shared_info)
    })
    .await
    .map_err(|e| ApiError::server(format!("tokenizing the inputs failed: {e}")))??;
    let tokens = inputs.iter().map(Vec::len).sum();
    let mut events = app
        .queue
        .submit(
            PromptInput::Embed(inputs),
            gerbil::GenerationSettings::default(),
            None,
        )
        .map_err(busy)?;
    match events.recv().await {
        Some(Event::Vectors(vectors)) => {
            let body = embeddings::response(&request, info, &app.model_name, vectors, tokens)?;
            Ok(Json(body).into_response())
        }
        Some(Event::Rejected(e)) => Err(ApiError::invalid(e.to_string(), Some("input"))),
        Some(Event::Failed(e)) => Err(ApiError::server(e)),
        _ => Err(ApiError::server(STOPPED)),
    }
}

/// The answer when the queue refuses a job.
fn busy(e: Submit) -> ApiError {
    match e {
        Submit::Full(max) => ApiError::server(format!(
            "the server is busy: {max} requests already wait for the model; try again shortly \
             (the limit is --max-queue)"
        ))
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .with_retry_after(1),
        Submit::Stopped => ApiError::server("the model thread has stopped"),
    }
}

/// Both completion endpoints: parse, queue, then answer whole or streamed.
async fn complete(app: &App, endpoint: Endpoint, body: Bytes) -> Result<Response, ApiError> {
    if app.info.embedding.is_some() {
        return Err(ApiError::invalid(
            "this server runs an embedding model, not a language model: it answers POST \
             /v1/embeddings, not completions",
            None,
        ));
    }
    let request: Request = parse_request(&body)?;
    let style = app.info.tool_style;
    let form = Structured::of(&request, endpoint, &style)?;
    let mut prompt = match endpoint {
        Endpoint::Chat => request.chat_prompt(&style)?,
        Endpoint::Completion => request.completion_prompt()?,
    };
    let mut template_tools = None;
    if let (Some(tools), PromptInput::Chat(messages)) = (&form.tools, &mut prompt) {
        structured::describe_tools(messages, &style, &tools.tools);
        template_tools = style.native.then(|| tools.definitions.clone());
    }
    let settings = request.settings(&app.info.defaults, rand::random())?;
    let constraint = constrain(app, &form).await?;
    let prompt = tokenize(app, prompt, template_tools, endpoint).await?;
    let mut events = app
        .queue
        .submit(prompt, settings, constraint)
        .map_err(busy)?;
    match events.recv().await {
        Some(Event::Started) => {}
        Some(Event::Rejected(e)) => return Err(rejected(e, endpoint)),
        Some(Event::Failed(e)) => return Err(ApiError::server(e.to_string())),
        Some(other) => return Err(ApiError::server(format!("unexpected {other:?}"))),
        None => return Err(ApiError::server(STOPPED)),
    }
    let envelope = Envelope::new(endpoint, &app.model_name);
    let tool_format = form.tools.is_some().then_some(style.format);
    if request.streams() {
        let stream = sse_stream(envelope, events, request.stream_usage(), tool_format);
        return Ok(Sse::new(stream).into_response());
    }
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(t, id) => {
                text.push_str(&t);
                ids.push(id);
            }
            Event::Finished { reason, stats } => {
                let mut finish = reason.name();
                let mut calls = Vec::new();
                if let Some(format) = tool_format {
                    let out = format.parse(&text);
                    text = out.content;
                    calls = out.calls.into_iter().map(|c| (call_id(), c)).collect();
                    // An answer cut by the token limit stays `length`.
                    if !calls.is_empty() && reason == FinishReason::Stop {
                        finish = "tool_calls";
                    }
                }
                let mut body = envelope.response(&text, &calls, finish, &stats);
                if request.return_token_ids == Some(true) {
                    body["choices"][0]["token_ids"] = ids.into();
                }
                return Ok(Json(body).into_response());
            }
            Event::Failed(e) => return Err(ApiError::server(e.to_string())),
            Event::Started | Event::Rejected(_) | Event::Vectors(_) => break,
        }
    }
    Err(ApiError::server(STOPPED))
}

/// The request's grammar compiled for the model (on tokio's blocking pool:
/// a large schema takes a while), or a 400 naming the field when it does
/// not compile or the model cannot follow grammars.
async fn constrain(app: &App, form: &Structured) -> Result<Option<GrammarConstraint>, ApiError> {
    let Some(grammar) = form.grammar.clone() else {
        return Ok(None);
    };
    let param = form.param();
    let grammars = app.info.grammars.clone().map_err(|why| {
        ApiError::invalid(
            format!("this model cannot give structured output or tool calls: {why}"),
            Some(param),
        )
    })?;
    tokio::task::spawn_blocking(move || grammars.constraint(&grammar))
        .await
        .map_err(|e| ApiError::server(format!("compiling the grammar failed: {e}")))?
        .map(Some)
        .map_err(|e| ApiError::invalid(format!("`{param}` cannot be followed: {e}"), Some(param)))
}

/// A text or chat prompt tokenized here, on tokio's blocking pool, not on
/// the model thread: a long prompt, or one too long for the context
/// (refused here, as the model would), never holds up the generations of
/// other requests. Token ids, and text for a plan without a tokenizer, go to
/// the model thread as they are.
async fn tokenize(
    app: &App,
    prompt: PromptInput,
    tools: Option<Value>,
    endpoint: Endpoint,
) -> Result<PromptInput, ApiError> {
    let Some(codec) = app.info.codec.clone() else {
        return Ok(prompt);
    };
    let bytes = match &prompt {
        PromptInput::Ids(_) | PromptInput::Embed(_) => 0,
        PromptInput::Chat(messages) => messages.iter().map(|m| m.content.len()).sum(),
        PromptInput::Text(text) => text.len(),
    };
    refuse_by_size(app, bytes as u64, endpoint)?;
    let encoded = match prompt {
        PromptInput::Ids(_) | PromptInput::Embed(_) => return Ok(prompt),
        PromptInput::Chat(messages) => {
            tokio::task::spawn_blocking(move || {
                codec.encode_chat_with_tools(&messages, tools.as_ref(), true)
            })
            .await
        }
        PromptInput::Text(text) => tokio::task::spawn_blocking(move || codec.encode(&text)).await,
    };
    let ids = encoded
        .map_err(|e| ApiError::server(format!("tokenizing the prompt failed: {e}")))?
        .map_err(|e| rejected(e.into(), endpoint))?;
    let (needed, max) = (ids.len() as u64, app.info.context);
    if needed > max {
        let overflow = RuntimeError::ContextOverflow { needed, max };
        return Err(rejected(overflow.into(), endpoint));
    }
    Ok(PromptInput::Ids(ids))
}

/// Refuses, before tokenizing it, a prompt of `bytes` bytes that cannot fit
/// the context: no token stands for more than the vocabulary's longest
/// token string, so it is at least `bytes / longest` tokens. The factor 2
/// leaves room for a normalizer that deletes characters.
fn refuse_by_size(app: &App, bytes: u64, endpoint: Endpoint) -> Result<(), ApiError> {
    let longest = app.info.longest_token as u64;
    let (at_least, max) = (bytes / (2 * longest), app.info.context);
    if at_least <= max {
        return Ok(());
    }
    let param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    };
    Err(ApiError::invalid(
        format!(
            "the prompt is {bytes} bytes, at least {at_least} tokens (no token of this model stands \
             for more than {longest} bytes), but the context holds {max} tokens: shorten it"
        ),
        Some(param),
    )
    .with_code("context_length_exceeded"))
}

/// The events of a started job as server-sent events: a chat's role chunk,
/// a chunk per non-empty piece of text, the finish chunk, the usage chunk
/// when asked, then `[DONE]`. With tools (`tools` is the model's format),
/// text that may begin a call is held back and each call is sent whole at
/// the end ([`ToolStream`]). A failure mid-stream becomes an error object
/// and ends the stream without `[DONE]`.
fn sse_stream(
    envelope: Envelope,
    events: UnboundedReceiver<Event>,
    include_usage: bool,
    tools: Option<ToolFormat>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let data = |v: &Value| SseEvent::default().data(v.to_string());
    let head = match envelope.endpoint {
        Endpoint::Chat => vec![data(&envelope.chunk(ChunkPiece::Start))],
        Endpoint::Completion => Vec::new(),
    };
    let calls = tools.map(ToolStream::new);
    let body = stream::unfold(Some((events, calls)), move |state| {
        let envelope = envelope.clone();
        async move {
            let (mut events, mut calls) = state?;
            loop {
                let Some(event) = events.recv().await else {
                    let error = ApiError::server(STOPPED).body();
                    return Some((vec![data(&error)], None));
                };
                let out = match event {
                    Event::Text(t, _) => {
                        let t = match &mut calls {
                            Some(c) => c.push(&t),
                            None => t,
                        };
                        if t.is_empty() {
                            continue;
                        }
                        vec![data(&envelope.chunk(ChunkPiece::Text(&t)))]
                    }
                    Event::Finished { reason, stats } => {
                        let mut out = Vec::new();
                        let mut finish = reason.name();
                        if let Some(c) = calls.take() {
                            let rest = c.finish();
                            if !rest.content.is_empty() {
                                out.push(data(&envelope.chunk(ChunkPiece::Text(&rest.content))));
                            }
                            for (index, call) in rest.calls.iter().enumerate() {
                                let id = call_id();
                                let piece = ChunkPiece::Call {
                                    index,
                                    id: &id,
                                    call,
                                };
                                out.push(data(&envelope.chunk(piece)));
                                if reason == FinishReason::Stop {
                                    finish = "tool_calls";
                                }
                            }
                        }
                        out.push(data(&envelope.chunk(ChunkPiece::Finish(finish))));
                        if include_usage {
                            out.push(data(&envelope.usage_chunk(&stats)));
                        }
                        out.push(SseEvent::default().data("[DONE]"));
                        return Some((out, None));
                    }
                    Event::Failed(e) => {
                        let error = ApiError::server(e.to_string()).body();
                        return Some((vec![data(&error)], None));
                    }
                    Event::Started | Event::Rejected(_) | Event::Vectors(_) => {
                        let error = ApiError::server(STOPPED).body();
                        return Some((vec![data(&error)], None));
                    }
                };
                return Some((out, Some((events, calls))));
            }
        }
    });
    stream::iter(head)
        .chain(body.flat_map(stream::iter))
        .map(Ok)
}

/// A worker's refusal as a 400 (`context_length_exceeded` for a prompt
/// over the context).
fn rejected(e: ModelError, endpoint: Endpoint) -> ApiError {
    if is_server_fault(&e) {
        return ApiError::server(format!("{e}; the request itself may be fine: try it again"))
            .with_status(StatusCode::SERVICE_UNAVAILABLE);
    }
    let overflow = matches!(e, ModelError::Runtime(RuntimeError::ContextOverflow { .. }));
    let param = overflow.then_some(match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    });
    let error = ApiError::invalid(e.to_string(), param);
    match overflow {
        true => error.with_code("context_length_exceeded"),
        false => error,
    }
}

/// Whether a job refused before it started failed through no fault of the
/// request: the template renderer could not run (a process limit, no file
/// descriptors left), or the GPU failed. The request's own faults (too long
/// for the context, token ids out of range, a template or tokenizer error
/// on its content) stay 400s.
fn is_server_fault(e: &ModelError) -> bool {
    match e {
        ModelError::Text(gerbil::TextError::TemplateSandbox { .. }) => true,
        ModelError::Runtime(r) => !matches!(
            r,
            RuntimeError::ContextOverflow { .. }
                | RuntimeError::TokenOutOfRange { .. }
                | RuntimeError::EmptyInput
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_refused_by_the_server_s_fault_is_a_5xx_and_by_the_request_s_a_400() {
        let sandbox = ModelError::Text(gerbil::TextError::TemplateSandbox {
            detail: "could not start gerbil-run: Too many open files".into(),
        });
        let e = rejected(sandbox, Endpoint::Chat);
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::SERVICE_UNAVAILABLE, "server_error")
        );
        let gpu = ModelError::Runtime(RuntimeError::Device("lost".into()));
        assert_eq!(
            rejected(gpu, Endpoint::Chat).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let overflow = ModelError::Runtime(RuntimeError::ContextOverflow { needed: 9, max: 4 });
        let e = rejected(overflow, Endpoint::Completion);
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("prompt"))
        );
        let raised = ModelError::Text(gerbil::TextError::TemplateRaised {
            message: "roles must alternate".into(),
        });
        assert_eq!(
            rejected(raised, Endpoint::Chat).status,
            StatusCode::BAD_REQUEST
        );
    }
}
