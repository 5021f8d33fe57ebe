//! `gerbil-run PLAN serve` as a client sees it: the real binary on a real
//! socket (`--port 0`, the port read from its `listening on` line), spoken
//! to over raw HTTP/1.1. SmolLM2 answers the reference chat message with
//! the reference text, and streams the reference continuation of a raw
//! prompt; the tiny Llama, given a
//! byte-level tokenizer and a chat template of the tests' own
//! ([`tiny_text_plan`]), covers the rest: seeded sampling equal to the
//! CLI's, concurrent clients, a client that disconnects mid-stream, and an
//! OpenAI error object for each kind of bad request.

use crate::common::*;
use gerbil_text::TextCodec;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A running `gerbil-run PLAN serve --port 0`; killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server with `-v` and waits for its `listening on` line.
    pub(crate) fn start(plan: &Path, args: &[&str]) -> Server {
        let mut child = clean_command(env!("CARGO_BIN_EXE_gerbil-run"), &[])
            .arg(plan)
            .args(["-v", "serve", "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gerbil-run serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (port_tx, port_rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                    let _ = port_tx.send(port);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let port = match port_rx.recv_timeout(Duration::from_secs(600)) {
            Ok(Some(port)) => port,
            _ => {
                let _ = child.kill();
                panic!("no `listening on` line: {}", log.lock().unwrap());
            }
        };
        assert_ne!(port, 0, "--port 0 prints the port chosen");
        Server { child, port, log }
    }

    /// Ctrl-C (SIGINT): the server shuts down gracefully and exits 0.
    fn interrupt(&mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(sent.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}: {}", self.log());
        for _ in 0..100 {
            if self.log().contains("shut down") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no `shut down` line: {}", self.log());
    }

    /// Runs `python3 scripts/SCRIPT --base-url <this server's /v1> EXTRA…`
    /// (an OpenAI Python client check), asserts that it succeeded, and
    /// returns what it printed.
    pub(crate) fn run_client(&self, script: &str, extra: &[&str]) -> String {
        let path = format!("{}/../../scripts/{script}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new("python3")
            .arg(path)
            .args(["--base-url", &format!("http://127.0.0.1:{}/v1", self.port)])
            .args(extra)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}\n{}\nserver: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends `body` with `method` to `path` as JSON; the response is read later.
    fn send(&self, method: &str, path: &str, body: &[u8]) -> TcpStream {
        let headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json")];
        self.send_with(method, path, &headers, body)
    }

    /// Sends `body` with `method` to `path` and exactly `headers` (besides
    /// the length and `Connection: close`).
    pub(crate) fn send_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(900))).unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    /// A whole response: status and JSON body.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        let mut r = Response::read(self.send(method, path, body));
        let text = r.text();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text:?}"));
        (r.status, json)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request("POST", path, body.to_string().as_bytes())
    }

    pub(crate) fn get(&self, path: &str) -> (u16, Value) {
        self.request("GET", path, b"")
    }

    /// Starts a streamed request; asserts the SSE status and content type.
    pub(crate) fn stream(&self, path: &str, body: &Value) -> Response {
        let r = Response::read(self.send("POST", path, body.to_string().as_bytes()));
        assert_eq!(r.status, 200, "{path} {body}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        r
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 response with its body undone from chunked encoding.
pub(crate) struct Response {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    body: Box<dyn BufRead + Send>,
}

impl Response {
    pub(crate) fn read(stream: TcpStream) -> Response {
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let body: Box<dyn BufRead + Send> =
            if get("transfer-encoding").as_deref() == Some("chunked") {
                Box::new(BufReader::new(Dechunk {
                    inner: r,
                    left: 0,
                    done: false,
                }))
            } else if let Some(n) = get("content-length") {
                Box::new(r.take(n.parse().unwrap()))
            } else {
                Box::new(r)
            };
        Response {
            status,
            headers,
            body,
        }
    }

    /// The rest of the body as bytes.
    pub(crate) fn bytes(&mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.body.read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// The rest of the body as text.
    pub(crate) fn text(&mut self) -> String {
        let mut text = String::new();
        self.body.read_to_string(&mut text).unwrap();
        text
    }

    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// The next server-sent event's data, checking the `data: …` line is
    /// followed by a blank line; `None` at the end of the body.
    pub(crate) fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.body.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            if line == "\n" || line.starts_with(':') {
                continue;
            }
            let data = line
                .strip_prefix("data: ")
                .and_then(|d| d.strip_suffix('\n'))
                .unwrap_or_else(|| panic!("not a data line: {line:?}"))
                .to_string();
            line.clear();
            self.body.read_line(&mut line).unwrap();
            assert_eq!(line, "\n", "an event ends with a blank line");
            return Some(data);
        }
    }

    /// Every event's data to the end of the stream.
    pub(crate) fn all_data(mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_data()).collect()
    }
}

/// The body of a `Transfer-Encoding: chunked` response.
struct Dechunk<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Dechunk<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            self.inner.read_line(&mut size)?;
            let hex = size.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(hex, 16).map_err(std::io::Error::other)?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        self.left -= n;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// The text and finish reason of a streamed answer, after checking the
/// chunks' shape: one id, the object type, a chat's first chunk carrying the
/// role, text chunks without a finish reason, one finish chunk, `[DONE]`.
fn streamed_text(events: &[String], chat: bool) -> (String, String) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let (last, rest) = chunks.split_last().expect("a finish chunk");
    for c in &chunks {
        assert_eq!(c["object"], object, "{c}");
        assert_eq!(c["id"], chunks[0]["id"], "one id per stream");
        assert_eq!(c["choices"][0]["index"], 0);
    }
    let mut text = String::new();
    for (i, c) in rest.iter().enumerate() {
        let choice = &c["choices"][0];
        assert!(choice["finish_reason"].is_null(), "{c}");
        if chat {
            let delta = &choice["delta"];
            assert_eq!(
                delta.get("role").is_some(),
                i == 0,
                "role in the first chunk only: {c}"
            );
            text.push_str(delta["content"].as_str().unwrap());
        } else {
            text.push_str(choice["text"].as_str().unwrap());
        }
    }
    let reason = last["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish reason");
    (text, reason.to_string())
}

pub(crate) fn error_of(status: u16, v: &Value, want_status: u16, param: Option<&str>) -> String {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    let message = e["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message: {v}"));
    assert!(!message.is_empty());
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    assert!(e.get("code").is_some() && e.get("param").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    message.to_string()
}

#[test]
fn smollm2_chat_completion_is_the_reference_text() {
    let reference: Value =
        serde_json::from_slice(&std::fs::read(data("refs/smollm2-135m.json")).unwrap()).unwrap();
    let prompts = reference["prompts"].as_array().unwrap();
    let case = |id: &str| prompts.iter().find(|p| p["id"] == id).unwrap().clone();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let chat = case("chat_capital");
    let raw = case("raw_french_emoji");
    let codec = TextCodec::from_tokenizer_json(
        &std::fs::read(smollm2_dir().join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    let greedy = ids(&chat["greedy_ids"]);
    let eos = chat["stop_at"].as_u64().unwrap() as usize;
    let want = codec.decode(&greedy[..eos], false).unwrap();
    assert_eq!(want, "The capital of France is Paris.");

    let dir = temp("smollm2");
    let plan = dir.path().join("smollm2.plan");
    compile_to(&smollm2_dir(), &plan, &["--max-context", "256"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&plan, &[]);
    let request = json!({
        "model": "anything",
        "messages": chat["messages"],
        "temperature": 0,
        "max_tokens": chat["max_new_tokens"],
    });
    let (status, v) = server.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "smollm2", "the plan's file stem");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], want.as_str());
    assert_eq!(choice["finish_reason"], "stop");
    let prompt_tokens = chat["input_ids"].as_array().unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(
        v["usage"]["completion_tokens"],
        eos + 1,
        "the answer and its end token"
    );
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + eos + 1);

    // The raw prompt streamed (its emoji decode across chunks): the
    // reference's first tokens, ending at the length limit. (Streamed and
    // whole answers are compared on the tiny model, where they are cheap.)
    let n = 6;
    let request = json!({"prompt": raw["text"], "max_tokens": n, "temperature": 0, "stream": true});
    let events = server.stream("/v1/completions", &request).all_data();
    let want = codec.decode(&ids(&raw["greedy_ids"])[..n], false).unwrap();
    assert_eq!(streamed_text(&events, false), (want, "length".to_string()));
}

/// `gerbil-run PLAN --prompt P --temperature 0.8 --seed S --max-new-tokens 24 --json`'s text
/// (the caller holds the GPU lock).
fn cli_sampled_text(plan: &Path, prompt: &str, seed: u64) -> String {
    cli_sampled(plan, prompt, seed)["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// [`cli_sampled_text`]'s whole JSON object.
fn cli_sampled(plan: &Path, prompt: &str, seed: u64) -> Value {
    let seed = seed.to_string();
    let args = [
        plan.to_str().unwrap(),
        "--prompt",
        prompt,
        "--temperature",
        "0.8",
    ];
    let o = gerbil_run_command(&args)
        .args(["--seed", &seed, "--max-new-tokens", "24", "--json"])
        .output()
        .expect("spawn gerbil-run");
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["seed"], json!(seed.parse::<u64>().unwrap()));
    v
}

/// The same request as [`cli_sampled_text`] through `/v1/completions`.
fn server_sampled_text(server: &Server, prompt: &str, seed: u64) -> String {
    let request = json!({"prompt": prompt, "temperature": 0.8, "seed": seed, "max_tokens": 24});
    let (status, v) = server.post("/v1/completions", &request);
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// One settings resolver behind both: a sampled request gives the same text through
/// `gerbil-run` and through the server (the tiny Llama's generation config, like SmolLM2's, has
/// no `do_sample`, so both sample with transformers' top-k 50 of its 512 tokens); ten seeds draw
/// at least two continuations, and a seed drawn twice gives the same one.
#[test]
fn the_cli_and_the_server_draw_the_same_text_for_a_seed() {
    let dir = temp("same-text");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&plan, &[]);
    let prompt = "alpha beta";
    let texts: Vec<String> = (0..10)
        .map(|seed| server_sampled_text(&server, prompt, seed))
        .collect();
    let distinct: std::collections::BTreeSet<&String> = texts.iter().collect();
    assert!(distinct.len() >= 2, "ten seeds, one text: {texts:?}");
    assert_eq!(server_sampled_text(&server, prompt, 3), texts[3]);
    assert_eq!(cli_sampled_text(&plan, prompt, 3), texts[3]);
    assert_eq!(cli_sampled_text(&plan, prompt, 7), texts[7]);
    // `return_token_ids` lists the ids generated, the CLI's `output_ids`.
    let request = json!({"prompt": prompt, "temperature": 0.8, "seed": 7, "max_tokens": 24,
                         "return_token_ids": true});
    let (status, v) = server.post("/v1/completions", &request);
    assert_eq!(status, 200, "{v}");
    let ids = &v["choices"][0]["token_ids"];
    assert_eq!(ids, &cli_sampled(&plan, prompt, 7)["output_ids"], "{v}");
    assert_eq!(
        ids.as_array().unwrap().len(),
        v["usage"]["completion_tokens"]
    );
}

#[test]
fn health_models_and_an_error_object_for_each_bad_request() {
    let dir = temp("errors");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(
        &plan,
        &["--model-name", "tiny-test", "--max-body-bytes", "4096"],
    );
    assert_eq!(server.get("/health"), (200, json!({"status": "ok"})));
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "tiny-test");
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(
        server.get("/v1/models/tiny-test"),
        (200, models["data"][0].clone())
    );
    let (s, v) = server.get("/v1/models/other");
    let m = error_of(s, &v, 404, Some("model"));
    assert!(m.contains("this server has `tiny-test`"), "{m}");

    let chat = "/v1/chat/completions";
    let (s, v) = server.request("POST", chat, b"{\"messages\": [");
    let m = error_of(s, &v, 400, None);
    assert!(m.contains("not valid JSON"), "{m}");
    let (s, v) = server.post(chat, &json!({"messages": 3}));
    let m = error_of(s, &v, 400, Some("messages"));
    assert!(m.contains("invalid type"), "{m}");
    let hi = json!([{"role": "user", "content": "hi"}]);
    let (s, v) = server.post(chat, &json!({"messages": hi, "max_tokens": "x"}));
    error_of(s, &v, 400, Some("max_tokens"));
    let (s, v) = server.post(chat, &json!({"messages": hi, "temperature": -1}));
    error_of(s, &v, 400, Some("temperature"));
    let (s, v) = server.post(chat, &json!({"prompt": "hi"}));
    error_of(s, &v, 400, Some("prompt"));
    let tools = json!([{"type": "function", "function": {"name": "no spaces"}}]);
    let (s, v) = server.post(chat, &json!({"messages": hi, "tools": tools}));
    let m = error_of(s, &v, 400, Some("tools"));
    assert!(m.contains("letters, digits"), "{m}");
    let (s, v) = server.post(chat, &json!({"messages": hi, "functions": [{"name": "f"}]}));
    let m = error_of(s, &v, 400, Some("functions"));
    assert!(m.contains("send `tools` instead"), "{m}");
    let yaml = json!({"type": "yaml"});
    let (s, v) = server.post(chat, &json!({"messages": hi, "response_format": yaml}));
    error_of(s, &v, 400, Some("response_format"));
    // The tiny plan's context is 128 tokens; `zq` has no merge: 2 tokens.
    let long = "zq".repeat(100);
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": long}], "stream": stream});
        let (s, v) = server.post(chat, &body);
        let m = error_of(s, &v, 400, Some("messages"));
        assert!(m.contains("context of 128 tokens"), "{m}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        let body = json!({"prompt": long, "stream": stream});
        let (s, v) = server.post("/v1/completions", &body);
        error_of(s, &v, 400, Some("prompt"));
    }
    let big = json!({"prompt": "a".repeat(5000)});
    let (s, v) = server.post("/v1/completions", &big);
    let m = error_of(s, &v, 413, None);
    assert!(m.contains("--max-body-bytes"), "{m}");
    let (s, v) = server.get("/v1/nothing");
    error_of(s, &v, 404, None);
    let (s, v) = server.get(chat);
    error_of(s, &v, 405, None);

    // Still serving, with the right answer, after every error.
    let (s, v) = server.post(
        chat,
        &json!({"messages": hi, "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // A temperature too small to divide by is greedy: the same answer.
    let tiny_t = json!({"messages": hi, "max_tokens": 3, "temperature": 1e-40,
                        "response_format": {"type": "text"}});
    let (s, w) = server.post(chat, &tiny_t);
    assert_eq!(s, 200, "{w}");
    assert_eq!(w["choices"][0]["message"], v["choices"][0]["message"]);
    assert!(!server.log().contains("panicked"), "{}", server.log());
    server.interrupt();
}

/// The guard in front of every route: the API key (from a file) on the
/// /v1 routes and not on /health, the Host a request names, the origin of a
/// browser's request (CORS only for `--cors-origin`), and JSON bodies only.
#[test]
fn keys_hosts_origins_and_content_types_are_checked() {
    let dir = temp("guard");
    let plan = tiny_text_plan(dir.path(), &[]);
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret\n").unwrap();
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(
        &plan,
        &[
            "--api-key-file",
            key_file.to_str().unwrap(),
            "--allowed-host",
            "gerbil.lan",
            "--cors-origin",
            "https://app.example",
        ],
    );
    let body = greedy_completion("hi", 1, false).to_string();
    let call = |headers: &[(&str, &str)]| {
        let mut r =
            Response::read(server.send_with("POST", "/v1/completions", headers, body.as_bytes()));
        let text = r.text();
        (r.status, r.header("access-control-allow-origin"), text)
    };
    let (host, json) = (
        ("Host", "127.0.0.1:8080"),
        ("Content-Type", "application/json"),
    );
    let key = ("Authorization", "Bearer s3cret");
    let (status, _, text) = call(&[host, json]);
    assert_eq!(status, 401, "{text}");
    assert!(
        text.contains("invalid_api_key") && text.contains("Bearer"),
        "{text}"
    );
    assert_eq!(call(&[host, json, ("Authorization", "Bearer nope")]).0, 401);
    assert_eq!(call(&[host, json, key]).0, 200);
    assert_eq!(server.get("/health").0, 200, "/health needs no key");
    // Bodies that are not declared JSON: the browser's "simple" requests.
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let (status, _, text) = call(&[host, ("Content-Type", ct), key]);
        assert_eq!(status, 415, "{ct}: {text}");
    }
    assert_eq!(call(&[host, key]).0, 415, "no content type");
    // DNS rebinding: a name that is not the server's.
    let (status, _, text) = call(&[("Host", "evil.example"), json, key]);
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("--allowed-host"), "{text}");
    assert_eq!(call(&[("Host", "gerbil.lan:8080"), json, key]).0, 200);
    // Web pages: other origins are refused, the allowed one gets CORS headers.
    let (status, _, text) = call(&[host, json, key, ("Origin", "https://evil.example")]);
    assert_eq!(status, 403, "{text}");
    let app = ("Origin", "https://app.example");
    let (status, allow, _) = call(&[host, json, key, app]);
    assert_eq!(
        (status, allow.as_deref()),
        (200, Some("https://app.example"))
    );
    let preflight = [host, app, ("Access-Control-Request-Method", "POST")];
    let r = Response::read(server.send_with("OPTIONS", "/v1/completions", &preflight, b""));
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-headers").as_deref(),
        Some("Authorization, Content-Type")
    );
    // The server's own page (same origin) needs no CORS.
    let own = ("Origin", "http://127.0.0.1:8080");
    assert_eq!(call(&[host, json, key, own]).0, 200);
    assert!(!server.log().contains("panicked"), "{}", server.log());
    server.interrupt();
}

/// SIGTERM while a client holds a request half sent: the server waits
/// `--shutdown-timeout`, closes the connection and exits 0; with a long
/// timeout, a second SIGTERM stops it at once (exit 130).
#[test]
fn sigterm_with_a_half_open_connection_ends_within_the_shutdown_timeout() {
    let dir = temp("drain");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let half_open = |server: &Server| {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        s
    };
    let term = |server: &Server| {
        let pid = server.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
    };
    let mut server = Server::start(&plan, &["--shutdown-timeout", "1"]);
    let _held = half_open(&server);
    let start = std::time::Instant::now();
    term(&server);
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}: {}", server.log());
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(server.log().contains("closing them"), "{}", server.log());

    let mut server = Server::start(&plan, &["--shutdown-timeout", "600"]);
    let _held = half_open(&server);
    let start = std::time::Instant::now();
    term(&server);
    std::thread::sleep(Duration::from_millis(500));
    term(&server);
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{}", server.log());
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

/// Slow and idle connections are closed after `--header-timeout`, a body
/// that does not arrive gets 408 after `--body-timeout`, and a connection
/// past `--max-connections` gets 503 at once — while the others are served.
#[test]
fn slow_idle_and_surplus_connections_are_closed_while_others_are_served() {
    let dir = temp("slow");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "--header-timeout",
        "3",
        "--body-timeout",
        "3",
        "--max-connections",
        "3",
    ];
    let mut server = Server::start(&plan, &args);
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    };
    let start = std::time::Instant::now();
    // A sends half a head, B a head and half its body.
    let mut slow_head = connect();
    slow_head
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127")
        .unwrap();
    let mut slow_body = connect();
    slow_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .unwrap();
    // Meanwhile another client is served.
    assert_eq!(server.get("/health").0, 200);
    std::thread::sleep(Duration::from_millis(300));
    // A third connection, idle, fills the cap; a fourth is refused at once.
    let mut idle = connect();
    std::thread::sleep(Duration::from_millis(300));
    let mut refused = Response::read(connect());
    assert_eq!(refused.status, 503, "{}", server.log());
    assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
    let text = refused.text();
    assert!(text.contains("--max-connections"), "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // The body that never came: 408 after the body timeout.
    let timed_out = Response::read(slow_body);
    assert_eq!(timed_out.status, 408, "{}", server.log());
    // The half head and the idle connection: closed by the server.
    for s in [&mut slow_head, &mut idle] {
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("still open: {other:?}"),
        }
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    // The cap has room again.
    assert_eq!(server.get("/health").0, 200);
    assert!(!server.log().contains("panicked"), "{}", server.log());
    server.interrupt();
}

/// A busy port fails before the model loads: the plan named is never read.
#[test]
fn a_busy_port_fails_before_the_model_loads() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = gerbil_run(&["/nonexistent/model.plan", "serve", "--port", &port]);
    assert_fails_with(&o, &format!("cannot listen on 127.0.0.1:{port}"));
    let o = gerbil_run(&[
        "/nonexistent/model.plan",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        &port,
    ]);
    assert!(!o.status.success());
    // Exposed without a key: said before anything else.
    let dir = temp("exposed");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&plan, &["--host", "0.0.0.0"]);
    assert!(
        server.log().contains("without --api-key"),
        "{}",
        server.log()
    );
    server.interrupt();
}

/// The server's log says a generation was cancelled, well before the
/// ~2,000 tokens of the context.
pub(crate) fn assert_cancelled_early(server: &Server) {
    let log = server.log();
    let cancelled: usize = log
        .lines()
        .find_map(|l| l.split("generation cancelled after ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cancellation in the log:\n{log}"));
    assert!(
        cancelled < 1000,
        "stopped after {cancelled} of ~2000 tokens"
    );
}

/// A greedy completion request for `prompt`.
fn greedy_completion(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
           "stream": stream})
}

#[test]
fn concurrent_clients_each_get_their_own_answer() {
    let dir = temp("concurrent");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Arc::new(Server::start(&plan, &[]));
    let prompts = ["alpha beta", "gamma delta epsilon", "zeta"];
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let (s, v) = server.post("/v1/completions", &greedy_completion(p, 24, false));
            assert_eq!(s, 200, "{v}");
            assert_eq!(v["usage"]["completion_tokens"], 24);
            v["choices"][0]["text"].clone()
        })
        .collect();
    assert!(alone[0] != alone[1] && alone[1] != alone[2], "{alone:?}");
    let threads: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let server = Arc::clone(&server);
            let p = p.to_string();
            std::thread::spawn(move || {
                // The middle client streams; the others wait for the whole answer.
                if i == 1 {
                    let events = server
                        .stream("/v1/completions", &greedy_completion(&p, 24, true))
                        .all_data();
                    let (text, reason) = streamed_text(&events, false);
                    assert_eq!(reason, "length");
                    Value::String(text)
                } else {
                    let (s, v) = server.post("/v1/completions", &greedy_completion(&p, 24, false));
                    assert_eq!(s, 200, "{v}");
                    v["choices"][0]["text"].clone()
                }
            })
        })
        .collect();
    let together: Vec<Value> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(together, alone);
}

/// Prompts are tokenized by the handlers, not on the model thread: one too
/// long for the context is refused while another request's long generation
/// is still streaming, instead of waiting behind it.
#[test]
fn a_prompt_too_long_is_refused_without_waiting_for_the_model() {
    let dir = temp("early");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "2048"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&plan, &[]);
    let long = json!({"prompt": "a long answer", "temperature": 0, "ignore_eos": true,
                      "max_tokens": 600, "stream": true});
    let mut busy = server.stream("/v1/completions", &long);
    for _ in 0..2 {
        assert!(busy.next_data().is_some());
    }
    // `zq` has no merge: two tokens each, 2,200 in all.
    let asked = std::time::Instant::now();
    let (s, v) = server.post("/v1/completions", &json!({"prompt": "zq".repeat(1100)}));
    let refused_after = asked.elapsed();
    let m = error_of(s, &v, 400, Some("prompt"));
    assert!(m.contains("context of 2048 tokens"), "{m}");
    // A prompt far past the context by its size alone: refused before it
    // is tokenized, also inside a chat message.
    let huge = "a".repeat(900_000);
    let (s, v) = server.post("/v1/completions", &json!({"prompt": huge}));
    let m = error_of(s, &v, 400, Some("prompt"));
    assert!(
        m.contains("900000 bytes, at least") && m.contains("holds 2048 tokens"),
        "{m}"
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (s, v) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": huge}]}),
    );
    let m = error_of(s, &v, 400, Some("messages"));
    assert!(m.contains("900000 bytes"), "{m}");
    // Had the refusal queued behind the answer, the answer would be over
    // (its rest buffered in the socket) by the time the refusal came.
    let refused = std::time::Instant::now();
    while busy.next_data().is_some_and(|d| d != "[DONE]") {}
    let answer_ended_after = refused.elapsed();
    assert!(
        refused_after < answer_ended_after,
        "refused after {refused_after:?}, the answer went on {answer_ended_after:?}"
    );
}

/// `GET /metrics` counts requests, errors and tokens in Prometheus' text
/// format, behind the API key when there is one.
#[test]
fn metrics_count_requests_errors_and_tokens() {
    let dir = temp("metrics");
    let plan = tiny_text_plan(dir.path(), &[]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&plan, &["--api-key", "k"]);
    let key = ("Authorization", "Bearer k");
    let json = ("Content-Type", "application/json");
    let host = ("Host", "127.0.0.1");
    let body = greedy_completion("hi", 3, false).to_string();
    let r = Response::read(server.send_with(
        "POST",
        "/v1/completions",
        &[host, json, key],
        body.as_bytes(),
    ));
    assert_eq!(r.status, 200);
    let r =
        Response::read(server.send_with("POST", "/v1/chat/completions", &[host, json, key], b"{"));
    assert_eq!(r.status, 400);
    let scrape = |headers: &[(&str, &str)]| {
        let mut r = Response::read(server.send_with("GET", "/metrics", headers, b""));
        (r.status, r.text())
    };
    assert_eq!(scrape(&[host]).0, 401);
    let (status, text) = scrape(&[host, key]);
    assert_eq!(status, 200, "{text}");
    for line in [
        "gerbil_requests_total{endpoint=\"completion\"} 1",
        "gerbil_requests_total{endpoint=\"chat\"} 1",
        "gerbil_request_errors_total{endpoint=\"chat\"} 1",
        "gerbil_request_errors_total{endpoint=\"completion\"} 0",
        "gerbil_generated_tokens_total 3",
        "gerbil_queue_waiting 0",
        "gerbil_requests_running 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    // `/slots`: the one slot, idle, its context and cache.
    let mut r = Response::read(server.send_with("GET", "/slots", &[host, key], b""));
    assert_eq!(r.status, 200);
    let slots: Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(slots[0]["is_processing"], false, "{slots}");
    assert!(slots[0]["kv_cache_tokens"].as_u64().unwrap() > 0, "{slots}");
    assert!(slots[0]["n_ctx"].as_u64().unwrap() > 0, "{slots}");
    server.interrupt();
}

/// With `--max-queue 1`, one request waits while another runs and the next
/// gets 503 with `Retry-After` at once; the waiting one is answered later.
#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let dir = temp("queue");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "2048"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Arc::new(Server::start(&plan, &["--max-queue", "1"]));
    // As long an answer as the context allows: the tiny model decodes
    // ~1,800 tok/s on lavapipe, so it runs for about a second.
    let long = json!({"prompt": "a long answer", "temperature": 0, "ignore_eos": true,
                      "max_tokens": 2030, "stream": true});
    let mut busy = server.stream("/v1/completions", &long);
    for _ in 0..2 {
        assert!(busy.next_data().is_some());
    }
    let waiting = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            server.post("/v1/completions", &greedy_completion("hi", 3, false))
        })
    };
    // Until the second request waits (no fixed sleep: a fast machine
    // would finish the long answer first).
    let queued = |server: &Server| {
        let headers = [("Host", "127.0.0.1")];
        let text = Response::read(server.send_with("GET", "/metrics", &headers, b"")).text();
        text.lines().any(|l| l == "gerbil_queue_waiting 1")
    };
    let start = std::time::Instant::now();
    while !queued(&server) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut r = Response::read(server.send(
        "POST",
        "/v1/completions",
        greedy_completion("and me", 3, false).to_string().as_bytes(),
    ));
    assert_eq!(r.status, 503, "{}", server.log());
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    let text = r.text();
    assert!(text.contains("--max-queue"), "{text}");
    while busy.next_data().is_some_and(|d| d != "[DONE]") {}
    let (s, v) = waiting.join().unwrap();
    assert_eq!(s, 200, "{v}");
}

#[test]
fn a_client_that_disconnects_mid_stream_stops_its_generation() {
    let dir = temp("disconnect");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "2048"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Arc::new(Server::start(&plan, &[]));
    let waiting = greedy_completion("the one who waits", 16, false);
    let (s, alone) = server.post("/v1/completions", &waiting);
    assert_eq!(s, 200, "{alone}");

    // No max_tokens: up to the end of the context, about 2,000 tokens.
    let long = json!({"prompt": "the one who leaves", "temperature": 0, "ignore_eos": true,
                      "stream": true});
    let mut leaver = server.stream("/v1/completions", &long);
    for _ in 0..2 {
        let chunk: Value = serde_json::from_str(&leaver.next_data().unwrap()).unwrap();
        assert_eq!(chunk["object"], "text_completion");
    }
    let queued = {
        let server = Arc::clone(&server);
        let waiting = waiting.clone();
        std::thread::spawn(move || server.post("/v1/completions", &waiting))
    };
    std::thread::sleep(Duration::from_millis(200));
    drop(leaver);
    let (s, v) = queued.join().unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], alone["choices"][0]["text"]);
    for n in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(v["usage"][n], alone["usage"][n]);
    }
    assert_cancelled_early(&server);

    // A client that stops waiting for a whole answer stops it too.
    let quitter = server.send("POST", "/v1/completions", long_whole(&long).as_bytes());
    std::thread::sleep(Duration::from_millis(500));
    quitter.shutdown(Shutdown::Both).unwrap();
    drop(quitter);
    let (s, v) = server.post("/v1/completions", &waiting);
    assert_eq!(
        (s, &v["choices"][0]["text"]),
        (200, &alone["choices"][0]["text"])
    );
    let log = server.log();
    assert_eq!(
        log.matches("generation cancelled after").count()
            + log.matches("skipped a queued request").count(),
        2,
        "{log}"
    );
}

/// `body` without streaming.
fn long_whole(body: &Value) -> String {
    let mut b = body.clone();
    b["stream"] = json!(false);
    b.to_string()
}
