//! The arena allocator: places live intervals in arena buffers.
//!
//! Each value is an [`Interval`] of schedule steps `[start, end]` (produced at
//! `start`, last read at `end`, both inclusive) with a size in bytes. Values
//! whose intervals intersect never share bytes — so a dispatch never reads
//! and writes overlapping memory, because its inputs are live at the step
//! that produces its output.
//!
//! The algorithm is greedy by size (largest first, lowest offset that fits
//! among the already-placed values that are live at the same time), the
//! approach of TFLite's arena planner. No arena grows beyond `max_arena`
//! bytes (the device's storage-binding limit): a value that does not fit
//! opens a new arena, and a value larger than the limit is an error.

/// A value's lifetime and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Step that writes it.
    pub start: usize,
    /// Last step that reads it (≥ `start`).
    pub end: usize,
    /// Size in bytes.
    pub size: u64,
}

impl Interval {
    /// Whether both values are live at some common step.
    pub fn overlaps_in_time(&self, other: &Interval) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// Where a value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Arena index.
    pub arena: usize,
    /// Byte offset in the arena (a multiple of the alignment).
    pub offset: u64,
}

/// The result: one placement per interval, and each arena's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Same order as the input intervals.
    pub placements: Vec<Placement>,
    /// Size of each arena in bytes.
    pub arena_sizes: Vec<u64>,
}

/// A value cannot be placed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("activation {index} needs {size} bytes but one binding may hold at most {max} bytes (max_storage_buffer_binding_size); use a smaller --max-tokens-per-step")]
pub struct TooLarge {
    /// Index of the interval.
    pub index: usize,
    /// Its size.
    pub size: u64,
    /// The limit.
    pub max: u64,
}

fn align_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

/// Places every interval. `align` is the binding-offset alignment (a power of
/// two); `max_arena` the largest arena allowed.
pub fn plan_arenas(
    intervals: &[Interval],
    align: u64,
    max_arena: u64,
) -> Result<ArenaPlan, TooLarge> {
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by(|&a, &b| {
        let (ia, ib) = (&intervals[a], &intervals[b]);
        ib.size
            .cmp(&ia.size)
            .then(ia.start.cmp(&ib.start))
            .then(a.cmp(&b))
    });
    let mut placements = vec![
        Placement {
            arena: 0,
            offset: 0
        };
        intervals.len()
    ];
    // Per arena: the placed values (offset, size, interval index).
    let mut arenas: Vec<Vec<(u64, u64, usize)>> = Vec::new();
    for idx in order {
        let iv = intervals[idx];
        let size = align_up(iv.size.max(1), align);
        if size > max_arena {
            return Err(TooLarge {
                index: idx,
                size: iv.size,
                max: max_arena,
            });
        }
        let mut placed = None;
        for (a, placed_vals) in arenas.iter().enumerate() {
            let mut conflicts: Vec<(u64, u64)> = placed_vals
                .iter()
                .filter(|(_, _, j)| intervals[*j].overlaps_in_time(&iv))
                .map(|&(o, s, _)| (o, s))
                .collect();
            conflicts.sort();
            let mut offset = 0u64;
            for (o, s) in conflicts {
                if offset + size <= o {
                    break;
                }
                offset = offset.max(align_up(o + s, align));
            }
            if offset + size <= max_arena {
                placed = Some((a, offset));
                break;
            }
        }
        let (a, offset) = placed.unwrap_or_else(|| {
            arenas.push(Vec::new());
            (arenas.len() - 1, 0)
        });
        arenas[a].push((offset, size, idx));
        placements[idx] = Placement { arena: a, offset };
    }
    let arena_sizes = arenas
        .iter()
        .map(|vals| vals.iter().map(|&(o, s, _)| o + s).max().unwrap_or(0))
        .collect();
    Ok(ArenaPlan {
        placements,
        arena_sizes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(intervals: &[Interval], plan: &ArenaPlan, align: u64, max: u64) {
        for (i, a) in intervals.iter().enumerate() {
            let pa = plan.placements[i];
            assert_eq!(pa.offset % align, 0);
            assert!(pa.offset + a.size <= plan.arena_sizes[pa.arena]);
            assert!(plan.arena_sizes[pa.arena] <= max);
            for (j, b) in intervals.iter().enumerate().skip(i + 1) {
                let pb = plan.placements[j];
                if pa.arena == pb.arena && a.overlaps_in_time(b) {
                    let disjoint =
                        pa.offset + a.size <= pb.offset || pb.offset + b.size <= pa.offset;
                    assert!(
                        disjoint,
                        "values {i} and {j} overlap: {a:?}@{pa:?} {b:?}@{pb:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn chain_reuses_memory() {
        // a -> b -> c -> d, each read only by the next step.
        let ivs: Vec<Interval> = (0..4)
            .map(|i| Interval {
                start: i,
                end: i + 1,
                size: 1000,
            })
            .collect();
        let plan = plan_arenas(&ivs, 256, 1 << 20).unwrap();
        check(&ivs, &plan, 256, 1 << 20);
        assert_eq!(plan.arena_sizes, vec![2048]);
    }

    #[test]
    fn oversized_value_is_an_error() {
        let ivs = [Interval {
            start: 0,
            end: 1,
            size: 5000,
        }];
        let err = plan_arenas(&ivs, 256, 4096).unwrap_err();
        assert_eq!(err.size, 5000);
        assert!(err.to_string().contains("max_storage_buffer_binding_size"));
    }

    #[test]
    fn spills_into_a_second_arena_at_the_limit() {
        let ivs = [
            Interval {
                start: 0,
                end: 2,
                size: 3000,
            },
            Interval {
                start: 1,
                end: 2,
                size: 3000,
            },
        ];
        let plan = plan_arenas(&ivs, 256, 4096).unwrap();
        check(&ivs, &plan, 256, 4096);
        assert_eq!(plan.arena_sizes.len(), 2);
    }

    proptest! {
        #[test]
        fn never_overlaps_live_values_nor_exceeds_the_limit(
            raw in prop::collection::vec((0usize..40, 0usize..10, 1u64..5000), 1..60),
            align_pow in 2u32..9,
            max in 6000u64..20000,
        ) {
            let align = 1u64 << align_pow;
            let ivs: Vec<Interval> = raw
                .iter()
                .map(|&(s, len, size)| Interval { start: s, end: s + len, size })
                .collect();
            let plan = plan_arenas(&ivs, align, max).unwrap();
            check(&ivs, &plan, align, max);
        }
    }
}
