//! `gerbilc compile ORG/NAME` against a hub of the test's own: a small HTTP
//! server on 127.0.0.1 that serves fixture repositories the way
//! huggingface.co does (`/api/models/{repo}[/revision/{rev}]` with the file
//! list, `/{repo}/resolve/{rev}/{file}` with `ETag`, `X-Repo-Commit`,
//! `Content-Length` and `Range`, `X-Error-Code` on errors), and records every
//! request. The real `gerbilc` and `gerbil-run` binaries run with
//! `HF_ENDPOINT` pointing at it and the hub cache in a temp directory.

use crate::common::{data, gerbil_run, stderr, temp};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const TINY: &str = "models/tiny/llama";
const MAIN_SHA: &str = "1111111111111111111111111111111111111111";
const V1_SHA: &str = "2222222222222222222222222222222222222222";
/// The token the gated repository accepts; `hf_other` is a valid token of
/// an account without access; any other token is invalid.
const GOOD_TOKEN: &str = "hf_good";
/// An endpoint nothing listens on.
const UNREACHABLE: &str = "http://127.0.0.1:1";

/// One repository of the fake hub: its files at every revision it has.
struct FakeRepo {
    id: &'static str,
    /// Branch or tag → commit (a commit is a revision too).
    revisions: Vec<(&'static str, &'static str)>,
    files: Vec<(String, Vec<u8>)>,
    /// Gated: the resolve endpoint wants this token.
    gated: bool,
}

impl FakeRepo {
    fn file(&self, name: &str) -> Option<&[u8]> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
    }

    fn commit(&self, revision: &str) -> Option<&'static str> {
        self.revisions
            .iter()
            .find(|(r, c)| *r == revision || *c == revision)
            .map(|(_, c)| *c)
    }
}

/// The tiny Llama checkpoint's files, as a repository has them.
fn tiny_files() -> Vec<(String, Vec<u8>)> {
    ["config.json", "generation_config.json", "model.safetensors"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(data(TINY).join(f)).unwrap()))
        .collect()
}

/// The tiny Llama with its weights in `model.safetensors.index.json` and one
/// shard, the way large checkpoints come.
fn sharded_files() -> Vec<(String, Vec<u8>)> {
    let mut files = tiny_files();
    let (_, weights) = files.pop().unwrap();
    let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&weights[8..8 + header_len]).unwrap();
    let shard = "model-00001-of-00001.safetensors";
    let weight_map: serde_json::Map<_, _> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .map(|k| (k.clone(), serde_json::Value::from(shard)))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    files.push((WEIGHTS_INDEX.into(), index.to_string().into_bytes()));
    files.push((shard.into(), weights));
    files
}
const WEIGHTS_INDEX: &str = "model.safetensors.index.json";

/// A repository of GGUF files only, as llama.cpp users publish them: the
/// tiny Llama at two quantizations (`$GERBIL_FIXTURES/tiny-gguf/`, written
/// by build-fixtures.py).
fn gguf_files() -> Vec<(String, Vec<u8>)> {
    let base = std::env::var_os("GERBIL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"));
    let mut files = vec![("README.md".to_string(), b"# tiny".to_vec())];
    for quant in ["Q8_0", "Q4_0"] {
        let path = base.join(format!("tiny-gguf/llama-{quant}.gguf"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run scripts/build-fixtures.py --out fixtures all",
                path.display()
            )
        });
        files.push((format!("tiny-llama-{quant}.gguf"), bytes));
    }
    files
}

fn fixture_repos() -> Vec<FakeRepo> {
    vec![
        FakeRepo {
            id: "test-org/tiny-llama",
            revisions: vec![("main", MAIN_SHA), ("v1", V1_SHA)],
            files: tiny_files(),
            gated: false,
        },
        FakeRepo {
            id: "test-org/tiny-llama-sharded",
            revisions: vec![("main", MAIN_SHA)],
            files: sharded_files(),
            gated: false,
        },
        FakeRepo {
            id: "test-org/tiny-llama-GGUF",
            revisions: vec![("main", MAIN_SHA)],
            files: gguf_files(),
            gated: false,
        },
        FakeRepo {
            id: "test-org/gated-llama",
            revisions: vec![("main", MAIN_SHA)],
            files: tiny_files(),
            gated: true,
        },
    ]
}

/// A request the fake hub received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

/// The fake hub: serves [`fixture_repos`] until the test ends.
struct FakeHub {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeHub {
    /// Starts a hub that cuts the connection halfway through the body of the
    /// first `drops` downloads of `model.safetensors`.
    fn start(drops: usize) -> FakeHub {
        FakeHub::start_with(drops, None)
    }

    /// Starts a hub that answers the way `hostile` says.
    fn hostile(hostile: Hostile) -> FakeHub {
        FakeHub::start_with(0, Some(hostile))
    }

    fn start_with(drops: usize, hostile: Option<Hostile>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new((fixture_repos(), AtomicUsize::new(drops), seen.clone()));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = state.clone();
                std::thread::spawn(move || {
                    let (repos, drops, seen) = &*state;
                    serve(stream, repos, drops, seen, hostile);
                });
            }
        });
        FakeHub { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests for files (the resolve endpoint), after the first `skip`.
    fn file_requests(&self, skip: usize) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .skip(skip)
            .filter(|s| s.path.contains("/resolve/"))
            .collect()
    }
}

/// How a hostile hub (or mirror) lies.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// The revision's commit is a path.
    Commit,
    /// `config.json`'s blob id is a path.
    BlobId,
    /// Every file comes with a path for its `ETag` and `X-Repo-Commit`.
    Etag,
    /// Every file is a redirect without `Location`.
    NoLocation,
    /// Every file redirects to itself.
    RedirectLoop,
    /// `model.safetensors` is other bytes of the same size.
    WrongBytes,
}

/// A name that would leave the cache.
const ESCAPE: &str = "../../../../escaped";

/// Answers one request on `stream`, then closes it.
fn serve(
    stream: TcpStream,
    repos: &[FakeRepo],
    drops: &AtomicUsize,
    seen: &Mutex<Vec<Seen>>,
    hostile: Option<Hostile>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = target.split('?').next().unwrap_or("").replace("%2F", "/");
    let req = Seen {
        path: path.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    };
    seen.lock().unwrap().push(req.clone());
    let reply = route(&req, repos, hostile);
    let mut out = stream;
    let body: &[u8] = if method == "HEAD" { &[] } else { &reply.body };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reason(reply.status),
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let cut = req.path.ends_with("/model.safetensors")
        && method == "GET"
        && reply.body.len() > 1
        && drops
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
            .is_ok();
    let body = if cut { &body[..body.len() / 2] } else { body };
    let _ = out.write_all(body);
    let _ = out.flush();
    let _ = out.shutdown(std::net::Shutdown::Both);
}

struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    }
}

/// An error the way the hub sends it.
fn hub_error(status: u16, code: Option<&str>, message: &str) -> Reply {
    let mut headers = vec![("X-Error-Message", message.to_string())];
    if let Some(code) = code {
        headers.push(("X-Error-Code", code.to_string()));
    }
    Reply {
        status,
        headers,
        body: serde_json::json!({ "error": message })
            .to_string()
            .into_bytes(),
    }
}

/// A file's blob id as the hub lists it: an LFS file's sha256 (weights),
/// else a 40-hex-digit git object id (here the sha256's first 40 digits).
fn blob_id(name: &str, bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if is_lfs(name) {
        hex
    } else {
        hex[..40].to_string()
    }
}

fn is_lfs(name: &str) -> bool {
    name.ends_with(".safetensors") || name.ends_with(".gguf")
}

fn route(req: &Seen, repos: &[FakeRepo], hostile: Option<Hostile>) -> Reply {
    // Any token but the known ones is refused, as the hub refuses it.
    if let Some(auth) = &req.auth {
        if auth != &format!("Bearer {GOOD_TOKEN}") && auth != "Bearer hf_other" {
            return hub_error(401, None, "Invalid credentials in Authorization header");
        }
    }
    let find = |id: &str| repos.iter().find(|r| r.id == id);
    if let Some(rest) = req.path.strip_prefix("/api/models/") {
        let (id, revision) = rest.split_once("/revision/").unwrap_or((rest, "main"));
        let Some(repo) = find(id) else {
            return hub_error(401, Some("RepoNotFound"), "Repository not found");
        };
        let Some(sha) = repo.commit(revision) else {
            return hub_error(404, Some("RevisionNotFound"), "Invalid rev id");
        };
        let siblings: Vec<_> = repo
            .files
            .iter()
            .map(|(n, b)| {
                let id = match hostile {
                    Some(Hostile::BlobId) if n == "config.json" => ESCAPE.to_string(),
                    _ => blob_id(n, b),
                };
                let mut s = serde_json::json!({"rfilename": n, "size": b.len(), "blobId": id});
                if is_lfs(n) {
                    s["lfs"] = serde_json::json!({"sha256": id, "size": b.len()});
                }
                s
            })
            .chain(std::iter::once(
                serde_json::json!({"rfilename": "README.md"}),
            ))
            .collect();
        let sha = match hostile {
            Some(Hostile::Commit) => ESCAPE,
            _ => sha,
        };
        let body = serde_json::json!({"id": repo.id, "sha": sha, "gated": repo.gated, "siblings": siblings});
        return Reply {
            status: 200,
            headers: vec![("Content-Type", "application/json".into())],
            body: body.to_string().into_bytes(),
        };
    }
    // /{org}/{name}/resolve/{rev}/{file}
    let segments: Vec<&str> = req.path.trim_start_matches('/').splitn(5, '/').collect();
    let [org, name, "resolve", revision, file] = segments[..] else {
        return hub_error(404, None, "Not found");
    };
    let Some(repo) = find(&format!("{org}/{name}")) else {
        return hub_error(401, Some("RepoNotFound"), "Repository not found");
    };
    if repo.gated && req.auth.as_deref() != Some(&format!("Bearer {GOOD_TOKEN}")) {
        let status = if req.auth.is_some() { 403 } else { 401 };
        return hub_error(
            status,
            Some("GatedRepo"),
            "Access to this model is restricted",
        );
    }
    let Some(sha) = repo.commit(revision) else {
        return hub_error(404, Some("RevisionNotFound"), "Invalid rev id");
    };
    let Some(bytes) = repo.file(file) else {
        return hub_error(404, Some("EntryNotFound"), "Entry not found");
    };
    let redirect = |location: Option<String>| Reply {
        status: 302,
        headers: location.map(|l| ("Location", l)).into_iter().collect(),
        body: Vec::new(),
    };
    let (etag, commit) = match hostile {
        Some(Hostile::NoLocation) => return redirect(None),
        Some(Hostile::RedirectLoop) => return redirect(Some(req.path.clone())),
        Some(Hostile::Etag) => (ESCAPE.to_string(), ESCAPE),
        _ => (blob_id(file, bytes), sha),
    };
    let wrong: Vec<u8>;
    let bytes = match hostile {
        Some(Hostile::WrongBytes) if file == "model.safetensors" => {
            wrong = bytes.iter().rev().copied().collect();
            &wrong[..]
        }
        _ => bytes,
    };
    let mut headers = vec![
        ("ETag", format!("\"{etag}\"")),
        ("X-Repo-Commit", commit.to_string()),
        ("Accept-Ranges", "bytes".to_string()),
    ];
    let range = req.range.as_deref().and_then(|r| r.strip_prefix("bytes="));
    let Some((from, to)) = range.and_then(|r| r.split_once('-')) else {
        return Reply {
            status: 200,
            headers,
            body: bytes.to_vec(),
        };
    };
    let from: usize = from.parse().unwrap();
    let to: usize = to.parse().unwrap_or(bytes.len() - 1).min(bytes.len() - 1);
    if from > to {
        return hub_error(416, None, "Range not satisfiable");
    }
    headers.push((
        "Content-Range",
        format!("bytes {from}-{to}/{}", bytes.len()),
    ));
    Reply {
        status: 206,
        headers,
        body: bytes[from..=to].to_vec(),
    }
}

/// Runs `gerbilc` against `hub` with `HF_HOME` in `home` and only the
/// given hub variables set.
fn gerbilc(hub: &FakeHub, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gerbilc"));
    cmd.args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HOME", home.join("hf"));
    for var in [
        "HF_HUB_CACHE",
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "ALL_PROXY",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "http_proxy",
        "https_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "gerbilc failed: {}", stderr(o));
}

#[track_caller]
fn assert_fails_with(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    for needle in needles {
        assert!(
            err.contains(needle),
            "expected `{needle}` in stderr:\n{err}"
        );
    }
    assert!(!err.contains("panicked"), "panicked: {err}");
}

/// Compiles `repo` (a hub id or a directory) to `dir/name.plan`.
fn compile(
    hub: &FakeHub,
    home: &Path,
    repo: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> PathBuf {
    let plan = home.join(format!("{}.plan", repo.replace('/', "_")));
    let mut args = vec!["compile", repo, "-o", plan.to_str().unwrap()];
    args.extend_from_slice(extra);
    assert_ok(&gerbilc(hub, home, &args, env));
    plan
}

/// The greedy continuation of 1,2,3 that `plan` gives.
fn output_ids(plan: &Path) -> serde_json::Value {
    let o = gerbil_run(&[
        plan.to_str().unwrap(),
        "--input-ids",
        "1,2,3",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "gerbil-run failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["output_ids"].as_array().map(Vec::len), Some(2));
    v["output_ids"].clone()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn repo_cache(home: &Path, id: &str) -> PathBuf {
    home.join("hf/hub")
        .join(format!("models--{}", id.replace('/', "--")))
}

#[test]
fn a_hub_model_compiles_and_runs_like_its_directory_and_the_second_compile_uses_the_cache() {
    let hub = FakeHub::start(0);
    let home = temp("good");
    let from_hub = compile(&hub, home.path(), "test-org/tiny-llama", &[], &[]);
    let seen = hub.seen();
    assert!(
        seen.iter()
            .any(|s| s.path == "/api/models/test-org/tiny-llama/revision/main"),
        "{seen:?}"
    );
    // Every file was fetched at the commit `main` named, none that the
    // repository lacks, and no token was sent.
    let files = hub.file_requests(0);
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        let path = format!("/test-org/tiny-llama/resolve/{MAIN_SHA}/{f}");
        assert!(files.iter().any(|s| s.path == path), "{path} in {files:?}");
    }
    assert!(files
        .iter()
        .all(|s| !s.path.contains("README") && s.auth.is_none()));

    let cache = repo_cache(home.path(), "test-org/tiny-llama");
    let snapshot = cache.join("snapshots").join(MAIN_SHA);
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        std::fs::read(data(TINY).join("model.safetensors")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(cache.join("refs/main")).unwrap(),
        MAIN_SHA
    );

    let local = compile(&hub, home.path(), data(TINY).to_str().unwrap(), &[], &[]);
    assert_eq!(output_ids(&from_hub), output_ids(&local));

    let before = hub.seen().len();
    compile(&hub, home.path(), "test-org/tiny-llama", &["--quiet"], &[]);
    assert_eq!(
        hub.file_requests(before).len(),
        0,
        "the second compile downloaded files"
    );

    // Offline, the cached revision is used, and said so.
    let offline = [("HF_ENDPOINT", UNREACHABLE)];
    let plan = home.path().join("offline.plan");
    let args = [
        "compile",
        "test-org/tiny-llama",
        "-o",
        plan.to_str().unwrap(),
    ];
    let o = gerbilc(&hub, home.path(), &args, &offline);
    assert_ok(&o);
    assert!(stderr(&o).contains("unreachable"), "{}", stderr(&o));
}

#[test]
fn a_sharded_hub_model_fetches_every_shard_its_index_names() {
    let hub = FakeHub::start(0);
    let home = temp("sharded");
    let plan = compile(&hub, home.path(), "test-org/tiny-llama-sharded", &[], &[]);
    let shard = "model-00001-of-00001.safetensors";
    assert!(hub.file_requests(0).iter().any(|s| s.path.ends_with(shard)));
    let local = compile(&hub, home.path(), data(TINY).to_str().unwrap(), &[], &[]);
    assert_eq!(output_ids(&plan), output_ids(&local));
}

/// `gerbil-run ORG/NAME:QUANT` compiles the file the quantization names into
/// the plan cache on first use and runs it; the next run takes the cached
/// plan (no compile, and no hub: it is unreachable then) and answers the same
/// as the plan `gerbilc` compiles from that file.
#[test]
fn gerbil_run_compiles_a_hub_model_once_into_the_plan_cache() {
    let hub = FakeHub::start(0);
    let home = temp("plan-cache");
    let repo = "test-org/tiny-llama-GGUF";
    let cache = home.path().join("gerbil");
    let run = |endpoint: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_gerbil-run"))
            .args([&format!("{repo}:Q8_0"), "--input-ids", "1,2,3"])
            .args(["--max-new-tokens", "2", "--json"])
            .env("HF_ENDPOINT", endpoint)
            .env("HF_HOME", home.path().join("hf"))
            .env("GERBIL_CACHE_DIR", &cache)
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_TOKEN")
            .output()
            .unwrap();
        assert_ok(&o);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["output_ids"].clone(), stderr(&o))
    };
    let (first, log) = run(&hub.url);
    assert!(
        log.contains("compiling test-org/tiny-llama-GGUF:Q8_0 for the first time"),
        "{log}"
    );
    let plans: Vec<PathBuf> = files_under(&cache.join("plans"));
    assert_eq!(plans.len(), 1, "{plans:?}");
    let (again, log) = run(UNREACHABLE);
    assert!(!log.contains("compiling"), "{log}");
    assert_eq!(again, first);
    let compiled = compile(&hub, home.path(), &format!("{repo}:Q8_0"), &[], &[]);
    assert_eq!(output_ids(&compiled), first);
    assert_eq!(files_under(&cache.join("plans")), plans);
}

#[test]
fn a_gguf_repository_compiles_the_file_a_quantization_names() {
    let hub = FakeHub::start(0);
    let home = temp("gguf");
    let repo = "test-org/tiny-llama-GGUF";
    let plan = compile(&hub, home.path(), &format!("{repo}:Q4_0"), &[], &[]);
    // Only that file was fetched (metadata, then body).
    let mut files: Vec<String> = hub
        .file_requests(0)
        .iter()
        .map(|s| s.path.clone())
        .collect();
    files.dedup();
    assert_eq!(
        files,
        [format!("/{repo}/resolve/{MAIN_SHA}/tiny-llama-Q4_0.gguf")]
    );
    let snapshot = repo_cache(home.path(), repo)
        .join("snapshots")
        .join(MAIN_SHA);
    let local = compile(
        &hub,
        home.path(),
        snapshot.join("tiny-llama-Q4_0.gguf").to_str().unwrap(),
        &[],
        &[],
    );
    assert_eq!(output_ids(&plan), output_ids(&local));

    // By file name; and from the cache when the hub cannot be reached.
    compile(
        &hub,
        home.path(),
        repo,
        &["--gguf", "tiny-llama-Q8_0.gguf"],
        &[],
    );
    let offline = [("HF_ENDPOINT", UNREACHABLE)];
    compile(&hub, home.path(), repo, &["--gguf", "q8_0"], &offline);

    // Without a choice, the files are named; so is a choice that matches none.
    let out = home.path().join("x.plan");
    let out = out.to_str().unwrap();
    let o = gerbilc(&hub, home.path(), &["compile", repo, "-o", out], &[]);
    assert_fails_with(&o, &["2 GGUF files", "tiny-llama-Q8_0.gguf", ":QUANT"]);
    let o = gerbilc(
        &hub,
        home.path(),
        &["compile", &format!("{repo}:Q5_K_M"), "-o", out],
        &[],
    );
    assert_fails_with(
        &o,
        &["no GGUF file matching `Q5_K_M`", "tiny-llama-Q4_0.gguf"],
    );
}

#[test]
fn revision_reaches_the_hub_and_a_missing_one_is_named() {
    let hub = FakeHub::start(0);
    let home = temp("revision");
    let plan = home.path().join("v1.plan");
    let args = [
        "compile",
        "test-org/tiny-llama",
        "--revision",
        "v1",
        "-o",
        plan.to_str().unwrap(),
    ];
    assert_ok(&gerbilc(&hub, home.path(), &args, &[]));
    let seen = hub.seen();
    assert!(
        seen.iter()
            .any(|s| s.path == "/api/models/test-org/tiny-llama/revision/v1"),
        "{seen:?}"
    );
    assert!(hub.file_requests(0).iter().all(|s| s.path.contains(V1_SHA)));
    let cache = repo_cache(home.path(), "test-org/tiny-llama");
    assert_eq!(
        std::fs::read_to_string(cache.join("refs/v1")).unwrap(),
        V1_SHA
    );
    assert!(cache
        .join("snapshots")
        .join(V1_SHA)
        .join("config.json")
        .is_file());

    let args = [
        "compile",
        "test-org/tiny-llama",
        "--revision",
        "no-such-branch",
    ];
    assert_fails_with(
        &gerbilc(&hub, home.path(), &args, &[]),
        &["revision `no-such-branch`", "test-org/tiny-llama"],
    );
    // --revision means nothing for a local directory.
    let tiny = data(TINY);
    let args = ["compile", tiny.to_str().unwrap(), "--revision", "v1"];
    assert_fails_with(
        &gerbilc(&hub, home.path(), &args, &[]),
        &["--revision", "local directory"],
    );
}

#[test]
fn a_missing_repo_is_named_and_an_argument_that_is_neither_dir_nor_id_says_so() {
    let hub = FakeHub::start(0);
    let home = temp("missing");
    assert_fails_with(
        &gerbilc(&hub, home.path(), &["compile", "nobody/no-such-model"], &[]),
        &["`nobody/no-such-model` was not found", &hub.url, "HF_TOKEN"],
    );
    // `tune` finds its model the same way (and fails before it needs a GPU).
    let args = ["tune", "nobody/no-such-model", "-o", "tiles.json"];
    assert_fails_with(
        &gerbilc(&hub, home.path(), &args, &[]),
        &["`nobody/no-such-model` was not found"],
    );
    assert_fails_with(
        &gerbilc(&hub, home.path(), &["compile", "./no/such/dir"], &[]),
        &["`./no/such/dir` is neither a directory nor a hub model id"],
    );
    assert!(hub.seen().iter().all(|s| !s.path.contains("no/such")));
    let o = gerbilc(
        &hub,
        home.path(),
        &["compile", "test-org/tiny-llama"],
        &[("HF_ENDPOINT", UNREACHABLE)],
    );
    assert_fails_with(
        &o,
        &[
            "could not reach the hub at http://127.0.0.1:1",
            "HF_ENDPOINT",
        ],
    );
}

#[test]
fn a_gated_repo_needs_a_token_and_a_good_one_gets_it() {
    let hub = FakeHub::start(0);
    let home = temp("gated");
    let repo = "test-org/gated-llama";
    assert_fails_with(
        &gerbilc(&hub, home.path(), &["compile", repo], &[]),
        &["gated", "accept its terms", "set HF_TOKEN", repo],
    );
    assert_fails_with(
        &gerbilc(
            &hub,
            home.path(),
            &["compile", repo],
            &[("HF_TOKEN", "hf_bad")],
        ),
        &["refused the token (HF_TOKEN)", "check HF_TOKEN"],
    );
    assert_fails_with(
        &gerbilc(
            &hub,
            home.path(),
            &["compile", repo],
            &[("HF_TOKEN", "hf_other")],
        ),
        &["has no access", "accept its terms"],
    );
    let before = hub.seen().len();
    let plan = compile(&hub, home.path(), repo, &[], &[("HF_TOKEN", GOOD_TOKEN)]);
    let files = hub.file_requests(before);
    assert!(!files.is_empty());
    let bearer = format!("Bearer {GOOD_TOKEN}");
    assert!(
        files
            .iter()
            .all(|s| s.auth.as_deref() == Some(bearer.as_str())),
        "{files:?}"
    );
    assert!(plan.is_file());
}

#[test]
fn a_token_file_under_hf_home_is_used() {
    let hub = FakeHub::start(0);
    let home = temp("token-file");
    std::fs::create_dir_all(home.path().join("hf")).unwrap();
    std::fs::write(home.path().join("hf/token"), format!("{GOOD_TOKEN}\n")).unwrap();
    compile(&hub, home.path(), "test-org/gated-llama", &[], &[]);
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request() {
    let hub = FakeHub::start(1);
    let home = temp("resume");
    let plan = compile(&hub, home.path(), "test-org/tiny-llama", &[], &[]);
    let size = std::fs::metadata(data(TINY).join("model.safetensors"))
        .unwrap()
        .len();
    let weights: Vec<Seen> = hub
        .file_requests(0)
        .into_iter()
        .filter(|s| {
            s.path.ends_with("/model.safetensors") && s.range.as_deref() != Some("bytes=0-0")
        })
        .collect();
    let ranges: Vec<_> = weights.iter().map(|s| s.range.clone()).collect();
    assert_eq!(
        ranges,
        [
            Some("bytes=0-".to_string()),
            Some(format!("bytes={}-", size / 2))
        ]
    );
    assert_no_partial_files(home.path());
    let snapshot = repo_cache(home.path(), "test-org/tiny-llama")
        .join("snapshots")
        .join(MAIN_SHA);
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        std::fs::read(data(TINY).join("model.safetensors")).unwrap()
    );
    let local = compile(&hub, home.path(), data(TINY).to_str().unwrap(), &[], &[]);
    assert_eq!(output_ids(&plan), output_ids(&local));
}

#[test]
fn a_download_that_keeps_failing_is_reported_never_used_and_resumed_next_time() {
    let bad = FakeHub::start(usize::MAX);
    let home = temp("interrupted");
    let cache = repo_cache(home.path(), "test-org/tiny-llama");
    // HF_HUB_CACHE takes precedence over HF_HOME.
    let hub_cache = home.path().join("hf/hub");
    let env = [("HF_HUB_CACHE", hub_cache.to_str().unwrap())];
    std::fs::create_dir_all(home.path().join("hf")).unwrap();
    let o = gerbilc(
        &bad,
        home.path(),
        &["compile", "test-org/tiny-llama", "-o", "never.plan"],
        &[("HF_HOME", "/nonexistent/hf-home"), env[0]],
    );
    assert_fails_with(
        &o,
        &[
            "model.safetensors",
            "test-org/tiny-llama",
            "run the command again",
        ],
    );
    let weights = std::fs::read(data(TINY).join("model.safetensors")).unwrap();
    let final_blob = cache
        .join("blobs")
        .join(blob_id("model.safetensors", &weights));
    assert!(
        !final_blob.exists(),
        "a partial download sits under its final name"
    );
    assert!(!cache
        .join("snapshots")
        .join(MAIN_SHA)
        .join("model.safetensors")
        .exists());
    let part =
        final_blob.with_file_name(format!("{}.part", blob_id("model.safetensors", &weights)));
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(
        kept > 0 && kept < weights.len() as u64,
        "{kept} bytes in {}",
        part.display()
    );

    let good = FakeHub::start(0);
    let plan = compile(
        &good,
        home.path(),
        "test-org/tiny-llama",
        &[],
        &[("HF_HOME", "/nonexistent/hf-home"), env[0]],
    );
    let resumed = good
        .file_requests(0)
        .into_iter()
        .filter(|s| {
            s.path.ends_with("/model.safetensors") && s.range.as_deref() != Some("bytes=0-0")
        })
        .map(|s| s.range)
        .collect::<Vec<_>>();
    assert_eq!(resumed, [Some(format!("bytes={kept}-"))]);
    assert_no_partial_files(home.path());
    assert_eq!(std::fs::read(&final_blob).unwrap(), weights);
    assert!(plan.is_file());
}

#[test]
fn download_bars_show_on_a_terminal_but_not_with_quiet() {
    let hub = FakeHub::start(0);
    // Under a pseudo-terminal (util-linux's `script`); returns what it showed.
    let on_a_terminal = |quiet: bool| {
        let home = temp("bars");
        let plan = home.path().join("bars.plan");
        let line = format!(
            "'{}' compile test-org/tiny-llama -o '{}' {}",
            env!("CARGO_BIN_EXE_gerbilc"),
            plan.display(),
            if quiet { "--quiet" } else { "" }
        );
        let o = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_HOME", home.path().join("hf"))
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_TOKEN")
            .env("COLUMNS", "120")
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "under script(1): {shown}{}", stderr(&o));
        assert!(plan.is_file(), "{shown}");
        shown
    };
    // A file's bar is drawn while it downloads and cleared when done (a
    // file of a few bytes may come and go between two redraws).
    let shown = on_a_terminal(false);
    assert!(shown.contains("model.safetensors ["), "{shown:?}");
    assert!(shown.contains("/491.27 KiB"), "no byte counts: {shown:?}");
    let quiet = on_a_terminal(true);
    assert!(!quiet.contains("model.safetensors"), "{quiet:?}");
}

fn assert_no_partial_files(home: &Path) {
    let partial: Vec<_> = files_under(home)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "part"))
        .collect();
    assert!(partial.is_empty(), "{partial:?}");
}

/// A hub (or `HF_ENDPOINT` mirror) that lies gets a clear error naming what
/// it sent, within a bounded time, with nothing written outside the cache;
/// names it sends but gerbil no longer reads (`ETag`, `X-Repo-Commit`)
/// cannot move files either; a revision that is a path is refused before
/// any request; a cached blob corrupted in place is fetched again.
#[test]
fn a_hostile_hub_gets_clear_errors_and_nothing_leaves_the_cache() {
    let cases: [(Hostile, &[&str]); 5] = [
        (Hostile::Commit, &["test-org/tiny-llama", "is not a commit"]),
        (Hostile::BlobId, &["is not a blob id", "config.json"]),
        (Hostile::NoLocation, &["HTTP 302", "config.json"]),
        (
            Hostile::RedirectLoop,
            &["redirected", "more than 5 times", "config.json"],
        ),
        (
            Hostile::WrongBytes,
            &["sha256", "model.safetensors", "deleted"],
        ),
    ];
    let only_in_cache = |root: &Path, home: &Path| {
        for f in files_under(root) {
            assert!(
                f.starts_with(home.join("hf/hub")),
                "{} outside the cache",
                f.display()
            );
            assert!(!f.to_string_lossy().contains("escaped"), "{}", f.display());
        }
    };
    for (kind, needles) in cases {
        let hub = FakeHub::hostile(kind);
        let root = temp("hostile");
        let home = root.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let start = std::time::Instant::now();
        let never = root.path().join("never.plan");
        let o = gerbilc(
            &hub,
            &home,
            &[
                "compile",
                "test-org/tiny-llama",
                "-o",
                never.to_str().unwrap(),
            ],
            &[],
        );
        assert_fails_with(&o, needles);
        assert!(!stderr(&o).contains("panicked"), "{kind:?}: {}", stderr(&o));
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{kind:?}"
        );
        only_in_cache(root.path(), &home);
        if matches!(kind, Hostile::WrongBytes) {
            assert_no_partial_files(&home);
            let blobs = repo_cache(&home, "test-org/tiny-llama").join("blobs");
            let weights = std::fs::read(data(TINY).join("model.safetensors")).unwrap();
            assert!(!blobs.join(blob_id("model.safetensors", &weights)).exists());
        }
    }

    // Paths in the headers gerbil does not read: the download works.
    let hub = FakeHub::hostile(Hostile::Etag);
    let root = temp("etag");
    let home = root.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let plan = compile(&hub, &home, "test-org/tiny-llama", &[], &[]);
    std::fs::remove_file(plan).unwrap();
    only_in_cache(root.path(), &home);

    // A revision that is a path: refused before any request.
    let hub = FakeHub::start(0);
    let o = gerbilc(
        &hub,
        &home,
        &[
            "compile",
            "test-org/tiny-llama",
            "--revision",
            "../../../file",
            "-o",
            "x.plan",
        ],
        &[],
    );
    assert_fails_with(&o, &["`../../../file` is not a revision name"]);
    assert!(hub.seen().is_empty(), "{:?}", hub.seen());

    // A cached blob corrupted in place, same size: caught and fetched again.
    let good = compile(&hub, &home, "test-org/tiny-llama", &[], &[]);
    let weights = std::fs::read(data(TINY).join("model.safetensors")).unwrap();
    let blob = repo_cache(&home, "test-org/tiny-llama")
        .join("blobs")
        .join(blob_id("model.safetensors", &weights));
    let mut corrupt = weights.clone();
    corrupt[weights.len() / 2] ^= 0xff;
    std::fs::write(&blob, &corrupt).unwrap();
    // The model compiled again over `good`, with `env`.
    let recompile = |env: &[(&str, &str)]| {
        let args = [
            "compile",
            "test-org/tiny-llama",
            "-o",
            good.to_str().unwrap(),
        ];
        gerbilc(&hub, &home, &args, env)
    };
    let before = hub.seen().len();
    let o = recompile(&[]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("does not match the hub's sha256"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&blob).unwrap(), weights);
    assert_eq!(
        hub.file_requests(before).len(),
        1,
        "only the corrupt file is fetched"
    );
    // Offline, a corrupt blob is refused rather than used.
    std::fs::write(&blob, &corrupt).unwrap();
    let o = recompile(&[("HF_ENDPOINT", UNREACHABLE)]);
    assert_fails_with(&o, &["sha256", "model.safetensors"]);

    // A link in the snapshot to a file outside the cache: refused.
    std::fs::write(&blob, &weights).unwrap();
    let outside = root.path().join("outside.json");
    std::fs::write(&outside, "{}").unwrap();
    let snapshot = repo_cache(&home, "test-org/tiny-llama")
        .join("snapshots")
        .join(MAIN_SHA);
    std::os::unix::fs::symlink(&outside, snapshot.join("tokenizer.json")).unwrap();
    let o = recompile(&[]);
    assert_fails_with(&o, &["tokenizer.json", "outside the cache"]);
}

/// A local checkpoint whose file links outside its directory is refused,
/// unless `--allow-outside-links` says the link is meant.
#[test]
fn a_local_checkpoint_linking_outside_its_directory_is_refused() {
    let root = temp("links");
    let dir = root.path().join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let outside = root.path().join("weights.safetensors");
    std::fs::copy(data(TINY).join("model.safetensors"), &outside).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(data(TINY).join(f), dir.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(&outside, dir.join("model.safetensors")).unwrap();
    let plan = root.path().join("m.plan");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            dir.to_str().unwrap(),
            "-o",
            plan.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_gerbilc"))
            .args(&args)
            .output()
            .unwrap()
    };
    assert_fails_with(
        &run(&[]),
        &[
            "model.safetensors",
            "outside the checkpoint",
            "--allow-outside-links",
        ],
    );
    assert_ok(&run(&["--allow-outside-links"]));
    // A link inside the directory is fine.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::rename(&outside, dir.join("weights.bin")).unwrap();
    std::os::unix::fs::symlink("weights.bin", dir.join("model.safetensors")).unwrap();
    assert_ok(&run(&[]));
}
