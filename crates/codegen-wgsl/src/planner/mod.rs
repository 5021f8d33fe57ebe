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
//! Classes rooted in a value the caller places itself (weights, caches, graph
//! outputs: [`Step::external`]) get no arena space. The others become live
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

/// Plans the arenas of `steps`. `external(v)` says whether the caller places
/// `v` itself; `size(v)` is a value's size in bytes; offsets are multiples of
/// `align`, and no arena exceeds `max_arena` bytes.
pub fn plan<V: Copy + Eq + Hash + Ord>(
    steps: &[Step<V>],
    external: impl Fn(V) -> bool,
    size: impl Fn(V) -> u64,
    align: u64,
    max_arena: u64,
) -> Result<BufferPlan<V>, TooLarge> {
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
    let arena_roots: Vec<V> = roots_in_order
        .iter()
        .copied()
        .filter(|&r| !external(r))
        .collect();
    let intervals: Vec<Interval> = arena_roots
        .iter()
        .map(|r| {
            let (start, end, size) = span[r];
            Interval { start, end, size }
        })
        .collect();
    let placed = plan_arenas(&intervals, align, max_arena)?;
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
    let homes = root
        .keys()
        .map(|&v| {
            let r = find(&root, v);
            (v, class_home.get(&r).copied().unwrap_or(Home::External(r)))
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

    /// A random schedule over values `0..n`: value `i` is defined by step
    /// `i`, reads up to 3 earlier values, and with some probability is
    /// written in place over one of them. Values below `ext` are external
    /// (defined by the first steps, like sources).
    fn schedule() -> impl Strategy<Value = (Vec<Step<u32>>, u32, Vec<u64>)> {
        (2u32..40, 0u32..4)
            .prop_flat_map(|(n, ext)| {
                let ext = ext.min(n - 1);
                let steps = (1..n)
                    .map(|i| {
                        (
                            proptest::collection::vec(0..i, 0..=3),
                            proptest::option::weighted(0.3, 0..i),
                        )
                    })
                    .collect::<Vec<_>>();
                (
                    steps,
                    Just(ext),
                    proptest::collection::vec(1u64..5000, n as usize),
                )
            })
            .prop_map(|(raw, ext, sizes)| {
                let mut steps = vec![Step {
                    reads: vec![],
                    defines: vec![(0, None)],
                }];
                for (i, (reads, alias)) in raw.into_iter().enumerate() {
                    let v = i as u32 + 1;
                    let mut reads = reads;
                    if let Some(a) = alias {
                        reads.push(a);
                    }
                    steps.push(Step {
                        reads,
                        defines: vec![(v, alias)],
                    });
                }
                (steps, ext, sizes)
            })
    }

    /// Independent oracle: the root of each value and each root's live steps.
    fn oracle(steps: &[Step<u32>]) -> (HashMap<u32, u32>, HashMap<u32, (usize, usize)>) {
        let mut root = HashMap::new();
        let mut live: HashMap<u32, (usize, usize)> = HashMap::new();
        for (s, st) in steps.iter().enumerate() {
            for &(v, a) in &st.defines {
                let r = a.map_or(v, |a| root[&a]);
                root.insert(v, r);
                let e = live.entry(r).or_insert((s, s));
                e.1 = e.1.max(s);
            }
            for v in &st.reads {
                let e = live.get_mut(&root[v]).expect("read before defined");
                e.1 = e.1.max(s);
            }
        }
        (root, live)
    }

    proptest! {
        #[test]
        fn live_classes_never_share_bytes((steps, ext, sizes) in schedule(), align_pow in 0u32..9, max_k in 8u64..64) {
            let align = 1u64 << align_pow;
            let max = max_k * 1024;
            let plan = plan(&steps, |v| v < ext, |v| sizes[v as usize], align, max).unwrap();
            let (root, live) = oracle(&steps);
            for (&v, home) in &plan.homes {
                let r = root[&v];
                match *home {
                    Home::External(e) => {
                        prop_assert_eq!(e, r);
                        prop_assert!(r < ext);
                    }
                    Home::Arena { arena, offset, size } => {
                        prop_assert!(r >= ext);
                        prop_assert_eq!(offset % align, 0);
                        prop_assert!(offset + size <= plan.arena_sizes[arena]);
                        prop_assert!(plan.arena_sizes[arena] <= max);
                        prop_assert!(size >= sizes[v as usize]);
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
    fn a_reader_of_the_in_place_result_keeps_the_original_alive() {
        // Step 1 updates x (0) in place as y (1); step 3 reads y. The value
        // defined at step 2 must not take x's bytes, because y — which lives
        // in x's bytes — is still to be read.
        let steps = vec![
            Step {
                reads: vec![],
                defines: vec![(0u32, None)],
            },
            Step {
                reads: vec![0],
                defines: vec![(1, Some(0))],
            },
            Step {
                reads: vec![],
                defines: vec![(2, None)],
            },
            Step {
                reads: vec![1, 2],
                defines: vec![(3, None)],
            },
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
