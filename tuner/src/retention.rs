//! Which committed checkpoints `num_to_keep` deletes.

use search::Mode;

use crate::store::CheckpointRecord;

/// The checkpoints (given oldest first) to delete so that the `keep` best
/// remain, and the latest (a restart needs it) whatever its score: Ray's
/// rule. Best is by `score` (NaN, infinite in the wrong direction or missing
/// counts as worst; ties keep the newer), or newest when there is no score
/// attribute (then the latest is one of the `keep`).
pub(crate) fn doomed(committed: &[CheckpointRecord], keep: usize, score: Option<&str>, order: Mode) -> Vec<CheckpointRecord> {
    let keep = keep.max(1);
    let Some(latest) = committed.last() else { return Vec::new() };
    if committed.len() <= keep {
        return Vec::new();
    }
    let value = |c: &CheckpointRecord| -> f64 {
        let v = score.and_then(|s| if s == "training_iteration" { Some(c.iteration as f64) } else { c.metrics.get(s).copied() });
        match v {
            Some(v) if !v.is_nan() => order.score(v),
            _ => f64::NEG_INFINITY,
        }
    };
    let mut ranked: Vec<&CheckpointRecord> = committed.iter().collect();
    // Best first: by score (when given), then newer first.
    ranked.sort_by(|a, b| {
        let by_score = if score.is_some() { value(b).total_cmp(&value(a)) } else { std::cmp::Ordering::Equal };
        by_score.then(b.iteration.cmp(&a.iteration))
    });
    ranked.into_iter().skip(keep).filter(|c| c.iteration != latest.iteration).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(iteration: u64, loss: f64) -> CheckpointRecord {
        CheckpointRecord {
            version: 1,
            iteration,
            uri: format!("c{iteration}"),
            ranks: vec![0],
            world_size: 1,
            metrics: [("loss".to_string(), loss)].into(),
        }
    }

    fn iters(v: Vec<CheckpointRecord>) -> Vec<u64> {
        let mut v: Vec<u64> = v.into_iter().map(|c| c.iteration).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn keeps_the_best_and_the_latest() {
        let all = vec![ck(1, 0.5), ck(2, 0.1), ck(3, f64::NAN), ck(4, 0.3), ck(5, 0.9)];
        // By loss, min: keep 2 and 4 (the best two) and 5 (latest); NaN is worst.
        assert_eq!(iters(doomed(&all, 2, Some("loss"), Mode::Min)), vec![1, 3]);
        // max: 5 and 1; the latest is one of them.
        assert_eq!(iters(doomed(&all, 2, Some("loss"), Mode::Max)), vec![2, 3, 4]);
        // No score: the newest.
        assert_eq!(iters(doomed(&all, 3, None, Mode::Max)), vec![1, 2]);
        // One: the best, and the latest even when it scores worst (Ray keeps both).
        assert_eq!(iters(doomed(&all, 1, Some("loss"), Mode::Min)), vec![1, 3, 4]);
        assert_eq!(iters(doomed(&all, 1, None, Mode::Min)), vec![1, 2, 3, 4]);
        assert!(doomed(&all, 5, Some("loss"), Mode::Min).is_empty());
        assert!(doomed(&[], 1, None, Mode::Min).is_empty());
        // A metric no checkpoint has: by age.
        assert_eq!(iters(doomed(&all, 2, Some("acc"), Mode::Max)), vec![1, 2, 3]);
    }
}
