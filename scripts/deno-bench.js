// Times the browser engine (crates/web, built by scripts/web.sh) outside a browser, in Deno,
// whose WebGPU is wgpu behind the JavaScript API a browser has: a browser-grade WebGPU runtime
// on any machine with a GPU, no display or browser needed (such as the device machine).
//
//   deno run --allow-read scripts/deno-bench.js DIST PLAN [--prompt-tokens N] [--new-tokens N] [--runs N]
//
// DIST is scripts/web.sh's folder. Loads PLAN through the engine's reader (the plan is never
// whole in memory), then runs greedy generations from N prompt token ids (ignoring
// end-of-sequence), printing one JSON line per run and a last one with the median decode tok/s,
// timed as the page times it: the tokens after the first over the time from the first to the
// last, as they leave the engine. Each run also gives the gaps between tokens (median, 90th
// percentile, largest, how many over 5 ms): whether tokens come steadily or in bursts.
//
// The surprise: wgpu looks for WebGPU on a Window or a WorkerGlobalScope, which Deno's main
// script is neither; a stand-in `Window` global makes it read `navigator.gpu`, as in a page.
const args = [...Deno.args];
const option = (name, fallback) => {
    const i = args.indexOf(name);
    if (i < 0) return fallback;
    const [, value] = args.splice(i, 2);
    return Number(value);
};
const promptTokens = option("--prompt-tokens", 16);
const newTokens = option("--new-tokens", 128);
const runs = option("--runs", 5);
const [dist, planPath] = args;
if (!dist || !planPath) {
    console.error("usage: deno run --allow-read scripts/deno-bench.js DIST PLAN [--prompt-tokens N] [--new-tokens N] [--runs N]");
    Deno.exit(2);
}
if (!navigator.gpu) {
    console.error("this Deno has no WebGPU (navigator.gpu is missing)");
    Deno.exit(1);
}
globalThis.Window ??= class Window {};

const pkg = new URL(`file://${await Deno.realPath(dist)}/pkg/`);
const { default: init, Engine } = await import(new URL("gerbil_web.js", pkg).href);
await init({ module_or_path: await Deno.readFile(new URL("gerbil_web_bg.wasm", pkg)) });

const file = Deno.openSync(planPath);
const size = file.statSync().size;
const read = (at, len) => {
    const bytes = new Uint8Array(len);
    file.seekSync(at, Deno.SeekMode.Start);
    for (let n = 0; n < len; ) {
        const got = file.readSync(bytes.subarray(n));
        if (got === null) throw new Error(`${planPath}: ends at ${at + n}, before ${at + len}`);
        n += got;
    }
    return bytes;
};
const loadStart = performance.now();
const engine = await Engine.load(planPath, size, read, () => {});
const info = JSON.parse(engine.info());
console.log(JSON.stringify({ load_ms: performance.now() - loadStart, ...info }));

// Ids below 512 are in every vocabulary (the tiny test models have 512).
const inputIds = Array.from({ length: promptTokens }, (_, i) => 1 + ((i * 37) % 500));
const settings = JSON.stringify({ max_tokens: newTokens, temperature: 0, ignore_eos: true });
const speeds = [];
for (let run = 0; run <= runs; run++) {
    engine.clear();
    const started = performance.now();
    const arrivals = [];
    const stats = JSON.parse(
        await engine.generate(JSON.stringify({ input_ids: inputIds }), settings, () => {
            arrivals.push(performance.now());
        }),
    );
    const n = stats.generated_tokens;
    const [first, last] = [arrivals[0], arrivals[arrivals.length - 1]];
    const tokS = (n - 1) / ((last - first) / 1000);
    // How tokens arrive: steady gaps mean the GPU paces them; a long gap every few tokens
    // with near-zero ones between means they come in batches and the wait is per batch.
    const gaps = arrivals.slice(1).map((t, i) => t - arrivals[i]).sort((a, b) => a - b);
    const at = (q) => gaps[Math.min(gaps.length - 1, Math.floor(q * gaps.length))];
    // The first run compiles pipelines and warms the caches: reported, not counted.
    if (run > 0) speeds.push(tokS);
    console.log(JSON.stringify({
        run, warmup: run === 0, generated: n, first_token_ms: first - started, decode_tok_s: tokS,
        gap_ms: { p50: at(0.5), p90: at(0.9), max: gaps[gaps.length - 1] },
        gaps_over_5ms: gaps.filter((g) => g > 5).length,
    }));
}
speeds.sort((a, b) => a - b);
console.log(JSON.stringify({ adapter: info.adapter, variant: info.variant, runs, median_decode_tok_s: speeds[speeds.length >> 1] }));
file.close();
