//! Which sequence slot a prompt runs in: the prefix cache across requests.
//!
//! A session opened with several slots ([`gerbil_runtime::SessionOptions::slots`])
//! keeps that many sequences' KV caches. [`place`] chooses, for a new prompt,
//! the slot whose cached tokens share the longest prefix with it. When the
//! prompt continues that slot's whole sequence (a conversation's next turn),
//! it runs there; when it shares only part (another user's conversation with
//! the same system prompt), the shared rows are copied into another slot — an
//! empty one, else the least recently used — so both conversations stay
//! cached; a prompt sharing nothing goes to an empty or the least recently
//! used slot. The surprise: the slot a prompt runs in never changes its
//! answer, only how many of its tokens are computed again.

/// Where a prompt runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The slot it runs in.
    pub slot: usize,
    /// Copy this many leading rows from this slot into `slot` first.
    pub copy_from: Option<(usize, usize)>,
}

/// How many leading tokens of `prompt` a cache holding `cached` serves: the
/// shared prefix, but never the prompt's last token (which must run to give
/// the first token's logits).
pub(crate) fn reusable(cached: &[u32], prompt: &[u32]) -> usize {
    let shared = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    shared.min(prompt.len().saturating_sub(1))
}

/// The placement of `prompt` among slots holding `cached[s]`, last used at
/// `last_used[s]` (larger is later), the session now in `current`; a slot
/// `busy` (a sequence of a batch runs in it) is never chosen, only copied
/// from. `None` when every slot is busy.
pub(crate) fn place(
    cached: &[&[u32]],
    last_used: &[u64],
    busy: &[bool],
    current: usize,
    prompt: &[u32],
) -> Option<Placement> {
    let reuse: Vec<usize> = cached.iter().map(|c| reusable(c, prompt)).collect();
    let free = |s: &usize| !busy.get(*s).copied().unwrap_or(false);
    // The longest reuse; among equals a free slot, the current one, then
    // the latest used.
    let best =
        (0..cached.len()).max_by_key(|&s| (reuse[s], free(&s), s == current, last_used[s]))?;
    if free(&best) && (reuse[best] == cached[best].len() || cached.len() == 1) {
        return Some(Placement {
            slot: best,
            copy_from: None,
        });
    }
    let victim = (0..cached.len())
        .filter(|&s| s != best)
        .filter(free)
        .min_by_key(|&s| (!cached[s].is_empty(), last_used[s]))
        .or_else(|| free(&best).then_some(best))?;
    Some(Placement {
        slot: victim,
        copy_from: (reuse[best] > 0 && victim != best).then_some((best, reuse[best])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(slot: usize, copy_from: Option<(usize, usize)>) -> Option<Placement> {
        Some(Placement { slot, copy_from })
    }

    #[test]
    fn a_conversation_continues_in_its_slot_and_a_shared_prefix_is_copied() {
        let system = [1, 2, 3, 4];
        let a = [1, 2, 3, 4, 10, 11];
        let empty: &[u32] = &[];
        let idle = [false; 3];
        // The next turn of `a` continues it.
        let p = place(&[&a, empty], &[1, 0], &idle, 0, &[1, 2, 3, 4, 10, 11, 12]);
        assert_eq!(p, at(0, None));
        // Another user with the same system prompt: copied into the empty slot.
        let p = place(&[&a, empty], &[1, 0], &idle, 0, &[1, 2, 3, 4, 20]);
        assert_eq!(p, at(1, Some((0, 4))));
        // Nothing shared: the empty slot, else the least recently used.
        let p = place(&[&a, empty], &[1, 0], &idle, 0, &[9, 9]);
        assert_eq!(p, at(1, None));
        let b = [7, 7, 7];
        let p = place(&[&a, &b, &system], &[5, 3, 9], &idle, 2, &[8, 8]);
        assert_eq!(p, at(1, None));
        // One slot: always it.
        let p = place(&[&a], &[0], &idle, 0, &[1, 2, 3, 4, 20]);
        assert_eq!(p, at(0, None));
        // A busy slot is copied from, never taken; all busy: nowhere.
        let p = place(
            &[&a, empty],
            &[1, 0],
            &[true, false],
            0,
            &[1, 2, 3, 4, 10, 11, 12],
        );
        assert_eq!(p, at(1, Some((0, 6))));
        assert_eq!(place(&[&a, empty], &[1, 0], &[true, true], 0, &[1]), None);
    }

    proptest! {
        /// Whatever the slots hold and whichever are busy, the placement is a
        /// free slot (none only when all are busy); the rows it reuses
        /// (copied, or kept in place) are a prefix of the prompt held by the
        /// slot they come from; no other slot would serve more of the
        /// prompt; and running in place cuts a slot's sequence only when it
        /// shares nothing with the prompt (or it is the only slot).
        #[test]
        fn placements_reuse_the_longest_prefix_without_cutting_another(
            cached in prop::collection::vec(prop::collection::vec(0u32..3, 0..6), 1..5),
            last_used in prop::collection::vec(0u64..10, 5),
            busy in prop::collection::vec(any::<bool>(), 5),
            prompt in prop::collection::vec(0u32..3, 1..8),
            current in 0usize..5,
        ) {
            let n = cached.len();
            let current = current % n;
            let views: Vec<&[u32]> = cached.iter().map(Vec::as_slice).collect();
            let busy = &busy[..n];
            let Some(p) = place(&views, &last_used[..n], busy, current, &prompt) else {
                prop_assert!(busy.iter().all(|&b| b));
                return Ok(());
            };
            prop_assert!(p.slot < n && !busy[p.slot]);
            let reused = match p.copy_from {
                Some((from, rows)) => {
                    prop_assert!(from != p.slot && from < n);
                    prop_assert!(rows <= cached[from].len());
                    prop_assert_eq!(&cached[from][..rows], &prompt[..rows]);
                    rows
                }
                None => reusable(&cached[p.slot], &prompt),
            };
            let best = views.iter().map(|c| reusable(c, &prompt)).max().unwrap_or(0);
            prop_assert_eq!(reused, best);
            let other_free = (0..n).any(|s| s != p.slot && !busy[s]);
            if other_free && p.copy_from.is_none() {
                let kept = reusable(&cached[p.slot], &prompt);
                prop_assert!(kept == cached[p.slot].len() || kept == 0);
            }
        }
    }
}
