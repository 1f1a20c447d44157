//! Scores kept in order, for "how many are better than this one" in far
//! less than a pass over them all: a rung of ASHA at a million trials is
//! asked that once per trial.
//!
//! Sorted blocks of at most `2 * BLOCK` values: an insert is a binary
//! search and a shift within one block (split when full), a count is a
//! binary search over the blocks, one within a block, and a sum over the
//! blocks' lengths after it: O(n / BLOCK + BLOCK) each.

/// A block's length before it splits in two.
const BLOCK: usize = 512;

/// Values in ascending order (scores: finite ones only); saved as one
/// ascending list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ranked<T = f64> {
    blocks: Vec<Vec<T>>,
}

impl<T> Default for Ranked<T> {
    fn default() -> Self {
        Self { blocks: Vec::new() }
    }
}

impl serde::Serialize for Ranked {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.blocks.iter().flatten())
    }
}

impl<'de> serde::Deserialize<'de> for Ranked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut values: Vec<f64> = Vec::deserialize(d)?;
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        Ok(Self { blocks: values.chunks(BLOCK).map(<[f64]>::to_vec).collect() })
    }
}

impl Ranked {
    /// Adds `v`; a value that is not finite is left out.
    pub(crate) fn insert(&mut self, v: f64) {
        if v.is_finite() {
            self.add(v);
        }
    }
}

impl<T: PartialOrd + Copy> Ranked<T> {
    /// Adds `v`.
    pub(crate) fn add(&mut self, v: T) {
        // The first block whose largest value is at least `v`, or the last.
        let i = self.blocks.partition_point(|b| b.last().is_some_and(|&x| x < v)).min(self.blocks.len().saturating_sub(1));
        let Some(block) = self.blocks.get_mut(i) else {
            self.blocks.push(vec![v]);
            return;
        };
        let at = block.partition_point(|&x| x < v);
        block.insert(at, v);
        if block.len() >= 2 * BLOCK {
            let upper = block.split_off(BLOCK);
            self.blocks.insert(i + 1, upper);
        }
    }

    /// How many values are greater than `v`.
    pub(crate) fn count_greater(&self, v: T) -> usize {
        let i = self.blocks.partition_point(|b| b.last().is_some_and(|&x| x <= v));
        let Some(block) = self.blocks.get(i) else { return 0 };
        let within = block.len() - block.partition_point(|&x| x <= v);
        within + self.blocks[i + 1..].iter().map(Vec::len).sum::<usize>()
    }

    /// How many values are less than `v`: its place in the order.
    pub(crate) fn count_less(&self, v: T) -> usize {
        let i = self.blocks.partition_point(|b| b.last().is_some_and(|&x| x < v));
        let before: usize = self.blocks[..i].iter().map(Vec::len).sum();
        before + self.blocks.get(i).map_or(0, |b| b.partition_point(|&x| x < v))
    }
}

/// An order-keeping `u64` of a finite `f64`: `a < b` exactly when `key(a) < key(b)`
/// (as `total_cmp`).
pub(crate) fn key(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Counts agree with a pass over every value, ties and repeats
        /// included, across many block splits.
        #[test]
        fn counts_agree_with_a_full_pass(values in proptest::collection::vec(prop_oneof![-50i32..50, -5000i32..5000], 0..3000), probes in proptest::collection::vec(-6000i32..6000, 1..20)) {
            let mut r = Ranked::default();
            let mut all = Vec::new();
            for v in &values {
                r.insert(f64::from(*v));
                all.push(f64::from(*v));
            }
            r.insert(f64::NAN);
            r.insert(f64::INFINITY);
            let mut pairs: Ranked<(u64, usize)> = Ranked::default();
            for (i, v) in values.iter().enumerate() {
                pairs.add((key(f64::from(*v)), i));
            }
            let back: Ranked = serde_json::from_str(&serde_json::to_string(&r).unwrap_or_default()).unwrap_or_default();
            for p in probes.iter().map(|p| f64::from(*p)).chain(all.iter().copied().take(5)) {
                let want = all.iter().filter(|&&x| x > p).count();
                prop_assert_eq!(r.count_greater(p), want, "probe {}", p);
                prop_assert_eq!(back.count_greater(p), want, "probe {} after a save and restore", p);
                let below = all.iter().filter(|&&x| x < p).count();
                prop_assert_eq!(pairs.count_less((key(p), 0)), below, "probe {} as a key", p);
            }
        }
    }
}
