//! The text form reads back: print → parse → print is the identity, and the
//! parsed graph verifies, for every tiny family model and SmolLM2 as lowered
//! and after every pass of the default pipeline.

mod common;

use gerbil_ir::{parse, print::print, verify, Graph};
use gerbil_passes::{default_pipeline, PassManager};

fn assert_round_trip(what: &str, graph: &Graph) {
    let text = print(graph);
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    verify(&parsed).unwrap_or_else(|e| panic!("{what}: parsed graph invalid: {e}"));
    let again = print(&parsed);
    assert!(
        again == text,
        "{what}: print(parse(text)) differs:\n{again}\n---\n{text}"
    );
    let (a, b) = (graph.g.node_weights(), parsed.g.node_weights());
    assert_eq!(a.count(), b.count(), "{what}: node count");
    assert_eq!(graph.outputs.len(), parsed.outputs.len(), "{what}: outputs");
}

fn check_pipeline(model: &str, mut graph: Graph) {
    assert_round_trip(&format!("{model} lowered"), &graph);
    PassManager::new(default_pipeline())
        .run(&mut graph, |run, g| {
            assert_round_trip(&format!("{model} after {}", run.name), g)
        })
        .unwrap();
}

#[test]
fn every_tiny_model_round_trips_after_every_pass() {
    for model in common::tiny_models() {
        check_pipeline(&model, common::tiny(&model));
    }
}

#[test]
fn smollm2_round_trips_after_every_pass() {
    check_pipeline("smollm2", common::lower_dir(&common::smollm2_dir()));
}
