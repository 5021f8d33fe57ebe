"""Used by scripts/device/embed-bench.sh and decoder-embed.sh on the GPU box:

    python3 scripts/device/embed-check.py GERBIL_RUN MODEL_DIR

Embeds each text of MODEL_DIR/refs.json (text -> the reference's float32 vector) with MODEL_DIR.plan
on the f32, f16 and tensor-core variants, and prints one line per variant and text:
`CHECK MODEL FLAGS N chars: cosine C`."""
import json, math, os, subprocess, sys

run, model = sys.argv[1], sys.argv[2]
name = os.path.basename(model.rstrip("/"))
refs = json.load(open(f"{model}/refs.json"))
for flags in (["--precision", "f32"], ["--precision", "f16", "--no-tensor-cores"], ["--tensor-cores"]):
    for text, want in refs.items():
        out = subprocess.run([run, f"{model}.plan", *flags, "embed", "--text", text],
                             capture_output=True, text=True, check=True).stdout
        got = json.loads(out)["embedding"]
        dot = sum(a * b for a, b in zip(got, want))
        cos = dot / math.sqrt(sum(a * a for a in got) * sum(b * b for b in want))
        print("CHECK", name, " ".join(flags), f"{len(text)} chars: cosine {cos:.10f}")
