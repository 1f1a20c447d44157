//! The resource-changing wrapper, worked by hand: nothing changes while new
//! trials may come; then free workers go to the running trials (evenly, or
//! to the best), only at results with a checkpoint; the wrapped scheduler's
//! decisions pass through; its state survives a save and restore.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use schedulers::{Capacity, Decision, Scheduler, SchedulerConfig, TrialStatus, TrialView};
use search::{Mode, TrialResult};

const CONFIG: serde_json::Value = serde_json::Value::Null;

fn view(id: &str, workers: u32) -> TrialView<'_> {
    TrialView { id, config: &CONFIG, status: TrialStatus::Running, num_results: 0, num_workers: workers }
}

fn result(id: &str, t: u64, loss: f64, checkpoint: bool) -> TrialResult {
    TrialResult {
        extra: None,
        trial_id: id.into(),
        seq: t - 1,
        training_iteration: t,
        metrics: [("loss".to_string(), loss), ("training_iteration".to_string(), t as f64)].into_iter().collect(),
        checkpoint: checkpoint.then(|| format!("/ckpt/{id}/{t}")),
    }
}

fn build(toml: &str) -> Box<dyn Scheduler> {
    let c: SchedulerConfig = toml::from_str(&format!("type = \"resource_changing\"\n{toml}")).unwrap();
    let mut s = c.build(Some("loss"), Some(Mode::Min)).unwrap();
    s.on_capacity(Capacity { workers: 4, trial_workers: 1 });
    s
}

/// Feeds a result; returns the decision.
fn feed(s: &mut dyn Scheduler, id: &str, workers: u32, t: u64, loss: f64, ckpt: bool) -> Decision {
    s.on_trial_result(&view(id, workers), &result(id, t, loss, ckpt))
}

fn resize(n: u32) -> Decision {
    Decision::Resize { num_workers: n }
}

#[test]
fn distribute_shares_the_free_workers_once_no_new_trial_can_come() {
    let mut s = build("");
    // While the searcher may add trials, nothing changes.
    assert_eq!(feed(s.as_mut(), "a", 1, 1, 1.0, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "b", 1, 1, 2.0, true), Decision::Continue);
    s.on_no_more_trials();
    // Two running on 4 workers: 2 each. Only at a result with a checkpoint.
    assert_eq!(feed(s.as_mut(), "a", 1, 2, 1.0, false), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "a", 1, 3, 1.0, true), resize(2));
    assert_eq!(feed(s.as_mut(), "b", 1, 2, 2.0, true), resize(2));
    // At their new size they go on.
    assert_eq!(feed(s.as_mut(), "a", 2, 4, 1.0, true), Decision::Continue);
    // b ends: a may take all 4.
    s.on_trial_complete(&view("b", 2), None);
    assert_eq!(feed(s.as_mut(), "a", 2, 5, 1.0, true), resize(4));
}

#[test]
fn a_trial_grows_only_into_free_workers_and_max_workers_caps_it() {
    let mut s = build("max_workers = 3");
    for id in ["a", "b", "c"] {
        assert_eq!(feed(s.as_mut(), id, 1, 1, 1.0, true), Decision::Continue);
    }
    s.on_no_more_trials();
    // Three running on 4: a share of 1 each (4 / 3), nothing to do.
    assert_eq!(feed(s.as_mut(), "a", 1, 2, 1.0, true), Decision::Continue);
    s.on_trial_complete(&view("c", 1), None);
    // Two running: a share of 2; a takes 1 more of the 2 free, then b the last.
    assert_eq!(feed(s.as_mut(), "a", 1, 3, 1.0, true), resize(2));
    assert_eq!(feed(s.as_mut(), "b", 1, 2, 1.0, true), resize(2));
    s.on_trial_complete(&view("b", 2), None);
    // Alone: 4, capped at max_workers = 3.
    assert_eq!(feed(s.as_mut(), "a", 2, 4, 1.0, true), resize(3));
}

#[test]
fn top_job_gives_the_free_workers_to_the_best_trial() {
    let mut s = build("allocation = \"top_job\"");
    assert_eq!(feed(s.as_mut(), "a", 1, 1, 5.0, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "b", 1, 1, 1.0, true), Decision::Continue);
    s.on_no_more_trials();
    // b is best (lowest loss): it takes the 2 free workers; a stays at 1.
    assert_eq!(feed(s.as_mut(), "a", 1, 2, 5.0, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "b", 1, 2, 1.0, true), resize(3));
    // a becomes the best: b goes back to 1 at its next checkpoint, then a grows into what it frees.
    assert_eq!(feed(s.as_mut(), "a", 1, 3, 0.5, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "b", 3, 3, 1.0, true), resize(1));
    assert_eq!(feed(s.as_mut(), "a", 1, 4, 0.5, true), resize(3));
}

#[test]
fn the_wrapped_schedulers_decisions_pass_through_and_state_survives() {
    let base = "[base]\ntype = \"asha\"\nmax_t = 9\ngrace_period = 1\nreduction_factor = 3\n";
    let mut s = build(base);
    // ASHA stops a trial at the first rung when two better ones are there.
    assert_eq!(feed(s.as_mut(), "a", 1, 1, 1.0, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "b", 1, 1, 2.0, true), Decision::Continue);
    assert_eq!(feed(s.as_mut(), "c", 1, 1, 3.0, true), Decision::Stop);
    s.on_no_more_trials();
    let saved = s.save();
    let mut restored = build(base);
    restored.restore(&saved).unwrap();
    assert_eq!(restored.save(), saved);
    // c stopped: its worker is free; a and b share 4.
    for t in [&mut s, &mut restored] {
        assert_eq!(feed(t.as_mut(), "a", 1, 2, 1.0, true), resize(2));
    }
    let err = |toml: &str| {
        let c: SchedulerConfig = toml::from_str(&format!("type = \"resource_changing\"\n{toml}")).unwrap();
        c.build(Some("loss"), Some(Mode::Min)).err().unwrap().to_string()
    };
    let e = err("[base]\ntype = \"asha\"\nreduction_factor = 1");
    assert!(e.starts_with("scheduler.base.reduction_factor: must be greater than 1"), "{e}");
    assert!(err("[base]\ntype = \"resource_changing\"").starts_with("scheduler.base.type: resource_changing cannot wrap itself"));
    assert!(err("max_workers = 0").starts_with("scheduler.max_workers: must be at least 1"));
}
