//! GPU faults as `gerbil-run` reports them: a plan whose variants need more
//! than the adapter allows fails with exit status 1 and one error line that
//! names the GPU, the limit, both values and where to go, without a panic.
//! (Out of memory and a lost device are injected through the library, in
//! `tests/e2e/gpu_faults.rs` of the e2e crate: a binary has no hook for them.)

use crate::common::*;

#[test]
fn a_plan_needing_more_workgroup_memory_than_the_gpu_has_is_refused_naming_the_limit() {
    let (_dir, plan) = tiny_plan("limits", &[]);
    let needed = 1u64 << 20;
    edit_header(&plan, |h| {
        for v in h["variants"].as_array_mut().unwrap() {
            v["requirements"]["max_compute_workgroup_storage_size"] = needed.into();
        }
    });
    let o = gerbil_run(&[plan.to_str().unwrap(), "--input-ids", "1,2,3"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_fails_with(&o, "error: the GPU `");
    assert_fails_with(&o, "can run none of the plan's variants: `cpu` needs max_compute_workgroup_storage_size of 1048576, the device's is ");
    assert_fails_with(
        &o,
        "; `portable` needs max_compute_workgroup_storage_size of 1048576, the device's is ",
    );
    assert_fails_with(&o, "a smaller --max-context / --max-tokens-per-step (for a limit), or run on another GPU (`gerbil-run devices` lists them, --device N picks one)");
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}
