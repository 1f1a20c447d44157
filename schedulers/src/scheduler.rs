//! The `Scheduler` trait and the read-only views it decides over.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use search::{Config, TrialResult};

/// What happens to a trial after one of its results. Each variant carries
/// everything the Tuner needs to carry it out.
///
/// A decision is about the trial whose result it answers. What a scheduler
/// decides about *other* trials as a consequence (a HyperBand bracket that
/// closes stops its paused trials; synchronous PBT's round exploits the
/// paused population when its last member arrives) can follow any hook,
/// not only a result, so it comes from [`Scheduler::take_stopped`] and
/// [`Scheduler::take_exploits`]: the Tuner asks for them after every hook,
/// and journals them with the hook, so a resumed sweep replays them. They
/// stay beside `Decision` rather than in every hook's return value because
/// most hooks of most schedulers have none, and the journal's replay
/// (tuner's journal.rs) checks them against what the sweep had recorded.
///
/// A `Pause` (or an `Exploit` or `Resize`) on a result at which the trial
/// has reached its end (its `[stop]` criteria are met) ends it TERMINATED
/// instead: there is nothing left to resume.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Decision {
    /// Keep training.
    Continue,
    /// Stop now, keep the trial resumable from its latest checkpoint.
    Pause,
    /// Stop for good: the trial ends TERMINATED.
    Stop,
    /// Population-based training: stop, take the donor's latest committed
    /// checkpoint and restart from it with the explored config.
    Exploit(Box<Exploit>),
    /// Stop and restart from the checkpoint this result carried, with
    /// `num_workers` workers (its world size follows). The Tuner carries it
    /// out only when that checkpoint can be restored at the new size; when
    /// it cannot, the trial continues as it is.
    Resize {
        /// The trial's new number of workers.
        num_workers: u32,
    },
}

/// A trial's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TrialStatus {
    /// Created, waiting for resources.
    Pending,
    /// Its workers are running.
    Running,
    /// Stopped by a scheduler, resumable from its checkpoint.
    Paused,
    /// Finished: ran to completion or was stopped.
    Terminated,
    /// Failed.
    Error,
}

impl TrialStatus {
    /// True for TERMINATED and ERROR: the trial will not run again.
    pub fn is_finished(self) -> bool {
        matches!(self, TrialStatus::Terminated | TrialStatus::Error)
    }
    /// The upper-case name, as shown in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            TrialStatus::Pending => "PENDING",
            TrialStatus::Running => "RUNNING",
            TrialStatus::Paused => "PAUSED",
            TrialStatus::Terminated => "TERMINATED",
            TrialStatus::Error => "ERROR",
        }
    }
}

impl std::fmt::Display for TrialStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A read-only view of one trial, handed to scheduler hooks.
#[derive(Debug, Clone, Copy)]
pub struct TrialView<'a> {
    /// The trial's id.
    pub id: &'a str,
    /// Its config.
    pub config: &'a Config,
    /// Its state when the hook is called.
    pub status: TrialStatus,
    /// How many results it has stored.
    pub num_results: u64,
    /// The workers its run has (or will have): its world size.
    pub num_workers: u32,
}

/// The PAUSED trials [`Scheduler::choose_trial_to_run`] picks among:
/// found by id, listed oldest first (by creation).
pub trait Paused {
    /// How many.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The paused trial `id`, if it is one.
    fn get(&self, id: &str) -> Option<TrialView<'_>>;
    /// Every paused trial, oldest first.
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_>;
    /// The oldest paused trial.
    fn oldest(&self) -> Option<TrialView<'_>> {
        self.iter().next()
    }
}

/// A list of views, oldest first (tests, the journal's replay): lookups
/// are a pass over it.
impl Paused for [TrialView<'_>] {
    fn len(&self) -> usize {
        <[TrialView<'_>]>::len(self)
    }
    fn get(&self, id: &str) -> Option<TrialView<'_>> {
        <[TrialView<'_>]>::iter(self).find(|t| t.id == id).copied()
    }
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_> {
        Box::new(<[TrialView<'_>]>::iter(self).copied())
    }
}

impl Paused for Vec<TrialView<'_>> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn get(&self, id: &str) -> Option<TrialView<'_>> {
        Paused::get(self.as_slice(), id)
    }
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_> {
        Paused::iter(self.as_slice())
    }
}

impl<const N: usize> Paused for [TrialView<'_>; N] {
    fn len(&self) -> usize {
        N
    }
    fn get(&self, id: &str) -> Option<TrialView<'_>> {
        Paused::get(self.as_slice(), id)
    }
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_> {
        Paused::iter(self.as_slice())
    }
}

/// A population-based exploit: `trial_id` stops and restarts from the
/// latest committed checkpoint of `donor` (the one the scheduler saw, at
/// `checkpoint_iteration`), training on with `config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exploit {
    /// The trial that takes over the donor's state (the recipient).
    pub trial_id: String,
    /// The trial whose checkpoint it takes.
    pub donor: String,
    /// The donor's checkpoint, as reported with its result.
    pub checkpoint: String,
    /// The iteration that checkpoint was reported with.
    pub checkpoint_iteration: u64,
    /// The recipient's new config: the donor's, explored.
    pub config: Config,
}

/// What the node holds, told to the scheduler before trials start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// How many workers (each with the experiment's per-worker resources)
    /// fit on the node at once.
    pub workers: u32,
    /// The workers a trial starts with (the experiment's `num_workers`).
    pub trial_workers: u32,
}

/// Errors of schedulers.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Saved state could not be restored.
    #[error("cannot restore scheduler state: {0}")]
    State(String),
}

/// Decides, after each stored result, whether a trial continues. One
/// required method; every other hook defaults to nothing.
///
/// Hooks run in the Tuner's event loop: `on_trial_add` when a trial is
/// created (PENDING), `on_trial_result` after each of its results is durable
/// (RUNNING), `on_trial_complete` or `on_trial_error` once when it ends.
pub trait Scheduler: Send {
    /// Called for every stored result of a RUNNING trial.
    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision;

    /// Called when a trial is created (PENDING).
    fn on_trial_add(&mut self, _trial: &TrialView<'_>) {}

    /// Called once when a trial ends TERMINATED; `result` is its last.
    fn on_trial_complete(&mut self, _trial: &TrialView<'_>, _result: Option<&TrialResult>) {}

    /// Called once when a trial ends ERROR.
    fn on_trial_error(&mut self, _trial: &TrialView<'_>) {}

    /// Picks which PAUSED trial gets a free slot; returns its id, or
    /// `None` to resume none now. Called whenever a slot is free and some
    /// trial is paused: first with `can_add` true when the searcher may
    /// still create a new trial (`None` then lets it), and again with
    /// `can_add` false once it cannot. Trials restarting after a failure or
    /// a resume start before any of these. `paused` finds a trial by id
    /// and lists them oldest first: a scheduler that knows which trial it
    /// wants looks it up, so a choice need not cost a pass over every
    /// paused trial. By default: new trials first, then the paused ones,
    /// oldest first.
    fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Option<String> {
        if can_add {
            None
        } else {
            paused.oldest().map(|t| t.id.to_string())
        }
    }

    /// Called once the searcher will create no more trials (it is finished,
    /// or it waits while nothing runs): a scheduler waiting for more trials
    /// (a HyperBand bracket still filling) must decide with what it has.
    fn on_no_more_trials(&mut self) {}

    /// Trials this scheduler has given up on as a consequence of a hook
    /// about *other* trials (a HyperBand bracket that closed): PAUSED ones
    /// end TERMINATED, running ones stop. Polled after every hook; a
    /// decision about the trial a hook is called for goes in its return
    /// value instead.
    fn take_stopped(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// Exploits of PAUSED trials decided as a consequence of a hook about
    /// another trial (synchronous PBT's round, decided when the last of the
    /// population reaches the interval). Polled with
    /// [`Scheduler::take_stopped`]; each is carried out before its trial
    /// runs again. An exploit naming a trial that is not PAUSED is dropped.
    fn take_exploits(&mut self) -> Vec<Exploit> {
        Vec::new()
    }

    /// Called before trials start (and again on resume) with what the node holds.
    fn on_capacity(&mut self, _capacity: Capacity) {}

    /// Metrics every result must carry for this scheduler, with the setting
    /// that names each (`("scheduler.time_attr", "epoch")`). A result
    /// without one is an error on its trial, raised by the Tuner before the
    /// scheduler sees the result.
    fn required_metrics(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whether this scheduler pauses trials (and so needs them to resume
    /// from checkpoints).
    fn pauses_trials(&self) -> bool {
        false
    }

    /// Whether [`Scheduler::on_trial_result`] may ever decide anything but
    /// [`Decision::Continue`]. When neither it nor a stopper can, a trial's
    /// ranks go on from each report without waiting for the loop's answer.
    /// By default it may.
    fn decides_on_results(&self) -> bool {
        true
    }

    /// State to persist for resume; must carry a `version` field.
    fn save(&self) -> Value {
        serde_json::json!({ "version": 1 })
    }

    /// [`Scheduler::save`]'s state as JSON text. A scheduler whose state
    /// grows with the trials writes it without building a `Value` first
    /// (ASHA's state for 100,000 trials: 14 MB of text, 170 MB as a `Value`).
    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.save()).unwrap_or_default()
    }

    /// Restores state written by [`Scheduler::save`].
    fn restore(&mut self, _state: &Value) -> Result<(), SchedulerError> {
        Ok(())
    }
}

/// A version-1 state a scheduler saved, read field by field; errors name
/// the scheduler.
pub(crate) struct Saved<'a> {
    state: &'a Value,
    what: &'a str,
}

impl<'a> Saved<'a> {
    /// `state`, if it is a version-1 state of `kind` (`what` names it in errors).
    pub(crate) fn open(state: &'a Value, kind: &str, what: &'a str) -> Result<Self, SchedulerError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != kind {
            return Err(SchedulerError::State(format!("not a version-1 {what} state: {state}")));
        }
        Ok(Self { state, what })
    }

    /// Its field `key`.
    pub(crate) fn field<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<T, SchedulerError> {
        serde_json::from_value(self.state[key].clone()).map_err(|e| SchedulerError::State(format!("{} state: {e}", self.what)))
    }
}

impl<S: Scheduler + ?Sized> Scheduler for Box<S> {
    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        (**self).on_trial_result(trial, result)
    }
    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        (**self).on_trial_add(trial)
    }
    fn on_trial_complete(&mut self, trial: &TrialView<'_>, result: Option<&TrialResult>) {
        (**self).on_trial_complete(trial, result)
    }
    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        (**self).on_trial_error(trial)
    }
    fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Option<String> {
        (**self).choose_trial_to_run(paused, can_add)
    }
    fn on_no_more_trials(&mut self) {
        (**self).on_no_more_trials()
    }
    fn take_stopped(&mut self) -> Vec<String> {
        (**self).take_stopped()
    }
    fn take_exploits(&mut self) -> Vec<Exploit> {
        (**self).take_exploits()
    }
    fn on_capacity(&mut self, capacity: Capacity) {
        (**self).on_capacity(capacity)
    }
    fn required_metrics(&self) -> Vec<(String, String)> {
        (**self).required_metrics()
    }
    fn pauses_trials(&self) -> bool {
        (**self).pauses_trials()
    }
    fn save(&self) -> Value {
        (**self).save()
    }
    fn save_json(&self) -> Vec<u8> {
        (**self).save_json()
    }
    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        (**self).restore(state)
    }
}
