//! `Tuner::keep_best`: a simulation at scale keeps its best finished
//! trials in the store and hands each one it lets go of to a fold (the
//! summary `nestor simulate --keep` prints), so that the store, and the
//! memory sled needs for it, stay the size of the trials kept.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use search::Mode;

use crate::store::{Store, StoreError, TrialRecord};

/// What a trial let go of is handed to.
pub(crate) type Fold = Box<dyn FnMut(TrialRecord) + Send>;

/// The finished trials kept, worst on top.
pub(crate) struct Keep {
    n: usize,
    metric: String,
    mode: Mode,
    kept: BinaryHeap<Kept>,
    fold: Fold,
    /// How many were let go of.
    let_go: u64,
}

/// A finished trial kept: ordered worst first, by its last value of the
/// metric (none or not finite is worst), then by creation, later first (the
/// earlier of equals stays, as the summary's best is the earlier).
#[derive(Debug)]
struct Kept {
    score: f64,
    index: u64,
    id: String,
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Kept {
    /// Greater is worse.
    fn cmp(&self, other: &Self) -> Ordering {
        other.score.total_cmp(&self.score).then(self.index.cmp(&other.index))
    }
}

/// The meta key holding how many trials were let go of.
pub(crate) const LET_GO: &str = "let_go";

impl Keep {
    /// Keeps the best `n` (at least 1) finished trials by `metric`.
    pub(crate) fn new(n: usize, metric: String, mode: Mode, fold: Fold) -> Self {
        Self { n: n.max(1), metric, mode, kept: BinaryHeap::new(), fold, let_go: 0 }
    }

    /// `record` ended (its end is stored): once more than `n` finished
    /// trials are kept, the worst is read back, deleted from the store and
    /// folded. Trials that may run again (paused, pending) are not counted.
    pub(crate) fn ended(&mut self, store: &Store, record: &TrialRecord) -> Result<(), StoreError> {
        if !record.status.is_finished() {
            return Ok(());
        }
        let value = record.last_result.as_ref().and_then(|r| r.metrics.get(&self.metric)).copied();
        let score = value.filter(|v| v.is_finite()).map_or(f64::NEG_INFINITY, |v| self.mode.score(v));
        self.kept.push(Kept { score, index: record.index, id: record.id.clone() });
        while self.kept.len() > self.n {
            let Some(worst) = self.kept.pop() else { break };
            let Some(rec) = store.trial(&worst.id)? else { continue };
            store.remove_trial(&worst.id)?;
            self.let_go += 1;
            store.put_meta(LET_GO, &serde_json::json!(self.let_go))?;
            (self.fold)(rec);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_is_on_top_and_the_earlier_of_equals_stays() {
        let k = |score: f64, index: u64| Kept { score, index, id: index.to_string() };
        let mut heap: BinaryHeap<Kept> = [k(0.5, 0), k(0.9, 1), k(f64::NEG_INFINITY, 2), k(0.5, 3)].into_iter().collect();
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop()).map(|k| k.index).collect();
        assert_eq!(order, vec![2, 3, 0, 1]);
    }
}
