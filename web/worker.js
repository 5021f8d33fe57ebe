// gerbil's engine in a Web Worker: loads a plan (from a URL, cached in the Origin Private File
// System, or from a file the user picked) and answers chats, posting progress and text to the
// page. Messages in: {type: "load", url} | {type: "load", file} | {type: "generate", request,
// settings} (request: {messages} | {prompt} | {input_ids}) | {type: "stop"} | {type: "clear"} |
// {type: "selftest"} (the loaded plan's self-test, read again from where it was loaded).
// Messages out: {type: "progress", stage, done, total} | {type: "loaded", info} | {type: "text",
// text} | {type: "done", stats} | {type: "selftest", report} | {type: "error", message, lost}.
//
// The engine reads the plan synchronously (FileSystemSyncAccessHandle, FileReaderSync), which
// only a worker may: the weights go to the GPU window by window and the plan is never whole in
// wasm memory. A "stop" arrives while an answer awaits the GPU, between tokens.
import init, { Engine } from "./pkg/gerbil_web.js";

let engine = null;
let lastLoad = null;
let closeSource = () => {};
const post = (m) => self.postMessage(m);

self.onmessage = async ({ data: m }) => {
    try {
        if (m.type === "load") await load(m);
        else if (m.type === "generate") await generate(m);
        else if (m.type === "stop") engine?.stop();
        else if (m.type === "clear") engine?.clear();
        else if (m.type === "selftest") await selftest();
    } catch (e) {
        const message = String(e?.message ?? e);
        post({ type: "error", message, lost: /device (was )?lost|lost the device/i.test(message) });
    }
};

async function load(m) {
    if (!navigator.gpu) throw new Error("this browser has no WebGPU (navigator.gpu is missing)");
    await init();
    engine?.free();
    engine = null;
    closeSource();
    lastLoad = m;
    const source = m.file ? fileSource(m.file) : await urlSource(m.url, m.headers ?? {});
    closeSource = source.close;
    const progress = (done, total) => post({ type: "progress", stage: "upload", done, total });
    try {
        engine = await Engine.load(source.name, source.size, source.read, progress);
    } catch (e) {
        // A cached plan that does not check out (cut, or mixed from two versions by a resumed
        // download) is dropped, so loading again downloads it anew.
        closeSource();
        closeSource = () => {};
        if (/checksum|truncated|changed/i.test(String(e?.message ?? e))) await source.forget?.();
        throw e;
    }
    closeSource();
    closeSource = () => {};
    const info = JSON.parse(engine.info());
    if (info.backend === "BrowserWebGpu") {
        // wgpu has no adapter name in a browser; WebGPU's own info says what it is.
        const adapter = await navigator.gpu.requestAdapter();
        const a = adapter?.info ?? {};
        info.adapter = [a.vendor, a.architecture, a.description].filter(Boolean).join(" ");
    }
    post({ type: "loaded", info, cached: source.cached ?? false });
}

// The loaded plan's self-test: its source opened again (from this browser's cache for a URL), every
// variant this adapter runs checked against the reference the plan carries.
async function selftest() {
    if (!engine || !lastLoad) throw new Error("no model is loaded");
    const source = lastLoad.file ? fileSource(lastLoad.file) : await urlSource(lastLoad.url, lastLoad.headers ?? {});
    try {
        const report = JSON.parse(await Engine.selftest(source.name, source.size, source.read));
        post({ type: "selftest", report });
    } finally {
        source.close();
    }
}

// One answer. The time to its first token is timed here, as tokens leave the engine; its decode
// rate is the engine's own (from the prompt's end to the last token): the engine decodes ahead
// and hands over a batch of tokens at once, so their arrival times here say nothing of it.
async function generate(m) {
    if (!engine) throw new Error("no model is loaded");
    const started = performance.now();
    let first = null;
    const stats = JSON.parse(
        await engine.generate(
            JSON.stringify(m.request),
            JSON.stringify(m.settings ?? {}),
            (text) => {
                first ??= performance.now();
                if (text) post({ type: "text", text });
            },
        ),
    );
    if (first !== null) stats.first_token_ms = first - started;
    post({ type: "done", stats });
}

// A file the user picked, read in place.
function fileSource(file) {
    const reader = new FileReaderSync();
    return {
        name: file.name,
        size: file.size,
        read: (at, len) => new Uint8Array(reader.readAsArrayBuffer(file.slice(at, at + len))),
        close: () => {},
    };
}

// A plan at a URL, downloaded once into the Origin Private File System and read from there; a
// plan whose ETag (or length and Last-Modified) changed is downloaded anew, and an unfinished
// download resumes with a Range request. Without OPFS the plan is kept in a Blob.
async function urlSource(url, auth) {
    const absolute = new URL(url, self.location.href).href;
    let root = null;
    try {
        root = await navigator.storage.getDirectory();
    } catch {
        // No OPFS (e.g. a private window): fall through to a Blob.
    }
    if (!root) return blobSource(absolute, auth);
    const key = await digest(absolute);
    const dir = await root.getDirectoryHandle("gerbil-plans", { create: true });
    const meta = await readMeta(dir, key);
    const handle = await (await dir.getFileHandle(`${key}.plan`, { create: true })).createSyncAccessHandle();
    try {
        const have = meta?.validator ? handle.getSize() : 0;
        const headers = { ...auth };
        if (meta?.complete && have === meta.size) {
            // Downloaded whole before: ask whether it changed.
            headers[meta.validator.startsWith("W/") || meta.validator.startsWith('"') ? "If-None-Match" : "If-Modified-Since"] = meta.validator;
        } else if (have > 0) {
            // Cut short before: resume where it stopped, if the plan is still the same.
            headers["If-Range"] = meta.validator;
            headers["Range"] = `bytes=${have}-`;
        }
        // The plan is kept here, not in the browser's HTTP cache too.
        const response = await fetch(absolute, { headers, cache: "no-store" });
        const cached = response.status === 304;
        if (!cached) {
            if (!response.ok) throw new Error(`${absolute}: HTTP ${response.status} ${response.statusText}`);
            const validator = response.headers.get("ETag") ?? response.headers.get("Last-Modified");
            const total = totalLength(response, have);
            let at = response.status === 206 ? have : 0;
            if (at === 0) handle.truncate(0);
            await writeMeta(dir, key, { url: absolute, validator, size: total, complete: false });
            const body = response.body.getReader();
            for (;;) {
                const { done, value } = await body.read();
                if (done) break;
                handle.write(value, { at });
                at += value.byteLength;
                post({ type: "progress", stage: "download", done: at, total });
            }
            handle.flush();
            if (total && at !== total) throw new Error(`${absolute}: the download ended at ${at} of ${total} bytes`);
            await writeMeta(dir, key, { url: absolute, validator, size: at, complete: !!validator });
        }
        return {
            name: absolute,
            size: handle.getSize(),
            cached,
            read: (at, len) => {
                const bytes = new Uint8Array(len);
                const n = handle.read(bytes, { at });
                return n === len ? bytes : bytes.subarray(0, n);
            },
            close: () => handle.close(),
            forget: async () => {
                await dir.removeEntry(`${key}.plan`).catch(() => {});
                await dir.removeEntry(`${key}.json`).catch(() => {});
            },
        };
    } catch (e) {
        handle.close();
        throw e;
    }
}

async function blobSource(url, auth) {
    const response = await fetch(url, { headers: auth, cache: "no-store" });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
    const total = totalLength(response, 0);
    const parts = [];
    let done = 0;
    const body = response.body.getReader();
    for (;;) {
        const chunk = await body.read();
        if (chunk.done) break;
        parts.push(chunk.value);
        done += chunk.value.byteLength;
        post({ type: "progress", stage: "download", done, total });
    }
    return { ...fileSource(new File(parts, url)), name: url };
}

// The whole plan's length: Content-Range's total for a 206, else Content-Length plus what the
// cache holds already (0 when unknown).
function totalLength(response, have) {
    const range = response.headers.get("Content-Range");
    if (response.status === 206 && range) return Number(range.split("/")[1]) || 0;
    const length = Number(response.headers.get("Content-Length")) || 0;
    return response.status === 206 ? have + length : length;
}

async function digest(text) {
    const hash = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
    return [...new Uint8Array(hash)].slice(0, 16).map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function readMeta(dir, key) {
    try {
        const file = await (await dir.getFileHandle(`${key}.json`)).getFile();
        return JSON.parse(await file.text());
    } catch {
        return null;
    }
}

async function writeMeta(dir, key, meta) {
    const handle = await (await dir.getFileHandle(`${key}.json`, { create: true })).createSyncAccessHandle();
    const bytes = new TextEncoder().encode(JSON.stringify(meta));
    handle.truncate(0);
    handle.write(bytes, { at: 0 });
    handle.flush();
    handle.close();
}
