//! A conformance suite for [`Searcher`] implementations: what every searcher
//! must do, checked the same way for each (like Optuna's sampler tests). A
//! new searcher gets these checks by calling [`check_searcher`] in its tests.

use serde_json::Value;

use crate::searcher::{Searcher, Suggestion};
use crate::space::Space;
use crate::types::TrialResult;

/// Runs the suite against searchers built by `make` over `space`, and panics
/// with a message naming the broken rule:
///
/// 1. every suggested config lies in the space (every key a parameter, every
///    value in its domain);
/// 2. the saved state carries a `version` field;
/// 3. saving after some suggestions and restoring into a fresh searcher
///    continues the very same sequence (what resume relies on);
/// 4. once `Finished`, a searcher stays finished, and never suggests more than
///    its `total_trials`.
///
/// Results are fed back (`loss` = the trial's index) so model-based searchers
/// can learn between suggestions.
pub fn check_searcher<S: Searcher>(make: impl Fn() -> S, space: &Space, rounds: usize) {
    let run = |s: &mut S, from: usize, n: usize| -> Vec<Value> {
        let mut out = Vec::new();
        for i in from..from + n {
            let id = format!("trial_{i:05}");
            match s.suggest(&id) {
                Suggestion::Config(c) => {
                    let result = TrialResult {
                        extra: None,
                        trial_id: id.clone(),
                        seq: 0,
                        training_iteration: 1,
                        metrics: [("loss".to_string(), i as f64)].into_iter().collect(),
                        checkpoint: None,
                    };
                    s.on_trial_result(&id, &result);
                    s.on_trial_complete(&id, Some(&result), false);
                    out.push(c);
                }
                Suggestion::Wait => panic!("searcher waits with no trial running (suggestion {i})"),
                Suggestion::Finished => break,
            }
        }
        out
    };

    let mut reference = make();
    let all = run(&mut reference, 0, rounds);
    for (i, c) in all.iter().enumerate() {
        if let Err(e) = space.check_point(c, &format!("suggestion[{i}]")) {
            panic!("rule 1, configs lie in the space: {e}");
        }
    }
    assert!(reference.save().get("version").is_some(), "rule 2: saved state must carry a version: {}", reference.save());
    if let Some(total) = reference.total_trials() {
        assert!(all.len() as u64 <= total, "rule 4: {} suggestions, but total_trials is {total}", all.len());
        if (all.len() as u64) == total {
            assert_eq!(reference.suggest("extra"), Suggestion::Finished, "rule 4: a finished searcher stays finished");
        }
    }

    let half = all.len() / 2;
    let mut first = make();
    let head = run(&mut first, 0, half);
    let state = first.save();
    let mut resumed = make();
    if let Err(e) = resumed.restore(&state) {
        panic!("rule 3: restoring saved state failed: {e}");
    }
    let tail = run(&mut resumed, half, all.len() - half);
    assert_eq!([head, tail].concat(), all, "rule 3: save + restore must continue the same sequence");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BasicVariantGenerator, ConcurrencyLimiter, Domain};

    fn space() -> Space {
        Space::builder()
            .param("lr", Domain::loguniform(1e-5, 1e-1))
            .param("q", Domain::quniform(0.0, 1.0, 0.05))
            .param("n", Domain::randn(0.0, 1.0))
            .param("opt", Domain::grid(["adam", "sgd", "rmsprop"]))
            .nested(
                "model",
                Space::builder().param("width", Domain::qlograndint(8, 1024, 8)).param("act", Domain::choice(["relu", "gelu"])),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn random_and_grid_search_conform() {
        check_searcher(|| BasicVariantGenerator::new(space(), 7, 3), &space(), 40);
    }

    #[test]
    fn points_to_evaluate_conform() {
        let points = vec![serde_json::json!({"lr": 0.01}), serde_json::json!({"model": {"act": "gelu"}})];
        check_searcher(|| BasicVariantGenerator::new(space(), 4, 9).with_points(points.clone()).unwrap(), &space(), 20);
    }

    #[test]
    fn tpe_and_bohb_conform() {
        check_searcher(|| crate::Tpe::new(space(), "loss", crate::Mode::Min, 2, crate::TpeOptions::default()), &space(), 30);
        check_searcher(|| crate::Bohb::new(space(), "loss", crate::Mode::Min, 2, crate::BohbOptions::default()), &space(), 30);
    }

    #[test]
    fn the_concurrency_limiter_conforms() {
        check_searcher(|| ConcurrencyLimiter::new(BasicVariantGenerator::new(space(), 5, 1), 2), &space(), 30);
    }

    #[test]
    #[should_panic(expected = "rule 1")]
    fn a_searcher_that_leaves_the_space_is_caught() {
        struct Rogue;
        impl Searcher for Rogue {
            fn suggest(&mut self, _: &str) -> Suggestion {
                Suggestion::Config(serde_json::json!({ "lr": 5.0 }))
            }
            fn save(&self) -> Value {
                serde_json::json!({ "version": 1 })
            }
            fn restore(&mut self, _: &Value) -> Result<(), crate::SearchError> {
                Ok(())
            }
        }
        check_searcher(|| Rogue, &space(), 3);
    }

    #[test]
    #[should_panic(expected = "rule 3")]
    fn a_searcher_that_forgets_its_place_is_caught() {
        struct Forgetful(u64);
        impl Searcher for Forgetful {
            fn suggest(&mut self, _: &str) -> Suggestion {
                self.0 += 1;
                Suggestion::Config(serde_json::json!({ "lr": 1e-3 * self.0 as f64 }))
            }
            fn save(&self) -> Value {
                serde_json::json!({ "version": 1 })
            }
            fn restore(&mut self, _: &Value) -> Result<(), crate::SearchError> {
                Ok(())
            }
        }
        check_searcher(|| Forgetful(0), &space(), 10);
    }
}
