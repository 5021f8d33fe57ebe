// gerbil's chat page. It talks to one of two engines: "the server" (the gerbil-run serve that
// serves this page: POST /v1/chat/completions, streamed) or "this browser" (the same plan run on
// the browser's WebGPU in worker.js, downloaded from a URL or opened from a file). The address
// picks either: ?engine=browser&plan=URL loads a plan at once, ?engine=server chats with the
// server. The page keeps the conversation and sends all of it each turn; both engines keep its
// tokens cached and run only the new turn. document.body's data-state (idle, loading, ready,
// answering, error) says where it is, for people and for tests.
//
// Scripts drive the page through its address (the README's contract): run=1 generates once from
// prompt=TEXT (chat=1: as one user message through the chat template) or input_ids=1,2,3, with
// max_new_tokens=N and temperature=T, and writes one JSON object into <pre id="result">:
// {output_ids, text, prompt_tokens, tok_s, adapter, variant}, or {error}; selftest=1 (with
// engine=browser&plan=URL) runs the plan's self-test instead and writes {selftest: report}.
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

const state = {
    engine: params.get("engine") === "browser" ? "browser" : "server",
    server: null, // the server's model id, when this page came from gerbil-run serve
    worker: null,
    lastLoad: null, // the worker's last load message, to load again after a lost device
    conversation: [],
    answer: null, // the answer in progress: {bubble, text, started, first, abort}
    loaded: null, // the browser engine's info, once a plan is loaded
    run: params.get("run") === "1", // the address asks for one generation (the contract)
    selftest: params.get("selftest") === "1", // the address asks for the plan's self-test
};

const setState = (s) => (document.body.dataset.state = s);
const apiKey = () => sessionStorage.getItem("gerbil-api-key");
const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

function alertUser(text, { reload = false } = {}) {
    $("alert-text").textContent = text;
    $("reload").hidden = !reload;
    $("alert").hidden = false;
    setState("error");
}

function clearAlert() {
    $("alert").hidden = true;
}

function megabytes(n) {
    return (n / 1e6).toFixed(n < 1e7 ? 1 : 0);
}

// --- the server --------------------------------------------------------------------------------

async function findServer() {
    try {
        let response = await fetch("/v1/models", { headers: authHeaders() });
        if (response.status === 401) {
            const key = prompt("This server needs an API key:");
            if (key) sessionStorage.setItem("gerbil-api-key", key);
            response = await fetch("/v1/models", { headers: authHeaders() });
        }
        if (!response.ok) return null;
        return (await response.json()).data?.[0]?.id ?? null;
    } catch {
        return null;
    }
}

async function askServer(messages, settings) {
    const controller = new AbortController();
    state.answer.abort = () => controller.abort();
    const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify({
            model: state.server,
            messages,
            ...settings,
            stream: true,
            stream_options: { include_usage: true },
        }),
        signal: controller.signal,
    });
    if (!response.ok) {
        const body = await response.json().catch(() => null);
        throw new Error(body?.error?.message ?? `HTTP ${response.status}`);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    let usage = null;
    let timings = null;
    let finish = null;
    try {
        for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            buffered += value;
            let end;
            while ((end = buffered.indexOf("\n\n")) >= 0) {
                const event = buffered.slice(0, end);
                buffered = buffered.slice(end + 2);
                for (const line of event.split("\n")) {
                    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
                    const chunk = JSON.parse(line.slice(6));
                    if (chunk.error) throw new Error(chunk.error.message);
                    const choice = chunk.choices?.[0];
                    if (choice?.delta?.content) addText(choice.delta.content);
                    if (choice?.finish_reason) finish = choice.finish_reason;
                    if (chunk.usage) usage = chunk.usage;
                    if (chunk.timings) timings = chunk.timings;
                }
            }
        }
    } catch (e) {
        if (e.name !== "AbortError") throw e;
        finish = "cancelled";
    }
    finished({
        generated_tokens: usage?.completion_tokens,
        // The server's own rate: its tokens arrive here in bursts.
        decode_tok_s: timings?.predicted_n > 1 ? timings.predicted_per_second : undefined,
        cached_tokens: usage?.prompt_tokens_details?.cached_tokens,
        prompt_tokens: usage?.prompt_tokens,
        finish_reason: finish,
    });
}

// --- the browser -------------------------------------------------------------------------------

function startWorker() {
    state.worker?.terminate();
    state.worker = new Worker("worker.js", { type: "module" });
    state.worker.onmessage = ({ data: m }) => fromWorker(m);
    state.worker.onerror = (e) => alertUser(`the engine's worker failed: ${e.message ?? e}`);
}

function load(message) {
    clearAlert();
    if (!navigator.gpu) {
        alertUser("This browser has no WebGPU, so it cannot run the model itself: use a recent Chrome, Edge or Safari (or Firefox with WebGPU enabled), or chat with the server instead.");
        return;
    }
    if (!state.worker) startWorker();
    state.lastLoad = message;
    $("where").textContent = "loading…";
    $("progress").hidden = false;
    $("progress").removeAttribute("value");
    setState("loading");
    state.worker.postMessage(message);
}

function fromWorker(m) {
    if (m.type === "progress") {
        const bar = $("progress");
        if (m.total) {
            bar.max = m.total;
            bar.value = m.done;
        }
        const what = m.stage === "download" ? "downloading" : "uploading to the GPU";
        $("progress-text").textContent = `${what}: ${megabytes(m.done)}${m.total ? ` of ${megabytes(m.total)}` : ""} MB`;
    } else if (m.type === "loaded") {
        const i = m.info;
        $("progress").hidden = true;
        $("progress-text").textContent = m.cached ? "(from this browser's cache)" : "";
        $("where").textContent = `${i.name} (${i.family}) in this browser on ${i.adapter || "an unnamed adapter"}, variant ${i.variant} (the plan has ${i.variants.join(", ")}); ${megabytes(i.weights_bytes)} MB of weights, context ${i.context}, ${megabytes(i.wasm_memory_bytes)} MB of wasm memory${i.text ? "" : "; the plan has no tokenizer, so it takes token ids only (input_ids= in the address)"}`;
        state.loaded = i;
        $("selftest").hidden = false;
        setState("ready");
        if (state.selftest) runSelftest();
        else if (state.run) runOnce();
    } else if (m.type === "text") {
        addText(m.text);
    } else if (m.type === "done") {
        finished(m.stats);
    } else if (m.type === "selftest") {
        $("selftest").disabled = false;
        $("stats").textContent = selftestSummary(m.report);
        if (state.selftest) writeResult({ selftest: m.report });
        // Once: a later load (after a lost device) does not run it again.
        state.selftest = false;
    } else if (m.type === "error") {
        $("progress").hidden = true;
        if (state.answer) abandonAnswer();
        alertUser(m.lost ? `The GPU device was lost: ${m.message}` : m.message, { reload: m.lost });
        if (state.run || state.selftest) writeResult({ error: m.message });
        state.selftest = false;
        if ($("selftest").disabled) {
            // The self-test itself failed: the button works again.
            $("selftest").disabled = false;
            $("stats").textContent = "";
        }
    }
}

// --- the conversation --------------------------------------------------------------------------

function bubble(role, text) {
    const div = document.createElement("div");
    div.className = `message ${role}`;
    div.textContent = text;
    $("messages").append(div);
    div.scrollIntoView({ block: "end" });
    return div;
}

function settings() {
    const s = {
        temperature: Number($("temperature").value),
        top_p: Number($("top-p").value),
        max_tokens: Number($("max-tokens").value),
    };
    if ($("seed").value !== "") s.seed = Number($("seed").value);
    return s;
}

async function send(event) {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.answer) return;
    if (state.engine === "browser" && document.body.dataset.state !== "ready") {
        alertUser("Load a model first: a plan URL or a file.");
        return;
    }
    clearAlert();
    $("prompt").value = "";
    state.conversation.push({ role: "user", content: text });
    bubble("user", text);
    state.answer = { bubble: bubble("assistant", ""), text: "", started: performance.now(), first: null };
    $("stop").disabled = false;
    $("send").disabled = true;
    setState("answering");
    const system = $("system").value.trim();
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...state.conversation];
    if (state.engine === "browser") {
        state.answer.abort = () => state.worker.postMessage({ type: "stop" });
        state.worker.postMessage({ type: "generate", request: { messages }, settings: settings() });
    } else {
        try {
            await askServer(messages, settings());
        } catch (e) {
            abandonAnswer();
            alertUser(e.message);
        }
    }
}

function addText(text) {
    const a = state.answer;
    if (!a) return;
    a.first ??= performance.now();
    a.text += text;
    a.bubble.textContent = a.text;
    a.bubble.scrollIntoView({ block: "end" });
}

function finished(stats) {
    const a = state.answer;
    if (!a) return;
    const end = performance.now();
    state.conversation.push({ role: "assistant", content: a.text });
    const n = stats.generated_tokens;
    const parts = [];
    if (n !== undefined) parts.push(`${n} tokens`);
    const tokS = stats.decode_tok_s ?? (n > 1 && a.first !== null && end > a.first ? (n - 1) / ((end - a.first) / 1000) : null);
    if (tokS !== null) parts.push(`${tokS.toFixed(1)} tok/s`);
    const firstMs = stats.first_token_ms ?? (a.first !== null ? a.first - a.started : null);
    if (firstMs !== null) parts.push(`first token after ${Math.round(firstMs)} ms`);
    if (stats.cached_tokens) parts.push(`${stats.cached_tokens} of ${stats.prompt_tokens} prompt tokens cached`);
    if (stats.finish_reason) parts.push(`finished: ${stats.finish_reason}`);
    $("stats").textContent = parts.join(" · ");
    a.bubble.dataset.done = "true";
    const once = a.once;
    endAnswer();
    once?.({ ...stats, text: a.text, tok_s: tokS });
}

// --- the address's one generation (run=1) ------------------------------------------------------

function writeResult(result) {
    state.run = false;
    $("result").textContent = JSON.stringify(result);
    $("result").hidden = false;
}

// The request the address asks for: {input_ids}, {messages} (chat=1) or {prompt}, or an error.
function requested() {
    const ids = params.get("input_ids");
    const text = params.get("prompt");
    if (ids !== null) {
        const list = ids.split(",").map((t) => t.trim());
        if (!list.every((t) => /^\d+$/.test(t))) return { error: `input_ids=${ids}: give comma-separated token ids, e.g. input_ids=1,2,3` };
        return { input_ids: list.map(Number) };
    }
    if (text === null) return { error: "run=1 needs prompt=TEXT or input_ids=1,2,3" };
    return params.get("chat") === "1" ? { messages: [{ role: "user", content: text }] } : { prompt: text };
}

function onceSettings() {
    const s = {};
    for (const [param, field] of [["max_new_tokens", "max_tokens"], ["temperature", "temperature"], ["seed", "seed"]]) {
        if (params.get(param) !== null) s[field] = Number(params.get(param));
    }
    return s;
}

async function runOnce() {
    const request = requested();
    if (request.error) return writeResult(request);
    const shown = request.messages?.[0].content ?? request.prompt ?? `token ids ${request.input_ids.join(",")}`;
    bubble("user", shown);
    state.answer = { bubble: bubble("assistant", ""), text: "", started: performance.now(), first: null };
    setState("answering");
    if (state.engine === "browser") {
        const i = state.loaded;
        state.answer.once = (r) => writeResult({ output_ids: r.output_ids, text: r.text, prompt_tokens: r.prompt_tokens, tok_s: r.tok_s, adapter: i.adapter, variant: i.variant });
        state.answer.abort = () => state.worker.postMessage({ type: "stop" });
        state.worker.postMessage({ type: "generate", request, settings: onceSettings() });
        return;
    }
    try {
        const r = await serverOnce(request);
        addText(r.text);
        finished({ generated_tokens: r.output_ids?.length, prompt_tokens: r.prompt_tokens, finish_reason: r.finish_reason, decode_tok_s: r.tok_s });
        writeResult({ output_ids: r.output_ids, text: r.text, prompt_tokens: r.prompt_tokens, tok_s: r.tok_s, adapter: "the server", variant: null });
    } catch (e) {
        abandonAnswer();
        alertUser(e.message);
        writeResult({ error: e.message });
    }
}

// One answer from the server, whole: /v1/chat/completions for messages, /v1/completions for a
// prompt or token ids, with the generated ids (return_token_ids). tok_s is the server's own decode
// rate (its `timings`), null below two tokens.
async function serverOnce(request) {
    const chat = request.messages !== undefined;
    const response = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify({
            model: state.server,
            ...(chat ? { messages: request.messages } : { prompt: request.prompt ?? request.input_ids }),
            ...onceSettings(),
            return_token_ids: true,
        }),
    });
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new Error(body?.error?.message ?? `HTTP ${response.status}`);
    const choice = body.choices[0];
    const timings = body.timings;
    return {
        text: chat ? choice.message.content ?? "" : choice.text,
        output_ids: choice.token_ids,
        prompt_tokens: body.usage.prompt_tokens,
        finish_reason: choice.finish_reason,
        tok_s: timings?.predicted_n > 1 ? timings.predicted_per_second : null,
    };
}

function abandonAnswer() {
    state.answer.bubble.remove();
    state.conversation.pop();
    endAnswer();
}

function endAnswer() {
    state.answer = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    if (document.body.dataset.state === "answering") setState("ready");
}

// One line of a self-test report: each variant's outcome, and whether all passed.
function selftestSummary(r) {
    const each = r.variants.map((v) =>
        v.status === "skipped" ? `${v.name} skipped`
            : v.max_abs_diff == null ? `${v.name} FAILED (${v.reason})`
            : `${v.name} ${v.status === "passed" ? "passed" : "FAILED"} (max |Δ| ${v.max_abs_diff.toExponential(2)}, tolerance ${v.tolerance.toExponential(2)})`);
    // wgpu has no adapter name in a browser; the page has WebGPU's own (see "loaded").
    const on = state.loaded?.adapter || r.device || "this adapter";
    return `Self-test on ${on}: ${r.passed ? "passed" : "FAILED"}: ${each.join("; ")}`;
}

function runSelftest() {
    if (!state.worker || !state.loaded) return;
    $("selftest").disabled = true;
    $("stats").textContent = "self-test running…";
    state.worker.postMessage({ type: "selftest" });
}

function clearConversation() {
    state.answer?.abort?.();
    state.conversation = [];
    $("messages").replaceChildren();
    $("stats").textContent = "";
    state.worker?.postMessage({ type: "clear" });
}

function chooseEngine(engine) {
    state.engine = engine;
    document.querySelector(`input[name=engine][value=${engine}]`).checked = true;
    $("loader").hidden = engine !== "browser";
    $("selftest").hidden = engine !== "browser" || !state.loaded;
    clearConversation();
    clearAlert();
    if (engine === "server") {
        $("where").textContent = `${state.server} on the server`;
        setState("ready");
    } else if (!state.lastLoad) {
        $("where").textContent = "no model loaded in this browser yet";
        setState("idle");
    } else {
        load(state.lastLoad);
    }
}

async function main() {
    $("ask").addEventListener("submit", send);
    $("prompt").addEventListener("keydown", (e) => {
        if (e.key === "Enter" && !e.shiftKey) send(e);
    });
    $("stop").addEventListener("click", () => state.answer?.abort?.());
    $("clear").addEventListener("click", clearConversation);
    $("selftest").addEventListener("click", runSelftest);
    $("reload").addEventListener("click", () => {
        startWorker();
        load(state.lastLoad);
    });
    $("load-url").addEventListener("submit", (e) => {
        e.preventDefault();
        load({ type: "load", url: $("plan-url").value, headers: authHeaders() });
    });
    $("plan-file").addEventListener("change", (e) => {
        if (e.target.files[0]) load({ type: "load", file: e.target.files[0] });
    });
    for (const radio of document.querySelectorAll("input[name=engine]")) {
        radio.addEventListener("change", () => chooseEngine(radio.value));
    }

    state.server = await findServer();
    const server = document.querySelector("input[name=engine][value=server]");
    server.disabled = !state.server;
    // A server started without --web-dir serves the page but not the browser engine.
    const engine = await fetch("pkg/gerbil_web.js", { method: "HEAD" }).catch(() => null);
    if (!engine?.ok) {
        const browser = document.querySelector("input[name=engine][value=browser]");
        browser.disabled = true;
        browser.parentElement.title = "This server has no browser engine: build it with scripts/web.sh and start the server with --web-dir web/dist";
        state.engine = "server";
    }
    if (state.server) $("plan-url").value = new URL("/v1/plan", location.href).href;
    if (!state.server) state.engine = "browser";
    const plan = params.get("plan");
    if (state.engine === "browser" && (plan || ((state.run || state.selftest) && state.server))) {
        if (plan) $("plan-url").value = new URL(plan, location.href).href;
        state.lastLoad = { type: "load", url: $("plan-url").value, headers: authHeaders() };
    }
    chooseEngine(state.engine);
    if (state.run && state.engine === "server") runOnce();
    else if (state.run && !state.lastLoad) writeResult({ error: "run=1 in this browser needs plan=URL" });
    else if (state.selftest && state.engine !== "browser") writeResult({ error: "selftest=1 runs in this browser: add engine=browser" });
    else if (state.selftest && !state.lastLoad) writeResult({ error: "selftest=1 needs plan=URL" });
}

main();
