//! Hardening against bad numbers, as a user meets them: a checkpoint whose
//! weights hold NaN/Inf is refused by `gerbilc` (naming the tensor and the
//! element) unless `--allow-non-finite`; a plan compiled anyway stops
//! generating at the first step with non-finite logits, on the CPU path
//! (`--top-logits`) and on the GPU path (greedy), instead of printing token 0.

use crate::common::*;
use std::path::Path;

/// A copy of the tiny Llama in a temp dir with element `index` of the f32
/// tensor `tensor` set to `value`.
fn poisoned_tiny(tensor: &str, index: usize, value: f32) -> tempfile::TempDir {
    let dir = temp("poisoned");
    let src = data("models/tiny/llama");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let info = &header[tensor];
    assert_eq!(info["dtype"], "F32");
    let start = 8 + n + info["data_offsets"][0].as_u64().unwrap() as usize + index * 4;
    bytes[start..start + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

fn compile_args<'a>(repo: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "compile",
        repo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--max-context",
        "16",
    ]
}

#[test]
fn non_finite_weights_are_refused_unless_allowed_and_then_stop_generation() {
    let repo = poisoned_tiny("model.norm.weight", 3, f32::NAN);
    let out = repo.path().join("poisoned.plan");
    let o = gerbilc(&compile_args(repo.path(), &out));
    assert_fails_with(
        &o,
        "tensor `model.norm.weight` holds a non-finite value (NaN) at element 3",
    );
    assert_fails_with(&o, "--allow-non-finite");
    assert!(!out.exists(), "a refused compile wrote a plan");

    let mut args = compile_args(repo.path(), &out);
    args.push("--allow-non-finite");
    let o = gerbilc(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = out.to_str().unwrap();

    // CPU path: every step's logits are read back and checked.
    let o = gerbil_run(&[plan, "--input-ids", "1,2", "--top-logits", "1", "--json"]);
    assert_fails_with(
        &o,
        "generation stopped at step 1 (position 1): the logits hold a non-finite value (NaN for token 0)",
    );
    // GPU path (greedy): the prompt's logits are checked once.
    let o = gerbil_run(&[plan, "--input-ids", "1,2", "--max-new-tokens", "4"]);
    assert_fails_with(&o, "generation stopped at step 1 (position 1)");
}

#[test]
fn an_infinite_weight_is_named_with_its_sign() {
    let repo = poisoned_tiny("model.layers.1.mlp.up_proj.weight", 17, f32::NEG_INFINITY);
    let out = repo.path().join("inf.plan");
    let o = gerbilc(&compile_args(repo.path(), &out));
    assert_fails_with(
        &o,
        "tensor `model.layers.1.mlp.up_proj.weight` holds a non-finite value (-inf) at element 17",
    );
}

/// A copy of the tiny Llama whose config.json has `from` replaced by `to`.
fn tiny_with_config(from: &str, to: &str) -> tempfile::TempDir {
    let dir = temp("config");
    let src = data("models/tiny/llama");
    for f in ["generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    assert!(config.contains(from));
    std::fs::write(dir.path().join("config.json"), config.replace(from, to)).unwrap();
    dir
}

#[test]
fn config_values_that_overflow_or_vanish_in_f32_are_refused_by_key() {
    // (edit, the key named, what it becomes); serde reads 1e-50 as 9.99…e-51.
    for (from, to, key, becomes) in [
        (
            "\"rope_theta\": 10000.0",
            "\"rope_theta\": 1e39",
            "`rope_parameters.rope_theta`: 1e39",
            "inf",
        ),
        (
            "\"rms_norm_eps\": 1e-06",
            "\"rms_norm_eps\": 1e-50",
            "`rms_norm_eps`: ",
            "0",
        ),
        (
            "\"rope_type\": \"default\"",
            "\"rope_type\": \"linear\", \"factor\": 1e-46",
            "`rope_parameters.factor`: ",
            "0",
        ),
    ] {
        let repo = tiny_with_config(from, to);
        let out = repo.path().join("c.plan");
        let o = gerbilc(&compile_args(repo.path(), &out));
        assert_fails_with(&o, key);
        assert_fails_with(
            &o,
            &format!(" becomes {becomes} in f32, the precision the kernels compute in"),
        );
        assert!(!stderr(&o).contains("inff"), "{}", stderr(&o));
    }
}

/// A copy of the tiny Llama with SmolLM2's `tokenizer.json` (or `tokenizer`
/// when given) and the chat template `template`.
fn tiny_with_text(tokenizer: Option<&str>, template: &str) -> tempfile::TempDir {
    let dir = temp("text");
    let src = data("models/tiny/llama");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let tokenizer_path = dir.path().join("tokenizer.json");
    match tokenizer {
        Some(text) => std::fs::write(tokenizer_path, text).unwrap(),
        None => {
            std::fs::copy(smollm2_dir().join("tokenizer.json"), tokenizer_path).unwrap();
        }
    }
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    dir
}

#[test]
fn broken_tokenizers_and_chat_templates_fail_the_compile() {
    let good = std::fs::read_to_string(smollm2_dir().join("chat_template.jinja")).unwrap();
    for (tokenizer, template, message) in [
        (
            Some("{\"version\": \"1.0\", \"model\": "),
            good.as_str(),
            "tokenizer.json: invalid tokenizer.json: ",
        ),
        (
            None,
            "{% for m in messages %}{{ m.content }}",
            "the chat template does not parse: ",
        ),
        (
            None,
            "{{ messages | tojson(indent=100000) }}",
            "tojson: indent 100000 is too large (at most 1024)",
        ),
        (
            None,
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "the chat template ran out of fuel (more than 1000000 steps): it loops too long",
        ),
        (
            None,
            "{{ raise_exception('roles must alternate') }}",
            "the chat template rejected the conversation: roles must alternate (rendering a sample conversation",
        ),
    ] {
        let repo = tiny_with_text(tokenizer, template);
        let out = repo.path().join("t.plan");
        let o = gerbilc(&compile_args(repo.path(), &out));
        assert_fails_with(&o, message);
        assert!(!out.exists());
    }
    // SmolLM2's own template passes (and the plan is written).
    let repo = tiny_with_text(None, &good);
    let out = repo.path().join("t.plan");
    let o = gerbilc(&compile_args(repo.path(), &out));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A `~` doubling loop: a terabyte of string after 40 steps, before any output.
const DOUBLING: &str = "{% set ns = namespace(s='x') %}{% for i in range(40) %}\
    {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";

/// What a template that builds strings too large says.
const TOO_MUCH_MEMORY: &str =
    "the chat template needed more than 1024 MiB of memory: it builds strings too large; it is \
     broken or hostile";

#[test]
fn templates_that_build_huge_strings_end_at_the_memory_limit() {
    // At compile time: the sample conversation renders in the sandbox.
    let repo = tiny_with_text(None, DOUBLING);
    let out = repo.path().join("t.plan");
    let o = gerbilc(&compile_args(repo.path(), &out));
    assert_fails_with(&o, TOO_MUCH_MEMORY);
    assert!(!out.exists());
    // At run time: a template that doubles only for one message compiles,
    // then that message is refused and the others render.
    let template = format!(
        "{{% if messages[-1].content == 'boom' %}}{DOUBLING}{{% endif %}}\
         {{% for m in messages %}}a{{% endfor %}}"
    );
    let repo = tiny_with_text(None, &template);
    let dir = temp("doubling");
    let plan = dir.path().join("t.plan");
    let o = gerbilc(&compile_args(repo.path(), &plan));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = plan.to_str().unwrap();
    let chat = |prompt| gerbil_run(&[plan, "--chat", "--prompt", prompt, "--max-new-tokens", "1"]);
    let o = chat("boom");
    assert_fails_with(&o, TOO_MUCH_MEMORY);
    let o = chat("hi");
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_plan_with_a_broken_tokenizer_still_runs_on_token_ids() {
    // gerbilc refuses such a plan now; the library still writes one (as an
    // older gerbilc did), and gerbil-run must not fail before it needs text.
    let mut ckpt = gerbil_compiler::Checkpoint::open(&data("models/tiny/llama")).unwrap();
    ckpt.text.tokenizer_json = Some(b"{\"broken\": ".to_vec());
    let opts = gerbil_compiler::CompileOptions {
        max_context: Some(16),
        ..Default::default()
    };
    let compiled = gerbil_compiler::compile(&ckpt, &opts, &mut ()).unwrap();
    let dir = temp("broken-tokenizer");
    let plan = dir.path().join("b.plan");
    compiled.plan.write(&plan).unwrap();
    let plan = plan.to_str().unwrap();
    let o = gerbil_run(&[plan, "--input-ids", "1,2", "--max-new-tokens", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).split_whitespace().count(), 3, "{}", stdout(&o));
    let o = gerbil_run(&[plan, "--prompt", "hello", "--max-new-tokens", "3"]);
    assert_fails_with(&o, "invalid tokenizer.json: ");
    assert_fails_with(&o, "this plan still runs on token ids (--input-ids)");
}

/// The template renderer is entered only as the sandbox starts it (its one
/// argument `--gerbil-template-child` and the limits in
/// `GERBIL_TEMPLATE_CHILD`): the variable exported by accident changes
/// nothing. A renderer dies with its parent (Linux: `PR_SET_PDEATHSIG`),
/// even while it still waits for its request.
#[test]
fn the_template_child_is_entered_only_on_purpose_and_dies_with_its_parent() {
    let limits = std::ffi::OsStr::new("4000000000,10");
    let o = gerbil_run_with(&["--version"], &[("GERBIL_TEMPLATE_CHILD", limits)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("gerbil-run "), "{}", stdout(&o));
    #[cfg(target_os = "linux")]
    {
        use std::io::BufRead;
        // sh starts the renderer on sh's own stdin (a pipe this test keeps
        // open, so the renderer waits for its request), prints its pid, and
        // becomes `sleep`; killing that process kills the renderer's parent.
        let script = format!(
            "exec 3<&0; GERBIL_TEMPLATE_CHILD=4000000000,10 '{}' --gerbil-template-child <&3 & \
             echo $!; exec sleep 60",
            env!("CARGO_BIN_EXE_gerbil-run")
        );
        let mut parent = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(parent.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().unwrap();
        // Held to the end: `wait` would close it, and the renderer would end
        // on the end of its input rather than on its parent's death.
        let _input = parent.stdin.take();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|s| !s.starts_with(" Z"))
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(alive(), "the renderer waits for its request");
        parent.kill().unwrap();
        parent.wait().unwrap();
        let start = std::time::Instant::now();
        while alive() && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!alive(), "the renderer outlived its parent");
    }
}
