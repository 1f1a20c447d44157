//! ASHA, asynchronous successive halving, in both of its forms: the
//! stopping type (Ray's `AsyncHyperBandScheduler`) and the promotion type
//! (the ASHA paper's algorithm, Syne Tune's `type="promotion"`).
//!
//! Rungs lie at `grace_period * reduction_factor^k` (below `max_t`) of the
//! time attribute; with several brackets, bracket `s` starts at rung `s`.
//! The rules, decided once here and tested:
//!
//! - A trial is judged once per report, at the highest rung it has reached
//!   and not yet been judged at. A report that crosses several rungs is
//!   judged at the highest; the lower ones are skipped, never judged later
//!   with a value from after their milestone (Ray judges them later).
//! - Stopping type: a trial continues when fewer than `reduction_factor`
//!   results (its own included) are in the rung, or when fewer than
//!   `ceil(n / reduction_factor)` of the rung's `n` results are strictly
//!   better than its own: it is in the top 1/rf. Ties continue.
//! - Promotion type: a trial pauses at each rung. A paused trial is
//!   promotable when it is among the top `floor(n / reduction_factor)` of its
//!   rung (ties broken by arrival) and was not promoted from it yet (the
//!   paper's rule). Once no new trial can start (the searcher is done),
//!   the top `ceil(n / reduction_factor)`: a rung of one or two trials
//!   promotes its best, so the best trial of a small sweep reaches `max_t`
//!   instead of ending paused at a low rung. Whenever
//!   a slot is free, the promotable trial in the highest rung resumes; only
//!   when there is none does a new trial start. A trial that is itself the
//!   next promotion when it reaches its rung continues without pausing.
//! - A NaN or infinite metric is the worst score: it is never promoted, and
//!   the stopping type stops the trial at the rung.
//! - At `max_t` a trial stops (it is complete).
//! - A result without the metric or the time attribute never reaches the
//!   scheduler: the Tuner makes it an error on its trial
//!   ([`Scheduler::required_metrics`]).
//! - With several brackets, trials are dealt to brackets in a fixed,
//!   weighted round-robin (Ray's weights, without its random draw), so the
//!   same sweep always makes the same decisions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use search::TrialResult;

use crate::objective::{Objective, Score};
use crate::ranked::{key, Ranked};
use crate::scheduler::{Decision, Paused, Scheduler, SchedulerError, TrialView};
use search::Mode;

use crate::settings::{four, halving, hundred, invalid, objective, one_usize, training_iteration, ConfigError};

/// Which ASHA.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AshaType {
    /// Stop trials below their rung's cutoff (Ray's ASHA).
    #[default]
    Stopping,
    /// Pause trials at each rung, resume the promotable ones (the ASHA paper).
    Promotion,
}

/// One result recorded in a rung.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    trial: String,
    score: Score,
    promoted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Bracket {
    /// Rung milestones, ascending, all below `max_t`.
    milestones: Vec<f64>,
    /// Promotion type: per rung, its results in arrival order. The
    /// stopping type keeps no ids: its rungs are `sizes` and `ranked`.
    rungs: Vec<Vec<Entry>>,
    /// Per rung, how many results it holds (finite or not).
    #[serde(default)]
    sizes: Vec<u64>,
    /// Per rung, its finite scores in order.
    #[serde(default)]
    ranked: Vec<Ranked>,
    /// Promotion type, per rung: its entries with a finite score in rank
    /// order (best first, ties by arrival), as `(key(-score), index)`.
    #[serde(skip)]
    order: Vec<Ranked<(u64, usize)>>,
    /// Promotion type, per rung: the entries not promoted yet, in the same
    /// order (those of trials that ended are passed over).
    #[serde(skip)]
    waiting: Vec<BTreeSet<(u64, usize)>>,
}

impl Bracket {
    /// Rebuilds `order` and `waiting` from the entries.
    fn index(&mut self) {
        self.order = vec![Ranked::default(); self.rungs.len()];
        self.waiting = vec![BTreeSet::new(); self.rungs.len()];
        for k in 0..self.rungs.len() {
            for i in 0..self.rungs[k].len() {
                self.index_entry(k, i);
            }
        }
    }

    fn index_entry(&mut self, k: usize, i: usize) {
        let e = &self.rungs[k][i];
        if let Some(v) = e.score.0.filter(|v| v.is_finite()) {
            let at = (key(-v), i);
            self.order[k].add(at);
            if !e.promoted {
                self.waiting[k].insert(at);
            }
        }
    }

    fn promote(&mut self, k: usize, i: usize) {
        let e = &mut self.rungs[k][i];
        e.promoted = true;
        if let Some(v) = e.score.0 {
            self.waiting[k].remove(&(key(-v), i));
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrialState {
    bracket: usize,
    /// The lowest rung it has not been judged at.
    next_rung: usize,
    /// Ended (complete, stopped or failed): never promoted.
    #[serde(default)]
    finished: bool,
}

/// Asynchronous successive halving; see the module documentation for its rules.
#[derive(Debug, Clone)]
pub struct Asha {
    objective: Objective,
    max_t: f64,
    rf: f64,
    kind: AshaType,
    weights: Vec<f64>,
    brackets: Vec<Bracket>,
    assigned: Vec<u64>,
    trials: BTreeMap<String, TrialState>,
    /// No new trial can start: the sweep is draining its paused trials.
    draining: bool,
}

impl Asha {
    /// ASHA over `objective`; the parameters are checked by
    /// [`crate::SchedulerConfig`], which is how schedulers are built from
    /// settings. `brackets` is at least 1.
    pub fn new(objective: Objective, kind: AshaType, max_t: f64, grace_period: f64, reduction_factor: f64, brackets: usize) -> Self {
        let brackets: Vec<Bracket> = (0..brackets.max(1))
            .map(|s| {
                let milestones: Vec<f64> =
                    (s..).map(|k| grace_period * reduction_factor.powi(k as i32)).take_while(|&m| m < max_t).take(64).collect();
                let n = milestones.len();
                Bracket {
                    rungs: vec![Vec::new(); n],
                    sizes: vec![0; n],
                    ranked: vec![Ranked::default(); n],
                    order: vec![Ranked::default(); n],
                    waiting: vec![BTreeSet::new(); n],
                    milestones,
                }
            })
            .collect();
        let most = brackets.iter().map(|b| b.milestones.len()).max().unwrap_or(0) as f64;
        let weights = brackets.iter().map(|b| (b.milestones.len() as f64 - most).exp()).collect();
        let assigned = vec![0; brackets.len()];
        Self { objective, max_t, rf: reduction_factor, kind, weights, brackets, assigned, trials: BTreeMap::new(), draining: false }
    }

    /// The rung milestones of each bracket.
    pub fn milestones(&self) -> Vec<Vec<f64>> {
        self.brackets.iter().map(|b| b.milestones.clone()).collect()
    }

    /// Whether `score` is in the top `ceil(n / rf)` of rung `k` of `bracket` with it.
    fn judge_stopping(bracket: &Bracket, k: usize, rf: f64, score: Score) -> bool {
        let Some(value) = score.0.filter(|v| v.is_finite()) else { return false };
        let n = bracket.sizes[k] as usize + 1;
        if (n as f64) < rf {
            return true;
        }
        let keep = (n as f64 / rf).ceil() as usize;
        bracket.ranked[k].count_greater(value) < keep
    }

    /// The paused trial to promote next: the highest rung first (across
    /// brackets, the lower bracket index first on equal milestones), and in
    /// a rung its best unpromoted trial within the top floor(n/rf).
    fn next_promotion(&self, eligible: impl Fn(&str) -> bool) -> Option<(usize, usize, usize)> {
        let draining = self.draining;
        let mut order: Vec<(usize, usize)> =
            self.brackets.iter().enumerate().flat_map(|(b, br)| (0..br.rungs.len()).map(move |k| (b, k))).collect();
        order.sort_by(|a, b| {
            let (ma, mb) = (self.brackets[a.0].milestones[a.1], self.brackets[b.0].milestones[b.1]);
            mb.total_cmp(&ma).then(a.0.cmp(&b.0))
        });
        for (b, k) in order {
            let bracket = &self.brackets[b];
            let rung = &bracket.rungs[k];
            // While new trials can start, the paper's floor(n / rf); once
            // none can, ceil(n / rf): every rung's best goes on.
            let share = rung.len() as f64 / self.rf;
            let top = if draining { share.ceil() } else { share.floor() } as usize;
            // The unpromoted entries best first, while they rank in the top.
            for &at in &bracket.waiting[k] {
                if bracket.order[k].count_less(at) >= top {
                    break;
                }
                let e = &rung[at.1];
                let live = self.trials.get(&e.trial).is_some_and(|t| !t.finished);
                if live && eligible(&e.trial) {
                    return Some((b, k, at.1));
                }
            }
        }
        None
    }

    /// `id` ended. The promotion type remembers it (it is never promoted);
    /// the stopping type lets go of it, so its memory follows the live
    /// trials, not all of them.
    fn finish(&mut self, id: &str) {
        if self.kind == AshaType::Stopping {
            self.trials.remove(id);
        } else if let Some(t) = self.trials.get_mut(id) {
            t.finished = true;
        }
    }
}

/// ASHA's saved state.
#[derive(Serialize)]
struct Saved<'a> {
    version: u32,
    kind: &'static str,
    brackets: &'a [Bracket],
    assigned: &'a [u64],
    trials: &'a BTreeMap<String, TrialState>,
    draining: bool,
}

impl Asha {
    fn saved(&self) -> Saved<'_> {
        Saved {
            version: 1,
            kind: "asha",
            brackets: &self.brackets,
            assigned: &self.assigned,
            trials: &self.trials,
            draining: self.draining,
        }
    }
}

impl Scheduler for Asha {
    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        if self.trials.contains_key(trial.id) {
            return;
        }
        // Smooth weighted round-robin: the bracket furthest below its share.
        let bracket = (0..self.brackets.len())
            .min_by(|&a, &b| {
                let (ra, rb) = ((self.assigned[a] + 1) as f64 / self.weights[a], (self.assigned[b] + 1) as f64 / self.weights[b]);
                ra.total_cmp(&rb).then(a.cmp(&b))
            })
            .unwrap_or(0);
        self.assigned[bracket] += 1;
        self.trials.insert(trial.id.to_string(), TrialState { bracket, next_rung: 0, finished: false });
    }

    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let Some((t, score)) = self.objective.read(result) else { return Decision::Continue };
        if !self.trials.contains_key(trial.id) {
            if self.kind == AshaType::Stopping && trial.num_results > 1 {
                // A trial this scheduler let go of (stopped or ended): its fate is decided.
                return Decision::Stop;
            }
            self.on_trial_add(trial);
        }
        if t >= self.max_t {
            self.finish(trial.id);
            return Decision::Stop;
        }
        let Some(state) = self.trials.get(trial.id).cloned() else { return Decision::Continue };
        let bracket = &self.brackets[state.bracket];
        let Some(k) = bracket.milestones.iter().rposition(|&m| m <= t) else { return Decision::Continue };
        if k < state.next_rung {
            return Decision::Continue;
        }
        let decision = match self.kind {
            AshaType::Stopping => {
                if Self::judge_stopping(bracket, k, self.rf, score) {
                    Decision::Continue
                } else {
                    Decision::Stop
                }
            }
            AshaType::Promotion => Decision::Pause,
        };
        let bracket = &mut self.brackets[state.bracket];
        if self.kind == AshaType::Promotion {
            bracket.rungs[k].push(Entry { trial: trial.id.to_string(), score, promoted: false });
            bracket.index_entry(k, bracket.rungs[k].len() - 1);
        }
        bracket.sizes[k] += 1;
        if let Some(v) = score.0 {
            bracket.ranked[k].insert(v);
        }
        if let Some(s) = self.trials.get_mut(trial.id) {
            s.next_rung = k + 1;
        }
        match decision {
            Decision::Pause => {
                // Pausing only to resume it at once would cost a restart.
                if let Some((b, k, i)) = self.next_promotion(|_| true) {
                    if self.brackets[b].rungs[k][i].trial == trial.id {
                        self.brackets[b].promote(k, i);
                        return Decision::Continue;
                    }
                }
                Decision::Pause
            }
            Decision::Stop => {
                self.finish(trial.id);
                Decision::Stop
            }
            other => other,
        }
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, _result: Option<&TrialResult>) {
        self.finish(trial.id);
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        self.finish(trial.id);
    }

    fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Option<String> {
        if self.kind != AshaType::Promotion {
            return if can_add { None } else { paused.oldest().map(|t| t.id.to_string()) };
        }
        self.draining |= !can_add;
        let (b, k, i) = self.next_promotion(|id| paused.get(id).is_some())?;
        self.brackets[b].promote(k, i);
        Some(self.brackets[b].rungs[k][i].trial.clone())
    }

    fn on_no_more_trials(&mut self) {
        self.draining = true;
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.objective.required()
    }

    fn pauses_trials(&self) -> bool {
        self.kind == AshaType::Promotion
    }

    fn save(&self) -> Value {
        serde_json::to_value(self.saved()).unwrap_or_default()
    }

    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.saved()).unwrap_or_default()
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        let saved = crate::scheduler::Saved::open(state, "asha", "ASHA")?;
        let brackets: Vec<Bracket> = saved.field("brackets")?;
        let same = brackets.len() == self.brackets.len() && brackets.iter().zip(&self.brackets).all(|(a, b)| a.milestones == b.milestones);
        if !same {
            return Err(SchedulerError::State("the saved ASHA state has other rungs than these settings".into()));
        }
        self.brackets = brackets;
        for b in &mut self.brackets {
            if b.sizes.len() != b.milestones.len() {
                // A state written before rungs kept their scores in order: rebuilt from the entries.
                b.sizes = b.rungs.iter().map(|r| r.len() as u64).collect();
                b.ranked = b
                    .rungs
                    .iter()
                    .map(|rung| {
                        let mut r = Ranked::default();
                        rung.iter().filter_map(|e| e.score.0).for_each(|v| r.insert(v));
                        r
                    })
                    .collect();
            }
            if self.kind == AshaType::Stopping {
                b.rungs.iter_mut().for_each(Vec::clear);
            }
            b.index();
        }
        self.assigned = saved.field("assigned")?;
        self.trials = saved.field("trials")?;
        self.draining = state["draining"].as_bool().unwrap_or(false);
        Ok(())
    }
}

/// ASHA's settings (Ray's `ASHAScheduler` names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AshaConfig {
    /// `stopping` (default) or `promotion`.
    #[serde(default)]
    pub asha_type: AshaType,
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute rungs are laid on.
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// Trials stop at this time (default 100).
    #[serde(default = "hundred")]
    pub max_t: f64,
    /// The first rung (default: 1 for `training_iteration`; for any other
    /// `time_attr`, a cost, `max_t / reduction_factor^2`: two rungs, where
    /// stopping saves the most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<f64>,
    /// Keep 1 in this many at each rung (default 4).
    #[serde(default = "four")]
    pub reduction_factor: f64,
    /// Brackets (default 1).
    #[serde(default = "one_usize")]
    pub brackets: usize,
}

impl Default for AshaConfig {
    fn default() -> Self {
        Self {
            asha_type: AshaType::Stopping,
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            max_t: hundred(),
            grace_period: None,
            reduction_factor: four(),
            brackets: 1,
        }
    }
}

impl AshaConfig {
    /// Checks the settings and builds ASHA; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<Asha, ConfigError> {
        let c = self;
        let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
        let grace = crate::settings::grace(c.grace_period, &c.time_attr, c.max_t, c.reduction_factor);
        halving(c.max_t, grace, c.reduction_factor)?;
        if c.brackets == 0 {
            return Err(invalid("brackets", "must be at least 1"));
        }
        let asha = Asha::new(obj, c.asha_type, c.max_t, grace, c.reduction_factor, c.brackets);
        if let Some(s) = asha.milestones().iter().position(Vec::is_empty) {
            return Err(invalid(
                "brackets",
                format!(
                    "bracket {s} would have no rung: grace_period * reduction_factor^{s} = {} is not below max_t = {}",
                    grace * c.reduction_factor.powi(s as i32),
                    c.max_t
                ),
            ));
        }
        Ok(asha)
    }
}
