//! HyperBand with synchronous brackets (Li et al. 2018, as Ray's
//! `HyperBandScheduler`), pausing trials at each rung until their bracket
//! has been halved.
//!
//! With `s_max = floor(log_rf(max_t / grace_period))`, brackets cycle
//! through `s = s_max, ..., 0`. Bracket `s` takes
//! `ceil((s_max + 1) / (s + 1) * rf^s)` trials, which first run to
//! `max_t / rf^s`, then each rung keeps the best `floor(n / rf)` (at least
//! one) and runs them `rf` times longer, up to `max_t`.
//!
//! Unlike Ray's, no trial is paused forever:
//! - a bracket still filling when the searcher runs dry
//!   ([`Scheduler::on_no_more_trials`]) is halved with the trials it has;
//! - a trial that completes, fails or is stopped by something else leaves
//!   its bracket, which then goes on without it;
//! - the losers of a halving are handed to the Tuner to end
//!   ([`Scheduler::take_stopped`]).
//!
//! A NaN or infinite metric ranks last and never survives a halving.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use search::TrialResult;

use crate::objective::{ranked, Objective, Score};
use crate::scheduler::{Decision, Paused, Scheduler, SchedulerError, TrialView};
use search::Mode;

use crate::settings::{eighty_one, halving, objective, three, training_iteration, ConfigError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Bracket {
    s: u32,
    capacity: usize,
    /// Its trials, in arrival order.
    members: Vec<String>,
    /// No more trials join it.
    filled: bool,
    milestones: Vec<f64>,
    /// The rung its live trials are running to.
    rung: usize,
    /// Scores at the current rung.
    recorded: BTreeMap<String, Score>,
    /// Survivors of the last halving not yet resumed.
    to_resume: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum State {
    Running,
    Paused,
    Done,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrialState {
    bracket: usize,
    state: State,
}

/// Synchronous HyperBand; see the module documentation.
#[derive(Debug, Clone)]
pub struct HyperBand {
    objective: Objective,
    max_t: f64,
    rf: f64,
    s_max: u32,
    brackets: Vec<Bracket>,
    trials: BTreeMap<String, TrialState>,
    to_stop: Vec<String>,
}

impl HyperBand {
    /// HyperBand over `objective` (settings checked by [`crate::SchedulerConfig`]).
    pub fn new(objective: Objective, max_t: f64, grace_period: f64, reduction_factor: f64) -> Self {
        let s_max = ((max_t / grace_period).ln() / reduction_factor.ln() + 1e-9).floor().clamp(0.0, 30.0) as u32;
        Self { objective, max_t, rf: reduction_factor, s_max, brackets: Vec::new(), trials: BTreeMap::new(), to_stop: Vec::new() }
    }

    /// Bracket `s`: its capacity and milestones.
    pub fn bracket_shape(&self, s: u32) -> (usize, Vec<f64>) {
        let n = ((self.s_max + 1) as f64 / (s + 1) as f64 * self.rf.powi(s as i32)).ceil() as usize;
        let r0 = self.max_t / self.rf.powi(s as i32);
        let mut milestones: Vec<f64> = (0..s).map(|i| r0 * self.rf.powi(i as i32)).collect();
        milestones.push(self.max_t);
        (n, milestones)
    }

    fn new_bracket(&mut self) -> usize {
        let s = match self.brackets.last() {
            Some(b) if b.s > 0 => b.s - 1,
            _ => self.s_max,
        };
        let (capacity, milestones) = self.bracket_shape(s);
        self.brackets.push(Bracket {
            s,
            capacity,
            members: Vec::new(),
            filled: false,
            milestones,
            rung: 0,
            recorded: BTreeMap::new(),
            to_resume: BTreeSet::new(),
        });
        self.brackets.len() - 1
    }

    /// Halves bracket `b` once every live trial has reached its rung.
    fn advance(&mut self, b: usize) {
        loop {
            let br = &self.brackets[b];
            if !br.filled {
                return;
            }
            let live: Vec<String> =
                br.members.iter().filter(|m| self.trials.get(*m).is_some_and(|t| t.state != State::Done)).cloned().collect();
            if live.is_empty() || !live.iter().all(|m| br.recorded.contains_key(m)) {
                return;
            }
            let scores: Vec<Score> = live.iter().map(|m| br.recorded[m]).collect();
            let keep = ((live.len() as f64 / self.rf).floor() as usize).max(1);
            let survivors: BTreeSet<String> =
                ranked(&scores).into_iter().take(keep).filter(|&i| scores[i].is_finite()).map(|i| live[i].clone()).collect();
            for m in &live {
                if !survivors.contains(m) {
                    if let Some(t) = self.trials.get_mut(m) {
                        t.state = State::Done;
                    }
                    self.to_stop.push(m.clone());
                }
            }
            let br = &mut self.brackets[b];
            br.rung += 1;
            br.recorded.clear();
            br.to_resume = survivors;
            if !br.to_resume.is_empty() {
                return;
            }
        }
    }
}

/// HyperBand's saved state.
#[derive(Serialize)]
struct Saved<'a> {
    version: u32,
    kind: &'static str,
    brackets: &'a [Bracket],
    trials: &'a BTreeMap<String, TrialState>,
    to_stop: &'a [String],
}

impl HyperBand {
    fn saved(&self) -> Saved<'_> {
        Saved { version: 1, kind: "hyperband", brackets: &self.brackets, trials: &self.trials, to_stop: &self.to_stop }
    }
}

impl Scheduler for HyperBand {
    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        if self.trials.contains_key(trial.id) {
            return;
        }
        let b = match self.brackets.iter().rposition(|b| !b.filled) {
            Some(b) => b,
            None => self.new_bracket(),
        };
        let br = &mut self.brackets[b];
        br.members.push(trial.id.to_string());
        br.filled = br.members.len() >= br.capacity;
        self.trials.insert(trial.id.to_string(), TrialState { bracket: b, state: State::Running });
    }

    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let Some((t, score)) = self.objective.read(result) else { return Decision::Continue };
        if !self.trials.contains_key(trial.id) {
            self.on_trial_add(trial);
        }
        let Some(&TrialState { bracket: b, state }) = self.trials.get(trial.id) else { return Decision::Continue };
        if state == State::Done {
            return Decision::Stop;
        }
        if t >= self.max_t {
            self.on_trial_complete(trial, Some(result));
            return Decision::Stop;
        }
        let br = &mut self.brackets[b];
        if t < br.milestones[br.rung] || br.recorded.contains_key(trial.id) {
            return Decision::Continue;
        }
        br.recorded.insert(trial.id.to_string(), score);
        if let Some(s) = self.trials.get_mut(trial.id) {
            s.state = State::Paused;
        }
        self.advance(b);
        if self.brackets[b].to_resume.remove(trial.id) {
            if let Some(s) = self.trials.get_mut(trial.id) {
                s.state = State::Running;
            }
            return Decision::Continue;
        }
        if let Some(i) = self.to_stop.iter().position(|m| m == trial.id) {
            self.to_stop.remove(i);
            return Decision::Stop;
        }
        Decision::Pause
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, _result: Option<&TrialResult>) {
        let Some(s) = self.trials.get_mut(trial.id) else { return };
        s.state = State::Done;
        let b = s.bracket;
        self.brackets[b].to_resume.remove(trial.id);
        self.advance(b);
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        self.on_trial_complete(trial, None);
    }

    fn choose_trial_to_run(&mut self, paused: &dyn Paused, _can_add: bool) -> Option<String> {
        for br in &mut self.brackets {
            if br.to_resume.is_empty() {
                continue;
            }
            if let Some(t) = paused.iter().find(|p| br.to_resume.contains(p.id)) {
                br.to_resume.remove(t.id);
                if let Some(s) = self.trials.get_mut(t.id) {
                    s.state = State::Running;
                }
                return Some(t.id.to_string());
            }
        }
        None
    }

    fn on_no_more_trials(&mut self) {
        for b in 0..self.brackets.len() {
            self.brackets[b].filled = true;
            self.advance(b);
        }
    }

    fn take_stopped(&mut self) -> Vec<String> {
        std::mem::take(&mut self.to_stop)
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.objective.required()
    }

    fn pauses_trials(&self) -> bool {
        true
    }

    fn save(&self) -> Value {
        serde_json::to_value(self.saved()).unwrap_or_default()
    }

    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.saved()).unwrap_or_default()
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        let saved = crate::scheduler::Saved::open(state, "hyperband", "HyperBand")?;
        self.brackets = saved.field("brackets")?;
        self.trials = saved.field("trials")?;
        self.to_stop = saved.field("to_stop")?;
        Ok(())
    }
}

/// HyperBand's settings (Ray's `HyperBandScheduler` names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HyperBandConfig {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute rungs are laid on.
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// The longest a trial runs (default 81).
    #[serde(default = "eighty_one")]
    pub max_t: f64,
    /// The least a trial runs (default: 1 for `training_iteration`; for any
    /// other `time_attr`, a cost, `max_t / reduction_factor^2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<f64>,
    /// Keep 1 in this many at each halving (default 3).
    #[serde(default = "three")]
    pub reduction_factor: f64,
}

impl Default for HyperBandConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            max_t: eighty_one(),
            grace_period: None,
            reduction_factor: three(),
        }
    }
}

impl HyperBandConfig {
    /// Checks the settings and builds HyperBand; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<HyperBand, ConfigError> {
        let c = self;
        let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
        let grace = crate::settings::grace(c.grace_period, &c.time_attr, c.max_t, c.reduction_factor);
        halving(c.max_t, grace, c.reduction_factor)?;
        Ok(HyperBand::new(obj, c.max_t, grace, c.reduction_factor))
    }
}
