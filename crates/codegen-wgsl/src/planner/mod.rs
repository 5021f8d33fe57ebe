//! `plan-buffers`: where every activation lives, from liveness over a schedule.
//!
//! The planner sees a schedule as a list of [`Step`]s: the values each step
//! reads and the values it defines. A value defined **in place** names the
//! value whose memory it reuses (a KV cache written by `cache_write`, or any
//! future op that updates its input). In-place values form one *storage
//! class* with the value they alias; a class is live from the step that
//! defines its first member to the last step that reads any member — so a
//! reader of the in-place result keeps the original's bytes alive too.
//!
//! Classes with a member the caller places itself (weights, caches, graph
//! outputs: the `external` predicate of [`plan`]) live in that member's
//! buffer and get no arena space. The others become live
//! intervals for the allocator in [`arena`], which places the largest first at
//! the lowest offset free for its whole lifetime. Invariant (proptest on
//! random schedules with in-place steps): two classes live at a common step
//! never share a byte, so a dispatch never reads and writes overlapping
//! memory except where the op writes its input in place.

pub mod arena;

use arena::{plan_arenas, Interval, TooLarge};
use std::collections::HashMap;
use std::hash::Hash;

/// One dispatch as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step<V> {
    /// Values read.
    pub reads: Vec<V>,
    /// Values defined: each with the value it overwrites in place, if any.
    pub defines: Vec<(V, Option<V>)>,
}

/// Where a value lives after planning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home<V> {
    /// Bytes `offset..offset + size` of arena `arena`.
    Arena {
        /// Arena index.
        arena: usize,
        /// Byte offset (aligned).
        offset: u64,
        /// Bytes of the class (its largest member).
        size: u64,
    },
    /// In the caller's buffer for this root value (itself, or the external
    /// value it aliases).
    External(V),
}

/// The planner's result.
#[derive(Clone, Debug)]
pub struct BufferPlan<V> {
    /// Every value defined by a step or named external.
    pub homes: HashMap<V, Home<V>>,
    /// Size of each arena in bytes.
    pub arena_sizes: Vec<u64>,
    /// Sum of every arena class's size, as if each had its own buffer.
    pub naive_bytes: u64,
}

/// A storage class larger than one arena may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oversized<V> {
    /// The class's root value.
    pub value: V,
    /// Its size in bytes.
    pub size: u64,
    /// The largest arena allowed.
    pub max: u64,
}

/// Plans the arenas of `steps`. `external(v)` says whether the caller places
/// `v` itself; `size(v)` is a value's size in bytes; offsets are multiples of
/// `align`, and no arena exceeds `max_arena` bytes.
pub fn plan<V: Copy + Eq + Hash + Ord>(
    steps: &[Step<V>],
    external: impl Fn(V) -> bool,
    size: impl Fn(V) -> u64,
    align: u64,
    max_arena: u64,
) -> Result<BufferPlan<V>, Oversized<V>> {
    // Storage classes: every value points at the root whose memory it uses.
    let mut root: HashMap<V, V> = HashMap::new();
    let find = |root: &HashMap<V, V>, v: V| -> V {
        let mut r = v;
        while let Some(&next) = root.get(&r) {
            if next == r {
                break;
            }
            r = next;
        }
        r
    };
    // Per root: (first step, last step, bytes).
    let mut span: HashMap<V, (usize, usize, u64)> = HashMap::new();
    let mut roots_in_order = Vec::new();
    for (s, step) in steps.iter().enumerate() {
        for &(v, alias) in &step.defines {
            let r = match alias {
                Some(a) => find(&root, a),
                None => v,
            };
            root.insert(v, r);
            let e = span.entry(r).or_insert_with(|| {
                roots_in_order.push(r);
                (s, s, 0)
            });
            e.1 = e.1.max(s);
            e.2 = e.2.max(size(v));
        }
        for &v in &step.reads {
            let r = find(&root, v);
            if let Some(e) = span.get_mut(&r) {
                e.1 = e.1.max(s);
            }
        }
    }
    // A class lives outside the arenas if any member does: in its root's
    // buffer when the root is external, else in its first external member's.
    let mut outside: HashMap<V, V> = HashMap::new();
    let mut members: Vec<V> = root.keys().copied().collect();
    members.sort();
    for &r in &roots_in_order {
        if external(r) {
            outside.insert(r, r);
        }
    }
    for v in members.iter().copied().filter(|&v| external(v)) {
        outside.entry(find(&root, v)).or_insert(v);
    }
    let arena_roots: Vec<V> = roots_in_order
        .iter()
        .copied()
        .filter(|r| !outside.contains_key(r))
        .collect();
    let intervals: Vec<Interval> = arena_roots
        .iter()
        .map(|r| {
            let (start, end, size) = span[r];
            Interval { start, end, size }
        })
        .collect();
    let placed = plan_arenas(&intervals, align, max_arena).map_err(|e: TooLarge| Oversized {
        value: arena_roots[e.index],
        size: e.size,
        max: e.max,
    })?;
    let mut class_home: HashMap<V, Home<V>> = HashMap::new();
    for ((r, iv), p) in arena_roots.iter().zip(&intervals).zip(&placed.placements) {
        class_home.insert(
            *r,
            Home::Arena {
                arena: p.arena,
                offset: p.offset,
                size: iv.size,
            },
        );
    }
    let homes = members
        .iter()
        .map(|&v| {
            let r = find(&root, v);
            let home = match outside.get(&r) {
                Some(&e) => Home::External(e),
                None => class_home[&r],
            };
            (v, home)
        })
        .collect();
    Ok(BufferPlan {
        homes,
        arena_sizes: placed.arena_sizes,
        naive_bytes: intervals.iter().map(|i| i.size).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn step(reads: &[u32], defines: &[(u32, Option<u32>)]) -> Step<u32> {
        Step {
            reads: reads.to_vec(),
            defines: defines.to_vec(),
        }
    }

    /// Sources: values no step defines, always external (like KV caches).
    const SOURCE: u32 = 1000;

    fn size_of(v: u32) -> u64 {
        u64::from(v.wrapping_mul(2_654_435_761) % 5000) + 1
    }

    /// A random schedule: each step defines one or two new values (numbered
    /// in order), reads up to three earlier values or sources, and may write
    /// a value in place over an earlier value or a source. `ext` marks the
    /// values the caller places itself.
    fn schedule() -> impl Strategy<Value = (Vec<Step<u32>>, Vec<bool>)> {
        let step = (
            proptest::collection::vec(0u32..1000, 0..=3),
            1usize..=2,
            proptest::collection::vec(proptest::option::weighted(0.3, 0u32..1000), 2),
        );
        (
            proptest::collection::vec(step, 1..40),
            proptest::collection::vec(proptest::bool::weighted(0.15), 80),
        )
            .prop_map(|(raw, ext)| {
                let mut steps = Vec::new();
                let mut next = 0u32;
                // Picks an earlier value (or, for r % 5 == 0, one of 3 sources).
                let pick = |r: u32, next: u32| {
                    if r.is_multiple_of(5) || next == 0 {
                        SOURCE + r % 3
                    } else {
                        r % next
                    }
                };
                for (reads, n, aliases) in raw {
                    let reads = reads.into_iter().map(|r| pick(r, next)).collect();
                    let mut defines = Vec::new();
                    for alias in aliases.into_iter().take(n) {
                        let alias = alias.map(|a| pick(a, next));
                        defines.push((next, alias));
                        next += 1;
                    }
                    steps.push(Step { reads, defines });
                }
                (steps, ext)
            })
    }

    /// Independent oracle: the root of each value and each root's live steps.
    fn oracle(steps: &[Step<u32>]) -> (HashMap<u32, u32>, HashMap<u32, (usize, usize)>) {
        let mut root: HashMap<u32, u32> = (SOURCE..SOURCE + 3).map(|s| (s, s)).collect();
        let mut live: HashMap<u32, (usize, usize)> = HashMap::new();
        for (s, st) in steps.iter().enumerate() {
            for v in &st.reads {
                if let Some(e) = live.get_mut(&root[v]) {
                    e.1 = e.1.max(s);
                }
            }
            for &(v, a) in &st.defines {
                let r = a.map_or(v, |a| root[&a]);
                root.insert(v, r);
                let e = live.entry(r).or_insert((s, s));
                e.1 = e.1.max(s);
            }
        }
        (root, live)
    }

    proptest! {
        #[test]
        fn live_classes_never_share_bytes((steps, ext) in schedule(), align_pow in 0u32..9, max_k in 8u64..64) {
            let align = 1u64 << align_pow;
            let max = max_k * 1024;
            let external = |v: u32| v >= SOURCE || ext[v as usize % ext.len()];
            let plan = plan(&steps, external, size_of, align, max).unwrap();
            let (root, live) = oracle(&steps);
            let class_has_external = |r: u32| root.iter().any(|(&v, &rv)| rv == r && external(v));
            for (&v, home) in &plan.homes {
                let r = root[&v];
                match *home {
                    Home::External(e) => {
                        // The class's root if it is external, else an external member.
                        prop_assert!(external(e));
                        prop_assert_eq!(root[&e], r);
                        if external(r) {
                            prop_assert_eq!(e, r);
                        }
                    }
                    Home::Arena { arena, offset, size } => {
                        prop_assert!(!class_has_external(r));
                        prop_assert_eq!(offset % align, 0);
                        prop_assert!(offset + size <= plan.arena_sizes[arena]);
                        prop_assert!(plan.arena_sizes[arena] <= max);
                        prop_assert!(size >= size_of(v));
                        // Aliases share their root's bytes.
                        prop_assert_eq!(plan.homes[&r], *home);
                    }
                }
            }
            for (&a, ha) in &plan.homes {
                for (&b, hb) in &plan.homes {
                    let (ra, rb) = (root[&a], root[&b]);
                    if ra == rb { continue; }
                    let (Home::Arena { arena: x, offset: oa, size: sa }, Home::Arena { arena: y, offset: ob, size: sb }) = (*ha, *hb) else { continue };
                    let (la, lb) = (live[&ra], live[&rb]);
                    let together = la.0 <= lb.1 && lb.0 <= la.1;
                    if together && x == y {
                        prop_assert!(oa + sa <= ob || ob + sb <= oa,
                            "values {a} and {b} are live together and overlap");
                    }
                }
            }
        }
    }

    #[test]
    fn an_in_place_result_that_is_external_takes_its_class_out_of_the_arenas() {
        // y (1) overwrites x (0) in place and is a graph output: x must be
        // written straight into y's buffer.
        let steps = vec![step(&[], &[(0, None)]), step(&[0], &[(1, Some(0))])];
        let plan = plan(&steps, |v| v == 1, |_| 64, 256, 1 << 20).unwrap();
        assert_eq!(plan.homes[&0], Home::External(1));
        assert_eq!(plan.homes[&1], Home::External(1));
        assert!(plan.arena_sizes.is_empty());
    }

    #[test]
    fn a_reader_of_the_in_place_result_keeps_the_original_alive() {
        // Step 1 updates x (0) in place as y (1); step 3 reads y. The value
        // defined at step 2 must not take x's bytes, because y — which lives
        // in x's bytes — is still to be read.
        let steps = vec![
            step(&[], &[(0, None)]),
            step(&[0], &[(1, Some(0))]),
            step(&[], &[(2, None)]),
            step(&[1, 2], &[(3, None)]),
        ];
        let plan = plan(&steps, |_| false, |_| 256, 256, 1 << 20).unwrap();
        let off = |v: u32| match plan.homes[&v] {
            Home::Arena { offset, .. } => offset,
            Home::External(_) => unreachable!(),
        };
        assert_eq!(off(0), off(1));
        assert_ne!(off(2), off(0));
    }
}
