//! Random and grid search (Ray Tune's basic variant generator), with
//! `points_to_evaluate` run first.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::error::SearchError;
use crate::searcher::{Searcher, Suggestion};
use crate::space::{merge, Space};
use crate::types::Config;

/// Random search over a space, with its grid axes expanded: each of
/// `num_samples` samples is run once per grid combination, so the sweep has
/// `max(num_samples, points) x grid_size` trials.
///
/// The config of trial `i` depends only on the seed and `i` (its random
/// values come from ChaCha8 stream `i`), so the sequence is the same on every
/// machine, and resuming needs only the count of trials already suggested.
/// Sample `s < points.len()` takes its values from `points_to_evaluate[s]`
/// where given, the rest sampled.
#[derive(Debug, Clone)]
pub struct BasicVariantGenerator {
    space: Space,
    seed: u64,
    num_samples: u64,
    points: Vec<Config>,
    next: u64,
}

const STATE_VERSION: u64 = 1;

impl BasicVariantGenerator {
    /// A generator of `num_samples` samples (each expanded over the grid).
    pub fn new(space: Space, num_samples: u64, seed: u64) -> Self {
        Self { space, seed, num_samples, points: Vec::new(), next: 0 }
    }

    /// Configs to run first; each is checked against the space (unknown keys
    /// and out-of-domain values are refused, naming the point and field).
    pub fn with_points(mut self, points: Vec<Config>) -> Result<Self, SearchError> {
        for (i, p) in points.iter().enumerate() {
            self.space.check_point(p, &format!("points_to_evaluate[{i}]"))?;
        }
        self.points = points;
        Ok(self)
    }

    /// The config of trial number `index` (0-based), whether or not suggested.
    pub fn config_at(&self, index: u64) -> Config {
        let grid = self.space.grid_size().max(1);
        let sample = index / grid;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        let mut config = self.space.sample(&mut rng, index % grid);
        if let Some(point) = usize::try_from(sample).ok().and_then(|s| self.points.get(s)) {
            merge(&mut config, point);
        }
        config
    }

    /// Number of trials suggested so far.
    pub fn suggested(&self) -> u64 {
        self.next
    }
}

impl Searcher for BasicVariantGenerator {
    fn suggest(&mut self, _trial_id: &str) -> Suggestion {
        if self.next >= self.total() {
            return Suggestion::Finished;
        }
        let c = self.config_at(self.next);
        self.next += 1;
        Suggestion::Config(c)
    }

    fn total_trials(&self) -> Option<u64> {
        Some(self.total())
    }

    fn save(&self) -> Value {
        json!({ "version": STATE_VERSION, "kind": "basic", "next": self.next, "seed": self.seed })
    }

    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        if state["version"].as_u64() != Some(STATE_VERSION) || state["kind"] != "basic" {
            return Err(SearchError::State(format!("not a version-{STATE_VERSION} basic searcher state: {state}")));
        }
        if state["seed"].as_u64() != Some(self.seed) {
            return Err(SearchError::State(format!("state was saved with seed {}, this searcher has seed {}", state["seed"], self.seed)));
        }
        self.next = state["next"].as_u64().ok_or_else(|| SearchError::State("missing `next`".into()))?;
        Ok(())
    }
}

impl BasicVariantGenerator {
    fn total(&self) -> u64 {
        self.num_samples.max(self.points.len() as u64).saturating_mul(self.space.grid_size().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Domain;

    fn space() -> Space {
        Space::builder()
            .param("lr", Domain::loguniform(1e-4, 1e-1))
            .param("opt", Domain::grid(["adam", "sgd"]))
            .param("bs", Domain::grid([16, 32, 64]))
            .build()
            .unwrap()
    }

    fn drain(s: &mut impl Searcher) -> Vec<Config> {
        let mut out = vec![];
        while let Suggestion::Config(c) = s.suggest("t") {
            out.push(c);
        }
        out
    }

    #[test]
    fn grid_is_the_cross_product_repeated_num_samples_times() {
        let mut g = BasicVariantGenerator::new(space(), 2, 0);
        let all = drain(&mut g);
        assert_eq!(all.len(), 12);
        let mut pairs: Vec<(String, i64)> =
            all[..6].iter().map(|c| (c["opt"].as_str().unwrap().into(), c["bs"].as_i64().unwrap())).collect();
        pairs.sort();
        pairs.dedup();
        assert_eq!(pairs.len(), 6, "each combination once per sample");
        let lrs: std::collections::BTreeSet<String> = all.iter().map(|c| c["lr"].to_string()).collect();
        assert_eq!(lrs.len(), 12, "random params drawn afresh per trial");
    }

    #[test]
    fn same_seed_same_sequence_and_resume_continues_it() {
        let mut a = BasicVariantGenerator::new(space(), 3, 42);
        let full = drain(&mut a);
        let mut b = BasicVariantGenerator::new(space(), 3, 42);
        let first: Vec<Config> = (0..5)
            .filter_map(|_| match b.suggest("t") {
                Suggestion::Config(c) => Some(c),
                _ => None,
            })
            .collect();
        let state = b.save();
        let mut c = BasicVariantGenerator::new(space(), 3, 42);
        c.restore(&state).unwrap();
        let rest = drain(&mut c);
        assert_eq!([first, rest].concat(), full);
        let other = drain(&mut BasicVariantGenerator::new(space(), 3, 43));
        assert_ne!(other, full);
        let mut wrong_seed = BasicVariantGenerator::new(space(), 3, 1);
        assert!(wrong_seed.restore(&state).is_err());
    }

    #[test]
    fn points_to_evaluate_run_first_and_are_checked() {
        let s = Space::builder().param("lr", Domain::loguniform(1e-4, 1e-1)).param("w", Domain::randint(1, 10)).build().unwrap();
        let mut g =
            BasicVariantGenerator::new(s.clone(), 3, 0).with_points(vec![json!({"lr": 0.01}), json!({"lr": 0.02, "w": 3})]).unwrap();
        let all = drain(&mut g);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0]["lr"], 0.01);
        assert!(all[0]["w"].is_i64());
        assert_eq!(all[1], json!({"lr": 0.02, "w": 3}));
        let e = BasicVariantGenerator::new(s, 3, 0).with_points(vec![json!({"w": 10})]).unwrap_err();
        assert_eq!(e.to_string(), "points_to_evaluate[0].w: 10 is outside randint [1, 10)");
    }
}
