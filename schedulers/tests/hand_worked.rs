//! Each scheduler on scripts worked out by hand: which trial stops, pauses
//! or is promoted at which rung, and why (the reasons are in the comments).

mod common;

use common::*;
use schedulers::{AshaConfig, AshaType, Decision, HyperBandConfig, MedianStoppingConfig, Scheduler, SchedulerConfig, TrialStatus};
use search::Mode;

use Decision::{Continue as C, Pause as P, Stop as S};

/// Feeds `(trial, iteration, loss)` reports; returns the decisions.
fn feed(s: &mut dyn Scheduler, mode: Mode, script: &[(usize, u64, f64)]) -> Vec<Decision> {
    let names = ids(64);
    let sign = if mode == Mode::Max { -1.0 } else { 1.0 };
    script.iter().map(|&(t, it, loss)| s.on_trial_result(&view(&names[t]), &result(&names[t], it, sign * loss))).collect()
}

fn add_all(s: &mut dyn Scheduler, n: usize) {
    for id in ids(n) {
        s.on_trial_add(&view_in(&id, TrialStatus::Pending));
    }
}

fn asha(kind: AshaType, max_t: f64, rf: f64) -> SchedulerConfig {
    SchedulerConfig::Asha(AshaConfig { asha_type: kind, max_t, reduction_factor: rf, grace_period: Some(1.0), ..Default::default() })
}

/// Nine trials, rf = 3, grace 1, max_t 9: rungs at 1 and 3.
#[test]
fn stopping_asha_nine_trials() {
    for mode in [Mode::Min, Mode::Max] {
        let mut s = build(asha(AshaType::Stopping, 9.0, 3.0), mode);
        add_all(&mut *s, 9);
        let losses = [5.0, 3.0, 8.0, 1.0, 9.0, 2.0, 7.0, 4.0, 6.0];
        let rung1: Vec<(usize, u64, f64)> = losses.iter().enumerate().map(|(t, &l)| (t, 1, l)).collect();
        // t0, t1: fewer than rf results in the rung, no top third to judge: continue.
        // t2 (8): 3 results, keep ceil(3/3) = 1; 2 are better: stop.
        // t3 (1): 4 results, keep 2; none better: continue.
        // t4 (9): keep 2; 4 better: stop.
        // t5 (2): 6 results, keep 2; 1 better (t3): continue.
        // t6 (7): 7 results, keep 3; 4 better: stop.
        // t7 (4): 8 results, keep 3; 3 better (t3, t5, t1): stop.
        // t8 (6): 9 results, keep 3; 5 better: stop.
        assert_eq!(feed(&mut *s, mode, &rung1), vec![C, C, S, C, S, C, S, S, S], "rung 1 ({mode})");
        // Iteration 2 is no rung.
        assert_eq!(feed(&mut *s, mode, &[(0, 2, 4.0), (1, 2, 2.0), (3, 2, 0.5), (5, 2, 1.5)]), vec![C; 4]);
        // Rung 3, in this order: t3 and t1 continue (fewer than rf); t0 (5/3)
        // has 2 of 3 better, keep 1: stop; t5 (2/3) has 1 of 4 better, keep 2: continue.
        let rung3 = [(3, 3, 1.0 / 3.0), (1, 3, 1.0), (0, 3, 5.0 / 3.0), (5, 3, 2.0 / 3.0)];
        assert_eq!(feed(&mut *s, mode, &rung3), vec![C, C, S, C], "rung 3 ({mode})");
        // max_t ends the survivors, whatever their metric.
        assert_eq!(feed(&mut *s, mode, &[(3, 9, 0.1), (1, 9, 50.0), (5, 9, 0.2)]), vec![S, S, S]);
    }
}

#[test]
fn stopping_asha_ties_continue() {
    let mut s = build(asha(AshaType::Stopping, 9.0, 3.0), Mode::Min);
    add_all(&mut *s, 4);
    // Third result equal to the best: not strictly worse than the cutoff.
    assert_eq!(feed(&mut *s, Mode::Min, &[(0, 1, 2.0), (1, 1, 2.0), (2, 1, 2.0), (3, 1, 2.5)]), vec![C, C, C, S]);
}

#[test]
fn stopping_asha_non_finite_is_worst_and_stopped() {
    for mode in [Mode::Min, Mode::Max] {
        let mut s = build(asha(AshaType::Stopping, 9.0, 3.0), mode);
        add_all(&mut *s, 6);
        // t0 NaN: stopped at its rung even with no one to compare to.
        // t1: 2 results, fewer than rf: continue. t2 (6): keep 1, t1 better: stop
        // (the NaN is not better). t3 (4): keep 2, none better: continue.
        // t4 (+inf) and t5 (-inf, which a naive max would call best): stop.
        let script = [(0, 1, f64::NAN), (1, 1, 5.0), (2, 1, 6.0), (3, 1, 4.0), (4, 1, f64::INFINITY), (5, 1, f64::NEG_INFINITY)];
        assert_eq!(feed(&mut *s, mode, &script), vec![S, C, S, C, S, S], "{mode}");
    }
}

/// A report that crosses several rungs is judged at the highest only, and
/// the skipped rungs are never judged later with a later value.
#[test]
fn stopping_asha_judges_a_multi_rung_jump_once() {
    let mut s = build(asha(AshaType::Stopping, 16.0, 2.0), Mode::Min);
    add_all(&mut *s, 4);
    // Rungs 1, 2, 4, 8. t0 and t1 fill rungs 1 and 2 with good values.
    assert_eq!(feed(&mut *s, Mode::Min, &[(0, 1, 1.0), (1, 1, 1.0), (0, 2, 0.5), (1, 2, 0.5)]), vec![C; 4]);
    // t2 first reports at 5: judged at rung 4 (empty: continue), not at 1 or 2.
    // Its next report, 6, crosses no new rung: rung 2 (where it would be
    // worse than both others) is not judged with it. At 8, rung 8: alone.
    assert_eq!(feed(&mut *s, Mode::Min, &[(2, 5, 10.0), (2, 6, 10.0), (2, 8, 10.0)]), vec![C, C, C]);
    // Rung 4 now holds t2 (10); t0 at 4 (0.1): 2 results, keep 1, none better: continue;
    // t1 at 4 (20): 3 results, keep 2, 2 better: stop.
    assert_eq!(feed(&mut *s, Mode::Min, &[(0, 4, 0.1), (1, 4, 20.0)]), vec![C, S]);
}

#[test]
fn promotion_asha_nine_trials() {
    for mode in [Mode::Min, Mode::Max] {
        let names = ids(9);
        let pick = |list: &[usize]| -> Vec<String> { list.iter().map(|&i| names[i].clone()).collect() };
        let mut s = build(asha(AshaType::Promotion, 9.0, 3.0), mode);
        add_all(&mut *s, 9);
        // Rung 1 holds t0 (5), then t1 (3): top floor(n/3) = 0: both pause.
        assert_eq!(feed(&mut *s, mode, &[(0, 1, 5.0), (1, 1, 3.0)]), vec![P, P]);
        // Nothing promotable yet: a new trial gets the slot.
        assert_eq!(choose(&mut s, &paused(&pick(&[0, 1])), true), None);
        // t2 (8): 3 in the rung, the top 1 is t1, not t2: t2 pauses, t1 is promoted.
        assert_eq!(feed(&mut *s, mode, &[(2, 1, 8.0)]), vec![P]);
        assert_eq!(choose(&mut s, &paused(&pick(&[0, 1, 2])), true), Some(1));
        // t3 (1): 4 in the rung, top 1 is t3 itself and nothing higher waits: it goes straight on.
        assert_eq!(feed(&mut *s, mode, &[(3, 1, 1.0)]), vec![C]);
        // Rung 3: t1 (1.0), then t3 (1/3): fewer than 3, nothing promotable: both pause.
        assert_eq!(feed(&mut *s, mode, &[(1, 3, 1.0), (3, 3, 1.0 / 3.0)]), vec![P, P]);
        assert_eq!(choose(&mut s, &paused(&pick(&[0, 1, 2, 3])), true), None);
        // t4 (9): top 1 of 5 is t3, already promoted: pause. t5 (2): top 2 of 6
        // are t3 (promoted) and t5: it goes straight on.
        assert_eq!(feed(&mut *s, mode, &[(4, 1, 9.0), (5, 1, 2.0)]), vec![P, C]);
        // t5 at rung 3 (2/3): the top 1 of 3 there is t3, paused: t5 pauses and t3 is promoted.
        assert_eq!(feed(&mut *s, mode, &[(5, 3, 2.0 / 3.0)]), vec![P]);
        assert_eq!(choose(&mut s, &paused(&pick(&[0, 1, 2, 3, 4, 5])), true), Some(3));
        // t3 reaches max_t: done.
        assert_eq!(feed(&mut *s, mode, &[(3, 9, 0.1)]), vec![S]);
        // No trial is promotable any more, even with no new trials to come.
        assert_eq!(choose(&mut s, &paused(&pick(&[0, 1, 2, 4, 5])), false), None);
    }
}

#[test]
fn hyperband_brackets_by_hand() {
    let names = ids(11);
    let pick = |list: &[usize]| -> Vec<String> { list.iter().map(|&i| names[i].clone()).collect() };
    let mut s = build(SchedulerConfig::Hyperband(HyperBandConfig { max_t: 9.0, ..Default::default() }), Mode::Min);
    // max_t 9, rf 3: s_max = 2. The first bracket (s = 2) takes 9 trials, rungs 1, 3, 9.
    add_all(&mut *s, 9);
    let losses = [5.0, 3.0, 8.0, 1.0, 9.0, 2.0, 7.0, 4.0, 6.0];
    let rung1: Vec<(usize, u64, f64)> = losses.iter().enumerate().map(|(t, &l)| (t, 1, l)).collect();
    // All pause until the ninth arrives; then the best 9/3 = 3 (t3, t5, t1) go on.
    // t8 itself is not among them: stopped. The other losers are handed back to end.
    assert_eq!(feed(&mut *s, Mode::Min, &rung1), vec![P, P, P, P, P, P, P, P, S]);
    let mut stopped = s.take_stopped();
    stopped.sort();
    assert_eq!(stopped, vec!["t0", "t2", "t4", "t6", "t7"]);
    let waiting = [1, 3, 5];
    assert_eq!(choose(&mut s, &paused(&pick(&waiting)), true), Some(0));
    assert_eq!(choose(&mut s, &paused(&pick(&waiting[1..])), true), Some(0));
    assert_eq!(choose(&mut s, &paused(&pick(&waiting[2..])), true), Some(0));
    assert_eq!(choose(&mut s, &paused(&pick(&[])), true), None);
    // Rung 3: three trials, keep max(1, 3/3) = 1: t3 (1/3). t5 arrives last and loses: stopped; t1 is handed back.
    assert_eq!(feed(&mut *s, Mode::Min, &[(1, 3, 1.0), (3, 3, 1.0 / 3.0), (5, 3, 2.0 / 3.0)]), vec![P, P, S]);
    assert_eq!(s.take_stopped(), vec!["t1"]);
    assert_eq!(choose(&mut s, &paused(&pick(&[3])), true), Some(0));
    assert_eq!(feed(&mut *s, Mode::Min, &[(3, 9, 0.1)]), vec![S]);
    // The next bracket (s = 1: 5 trials, rungs 3 and 9) gets two trials before the searcher runs dry.
    add_all(&mut *s, 11);
    assert_eq!(feed(&mut *s, Mode::Min, &[(9, 1, 3.0), (9, 3, 2.0)]), vec![C, P]);
    // Without more trials the bracket would wait forever (Ray's defect); told, it halves with two.
    s.on_no_more_trials();
    // t10 reaches rung 3 with 1.0: keep max(1, 2/3) = 1, t10 itself: it goes on; t9 is ended.
    assert_eq!(feed(&mut *s, Mode::Min, &[(10, 3, 1.0)]), vec![C]);
    assert_eq!(s.take_stopped(), vec!["t9"]);
}

#[test]
fn hyperband_goes_on_without_a_failed_trial() {
    let mut s = build(SchedulerConfig::Hyperband(HyperBandConfig { max_t: 3.0, ..Default::default() }), Mode::Min);
    // max_t 3: s_max = 1; the first bracket takes ceil(2/2 * 3) = 3 trials, rungs 1 and 3.
    add_all(&mut *s, 3);
    assert_eq!(feed(&mut *s, Mode::Min, &[(0, 1, 1.0), (1, 1, 2.0)]), vec![P, P]);
    // t2 fails before its rung: the bracket halves with the two it has.
    s.on_trial_error(&view("t2"));
    assert_eq!(s.take_stopped(), vec!["t1"]);
    let t0 = [view_in("t0", TrialStatus::Paused)];
    assert_eq!(choose(&mut s, &t0, true), Some(0));
}

#[test]
fn median_stopping_by_hand() {
    let cfg = |hard_stop| {
        SchedulerConfig::MedianStopping(MedianStoppingConfig {
            grace_period: 1.0,
            min_samples_required: 2,
            hard_stop,
            ..Default::default()
        })
    };
    for mode in [Mode::Min, Mode::Max] {
        let mut s = build(cfg(true), mode);
        // t0 and t1 have too few others to be judged.
        assert_eq!(feed(&mut *s, mode, &[(0, 1, 1.0), (0, 2, 1.0), (1, 1, 3.0), (1, 2, 3.0)]), vec![C; 4]);
        // t2 at 1 (2.0): the others' running means at 1 are 1 and 3, median 2;
        // its best, 2, is not strictly worse: continue. At 2 (2.5): means 1 and 3 again,
        // best still 2: continue.
        assert_eq!(feed(&mut *s, mode, &[(2, 1, 2.0), (2, 2, 2.5)]), vec![C, C]);
        // t3 at 1 (4.0): means of t0, t1, t2 at 1: 1, 3, 2; median 2; best 4 is worse: stop.
        assert_eq!(feed(&mut *s, mode, &[(3, 1, 4.0)]), vec![S], "{mode}");
        // A NaN is the worst result: stopped once it can be judged.
        assert_eq!(feed(&mut *s, mode, &[(4, 1, f64::NAN)]), vec![S]);
    }
    // Without hard_stop the trial pauses, once: resumed, it runs to its end.
    let mut s = build(cfg(false), Mode::Min);
    let d = feed(&mut *s, Mode::Min, &[(0, 1, 1.0), (1, 1, 3.0), (2, 1, 9.0), (2, 2, 9.0), (2, 3, 9.0)]);
    assert_eq!(d, vec![C, C, P, C, C]);
    // Paused trials wait for new ones, then go oldest first.
    let t2 = [view_in("t2", TrialStatus::Paused)];
    assert_eq!(choose(&mut s, &t2, true), None);
    assert_eq!(choose(&mut s, &t2, false), Some(0));
}

#[test]
fn a_restored_scheduler_continues_the_same_schedule() {
    for c in [asha(AshaType::Promotion, 9.0, 3.0), SchedulerConfig::Hyperband(HyperBandConfig { max_t: 9.0, ..Default::default() })] {
        let mut a = build(c.clone(), Mode::Min);
        add_all(&mut *a, 9);
        let head: Vec<(usize, u64, f64)> = (0..5).map(|t| (t, 1, (t * 7 % 5) as f64)).collect();
        let tail: Vec<(usize, u64, f64)> = (5..9).map(|t| (t, 1, (t * 7 % 5) as f64)).collect();
        let _ = feed(&mut *a, Mode::Min, &head);
        let mut b = build(c, Mode::Min);
        b.restore(&a.save()).unwrap();
        assert_eq!(feed(&mut *a, Mode::Min, &tail), feed(&mut *b, Mode::Min, &tail));
        assert_eq!(a.take_stopped(), b.take_stopped());
        assert_eq!(a.save(), b.save());
    }
}
