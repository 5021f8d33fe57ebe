//! A two-turn conversation through the library: load a plan, chat, print
//! each answer as it streams and how much of the prompt the KV cache held.
//!
//! ```sh
//! gerbilc compile HuggingFaceTB/SmolLM2-135M-Instruct -o smollm2.plan
//! cargo run --release -p gerbil --example chat -- smollm2.plan
//! ```

use gerbil::{Chat, GenerationSettings, Model, ModelOptions};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plan = std::env::args().nth(1).ok_or("usage: chat PLAN")?;
    let model = pollster::block_on(Model::open(plan.as_ref(), &ModelOptions::default()))?;
    let mut chat = Chat::new(model).with_system("You answer in one short sentence.");
    let settings = GenerationSettings {
        max_new_tokens: 64,
        ..GenerationSettings::default()
    };
    for question in ["What is the capital of France?", "And of Germany?"] {
        println!("> {question}");
        let mut reply = chat.send(question, &settings)?;
        while let Some(piece) = pollster::block_on(reply.next()) {
            print!("{}", piece?.text);
            std::io::stdout().flush()?;
        }
        let stats = reply.stats();
        println!(
            "\n[{} prompt tokens, {} from the cache; {:.0} tok/s]",
            stats.prompt_tokens,
            stats.cached_tokens,
            stats.decode_tokens_per_second()
        );
    }
    Ok(())
}
