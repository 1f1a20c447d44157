//! A conformance suite for [`Scheduler`] implementations: the rules every
//! scheduler keeps, checked the same way for each. A new scheduler gets them
//! by calling [`check_scheduler`] in its tests.

use search::TrialResult;

use crate::scheduler::{Decision, Scheduler, TrialStatus, TrialView};

/// Feeds `make()`'s scheduler a scripted sweep (`trials` trials, `iterations`
/// results each, interleaved, some NaN and infinite metrics) and panics with a
/// message naming the broken rule:
///
/// 1. non-finite metrics yield a decision, never a panic;
/// 2. the same results in the same order give the same decisions (invariant 7);
/// 3. the saved state carries a `version` and restores into a fresh scheduler,
///    after which both decide the rest of the script alike;
/// 4. `choose_trial_to_run` picks one of the paused trials or none;
/// 5. `take_stopped` names only trials of the sweep.
pub fn check_scheduler<S: Scheduler>(make: impl Fn() -> S, metric: &str, trials: usize, iterations: u64) {
    let config = serde_json::json!({});
    let script: Vec<(usize, TrialResult)> = (1..=iterations)
        .flat_map(|it| (0..trials).map(move |t| (t, it)))
        .enumerate()
        .map(|(seq, (t, it))| {
            let value = match (t * 7 + it as usize) % 11 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                v => v as f64 / (it as f64),
            };
            let result = TrialResult {
                extra: None,
                trial_id: format!("trial_{t:05}"),
                seq: seq as u64,
                training_iteration: it,
                metrics: [(metric.to_string(), value), ("time_total_s".to_string(), it as f64)].into_iter().collect(),
                checkpoint: None,
            };
            (t, result)
        })
        .collect();
    let ids: Vec<String> = (0..trials).map(|t| format!("trial_{t:05}")).collect();
    let drive = |s: &mut S, part: &[(usize, TrialResult)], stopped: &mut Vec<bool>| -> Vec<Decision> {
        let mut out = Vec::new();
        for (t, r) in part {
            if stopped[*t] {
                continue;
            }
            let view = TrialView {
                id: &ids[*t],
                config: &config,
                status: TrialStatus::Running,
                num_results: r.training_iteration,
                num_workers: 1,
            };
            let d = s.on_trial_result(&view, r);
            if d != Decision::Continue {
                stopped[*t] = true;
            }
            out.push(d);
            for id in s.take_stopped() {
                assert!(ids.contains(&id), "rule 5: take_stopped named {id:?}, not a trial of this sweep");
            }
        }
        out
    };
    let fresh = |s: &mut S| {
        for id in &ids {
            s.on_trial_add(&TrialView { id, config: &config, status: TrialStatus::Pending, num_results: 0, num_workers: 1 });
        }
    };

    let mut a = make();
    fresh(&mut a);
    let mut stopped_a = vec![false; trials];
    let decisions_a = drive(&mut a, &script, &mut stopped_a);
    let mut b = make();
    fresh(&mut b);
    let mut stopped_b = vec![false; trials];
    assert_eq!(drive(&mut b, &script, &mut stopped_b), decisions_a, "rule 2: same results, same decisions");

    let half = script.len() / 2;
    let mut c = make();
    fresh(&mut c);
    let mut stopped_c = vec![false; trials];
    let head = drive(&mut c, &script[..half], &mut stopped_c);
    let state = c.save();
    assert!(state.get("version").is_some(), "rule 3: saved state must carry a version: {state}");
    let mut d = make();
    if let Err(e) = d.restore(&state) {
        panic!("rule 3: restoring saved state failed: {e}");
    }
    let mut stopped_d = stopped_c.clone();
    let tail_c = drive(&mut c, &script[half..], &mut stopped_c);
    let tail_d = drive(&mut d, &script[half..], &mut stopped_d);
    assert_eq!(tail_c, tail_d, "rule 3: a restored scheduler decides like the original");
    assert_eq!([head, tail_c].concat(), decisions_a, "rule 2: decisions do not depend on a save in between");

    let candidates: Vec<TrialView<'_>> =
        ids.iter().map(|id| TrialView { id, config: &config, status: TrialStatus::Pending, num_results: 0, num_workers: 1 }).collect();
    for can_add in [true, false] {
        if let Some(id) = a.choose_trial_to_run(&candidates, can_add) {
            assert!(ids.contains(&id), "rule 4: choose_trial_to_run returned {id}, not one of the paused trials");
        }
        assert_eq!(a.choose_trial_to_run(&Vec::new(), can_add), None, "rule 4: nothing to choose from, nothing chosen");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AshaConfig, AshaType, Fifo, HyperBandConfig, MedianStoppingConfig, SchedulerConfig};
    use search::Mode;

    #[test]
    fn fifo_conforms() {
        check_scheduler(|| Fifo, "loss", 6, 9);
    }

    #[test]
    fn every_configured_scheduler_conforms() {
        let configs = [
            SchedulerConfig::Asha(AshaConfig { max_t: 9.0, reduction_factor: 2.0, brackets: 2, ..Default::default() }),
            SchedulerConfig::Asha(AshaConfig { asha_type: AshaType::Promotion, max_t: 9.0, reduction_factor: 2.0, ..Default::default() }),
            SchedulerConfig::Hyperband(HyperBandConfig { max_t: 9.0, ..Default::default() }),
            SchedulerConfig::MedianStopping(MedianStoppingConfig::default()),
            SchedulerConfig::MedianStopping(MedianStoppingConfig { hard_stop: false, min_samples_required: 1, ..Default::default() }),
            SchedulerConfig::Pbt(
                crate::PbtConfig {
                    time_attr: "training_iteration".into(),
                    perturbation_interval: 2.0,
                    seed: Some(3),
                    ..Default::default()
                }
                .mutate("lr", search::Domain::loguniform(1e-4, 1e-1)),
            ),
            SchedulerConfig::Pb2(
                crate::Pb2Config {
                    time_attr: "training_iteration".into(),
                    perturbation_interval: 2.0,
                    seed: Some(3),
                    ..Default::default()
                }
                .bound("lr", search::Domain::loguniform(1e-4, 1e-1)),
            ),
            SchedulerConfig::Pbt(
                crate::PbtConfig {
                    time_attr: "training_iteration".into(),
                    perturbation_interval: 2.0,
                    synch: true,
                    seed: Some(3),
                    ..Default::default()
                }
                .mutate("lr", search::Domain::loguniform(1e-4, 1e-1)),
            ),
            SchedulerConfig::ResourceChanging(crate::ResourceChangingConfig {
                base: Box::new(SchedulerConfig::Asha(AshaConfig { max_t: 9.0, reduction_factor: 2.0, ..Default::default() })),
                ..Default::default()
            }),
        ];
        for c in configs {
            for mode in [Mode::Min, Mode::Max] {
                check_scheduler(|| c.build(Some("loss"), Some(mode)).unwrap(), "loss", 9, 12);
            }
        }
    }

    #[test]
    #[should_panic(expected = "rule 2")]
    fn a_scheduler_with_hidden_randomness_is_caught() {
        struct Moody(u64);
        impl Scheduler for Moody {
            fn on_trial_result(&mut self, _: &TrialView<'_>, _: &TrialResult) -> Decision {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
                self.0 += 1;
                if (u64::from(t) + self.0).is_multiple_of(3) {
                    Decision::Stop
                } else {
                    Decision::Continue
                }
            }
        }
        // Many trials: a random decision sequence repeating by chance is negligible.
        check_scheduler(|| Moody(0), "loss", 40, 20);
    }
}
