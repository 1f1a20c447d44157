//! How a data set is split across a trial's ranks, epoch by epoch: the same
//! pure function as the Python client's (`nestor/data/_split.py`), drawn to
//! the same bits, so a rank computes its own share from the blocks' row
//! counts, the world size, its rank, the epoch and the seed, on any node
//! and after any restart.
//!
//! Of N rows, `N % world` are left out each epoch: a window of the blocks
//! in their given order that moves on by its own length each epoch, so no
//! row is left out twice in a row. The rest, the blocks end to end (in a
//! seeded new order each epoch when shuffled), is cut into `world` runs of
//! `N / world` rows: every rank the same number, no row on two ranks.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// The stream of the blocks' order (a row permutation's stream is its block's index).
pub const BLOCKS: u64 = u64::MAX;

/// A piece of a rank's share: rows `start..end` of block `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The block's index in the plan.
    pub block: usize,
    /// The first row, within the block.
    pub start: u64,
    /// One past the last row.
    pub end: u64,
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The 64-bit stream of one permutation: `(seed, epoch, which)` mixed.
pub fn stream(seed: u64, epoch: u64, which: u64) -> u64 {
    let s = mix(seed ^ 0x6E65_7374_6F72); // "nestor"
    let s = mix(s ^ epoch.wrapping_add(GOLDEN));
    mix(s ^ which.wrapping_add(GOLDEN))
}

/// A seeded permutation of `0..n`: the indices sorted by splitmix64 keys,
/// `mix(stream + (i + 1) * golden)`, ties by index.
pub fn permutation(n: usize, seed: u64, epoch: u64, which: u64) -> Vec<usize> {
    let s = stream(seed, epoch, which);
    let mut keyed: Vec<(u64, usize)> = (0..n).map(|i| (mix(s.wrapping_add((i as u64 + 1).wrapping_mul(GOLDEN))), i)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// The blocks' order in `epoch`: as given, or the seeded permutation of `(seed, epoch)`.
pub fn block_order(blocks: usize, epoch: u64, seed: u64, shuffle: bool) -> Vec<usize> {
    if shuffle {
        permutation(blocks, seed, epoch, BLOCKS)
    } else {
        (0..blocks).collect()
    }
}

/// How many rows each rank reads an epoch.
pub fn rows_per_rank(total: u64, world: u32, split: bool) -> u64 {
    if !split || world <= 1 {
        total
    } else {
        total / u64::from(world)
    }
}

/// The pieces of blocks rank `rank` of `world` reads in `epoch`, in reading
/// order; `rows[i]` is block i's row count.
///
/// # Panics
///
/// When `rank >= world`.
pub fn share(rows: &[u64], world: u32, rank: u32, epoch: u64, seed: u64, shuffle: bool, split: bool) -> Vec<Piece> {
    assert!(rank < world, "rank {rank} of a world of {world}");
    let order = block_order(rows.len(), epoch, seed, shuffle);
    let total: u64 = rows.iter().sum();
    if !split || world == 1 || total == 0 {
        return order.into_iter().filter(|&b| rows[b] > 0).map(|b| Piece { block: b, start: 0, end: rows[b] }).collect();
    }
    let (per, left) = (total / u64::from(world), total % u64::from(world));
    if per == 0 {
        return Vec::new();
    }
    let mut first = Vec::with_capacity(rows.len() + 1);
    first.push(0u64);
    for r in rows {
        first.push(first.last().copied().unwrap_or(0) + r);
    }
    // The window left out this epoch (it may wrap around the end).
    let out_lo = ((u128::from(epoch) * u128::from(left) + u128::from(u64::from(world) * per)) % u128::from(total)) as u64;
    let mut holes = vec![(out_lo, (out_lo + left).min(total))];
    if out_lo + left > total {
        holes.push((0, out_lo + left - total));
    }
    let (want_lo, want_hi) = (u64::from(rank) * per, (u64::from(rank) + 1) * per);
    let mut pieces = Vec::new();
    let mut at = 0u64;
    for b in order {
        let mut runs = vec![(0u64, rows[b])];
        for &(lo, hi) in &holes {
            let (lo, hi) = (lo.saturating_sub(first[b]), hi.saturating_sub(first[b]).min(rows[b]));
            if lo >= hi {
                continue;
            }
            runs = runs.into_iter().flat_map(|(s, e)| [(s, e.min(lo)), (s.max(hi), e)]).filter(|(s, e)| s < e).collect();
        }
        for (s, e) in runs {
            let n = e - s;
            let (lo, hi) = (want_lo.saturating_sub(at), want_hi.saturating_sub(at).min(n));
            if lo < hi {
                pieces.push(Piece { block: b, start: s + lo, end: s + hi });
            }
            at += n;
            if at >= want_hi {
                return pieces;
            }
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn every_rank_the_same_rows_none_twice_and_never_the_same_left_out(
            rows in proptest::collection::vec(prop_oneof![Just(0u64), Just(1), 0u64..60], 0..12),
            world in 1u32..6,
            seed in any::<u64>(),
            shuffle in any::<bool>(),
        ) {
            let total: u64 = rows.iter().sum();
            let all: BTreeSet<(usize, u64)> = rows.iter().enumerate().flat_map(|(b, &n)| (0..n).map(move |i| (b, i))).collect();
            let mut before: Option<BTreeSet<(usize, u64)>> = None;
            for epoch in 0..4 {
                let mut seen = BTreeSet::new();
                for rank in 0..world {
                    let pieces = share(&rows, world, rank, epoch, seed, shuffle, true);
                    prop_assert_eq!(&pieces, &share(&rows, world, rank, epoch, seed, shuffle, true));
                    let mut n = 0;
                    for p in &pieces {
                        prop_assert!(p.start < p.end && p.end <= rows[p.block]);
                        for i in p.start..p.end {
                            prop_assert!(seen.insert((p.block, i)), "row {:?} twice in epoch {}", (p.block, i), epoch);
                        }
                        n += p.end - p.start;
                    }
                    prop_assert_eq!(n, rows_per_rank(total, world, true));
                }
                if world > 1 && total >= u64::from(world) {
                    let left: BTreeSet<_> = all.difference(&seen).copied().collect();
                    prop_assert_eq!(left.len() as u64, total % u64::from(world));
                    if let Some(b) = &before {
                        prop_assert!(left.is_disjoint(b), "epoch {} left out {:?} again", epoch, left);
                    }
                    before = Some(left);
                }
            }
        }

        #[test]
        fn a_permutation_is_one_and_changes_with_its_epoch(n in 0usize..500, seed in any::<u64>(), epoch in 0u64..1000) {
            let p = permutation(n, seed, epoch, 7);
            let mut sorted = p.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            if n >= 16 {
                prop_assert_ne!(p, permutation(n, seed, epoch + 1, 7));
            }
        }
    }

    #[test]
    fn unsplit_every_rank_reads_every_row() {
        let rows = [3, 0, 5];
        for rank in 0..3 {
            let pieces = share(&rows, 3, rank, 2, 0, false, false);
            assert_eq!(pieces.iter().map(|p| p.end - p.start).sum::<u64>(), 8);
        }
    }
}
