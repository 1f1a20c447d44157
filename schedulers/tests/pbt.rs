//! Population-based training, worked out by hand: who exploits whom, when,
//! with which checkpoint and config; never a donor without a checkpoint;
//! the same choices after a save and restore.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use schedulers::{Decision, Exploit, PbtConfig, Scheduler, SchedulerConfig, TrialStatus, TrialView};
use search::{Domain, Mode, TrialResult};
use serde_json::{json, Value};

fn pbt(seed: u64) -> Box<dyn Scheduler> {
    let c = PbtConfig {
        time_attr: "training_iteration".into(),
        perturbation_interval: 2.0,
        quantile_fraction: 0.25,
        resample_probability: 0.0,
        seed: Some(seed),
        ..PbtConfig::default()
    }
    .mutate("lr", Domain::uniform(0.0, 10.0));
    SchedulerConfig::Pbt(c).build(Some("loss"), Some(Mode::Min)).unwrap()
}

struct Population {
    configs: Vec<Value>,
}

impl Population {
    fn new(n: usize) -> Self {
        Self { configs: (0..n).map(|i| json!({ "lr": 1.0 + i as f64 })).collect() }
    }
    fn view(&self, i: usize) -> TrialView<'_> {
        TrialView { id: ID[i], config: &self.configs[i], status: TrialStatus::Running, num_results: 0, num_workers: 1 }
    }
}

const ID: [&str; 5] = ["t0", "t1", "t2", "t3", "t4"];

fn result(i: usize, t: u64, loss: f64, checkpoint: bool) -> TrialResult {
    TrialResult {
        extra: None,
        trial_id: ID[i].into(),
        seq: t - 1,
        training_iteration: t,
        metrics: [("loss".to_string(), loss), ("training_iteration".to_string(), t as f64)].into_iter().collect(),
        checkpoint: checkpoint.then(|| format!("/ckpt/{}/checkpoint_{t:06}", ID[i])),
    }
}

/// Feeds one result; returns the decision and the exploits it caused.
fn feed(s: &mut dyn Scheduler, pop: &mut Population, i: usize, t: u64, loss: f64, ckpt: bool) -> (Decision, Vec<Exploit>) {
    let d = s.on_trial_result(&pop.view(i), &result(i, t, loss, ckpt));
    let e: Vec<Exploit> = match &d {
        Decision::Exploit(x) => vec![(**x).clone()],
        _ => Vec::new(),
    };
    for x in &e {
        let r = ID.iter().position(|id| *id == x.trial_id).unwrap();
        pop.configs[r] = x.config.clone();
    }
    (d, e)
}

#[test]
fn the_bottom_quarter_exploits_the_top_quarter_at_each_interval_and_never_a_trial_without_a_checkpoint() {
    let mut s = pbt(3);
    let mut pop = Population::new(4);
    for i in 0..4 {
        s.on_trial_add(&pop.view(i));
    }
    // The whole population runs: nobody waits for a slot, so nobody yields one.
    s.on_no_more_trials();
    // Iteration 1: less than an interval since the start, nobody is judged.
    for (i, loss) in [(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)] {
        assert_eq!(feed(&mut *s, &mut pop, i, 1, loss, true), (Decision::Continue, vec![]));
    }
    // Iteration 2: t0 is best but reports without a checkpoint (its last one is from iteration 1).
    assert_eq!(feed(&mut *s, &mut pop, 0, 2, 0.05, false).0, Decision::Continue);
    assert_eq!(feed(&mut *s, &mut pop, 1, 2, 0.15, true).0, Decision::Continue);
    assert_eq!(feed(&mut *s, &mut pop, 2, 2, 0.25, true).0, Decision::Continue);
    // t3 is the bottom quarter (1 of 4); the top quarter is t0, whose latest
    // committed checkpoint is iteration 1's: that is the one it hands over.
    let (d, e) = feed(&mut *s, &mut pop, 3, 2, 0.35, true);
    assert!(matches!(d, Decision::Exploit(_)), "{d:?}");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!((e[0].trial_id.as_str(), e[0].donor.as_str()), ("t3", "t0"));
    assert_eq!((e[0].checkpoint.as_str(), e[0].checkpoint_iteration), ("/ckpt/t0/checkpoint_000001", 1));
    // The donor's lr 1.0, times 1.2 or 0.8.
    let lr = e[0].config["lr"].as_f64().unwrap();
    assert!((lr - 1.2).abs() < 1e-12 || (lr - 0.8).abs() < 1e-12, "{lr}");

    // t3 restarts from iteration 1: it is not ranked until it reports again.
    // Iteration 3 for the others: not an interval since their last check (2).
    for (i, loss) in [(0, 0.04), (1, 0.14), (2, 0.24)] {
        assert_eq!(feed(&mut *s, &mut pop, i, 3, loss, true), (Decision::Continue, vec![]));
    }
    // t3's next check is an interval after the donor's checkpoint time (1): at 3.
    let (d, e) = feed(&mut *s, &mut pop, 3, 2, 0.5, false);
    assert_eq!((d, e.len()), (Decision::Continue, 0));
    let (d, e) = feed(&mut *s, &mut pop, 3, 3, 0.6, true);
    assert!(matches!(d, Decision::Exploit(_)), "{e:?}");
    assert_eq!((e[0].donor.as_str(), e[0].checkpoint.as_str()), ("t0", "/ckpt/t0/checkpoint_000003"));

    // A finished trial is neither ranked nor a donor: with t0 gone, t1 is the top.
    s.on_trial_complete(&pop.view(0), None);
    assert_eq!(feed(&mut *s, &mut pop, 1, 4, 0.13, true).0, Decision::Continue);
    let (d, e) = feed(&mut *s, &mut pop, 2, 4, 0.9, true);
    assert!(matches!(d, Decision::Exploit(_)), "{d:?}");
    assert_eq!((e[0].trial_id.as_str(), e[0].donor.as_str(), e[0].checkpoint_iteration), ("t2", "t1", 4));
}

#[test]
fn no_exploit_when_no_top_trial_has_a_checkpoint() {
    let mut s = pbt(1);
    let mut pop = Population::new(4);
    s.on_no_more_trials();
    for t in 1..=6 {
        for (i, loss) in [(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)] {
            // Only the bottom three checkpoint: the top one never does.
            let (d, e) = feed(&mut *s, &mut pop, i, t, loss, i != 0);
            assert_eq!((d, e), (Decision::Continue, vec![]), "iteration {t}, trial {i}");
        }
    }
}

/// The paused trials of a test: views over the population's configs.
struct PausedSet<'a> {
    pop: &'a Population,
    ids: Vec<usize>,
}

impl schedulers::Paused for PausedSet<'_> {
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn get(&self, id: &str) -> Option<TrialView<'_>> {
        self.ids.iter().map(|&i| self.pop.view(i)).find(|v| v.id == id)
    }
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_> {
        Box::new(self.ids.iter().map(|&i| self.pop.view(i)))
    }
}

#[test]
fn a_trial_yields_its_slot_at_its_check_while_others_wait_and_the_least_trained_goes_next() {
    let mut s = pbt(4);
    let mut pop = Population::new(4);
    // Two of four started; more may come (the searcher has not said it is done).
    s.on_trial_add(&pop.view(0));
    s.on_trial_add(&pop.view(1));
    assert_eq!(feed(&mut *s, &mut pop, 0, 1, 0.1, true).0, Decision::Continue, "not at an interval yet");
    // At its check t0 goes on in the ranking but yields: trials wait for a slot.
    assert_eq!(feed(&mut *s, &mut pop, 0, 2, 0.1, true).0, Decision::Pause);
    // Without a checkpoint it would lose what it trained since its last one: it goes on.
    assert_eq!(feed(&mut *s, &mut pop, 1, 2, 0.05, false).0, Decision::Continue);
    // A free slot: new trials first, while they may come.
    let paused = PausedSet { pop: &pop, ids: vec![0] };
    assert_eq!(s.choose_trial_to_run(&paused, true), None);
    s.on_trial_add(&pop.view(2));
    s.on_trial_add(&pop.view(3));
    // t2 reaches its check while t0 is paused: it yields too.
    assert_eq!(feed(&mut *s, &mut pop, 2, 2, 0.3, true).0, Decision::Pause);
    // No new trial can come: the paused one with the least training goes next (t2 at 2 before t0 at 2 by age: t0).
    let paused = PausedSet { pop: &pop, ids: vec![0, 2] };
    assert_eq!(s.choose_trial_to_run(&paused, false).as_deref(), Some("t0"));
    // t0 ran on to 4 and yields again, since t2 still waits.
    assert_eq!(feed(&mut *s, &mut pop, 0, 4, 0.05, true).0, Decision::Pause);
    let paused = PausedSet { pop: &pop, ids: vec![0, 2] };
    assert_eq!(s.choose_trial_to_run(&paused, false).as_deref(), Some("t2"), "t2 trained less");
    // t3 reaches its check while t0 waits: it yields, and trained less than t0.
    assert_eq!(feed(&mut *s, &mut pop, 3, 2, 0.25, true).0, Decision::Pause);
    let paused = PausedSet { pop: &pop, ids: vec![0, 3] };
    assert_eq!(s.choose_trial_to_run(&paused, false).as_deref(), Some("t3"));
    let paused = PausedSet { pop: &pop, ids: vec![0] };
    assert_eq!(s.choose_trial_to_run(&paused, false).as_deref(), Some("t0"));
    // Nobody waits any more: each goes on at its check.
    assert_eq!(feed(&mut *s, &mut pop, 3, 4, 0.25, true).0, Decision::Continue);
    assert_eq!(feed(&mut *s, &mut pop, 2, 4, 0.2, true).0, Decision::Continue);
    // A restored scheduler knows the population is closed: nobody waits, nobody yields.
    let mut restored = pbt(4);
    restored.restore(&s.save()).unwrap();
    assert_eq!(feed(&mut *restored, &mut pop, 0, 6, 0.01, true).0, Decision::Continue);
}

#[test]
fn a_restored_scheduler_makes_the_same_choices() {
    // Five trials whose ranks shuffle every iteration, run twice: straight
    // through, and saved then restored into a new scheduler half way.
    let script: Vec<(usize, u64, f64)> =
        (1..=12u64).flat_map(|t| (0..5usize).map(move |i| (i, t, ((i as u64 * 7 + t * 3) % 11) as f64))).collect();
    let run = |restore_at: Option<usize>| {
        let mut s = pbt(9);
        let mut pop = Population::new(5);
        for i in 0..5 {
            s.on_trial_add(&pop.view(i));
        }
        let mut log = Vec::new();
        for (n, &(i, t, loss)) in script.iter().enumerate() {
            if restore_at == Some(n) {
                let state = s.save();
                s = pbt(9);
                s.restore(&state).unwrap();
            }
            let (d, e) = feed(&mut *s, &mut pop, i, t, loss, true);
            log.push((d, e));
        }
        log
    };
    let straight = run(None);
    assert!(straight.iter().filter(|(d, _)| matches!(d, Decision::Exploit(_))).count() >= 3, "too few exploits to compare: {straight:?}");
    assert_eq!(run(Some(31)), straight);
}
