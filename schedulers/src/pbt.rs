//! Population-based training (Jaderberg et al. 2017), asynchronous, as Ray
//! Tune's `PopulationBasedTraining`.
//!
//! Every `perturbation_interval` of a trial's `time_attr`, the live trials
//! with a score are ranked. A trial in the bottom `quantile_fraction`
//! *exploits* one of the top `quantile_fraction`, picked at random: it
//! stops, takes that donor's latest committed checkpoint, and restarts from
//! it with the donor's config *explored*. A trial in the top or middle goes
//! on.
//!
//! Exploring changes each key of `hyperparam_mutations`: with probability
//! `resample_probability` (or when the value is not one the mutation can
//! produce) it is drawn afresh from the mutation; otherwise a list value
//! moves to a neighbour in the list and a number is multiplied by one of
//! `perturbation_factors` (1.2 or 0.8), then brought back into the
//! mutation's domain (clamped, rounded, quantized). A custom explore
//! function, if any, runs last.
//!
//! Where Ray's users get hurt, this one is strict: a trial with no committed
//! checkpoint is never a donor (the exploit would restart the recipient
//! from nothing), the donor's checkpoint is the one it was ranked with (the
//! latest the scheduler saw with its results, never an older one), and a
//! recipient is not ranked again, nor chosen as a donor, until it has
//! reported from its new state.
//!
//! The random draws are seeded per perturbation, so a restored scheduler
//! makes the same choices as one that never stopped.
//!
//! **Fair share** (Ray's, so a population larger than the slots takes part
//! as a whole): at its perturbation check, a trial that goes on but whose
//! result carries a checkpoint pauses there when another trial is paused
//! or new trials may still join; a free slot goes to a new trial first, then
//! to the paused trial with the least `time_attr` (Ray's
//! `choose_trial_to_run`). A result without a checkpoint never pauses: the
//! trial would lose what it trained since its last one.
//!
//! **Synchronous** (`synch`, Ray's `synch=True`): a trial that reaches the
//! next sync point (the first at `max(perturbation_interval,
//! burn_in_period)`) pauses there until every live trial has, and until no
//! new trial can join the population (the searcher has made its last). The
//! last to arrive decides the round for all: the ranks are taken over the
//! whole population at the same point of training, each of the bottom
//! quantile, worst first, exploits one of the top (the paused ones through
//! [`Scheduler::take_exploits`]), and the next sync point is `interval`
//! further on (or the furthest trial's time, if later). Every trial pauses
//! at the sync point, so a donor keeps the checkpoint it was ranked with
//! until its recipients have copied it; the recipients resume first, then
//! the least trained. The outcome depends on the seed and the results only,
//! never on which trial happened to report first: asynchronous PBT ranks a
//! trial against whatever results are in when it reaches its interval, so
//! machine load changes its choices. The price is waiting: a straggler holds
//! the population at each sync point.
//!
//! **PB2** (Parker-Holder et al. 2020, Ray's `PB2`) is the same scheduler
//! with a model-based explore step. Every perturbation interval, each trial
//! adds an observation: its time, its score at the interval's start, its
//! bounded hyperparameters (scaled to the unit cube on their sampling
//! scale) and the score it gained per unit of time. A recipient's new
//! values maximise the upper confidence bound of a Gaussian process fitted
//! to the recent observations ([`crate::gp`]: a time-varying kernel, so
//! older intervals count less), at the current time and the score it starts
//! from; the configs other trials are running count as pending points, so
//! the bound's uncertainty term sends it elsewhere. A recipient's gain is
//! measured from its donor's checkpoint, not from its own old state.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use search::{Config, Domain, TrialResult};

use crate::gp::Gp;
use crate::objective::{Objective, Score};
use crate::{Decision, Exploit, Paused, Scheduler, SchedulerError, TrialView};

/// What one hyperparameter may become when explored.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// One of these values; perturbed to a neighbour in the list.
    Values(Vec<Value>),
    /// A numeric domain: resampled from it, or multiplied by a
    /// perturbation factor and brought back into it.
    Domain(Domain),
}

impl Mutation {
    /// Whether `value` is one this mutation can produce.
    pub fn contains(&self, value: &Value) -> bool {
        match self {
            Mutation::Values(v) => v.contains(value),
            Mutation::Domain(d) => d.contains(value),
        }
    }
}

/// A user's explore step, run after the built-in one on the explored
/// config (Ray's `custom_explore_fn`), with the perturbation's seeded RNG.
#[derive(Clone)]
pub struct CustomExplore(pub Arc<ExploreFn>);

/// The signature of a custom explore step.
pub type ExploreFn = dyn Fn(&mut Config, &mut dyn RngCore) + Send + Sync;

impl CustomExplore {
    /// Wraps a function.
    pub fn new<F: Fn(&mut Config, &mut dyn RngCore) + Send + Sync + 'static>(f: F) -> Self {
        Self(Arc::new(f))
    }
}

impl std::fmt::Debug for CustomExplore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CustomExplore(..)")
    }
}

impl PartialEq for CustomExplore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What the scheduler knows of one live trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Member {
    /// Creation order, for stable ranking on ties.
    order: u64,
    /// Its config as of its latest result (or exploit).
    config: Config,
    /// Its latest score; `None` until it reports (again, after an exploit).
    score: Option<Score>,
    /// `time_attr` at its last perturbation check.
    last_perturbation: f64,
    /// Its latest committed checkpoint: uri, iteration, `time_attr`.
    checkpoint: Option<(String, u64, f64)>,
    /// The score its latest checkpoint was reported with.
    #[serde(default)]
    checkpoint_score: Option<f64>,
    /// PB2: the time and score its current interval started from.
    #[serde(default)]
    base: Option<(f64, f64)>,
    /// `time_attr` at its latest result (or at its donor's checkpoint).
    #[serde(default)]
    time: f64,
    /// Synchronous: it exploited in the latest round and has not reported since.
    #[serde(default)]
    recipient: bool,
    /// Asynchronous: paused at its check, to let the waiting trials run.
    #[serde(default)]
    paused: bool,
}

/// PB2: one interval of one trial's training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Observation {
    /// When it ended, in perturbation intervals.
    t: f64,
    /// The score it started from.
    before: f64,
    /// The bounded hyperparameters it ran with, in the unit cube.
    h: Vec<f64>,
    /// Score gained per unit of `time_attr`.
    gain: f64,
}

/// PB2's explore step: bounded hyperparameters and what the population's
/// intervals gained with them.
#[derive(Debug, Clone)]
struct Bandit {
    bounds: Vec<(Vec<String>, Domain)>,
    data: Vec<Observation>,
}

/// Observations kept; the model is fitted to the latest `FIT_WINDOW`.
const MAX_OBSERVATIONS: usize = 400;
const FIT_WINDOW: usize = 80;

impl Bandit {
    fn observe(&mut self, o: Observation) {
        self.data.push(o);
        if self.data.len() > MAX_OBSERVATIONS {
            self.data.remove(0);
        }
    }

    fn unit(&self, config: &Config) -> Vec<f64> {
        self.bounds.iter().map(|(path, d)| get(config, path).and_then(|v| d.to_unit(v)).unwrap_or(0.5)).collect()
    }

    /// New values for the bounded hyperparameters of `config`: the GP-UCB
    /// maximiser at time `t` (in intervals) for a trial starting from score
    /// `before`, with `pending` (unit-cube configs of the other live trials)
    /// lowering the uncertainty where they run. Random while there are too
    /// few observations to fit.
    fn explore(&self, config: &Config, t: f64, before: f64, pending: &[Vec<f64>], rng: &mut ChaCha8Rng) -> Config {
        let mut out = config.clone();
        let chosen = self.maximise_ucb(t, before, pending, rng).unwrap_or_else(|| self.bounds.iter().map(|_| rng.random()).collect());
        for ((path, d), u) in self.bounds.iter().zip(chosen) {
            if let Some(v) = d.at_unit(u) {
                set(&mut out, path, v);
            }
        }
        out
    }

    fn maximise_ucb(&self, t: f64, before: f64, pending: &[Vec<f64>], rng: &mut ChaCha8Rng) -> Option<Vec<f64>> {
        let recent = &self.data[self.data.len().saturating_sub(FIT_WINDOW)..];
        if recent.len() < 2 {
            return None;
        }
        // The starting score is a feature, scaled over what the window saw.
        let (lo, hi) =
            recent.iter().map(|o| o.before).chain([before]).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        let scale = |v: f64| if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        let point = |t: f64, before: f64, h: &[f64]| -> Vec<f64> { [t, scale(before)].into_iter().chain(h.iter().copied()).collect() };
        let x: Vec<Vec<f64>> = recent.iter().map(|o| point(o.t, o.before, &o.h)).collect();
        let y: Vec<f64> = recent.iter().map(|o| o.gain).collect();
        let gp = Gp::fit(x, &y)?;
        let pending: Vec<Vec<f64>> = pending.iter().map(|h| point(t, before, h)).collect();
        let model = gp.with_pending(&pending)?;
        // GP-UCB's exploration weight grows slowly with the data (as in PB2).
        let kappa = (0.2 + (0.4 * recent.len() as f64).ln().max(0.0)).sqrt();
        let ucb = |h: &[f64]| {
            let p = point(t, before, h);
            gp.predict(&p).0 + kappa * model.variance(&p).sqrt()
        };
        let d = self.bounds.len();
        // Random candidates, then a local search around the best few.
        let mut candidates: Vec<(f64, Vec<f64>)> = (0..512)
            .map(|_| {
                let h: Vec<f64> = (0..d).map(|_| rng.random()).collect();
                (ucb(&h), h)
            })
            .collect();
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut best = candidates[0].clone();
        for (start_value, start) in candidates.into_iter().take(4) {
            let (mut value, mut h) = (start_value, start);
            let mut step = 0.1;
            for _ in 0..40 {
                let trial: Vec<f64> = h.iter().map(|v| (v + step * (rng.random::<f64>() * 2.0 - 1.0)).clamp(0.0, 1.0)).collect();
                let v = ucb(&trial);
                if v > value {
                    (value, h) = (v, trial);
                } else {
                    step *= 0.9;
                }
            }
            if value > best.0 {
                best = (value, h);
            }
        }
        Some(best.1)
    }
}

/// Population-based training. See the module docs.
pub struct Pbt {
    obj: Objective,
    interval: f64,
    burn_in: f64,
    quantile_fraction: f64,
    resample_probability: f64,
    factors: Vec<f64>,
    mutations: Vec<(Vec<String>, Mutation)>,
    custom: Option<CustomExplore>,
    /// PB2's model-based explore step, instead of perturbing.
    bandit: Option<Bandit>,
    seed: u64,
    /// Perturbations decided so far: seeds the next one's draws.
    perturbations: u64,
    added: u64,
    members: BTreeMap<String, Member>,
    /// No new trial will join the population (`on_no_more_trials`, or
    /// asked to choose with `can_add` false).
    closed: bool,
    /// Synchronous rounds (see the module docs).
    synch: Option<Synch>,
}

/// Synchronous PBT's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Synch {
    /// The time every live trial must reach before the next round.
    next: f64,
    /// No new trial will join the population.
    closed: bool,
    /// Exploits of paused trials the latest round decided, not yet taken.
    exploits: Vec<Exploit>,
    /// PB2: the intervals that ended at this sync point, by trial.
    #[serde(default)]
    observed: Vec<(String, Observation)>,
}

impl Pbt {
    /// A PBT scheduler; `mutations` maps dotted config paths (`optim.lr`) to
    /// what each may become. The settings are checked by
    /// [`crate::PbtConfig`]; here they are taken as given.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obj: Objective,
        perturbation_interval: f64,
        burn_in_period: f64,
        quantile_fraction: f64,
        resample_probability: f64,
        perturbation_factors: Vec<f64>,
        mutations: Vec<(String, Mutation)>,
        custom: Option<CustomExplore>,
        seed: u64,
    ) -> Self {
        Self {
            obj,
            interval: perturbation_interval,
            burn_in: burn_in_period,
            quantile_fraction,
            resample_probability,
            factors: perturbation_factors,
            mutations: mutations.into_iter().map(|(k, m)| (k.split('.').map(str::to_string).collect(), m)).collect(),
            custom,
            bandit: None,
            seed,
            perturbations: 0,
            added: 0,
            members: BTreeMap::new(),
            closed: false,
            synch: None,
        }
    }

    /// Makes it synchronous (Ray's `synch=True`): see the module docs.
    pub fn synchronous(mut self, synch: bool) -> Self {
        self.synch =
            synch.then(|| Synch { next: self.interval.max(self.burn_in), closed: false, exploits: Vec::new(), observed: Vec::new() });
        self
    }

    /// A PB2 scheduler: PBT whose explore step picks the bounded numeric
    /// hyperparameters `bounds` (dotted paths) by GP-UCB. See the module docs.
    pub fn pb2(
        obj: Objective,
        perturbation_interval: f64,
        burn_in_period: f64,
        quantile_fraction: f64,
        bounds: Vec<(String, Domain)>,
        seed: u64,
    ) -> Self {
        let mut pbt = Pbt::new(obj, perturbation_interval, burn_in_period, quantile_fraction, 0.0, Vec::new(), Vec::new(), None, seed);
        pbt.bandit = Some(Bandit {
            bounds: bounds.into_iter().map(|(k, d)| (k.split('.').map(str::to_string).collect(), d)).collect(),
            data: Vec::new(),
        });
        pbt
    }

    fn kind(&self) -> &'static str {
        if self.bandit.is_some() {
            "pb2"
        } else {
            "pbt"
        }
    }

    fn member(&mut self, trial: &TrialView<'_>) -> &mut Member {
        let order = &mut self.added;
        self.members.entry(trial.id.to_string()).or_insert_with(|| {
            *order += 1;
            Member {
                order: *order,
                config: trial.config.clone(),
                score: None,
                last_perturbation: 0.0,
                checkpoint: None,
                checkpoint_score: None,
                base: None,
                time: 0.0,
                recipient: false,
                paused: false,
            }
        })
    }

    /// The bottom and top quantiles of the live trials with a score, worst
    /// first and best last (Ray's rule: `ceil(n * fraction)` each, at most
    /// half; none with fewer than two trials).
    fn quantiles(&self) -> (Vec<&str>, Vec<&str>) {
        let mut ranked: Vec<(&str, &Member)> =
            self.members.iter().filter(|(_, m)| m.score.is_some()).map(|(k, m)| (k.as_str(), m)).collect();
        if ranked.len() <= 1 {
            return (Vec::new(), Vec::new());
        }
        // Ascending score; on a tie the later trial ranks lower.
        let key = |m: &Member| m.score.map_or(f64::NEG_INFINITY, Score::value);
        ranked.sort_by(|a, b| key(a.1).total_cmp(&key(b.1)).then(b.1.order.cmp(&a.1.order)));
        let n = ranked.len();
        let mut k = (n as f64 * self.quantile_fraction).ceil() as usize;
        if k as f64 > n as f64 / 2.0 {
            k = n / 2;
        }
        let ids: Vec<&str> = ranked.iter().map(|(id, _)| *id).collect();
        (ids[..k].to_vec(), ids[n - k..].to_vec())
    }

    /// `id` exploits one of `upper` (picked at random among those with a
    /// committed checkpoint), at its `time`: the explored config, and the
    /// member reset until it reports from its new state. `None` when no
    /// donor has a checkpoint.
    fn exploit(&mut self, id: &str, time: f64, upper: &[String]) -> Option<Exploit> {
        // Only a trial with a committed checkpoint can give its state away.
        let donors: Vec<&String> = upper.iter().filter(|d| d.as_str() != id && self.members[d.as_str()].checkpoint.is_some()).collect();
        if donors.is_empty() {
            return None;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ self.perturbations.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.perturbations += 1;
        let donor = donors[rng.random_range(0..donors.len())].clone();
        let d = &self.members[&donor];
        let (uri, iteration, at) = d.checkpoint.clone()?;
        let start = d.checkpoint_score;
        let config = match &self.bandit {
            Some(b) => {
                let pending: Vec<Vec<f64>> =
                    self.members.iter().filter(|(m, _)| m.as_str() != id).map(|(_, m)| b.unit(&m.config)).collect();
                let before = start.or(d.score.and_then(|s| s.0)).unwrap_or(0.0);
                b.explore(&d.config, time / self.interval, before, &pending, &mut rng)
            }
            None => self.explore(&d.config, &mut rng),
        };
        let synch = self.synch.is_some();
        let m = self.members.get_mut(id)?;
        // Not ranked, nor a donor, until it reports from its new state.
        m.config = config.clone();
        m.score = None;
        m.checkpoint = None;
        m.checkpoint_score = None;
        m.last_perturbation = at;
        m.time = at;
        m.recipient = synch;
        // Its next interval's gain counts from the donor's checkpoint.
        m.base = start.map(|s| (at, s));
        Some(Exploit { trial_id: id.to_string(), donor, checkpoint: uri, checkpoint_iteration: iteration, config })
    }

    /// Synchronous: whether the round is due (every live trial at the sync
    /// point, and no new one to come).
    fn round_due(&self) -> bool {
        self.synch.as_ref().is_some_and(|s| s.closed && !self.members.is_empty() && self.members.values().all(|m| m.time >= s.next))
    }

    /// Synchronous: the round, over the whole population. Returns its exploits.
    fn round(&mut self) -> Vec<Exploit> {
        if let (Some(s), Some(b)) = (&mut self.synch, &mut self.bandit) {
            let mut observed = std::mem::take(&mut s.observed);
            observed.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, o) in observed {
                b.observe(o);
            }
        }
        let (lower, upper) = self.quantiles();
        let (lower, upper): (Vec<String>, Vec<String>) =
            (lower.into_iter().map(str::to_string).collect(), upper.into_iter().map(str::to_string).collect());
        let furthest = self.members.values().map(|m| m.time).fold(f64::NEG_INFINITY, f64::max);
        let mut out = Vec::new();
        for id in &lower {
            let time = self.members[id].time;
            out.extend(self.exploit(id, time, &upper));
        }
        if let Some(s) = &mut self.synch {
            s.next = (s.next + self.interval).max(furthest);
        }
        out
    }

    /// Synchronous: holds the round if it is due, its exploits kept for [`Scheduler::take_exploits`].
    fn round_if_due(&mut self) {
        if self.round_due() {
            let exploits = self.round();
            if let Some(s) = &mut self.synch {
                s.exploits.extend(exploits);
            }
        }
    }

    /// The donor's config, explored (see the module docs).
    pub fn explore(&self, config: &Config, rng: &mut dyn RngCore) -> Config {
        let mut out = config.clone();
        for (path, mutation) in &self.mutations {
            let current = get(&out, path).cloned().unwrap_or(Value::Null);
            let resample = rng.random::<f64>() < self.resample_probability || !mutation.contains(&current);
            let new = match mutation {
                Mutation::Values(values) | Mutation::Domain(Domain::Choice(values) | Domain::Grid(values)) => {
                    if values.is_empty() {
                        continue;
                    }
                    match values.iter().position(|v| v == &current).filter(|_| !resample) {
                        Some(i) => {
                            let j = if rng.random::<bool>() { i + 1 } else { i.saturating_sub(1) };
                            values[j.min(values.len() - 1)].clone()
                        }
                        None => values[rng.random_range(0..values.len())].clone(),
                    }
                }
                Mutation::Domain(d) => {
                    let perturbed = current.as_f64().filter(|_| !resample && !self.factors.is_empty()).and_then(|x| {
                        let f = self.factors[rng.random_range(0..self.factors.len())];
                        d.nearest(x * f)
                    });
                    perturbed.unwrap_or_else(|| d.sample(rng))
                }
            };
            set(&mut out, path, new);
        }
        if let Some(custom) = &self.custom {
            (custom.0)(&mut out, rng);
        }
        out
    }
}

fn get<'a>(config: &'a Config, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(config, |v, k| v.get(k))
}

fn set(config: &mut Config, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut node = config;
    for k in parents {
        if !node.is_object() {
            *node = json!({});
        }
        let Some(obj) = node.as_object_mut() else { return };
        node = obj.entry(k.clone()).or_insert_with(|| json!({}));
    }
    if !node.is_object() {
        *node = json!({});
    }
    if let Some(obj) = node.as_object_mut() {
        obj.insert(last.clone(), value);
    }
}

/// PBT's (or PB2's) saved state.
#[derive(Serialize)]
struct Saved<'a> {
    version: u32,
    kind: &'static str,
    members: &'a BTreeMap<String, Member>,
    perturbations: u64,
    added: u64,
    /// PB2's observations.
    #[serde(skip_serializing_if = "Option::is_none")]
    observations: Option<&'a [Observation]>,
    /// Synchronous rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    synch: Option<&'a Synch>,
    /// No new trial will join (asynchronous fair share).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    closed: bool,
}

impl Pbt {
    fn saved(&self) -> Saved<'_> {
        Saved {
            version: 1,
            kind: self.kind(),
            members: &self.members,
            perturbations: self.perturbations,
            added: self.added,
            observations: self.bandit.as_ref().map(|b| b.data.as_slice()),
            synch: self.synch.as_ref(),
            closed: self.closed,
        }
    }
}

impl Scheduler for Pbt {
    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        self.member(trial);
    }

    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let Some((time, score)) = self.obj.read(result) else { return Decision::Continue };
        let (interval, burn_in) = (self.interval, self.burn_in);
        let next_sync = self.synch.as_ref().map(|s| s.next);
        let m = self.member(trial);
        m.config = trial.config.clone();
        m.score = Some(score);
        m.time = time;
        m.recipient = false;
        m.paused = false;
        if let Some(uri) = &result.checkpoint {
            m.checkpoint = Some((uri.clone(), result.training_iteration, time));
            m.checkpoint_score = score.0;
        }
        let due = match next_sync {
            Some(next) => time >= next,
            None => time >= burn_in && time - m.last_perturbation >= interval,
        };
        if !due {
            return Decision::Continue;
        }
        m.last_perturbation = time;
        // PB2 learns from the interval that just ended.
        let ended = m.base.filter(|(t0, _)| time > *t0).zip(score.0).map(|((t0, s0), s)| (s0, (s - s0) / (time - t0)));
        m.base = score.0.map(|s| (time, s));
        if let Some(b) = &mut self.bandit {
            if let Some((before, gain)) = ended {
                let o = Observation { t: time / interval, before, h: b.unit(trial.config), gain };
                match &mut self.synch {
                    // Learnt at the round, in the order of the trials' ids, not of their arrival.
                    Some(s) => s.observed.push((trial.id.to_string(), o)),
                    None => b.observe(o),
                }
            }
        }
        if self.synch.is_some() {
            // It waits at the sync point for the rest of the population.
            if !self.round_due() {
                return Decision::Pause;
            }
            let mut exploits = self.round();
            let mine = exploits.iter().position(|e| e.trial_id == trial.id).map(|i| exploits.remove(i));
            if let Some(s) = &mut self.synch {
                s.exploits.extend(exploits);
            }
            return mine.map_or(Decision::Pause, |e| Decision::Exploit(Box::new(e)));
        }
        let (lower, upper) = self.quantiles();
        if lower.contains(&trial.id) {
            let upper: Vec<String> = upper.into_iter().map(str::to_string).collect();
            if let Some(e) = self.exploit(trial.id, time, &upper) {
                return Decision::Exploit(Box::new(e));
            }
        }
        // Fair share: it yields its slot to the trials waiting for one.
        let waiting = !self.closed || self.members.iter().any(|(id, m)| m.paused && id != trial.id);
        match self.members.get_mut(trial.id) {
            Some(m) if waiting && result.checkpoint.is_some() => {
                m.paused = true;
                Decision::Pause
            }
            _ => Decision::Continue,
        }
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, _result: Option<&TrialResult>) {
        self.members.remove(trial.id);
        // The population may have been waiting for it.
        self.round_if_due();
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        self.members.remove(trial.id);
        self.round_if_due();
    }

    fn on_no_more_trials(&mut self) {
        self.closed = true;
        if let Some(s) = &mut self.synch {
            s.closed = true;
        }
        self.round_if_due();
    }

    /// Asynchronous: new trials first, then the paused one with the least
    /// `time_attr` (of equals, the oldest).
    /// Synchronous: new trials first; then, once the population is closed,
    /// those behind the sync point: the round's recipients first (so their
    /// donors stay at the checkpoint they were ranked with until copied),
    /// then the least trained. A trial at the sync point waits for the round.
    fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Option<String> {
        if !can_add {
            self.closed = true;
        }
        let Some(s) = &mut self.synch else {
            if can_add {
                return None;
            }
            let least = paused
                .iter()
                .map(|t| (t.id, self.members.get(t.id).map_or((f64::NEG_INFINITY, 0), |m| (m.time, m.order))))
                .min_by(|(_, a), (_, b)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(id, _)| id.to_string());
            if let Some(m) = least.as_ref().and_then(|id| self.members.get_mut(id)) {
                m.paused = false;
            }
            return least;
        };
        if can_add {
            return None;
        }
        if !s.closed {
            s.closed = true;
            self.round_if_due();
            // The round's exploits are carried out before any trial resumes.
            if self.synch.as_ref().is_some_and(|s| !s.exploits.is_empty()) {
                return None;
            }
        }
        let next = self.synch.as_ref().map_or(f64::INFINITY, |s| s.next);
        paused
            .iter()
            .filter_map(|t| self.members.get(t.id).filter(|m| m.time < next).map(|m| (t.id, m)))
            .min_by(|(_, a), (_, b)| b.recipient.cmp(&a.recipient).then(a.time.total_cmp(&b.time)).then(a.order.cmp(&b.order)))
            .map(|(id, _)| id.to_string())
    }

    fn take_exploits(&mut self) -> Vec<Exploit> {
        self.synch.as_mut().map(|s| std::mem::take(&mut s.exploits)).unwrap_or_default()
    }

    fn pauses_trials(&self) -> bool {
        true
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.obj.required()
    }

    fn save(&self) -> Value {
        serde_json::to_value(self.saved()).unwrap_or_default()
    }

    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.saved()).unwrap_or_default()
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != self.kind() {
            return Err(SchedulerError::State(format!("not a version-1 {} state: {state}", self.kind().to_uppercase())));
        }
        let kind = self.kind().to_uppercase();
        let bad = |e: serde_json::Error| SchedulerError::State(format!("{kind} state: {e}"));
        if let Some(b) = &mut self.bandit {
            b.data = serde_json::from_value(state["observations"].clone()).map_err(bad)?;
        }
        if self.synch.is_some() {
            // A state saved by the asynchronous scheduler starts the rounds afresh.
            if let Some(saved) = state.get("synch") {
                self.synch = Some(serde_json::from_value(saved.clone()).map_err(bad)?);
            }
        }
        self.members = serde_json::from_value(state["members"].clone()).map_err(bad)?;
        self.perturbations = state["perturbations"].as_u64().unwrap_or(0);
        self.closed = state["closed"].as_bool().unwrap_or(false);
        self.added = state["added"].as_u64().unwrap_or(self.members.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrialStatus;
    use search::Mode;

    fn pbt(mutations: Vec<(&str, Mutation)>) -> Pbt {
        Pbt::new(
            Objective::new("loss", Mode::Min),
            2.0,
            0.0,
            0.25,
            0.0,
            vec![1.2, 0.8],
            mutations.into_iter().map(|(k, m)| (k.to_string(), m)).collect(),
            None,
            7,
        )
    }

    #[test]
    fn a_list_value_moves_to_a_neighbour_and_a_number_by_a_factor_within_its_domain() {
        let p = pbt(vec![
            ("opt.lr", Mutation::Domain(Domain::loguniform(1e-3, 1.0))),
            ("bs", Mutation::Values(vec![json!(16), json!(32), json!(64)])),
            ("layers", Mutation::Domain(Domain::randint(1, 5))),
        ]);
        let start = json!({ "opt": { "lr": 0.1 }, "bs": 32, "layers": 4, "other": "kept" });
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let c = p.explore(&start, &mut rng);
            let lr = c["opt"]["lr"].as_f64().unwrap_or(0.0);
            assert!((lr - 0.12).abs() < 1e-12 || (lr - 0.08).abs() < 1e-12, "{c}");
            assert!(c["bs"] == json!(16) || c["bs"] == json!(64), "{c}");
            // 4 * 1.2 = 4.8 rounds to 5, outside randint [1, 5): clamped to 4; 4 * 0.8 = 3.2 -> 3.
            assert!(c["layers"] == json!(4) || c["layers"] == json!(3), "{c}");
            assert_eq!(c["other"], "kept");
        }
        // A value the mutation cannot produce is resampled.
        let c = p.explore(&json!({ "opt": { "lr": 5.0 }, "bs": 48, "layers": 4 }), &mut rng);
        assert!(Domain::loguniform(1e-3, 1.0).contains(&c["opt"]["lr"]) && [16, 32, 64].contains(&c["bs"].as_i64().unwrap_or(0)), "{c}");
    }

    /// PB2's explore step, fed intervals whose gain peaks at lr = 0.7 (on
    /// a uniform [0, 1] bound), proposes values near the peak; with no
    /// observations it draws at random within the bounds.
    #[test]
    fn pb2_explores_toward_the_observed_best_gain() {
        let mut b = Bandit { bounds: vec![(vec!["lr".into()], Domain::uniform(0.0, 1.0))], data: Vec::new() };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let c = b.explore(&json!({ "lr": 0.1, "keep": 1 }), 1.0, 0.0, &[], &mut rng);
        assert!(Domain::uniform(0.0, 1.0).contains(&c["lr"]) && c["keep"] == 1, "{c}");
        for t in 1..=6 {
            for i in 0..8 {
                let lr = (i as f64 + 0.5) / 8.0 + 0.01 * t as f64;
                b.data.push(Observation { t: t as f64, before: -1.0 / t as f64, h: vec![lr], gain: 1.0 - (lr - 0.7).powi(2) * 4.0 });
            }
        }
        let mut chosen = Vec::new();
        for _ in 0..10 {
            let c = b.explore(&json!({ "lr": 0.1 }), 7.0, -1.0 / 7.0, &[], &mut rng);
            chosen.push(c["lr"].as_f64().unwrap());
        }
        assert!(chosen.iter().all(|lr| (lr - 0.7).abs() < 0.15), "{chosen:?}");
    }

    fn result(id: &str, iteration: u64, loss: f64) -> TrialResult {
        TrialResult {
            extra: None,
            trial_id: id.into(),
            seq: iteration,
            training_iteration: iteration,
            metrics: [("loss".to_string(), loss), ("training_iteration".to_string(), iteration as f64)].into_iter().collect(),
            checkpoint: Some(format!("{id}/checkpoint_{iteration:06}")),
        }
    }

    /// Synchronous: trials wait at the sync point until the whole
    /// population has reached it and no new trial can join; the last to
    /// arrive holds the round, in which the worst exploits the best (a paused
    /// one through `take_exploits`); the recipient resumes first; and a
    /// scheduler restored in the middle of the round decides the same.
    #[test]
    fn synchronous_rounds_wait_for_the_population_and_exploit_paused_trials() {
        let make = || pbt(vec![("lr", Mutation::Domain(Domain::loguniform(1e-3, 1.0)))]).synchronous(true);
        let ids = ["t0", "t1", "t2", "t3"];
        let configs: Vec<Config> = (0..4).map(|i| json!({ "lr": 0.01 * (i + 1) as f64 })).collect();
        let view = |i: usize, status| TrialView { id: ids[i], config: &configs[i], status, num_results: 0, num_workers: 1 };
        let mut p = make();
        for i in 0..4 {
            p.on_trial_add(&view(i, TrialStatus::Pending));
        }
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(p.on_trial_result(&view(i, TrialStatus::Running), &result(id, 1, 1.0)), Decision::Continue);
        }
        // t0 is the worst at the sync point, t1 the best.
        let losses = [9.0, 1.0, 3.0, 2.0];
        for (i, (id, loss)) in ids.iter().zip(losses).take(3).enumerate() {
            assert_eq!(p.on_trial_result(&view(i, TrialStatus::Running), &result(id, 2, loss)), Decision::Pause, "{id} waits");
        }
        assert!(p.take_exploits().is_empty());
        // New trials may still come: the one in line decides nothing yet.
        assert_eq!(p.choose_trial_to_run(&[view(0, TrialStatus::Paused)], true), None);
        p.on_no_more_trials();
        assert!(p.take_exploits().is_empty(), "t3 has not reached the sync point");
        let saved = p.save();
        let mut restored = make();
        restored.restore(&saved).unwrap();
        for s in [&mut p, &mut restored] {
            assert_eq!(s.on_trial_result(&view(3, TrialStatus::Running), &result(ids[3], 2, losses[3])), Decision::Pause);
        }
        let exploits = p.take_exploits();
        assert_eq!(exploits, restored.take_exploits(), "a restored scheduler holds the same round");
        assert_eq!(exploits.len(), 1, "{exploits:?}");
        let e = &exploits[0];
        assert_eq!(
            (e.trial_id.as_str(), e.donor.as_str(), e.checkpoint.as_str(), e.checkpoint_iteration),
            ("t0", "t1", "t1/checkpoint_000002", 2)
        );
        let lr = e.config["lr"].as_f64().unwrap_or(0.0);
        assert!((lr - 0.024).abs() < 1e-12 || (lr - 0.016).abs() < 1e-12, "the donor's lr, perturbed: {e:?}");
        // All paused at the sync point: the recipient resumes first.
        let paused: Vec<TrialView<'_>> = [3, 1, 0, 2].iter().map(|&i| view(i, TrialStatus::Paused)).collect();
        assert_eq!(p.choose_trial_to_run(&paused, false).as_deref(), Some("t0"), "the recipient first");
        // Nobody passes the next sync point (at 4) before the others.
        assert_eq!(p.on_trial_result(&view(1, TrialStatus::Running), &result(ids[1], 3, 1.0)), Decision::Continue);
        assert_eq!(p.on_trial_result(&view(1, TrialStatus::Running), &result(ids[1], 4, 1.0)), Decision::Pause);
    }
}
