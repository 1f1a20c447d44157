//! Trials whose number of workers changes while they train (Ray Tune's
//! `ResourceChangingScheduler`): a wrapper around another scheduler.
//!
//! The wrapped scheduler decides as usual. When it lets a trial continue on
//! a result that carries a checkpoint (the only point a run can be resized
//! at), the wrapper works out the workers that trial should have; if that
//! differs from what it runs with, the trial pauses and restarts from that
//! checkpoint with the new number ([`Decision::Resize`]), its world size
//! following.
//!
//! Nothing changes while new trials may still come: their slots come
//! first. Once the searcher has no more (`on_no_more_trials`), slots free
//! up as trials end, and:
//! - `Distribute` (Ray's `DistributeResources`, the default) gives every
//!   running trial an even share of the node's workers, `capacity /
//!   running`, at least the experiment's `num_workers` and at most
//!   `max_workers`; a trial grows only into workers that are free;
//! - `TopJob` (Ray's `DistributeResourcesToTopJob`) gives the free workers
//!   to the best running trial, and takes a trial that is not the best back
//!   to the experiment's `num_workers`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use search::TrialResult;

use crate::objective::{Objective, Score};
use crate::scheduler::{Capacity, Decision, Exploit, Paused, Scheduler, SchedulerError, TrialView};

/// How the free workers are shared out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerAllocation {
    /// An even share for every running trial.
    #[default]
    Distribute,
    /// All free workers to the best running trial.
    TopJob,
}

/// A running trial as the wrapper knows it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Member {
    workers: u32,
    score: Option<Score>,
}

/// The resource-changing wrapper. See the module docs.
pub struct ResourceChanging {
    base: Box<dyn Scheduler>,
    obj: Objective,
    allocation: WorkerAllocation,
    max_workers: Option<u32>,
    capacity: Option<Capacity>,
    no_more: bool,
    running: BTreeMap<String, Member>,
}

impl ResourceChanging {
    /// Wraps `base`; `obj` ranks trials for [`WorkerAllocation::TopJob`].
    pub fn new(base: Box<dyn Scheduler>, obj: Objective, allocation: WorkerAllocation, max_workers: Option<u32>) -> Self {
        Self { base, obj, allocation, max_workers, capacity: None, no_more: false, running: BTreeMap::new() }
    }

    /// The workers `id` (running with `current`) should have now.
    fn target(&self, id: &str, current: u32) -> u32 {
        let Some(cap) = self.capacity.filter(|_| self.no_more) else { return current };
        let floor = cap.trial_workers.max(1);
        let ceiling = self.max_workers.unwrap_or(cap.workers).min(cap.workers).max(floor);
        let used: u32 = self.running.values().map(|m| m.workers).sum();
        let free = cap.workers.saturating_sub(used);
        match self.allocation {
            WorkerAllocation::Distribute => {
                let share = (cap.workers / self.running.len().max(1) as u32).clamp(floor, ceiling);
                if share > current {
                    current + (share - current).min(free)
                } else {
                    share
                }
            }
            WorkerAllocation::TopJob => {
                let key = |m: &Member| m.score.map_or(f64::NEG_INFINITY, Score::value);
                // The best running trial; on a tie, the first by id.
                let best = self.running.iter().fold(None::<(&String, f64)>, |acc, (k, m)| match acc {
                    Some((_, b)) if b >= key(m) => acc,
                    _ => Some((k, key(m))),
                });
                if best.is_some_and(|(b, _)| b == id) {
                    (current + free).min(ceiling).max(current)
                } else {
                    current.min(floor)
                }
            }
        }
    }
}

impl Scheduler for ResourceChanging {
    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let decision = self.base.on_trial_result(trial, result);
        let score = self.obj.read(result).map(|(_, s)| s);
        let current = trial.num_workers.max(1);
        if decision != Decision::Continue {
            // Paused or stopped: its workers are free.
            self.running.remove(trial.id);
            return decision;
        }
        self.running.insert(trial.id.to_string(), Member { workers: current, score });
        if result.checkpoint.is_none() {
            return decision;
        }
        let target = self.target(trial.id, current);
        if target == current {
            return decision;
        }
        // Its workers change as it restarts: counted at the new size from now.
        self.running.insert(trial.id.to_string(), Member { workers: target, score });
        Decision::Resize { num_workers: target }
    }

    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        self.base.on_trial_add(trial);
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, result: Option<&TrialResult>) {
        self.running.remove(trial.id);
        self.base.on_trial_complete(trial, result);
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        self.running.remove(trial.id);
        self.base.on_trial_error(trial);
    }

    fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Option<String> {
        self.base.choose_trial_to_run(paused, can_add)
    }

    fn on_no_more_trials(&mut self) {
        self.no_more = true;
        self.base.on_no_more_trials();
    }

    fn take_stopped(&mut self) -> Vec<String> {
        self.base.take_stopped()
    }

    fn take_exploits(&mut self) -> Vec<Exploit> {
        self.base.take_exploits()
    }

    fn on_capacity(&mut self, capacity: Capacity) {
        self.capacity = Some(capacity);
        self.base.on_capacity(capacity);
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        let mut out = self.base.required_metrics();
        if self.allocation == WorkerAllocation::TopJob {
            out.push(("scheduler.metric".into(), self.obj.metric.clone()));
        }
        out
    }

    fn pauses_trials(&self) -> bool {
        true
    }

    fn save(&self) -> Value {
        json!({
            "version": 1,
            "kind": "resource_changing",
            "base": self.base.save(),
            "no_more": self.no_more,
            "running": self.running,
        })
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != "resource_changing" {
            return Err(SchedulerError::State(format!("not a version-1 resource-changing state: {state}")));
        }
        self.base.restore(&state["base"])?;
        self.no_more = state["no_more"].as_bool().unwrap_or(false);
        self.running =
            serde_json::from_value(state["running"].clone()).map_err(|e| SchedulerError::State(format!("resource-changing state: {e}")))?;
        Ok(())
    }
}
