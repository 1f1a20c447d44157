//! Property tests of the schedulers' invariants, on random sweeps driven the
//! way the Tuner drives them (slots, pausing, resuming, failures, the end of
//! the search):
//!
//! - stopping ASHA never keeps a trial below its rung's cutoff;
//! - promotion ASHA never leaves a slot idle while a promotable trial is
//!   paused, and promotes only trials in their rung's top third;
//! - HyperBand and the median rule never leave a trial paused forever.

mod common;

use common::{choose, view, view_in};
use proptest::prelude::*;

use schedulers::{
    AshaConfig, AshaType, Decision, HyperBandConfig, MedianStoppingConfig, Scheduler, SchedulerConfig, Score, TrialStatus, TrialView,
};
use search::Mode;

const MAX_T: u64 = 9;
const RF: f64 = 3.0;

/// A loss: mostly finite, sometimes NaN or infinite.
fn loss() -> impl Strategy<Value = f64> {
    prop_oneof![20 => 0.0f64..10.0, 1 => Just(f64::NAN), 1 => Just(f64::INFINITY)]
}

/// A random sweep: per trial a curve of MAX_T losses and maybe an iteration
/// it fails at; the order in which running trials advance; the slots.
#[derive(Debug, Clone)]
struct Sweep {
    curves: Vec<Vec<f64>>,
    fails: Vec<Option<u64>>,
    order: Vec<usize>,
    slots: usize,
}

fn sweep() -> impl Strategy<Value = Sweep> {
    (2usize..16, 1usize..5).prop_flat_map(|(n, slots)| {
        (
            proptest::collection::vec(proptest::collection::vec(loss(), MAX_T as usize), n),
            proptest::collection::vec(prop_oneof![6 => Just(None), 1 => (1..=MAX_T).prop_map(Some)], n),
            proptest::collection::vec(0usize..1000, 1..400),
        )
            .prop_map(move |(curves, fails, order)| Sweep { curves, fails, order, slots })
    })
}

/// What a checker sees of the drive.
enum Event<'a> {
    /// `trial` reported `iteration`; the scheduler decided `decision`.
    Result { trial: &'a str, iteration: u64, loss: f64, decision: Decision },
    /// `choose_trial_to_run` over `paused` returned `chosen`.
    Chose { paused: &'a [String], chosen: Option<usize>, can_add: bool },
    /// `on_no_more_trials` was called.
    NoMore,
}

/// Drives `s` through `sw` as the Tuner would; returns the trials still
/// paused when nothing runs and nothing new can start.
fn drive(s: &mut dyn Scheduler, sw: &Sweep, check: &mut dyn FnMut(Event<'_>)) -> Vec<String> {
    let ids: Vec<String> = (0..sw.curves.len()).map(|i| format!("t{i:02}")).collect();
    // (trial, next iteration) of the running and the paused trials.
    let mut running: Vec<(usize, u64)> = Vec::new();
    let mut paused: Vec<(usize, u64)> = Vec::new();
    let (mut created, mut told, mut step) = (0usize, false, 0usize);
    let apply_stopped = |s: &mut dyn Scheduler, running: &mut Vec<(usize, u64)>, paused: &mut Vec<(usize, u64)>| {
        for id in s.take_stopped() {
            running.retain(|(t, _)| ids[*t] != id);
            paused.retain(|(t, _)| ids[*t] != id);
        }
    };
    loop {
        while running.len() < sw.slots {
            let can_add = created < ids.len();
            if !paused.is_empty() {
                let names: Vec<String> = paused.iter().map(|(t, _)| ids[*t].clone()).collect();
                let views: Vec<TrialView<'_>> = names.iter().map(|n| view(n)).collect();
                let chosen = choose(s, &views, can_add);
                check(Event::Chose { paused: &names, chosen, can_add });
                if let Some(i) = chosen {
                    running.push(paused.remove(i));
                    continue;
                }
            }
            if can_add {
                s.on_trial_add(&view_in(&ids[created], TrialStatus::Pending));
                running.push((created, 1));
                created += 1;
                continue;
            }
            if !told {
                told = true;
                s.on_no_more_trials();
                check(Event::NoMore);
                apply_stopped(s, &mut running, &mut paused);
                continue;
            }
            break;
        }
        apply_stopped(s, &mut running, &mut paused);
        if running.is_empty() {
            if !told && !paused.is_empty() {
                told = true;
                s.on_no_more_trials();
                check(Event::NoMore);
                apply_stopped(s, &mut running, &mut paused);
                continue;
            }
            return paused.iter().map(|(t, _)| ids[*t].clone()).collect();
        }
        let r = sw.order[step % sw.order.len()] % running.len();
        step += 1;
        let (t, it) = running[r];
        if sw.fails[t] == Some(it) {
            running.remove(r);
            s.on_trial_error(&view(&ids[t]));
            continue;
        }
        let loss = sw.curves[t][it as usize - 1];
        let decision = s.on_trial_result(&view(&ids[t]), &common::result(&ids[t], it, loss));
        check(Event::Result { trial: &ids[t], iteration: it, loss, decision: decision.clone() });
        match decision {
            // At its last iteration there is nothing left to pause for: as in
            // the Tuner (its stop criteria are met), the trial completes.
            Decision::Continue | Decision::Pause if it == MAX_T => {
                running.remove(r);
                s.on_trial_complete(&view(&ids[t]), None);
            }
            Decision::Continue => running[r].1 += 1,
            Decision::Pause => {
                running.remove(r);
                paused.push((t, it + 1));
            }
            Decision::Stop => {
                running.remove(r);
            }
            other => panic!("{} got {other:?}: these schedulers neither exploit nor resize", ids[t]),
        }
    }
}

fn build(c: SchedulerConfig) -> Box<dyn Scheduler> {
    common::build(c, Mode::Min)
}

fn asha(kind: AshaType) -> SchedulerConfig {
    SchedulerConfig::Asha(AshaConfig {
        asha_type: kind,
        max_t: MAX_T as f64,
        grace_period: Some(1.0),
        reduction_factor: RF,
        ..Default::default()
    })
}

/// A rung as the documented rules define it: results in arrival order.
#[derive(Default)]
struct Rung {
    entries: Vec<(String, Score, bool)>,
}

impl Rung {
    /// Indices of the top `floor(n / rf)` (once no trial can start,
    /// `ceil(n / rf)`), best first, ties to the earlier.
    fn top(&self, draining: bool) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.entries.len()).collect();
        idx.sort_by(|&a, &b| self.entries[b].1.value().total_cmp(&self.entries[a].1.value()));
        let share = self.entries.len() as f64 / RF;
        idx.truncate(if draining { share.ceil() } else { share.floor() } as usize);
        idx
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn stopping_asha_never_keeps_a_trial_below_its_rungs_cutoff(sw in sweep()) {
        let mut s = build(asha(AshaType::Stopping));
        // Rungs at 1 and 3: every trial reaches each in one report, in order.
        let mut rungs: [Vec<Score>; 2] = Default::default();
        let mut violations = Vec::new();
        drive(&mut *s, &sw, &mut |e| {
            let Event::Result { trial, iteration, loss, decision } = e else { return };
            if iteration >= MAX_T {
                if decision != Decision::Stop {
                    violations.push(format!("{trial} not stopped at max_t"));
                }
                return;
            }
            let Some(k) = [1, 3].iter().position(|&m| m == iteration) else {
                if decision != Decision::Continue {
                    violations.push(format!("{trial} stopped at {iteration}, not a rung"));
                }
                return;
            };
            let score = Score::of(Mode::Min, loss);
            let rung = &mut rungs[k];
            rung.push(score);
            let n = rung.len();
            let keep = (n as f64 / RF).ceil() as usize;
            let better = rung.iter().filter(|s| **s > score).count();
            let in_top = score.is_finite() && ((n as f64) < RF || better < keep);
            if decision == Decision::Continue && !in_top {
                violations.push(format!("{trial} kept at rung {iteration} below the cutoff ({better} of {n} better, keep {keep})"));
            }
            if decision == Decision::Stop && in_top {
                violations.push(format!("{trial} stopped at rung {iteration} inside the top ({better} of {n} better)"));
            }
        });
        prop_assert!(violations.is_empty(), "{:?}", violations);
    }

    #[test]
    fn promotion_asha_never_idles_a_slot_while_a_trial_is_promotable(sw in sweep()) {
        let mut s = build(asha(AshaType::Promotion));
        let mut rungs: [Rung; 2] = Default::default();
        let mut violations = Vec::new();
        let mut draining = false;

        drive(&mut *s, &sw, &mut |e| match e {
            Event::NoMore => draining = true,
            Event::Result { trial, iteration, loss, decision } => {
                if let Some(k) = [1, 3].iter().position(|&m| m == iteration) {
                    rungs[k].entries.push((trial.to_string(), Score::of(Mode::Min, loss), decision == Decision::Continue));
                    if decision == Decision::Continue && !rungs[k].top(draining).iter().any(|&i| rungs[k].entries[i].0 == trial) {
                        violations.push(format!("{trial} went on from rung {iteration} outside its top third"));
                    }
                }
            }
            Event::Chose { paused, chosen, can_add } => {
                draining |= !can_add;
                // The paused trials promotable by the rules, highest rung first.
                let promotable: Vec<(usize, usize)> = (0..2)
                    .rev()
                    .flat_map(|k| rungs[k].top(draining).into_iter().map(move |i| (k, i)))
                    .filter(|&(k, i)| {
                        let (id, score, promoted) = &rungs[k].entries[i];
                        !promoted && score.is_finite() && paused.contains(id)
                    })
                    .collect();
                match chosen {
                    None if !promotable.is_empty() => violations.push(format!("a slot idles while {:?} is promotable", rungs[promotable[0].0].entries[promotable[0].1].0)),
                    None => {}
                    Some(i) => {
                        let id = &paused[i];
                        match promotable.iter().find(|&&(k, j)| &rungs[k].entries[j].0 == id) {
                            Some(&(k, j)) => {
                                rungs[k].entries[j].2 = true;
                                if promotable[0].0 != k {
                                    violations.push(format!("{id} promoted from rung {k} while a higher rung had a promotable trial"));
                                }
                            }
                            None => violations.push(format!("{id} promoted, but not promotable")),
                        }
                    }
                }
            }
        });
        // Small rungs strand nobody: every rung's best (finite) trial went on.
        for (k, rung) in rungs.iter().enumerate() {
            // The first of the best: ties go to the earlier arrival.
            if let Some((id, _, promoted)) = rung.entries.iter().filter(|e| e.1.is_finite()).min_by(|a, b| b.1.value().total_cmp(&a.1.value())) {
                prop_assert!(*promoted, "{} is the best of rung {} but was never promoted", id, k);
            }
        }
        prop_assert!(violations.is_empty(), "{:?}", violations);
    }

    #[test]
    fn hyperband_leaves_no_trial_paused_forever(sw in sweep(), max_t in prop_oneof![Just(3.0), Just(9.0)]) {
        let mut s = build(SchedulerConfig::Hyperband(HyperBandConfig { max_t, ..Default::default() }));
        let left = drive(&mut *s, &sw, &mut |_| {});
        prop_assert!(left.is_empty(), "paused forever: {:?}", left);
    }

    #[test]
    fn the_pausing_median_rule_leaves_no_trial_paused_forever(sw in sweep()) {
        let c = MedianStoppingConfig { hard_stop: false, min_samples_required: 1, ..Default::default() };
        let mut s = build(SchedulerConfig::MedianStopping(c));
        let mut paused_once = std::collections::BTreeMap::<String, u32>::new();
        let left = drive(&mut *s, &sw, &mut |e| {
            if let Event::Result { trial, decision: Decision::Pause, .. } = e {
                *paused_once.entry(trial.to_string()).or_default() += 1;
            }
        });
        prop_assert!(left.is_empty(), "paused forever: {:?}", left);
        prop_assert!(paused_once.values().all(|&n| n == 1), "a trial paused twice: {:?}", paused_once);
    }
}

/// The case that once failed on a fresh clone: the pausing median rule
/// pauses a trial at its last iteration (its best, 9, is worse than the
/// other's running mean there, 80/9, and better before). The trial
/// completes there; it is never resumed past its end.
#[test]
fn a_pause_at_the_last_iteration_ends_the_trial() {
    let sw = Sweep {
        curves: vec![[10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 0.0].to_vec(), vec![9.0; MAX_T as usize]],
        fails: vec![None, None],
        order: vec![0],
        slots: 1,
    };
    let c = MedianStoppingConfig { hard_stop: false, min_samples_required: 1, ..Default::default() };
    let mut s = build(SchedulerConfig::MedianStopping(c));
    let mut last = None;
    let left = drive(&mut *s, &sw, &mut |e| {
        if let Event::Result { trial: "t01", iteration, decision, .. } = e {
            last = Some((iteration, decision));
        }
    });
    assert_eq!(last, Some((MAX_T, Decision::Pause)), "the rule paused t01 at its last iteration");
    assert!(left.is_empty(), "paused forever: {left:?}");
}
