//! How long constrained decoding spends on the CPU per token: builds the
//! grammar compiler for a `tokenizer.json`, compiles a JSON schema, and
//! walks 200 tokens choosing the first allowed id each step (`{"` tends to
//! open strings, the costliest state), timing the masks.
//!
//! ```sh
//! cargo run --release -p gerbil-grammar --example mask_time -- tokenizer.json [schema.json]
//! ```
//!
//! The GPU's decode step must take longer than a mask for constrained
//! decoding to run at the GPU's speed (the mask of the next step is
//! computed right after a token is accepted).

use gerbil::{TextCodec, TokenConstraint};
use gerbil_grammar::{Grammar, Grammars};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let tokenizer = args
        .next()
        .ok_or("usage: mask_time TOKENIZER.json [SCHEMA.json]")?;
    let codec = TextCodec::from_tokenizer_json(&std::fs::read(&tokenizer)?)?;
    let vocab = codec.vocab_size();
    let grammar = match args.next() {
        Some(path) => Grammar::JsonSchema(serde_json::from_slice(&std::fs::read(path)?)?),
        None => Grammar::JsonObject,
    };
    let start = Instant::now();
    let grammars = Grammars::for_vocabulary(std::sync::Arc::new(codec), vocab, &[])?;
    println!(
        "vocabulary of {vocab} ids: token trie in {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    let mut c = grammars.constraint(&grammar)?;
    println!("grammar compiled in {:?}", start.elapsed());
    let mut logits = vec![0.0f32; vocab];
    let mut times = Vec::new();
    for _ in 0..200 {
        logits.fill(0.0);
        let start = Instant::now();
        c.mask(&mut logits)?;
        let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i] == 0.0).collect();
        let Some(&token) = allowed.get(allowed.len() / 2) else {
            break;
        };
        c.accept(token as u32)?;
        times.push(start.elapsed());
        if c.is_complete() {
            break;
        }
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    println!(
        "{} tokens: mask + accept median {:?}, p90 {:?}, max {:?}",
        times.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    );
    Ok(())
}
