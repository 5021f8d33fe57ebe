//! The prefix cache across requests (`serve --slots`): requests that share
//! a long system prompt compute it once, users taking turns keep their
//! conversations cached, and no answer changes for it — each equals the
//! answer of a server that caches nothing between these requests.

use crate::common::*;
use crate::serve::{assert_cancelled_early, Server};
use serde_json::{json, Value};

fn ask(server: &Server, messages: &Value) -> (String, u64, u64) {
    let body = json!({"messages": messages, "temperature": 0, "max_tokens": 12,
                      "ignore_eos": true});
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &v["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (text, cached, usage["prompt_tokens"].as_u64().unwrap())
}

#[test]
fn a_shared_system_prompt_is_computed_once_and_conversations_stay_cached() {
    let dir = temp("slots");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "2048"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let system = "You answer questions about the weather in the mountains, briefly and \
                  kindly, and you never make anything up. "
        .repeat(3);
    let user = |text: &str| {
        json!([{"role": "system", "content": system},
                                   {"role": "user", "content": text}])
    };
    let (a, b) = (user("alpha?"), user("beta?"));

    // Uncached answers: a server given each request first.
    let fresh = |messages: &Value| {
        let server = Server::start(&plan, &["--slots", "1"]);
        let (text, cached, _) = ask(&server, messages);
        assert_eq!(cached, 0);
        text
    };
    let (alone_a, alone_b) = (fresh(&a), fresh(&b));

    let server = Server::start(&plan, &["--slots", "2"]);
    assert!(
        server.log().contains("no batch schedule"),
        "{}",
        server.log()
    );
    let (text_a, cached, prompt_a) = ask(&server, &a);
    assert_eq!((text_a.as_str(), cached), (alone_a.as_str(), 0));
    let (text_b, cached, prompt) = ask(&server, &b);
    assert_eq!(text_b, alone_b);
    assert!(
        cached > system.len() as u64 / 8 && cached < prompt,
        "{cached} of {prompt} prompt tokens cached: the system prompt"
    );
    // A's next turn finds A's whole first turn, though B ran between.
    let mut a2 = a.as_array().unwrap().clone();
    a2.push(json!({"role": "assistant", "content": text_a}));
    a2.push(json!({"role": "user", "content": "and tomorrow?"}));
    let a2 = Value::Array(a2);
    let (_, cached_a2, prompt_a2) = ask(&server, &a2);
    assert!(
        cached_a2 >= prompt_a && cached_a2 < prompt_a2,
        "{cached_a2} of {prompt_a2} cached; A's first prompt alone is {prompt_a} tokens"
    );
    let (status, slots) = server.get("/slots");
    assert_eq!(status, 200);
    let slots = slots.as_array().unwrap();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(
        slots
            .iter()
            .all(|s| s["kv_cache_tokens"].as_u64().unwrap() > 0),
        "{slots:?}"
    );
}

/// `serve` on a plan with a batch schedule answers concurrent requests
/// together: 8 clients at once finish in less than half the time the same
/// requests take one after another, and each gets the answer it gets alone.
#[test]
fn concurrent_clients_are_decoded_together() {
    let dir = temp("batched");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "1024", "--max-batch", "8"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = std::sync::Arc::new(Server::start(&plan, &["--slots", "8"]));
    assert!(
        server.log().contains("answering up to 8 requests together"),
        "{}",
        server.log()
    );
    let body = |i: usize| {
        json!({"prompt": format!("client {i} says"), "max_tokens": 64, "temperature": 0,
               "ignore_eos": true})
    };
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let start = std::time::Instant::now();
    let alone: Vec<String> = (0..8)
        .map(|i| {
            let (status, v) = server.post("/v1/completions", &body(i));
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["usage"]["completion_tokens"], 64);
            text(&v)
        })
        .collect();
    let one_at_a_time = start.elapsed();
    let start = std::time::Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let server = std::sync::Arc::clone(&server);
            let body = body(i);
            std::thread::spawn(move || server.post("/v1/completions", &body))
        })
        .collect();
    let together: Vec<String> = threads
        .into_iter()
        .map(|t| {
            let (status, v) = t.join().unwrap();
            assert_eq!(status, 200, "{v}");
            text(&v)
        })
        .collect();
    let at_once = start.elapsed();
    eprintln!("8 clients at once took {at_once:?}, one at a time {one_at_a_time:?}");
    assert_eq!(together, alone);
    assert!(
        at_once * 2 < one_at_a_time,
        "8 clients at once took {at_once:?}, one at a time {one_at_a_time:?}"
    );
}

/// In a batch, a client that disconnects mid-stream stops its own
/// generation only: another request decoded beside it gets its solo answer,
/// the leaver is cancelled long before the end of the context, and its slot
/// takes the next request.
#[test]
fn a_client_leaving_a_batch_frees_its_slot_and_spares_the_others() {
    let dir = temp("batch-leave");
    let plan = tiny_text_plan(dir.path(), &["--max-context", "2048", "--max-batch", "2"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = std::sync::Arc::new(Server::start(&plan, &["--slots", "2"]));
    let stayer = json!({"prompt": "the one who stays", "max_tokens": 48, "temperature": 0,
                        "ignore_eos": true});
    let (s, alone) = server.post("/v1/completions", &stayer);
    assert_eq!(s, 200, "{alone}");
    // No max_tokens: up to the end of the context, about 2,000 tokens.
    let long = json!({"prompt": "the one who leaves", "temperature": 0, "ignore_eos": true,
                      "stream": true});
    let mut leaver = server.stream("/v1/completions", &long);
    for _ in 0..2 {
        assert!(leaver.next_data().is_some());
    }
    let beside = {
        let server = std::sync::Arc::clone(&server);
        let stayer = stayer.clone();
        std::thread::spawn(move || server.post("/v1/completions", &stayer))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(leaver);
    let (s, v) = beside.join().unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], alone["choices"][0]["text"]);
    // The freed slot answers the next request.
    let (s, v) = server.post("/v1/completions", &stayer);
    assert_eq!(
        (s, &v["choices"][0]["text"]),
        (200, &alone["choices"][0]["text"])
    );
    assert_cancelled_early(&server);
}
