//! The Jinja environment transformers renders chat templates in, rebuilt on `minijinja`.
//!
//! transformers uses `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[loopcontrols])`, Python string methods (`.strip()`, `.split()`, ...), a
//! `raise_exception(message)` global and its own `tojson` filter (Python `json.dumps`, no
//! HTML escaping). minijinja gets the first two from its settings and `minijinja_contrib`'s
//! pycompat; the other two are defined here. Not provided: `strftime_now` (templates test for
//! it with `is defined` and fall back to a fixed date) and the `{% generation %}` tag.
//!
//! A template is code from a download, so it renders under limits: [`FUEL`] instructions
//! (which bounds the time too: there is no loop without instructions), [`RECURSION_LIMIT`]
//! nested calls and blocks, and [`MAX_OUTPUT_BYTES`] of output, checked as it is written; our
//! `tojson` stops at the same size and refuses an indent over [`MAX_TOJSON_INDENT`].
//! minijinja itself refuses `range` over 100,000 items and strings repeated past 100 MB.
//! Any of these ends in [`TextError::TemplateLimit`] naming the limit. Not bounded here: a
//! template that doubles a string with `~` in a short loop builds it in memory before any
//! output (minijinja has no hook on concatenation); the binaries render in a
//! [`TemplateSandbox`](super::TemplateSandbox), a child process whose memory and CPU time the
//! operating system caps.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};

use super::{ChatMessage, TextError};

const NAME: &str = "chat_template";

/// Marks errors raised by `raise_exception` so they are reported as the template's own message.
const RAISED: &str = "raise_exception: ";

/// Instructions one render may run. Real templates take 25–50 per message
/// (SmolLM2's 23, Gemma 3's 50, measured over 10,000 messages), so this
/// covers 20,000 messages, more than any context holds; a hostile template
/// (a macro calling itself twice per level) spends it in about 0.3 s.
pub const FUEL: u64 = 1_000_000;

/// Nesting depth of macro calls, includes and blocks (minijinja's default is 500).
pub const RECURSION_LIMIT: usize = 200;

/// Largest rendered prompt, in bytes; far more than any context window holds.
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;

/// Largest `tojson(indent=N)`, in spaces (or characters of an indent string).
pub const MAX_TOJSON_INDENT: usize = 1024;

/// The render's output, refusing to grow past [`MAX_OUTPUT_BYTES`].
#[derive(Default)]
struct CappedOutput {
    buf: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > MAX_OUTPUT_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("output too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn output_limit() -> TextError {
    TextError::TemplateLimit {
        reason: format!(
            "wrote more than {} MiB of output: it writes too much",
            MAX_OUTPUT_BYTES >> 20
        ),
    }
}

pub(super) struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl ChatTemplate {
    pub(super) fn new(source: String) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{message}"),
                ))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|source| TextError::TemplateSyntax { source })?;
        Ok(Self { env, source })
    }

    /// The template's Jinja source.
    pub(super) fn source(&self) -> &str {
        &self.source
    }

    pub(super) fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String, TextError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|source| TextError::TemplateRender { source })?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        };
        let mut out = CappedOutput::default();
        let rendered = template.render_captured_to(ctx, &mut out);
        if out.overflowed {
            return Err(output_limit());
        }
        rendered.map_err(|source| {
            if source.kind() == ErrorKind::OutOfFuel {
                return TextError::TemplateLimit {
                    reason: format!("ran out of fuel (more than {FUEL} steps): it loops too long"),
                };
            }
            // The raise_exception error may arrive wrapped in the error of the caller's frame.
            let mut err: Option<&(dyn std::error::Error + 'static)> = Some(&source);
            while let Some(e) = err {
                if let Some(m) = e.downcast_ref::<Error>() {
                    if let Some(message) = m.detail().and_then(|d| d.strip_prefix(RAISED)) {
                        return TextError::TemplateRaised {
                            message: message.to_owned(),
                        };
                    }
                    if m.detail() == Some(TOJSON_TOO_LARGE) {
                        return output_limit();
                    }
                    if m.detail() == Some("recursion limit exceeded") {
                        return TextError::TemplateLimit {
                            reason: format!(
                                "nests calls or blocks more than {RECURSION_LIMIT} deep: \
                                 it recurses too much"
                            ),
                        };
                    }
                }
                err = e.source();
            }
            TextError::TemplateRender { source }
        })?;
        String::from_utf8(out.buf).map_err(|e| TextError::TemplateLimit {
            reason: format!("wrote output that is not UTF-8: {e}"),
        })
    }
}

/// The detail of the error `tojson` raises when its output passes [`MAX_OUTPUT_BYTES`].
const TOJSON_TOO_LARGE: &str = "tojson: the JSON is too large";

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// i.e. Python's `json.dumps` with those arguments.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = usize::try_from(v)?;
                if n > MAX_TOJSON_INDENT {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent {n} is too large (at most {MAX_TOJSON_INDENT})"),
                    ));
                }
                Some(" ".repeat(n))
            }
        },
    };
    if indent.as_ref().is_some_and(|i| i.len() > MAX_TOJSON_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: the indent string is longer than {MAX_TOJSON_INDENT} characters"),
        ));
    }
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v.try_iter()?.map(|p| p.to_string()).collect();
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => Some((item, key)),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair (item_separator, key_separator)",
                    ))
                }
            }
        }
        _ => None,
    };
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_owned(), ": ".to_owned())
    });
    let mut json = PyJson {
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    json.value(value, 0)?;
    Ok(Value::from(json.out))
}

struct PyJson {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => self.out.push_str(&v.to_string()),
            ValueKind::Number => self.out.push_str(&py_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', depth, items.len(), |json, i| {
                    json.value(&items[i], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.container('{', '}', depth, keys.len(), |json, i| {
                    let key = &keys[i];
                    match key.as_str() {
                        Some(s) => json.string(s),
                        None => json.string(&key.to_string()),
                    }
                    json.out.push_str(&json.key_sep.clone());
                    json.value(&v.get_item(key)?, depth + 1)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: object of kind {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn container(
        &mut self,
        open: char,
        close: char,
        depth: usize,
        len: usize,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                self.out.push_str(&self.item_sep.clone());
            }
            self.newline(depth + 1);
            item(self, i)?;
            if self.out.len() > MAX_OUTPUT_BYTES {
                return Err(Error::new(ErrorKind::InvalidOperation, TOJSON_TOO_LARGE));
            }
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, scientific outside `1e-4 <= |x| < 1e16`.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "1.2345e-5".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_float_matches_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.25e-7, "-1.25e-07"),
            (1e100, "1e+100"),
            (100.0, "100.0"),
            (0.0, "0.0"),
        ] {
            assert_eq!(py_float(x), want, "{x}");
        }
    }

    fn render(src: &str) -> String {
        let t = ChatTemplate::new(src.to_owned()).unwrap();
        let template = t.env.get_template(NAME).unwrap();
        template.render(minijinja::context! {}).unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let x = r#"{% set x = {"b": [1, 2.5, true, none], "a": "<é\"\n>"} %}"#;
        // Python: json.dumps(x, ensure_ascii=False) — key order kept, no HTML escaping.
        assert_eq!(
            render(&format!("{x}{{{{ x | tojson }}}}")),
            r#"{"b": [1, 2.5, true, null], "a": "<é\"\n>"}"#
        );
        assert_eq!(
            render(&format!("{x}{{{{ x | tojson(indent=2, sort_keys=true) }}}}")),
            "{\n  \"a\": \"<é\\\"\\n>\",\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ]\n}"
        );
        assert_eq!(
            render(&format!("{x}{{{{ x.a | tojson(ensure_ascii=true) }}}}")),
            r#""<\u00e9\"\n>""#
        );
        assert_eq!(
            render(&format!("{x}{{{{ x.b | tojson(separators=(',', ':')) }}}}")),
            "[1,2.5,true,null]"
        );
    }

    /// Renders a hostile template the way a chat does, and returns the error a user reads.
    fn hostile(src: &str) -> String {
        let start = std::time::Instant::now();
        let t = ChatTemplate::new(src.to_owned()).unwrap();
        let err = t
            .render(&[], None, true, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{src}: took {:?}",
            start.elapsed()
        );
        err
    }

    #[test]
    fn an_endless_loop_runs_out_of_fuel() {
        let err = hostile(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert_eq!(
            err,
            "the chat template ran out of fuel (more than 1000000 steps): it loops too long; \
             it is broken or hostile: fix the template or pass another"
        );
    }

    #[test]
    fn deep_recursion_stops_at_the_limit() {
        let err = hostile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(err.contains("more than 200 deep"), "{err}");
    }

    #[test]
    fn huge_output_stops_at_the_cap() {
        // 1 MB a line, 100,000 lines: 100 GB if nothing stopped it.
        let err =
            hostile("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}");
        assert!(err.contains("wrote more than 64 MiB of output"), "{err}");
        // tojson with a big (but allowed) indent over a big structure.
        let err = hostile("{{ range(100000) | list | tojson(indent=1000) }}");
        assert!(err.contains("wrote more than 64 MiB of output"), "{err}");
    }

    #[test]
    fn huge_indents_repeats_and_ranges_fail_fast() {
        let err = hostile("{{ [1, [2]] | tojson(indent=1000000000000) }}");
        assert!(
            err.contains("indent 1000000000000 is too large (at most 1024)"),
            "{err}"
        );
        let err = hostile("{{ 'x' * 10**12 }}");
        assert!(
            err.starts_with("rendering the chat template failed"),
            "{err}"
        );
        let err = hostile("{% for i in range(10**12) %}{% endfor %}");
        assert!(err.contains("range has too many elements"), "{err}");
    }

    #[test]
    fn limits_leave_real_templates_alone() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content | tojson(indent=2) }}\n{% endfor %}"
                .to_owned(),
        )
        .unwrap();
        let messages: Vec<ChatMessage> = (0..2000)
            .map(|i| ChatMessage {
                role: "user".into(),
                content: format!("message {i}"),
            })
            .collect();
        let out = t.render(&messages, None, true, None, None).unwrap();
        assert!(
            out.ends_with("<|user|>\"message 1999\"\n"),
            "{}",
            &out[out.len() - 40..]
        );
    }
}
