//! Result queries over a finished (or running, or crashed) experiment:
//! Ray Tune's `ResultGrid`, read from the result store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schedulers::TrialStatus;
use search::{Config, Metrics, Mode, TrialResult};

use crate::store::{effective_history, CheckpointRecord, ExploitRecord, Store, StoreError, TrialRecord};

/// How a trial's series is reduced to one score (Ray's `scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// The last result.
    #[default]
    Last,
    /// The mean over all results.
    Avg,
    /// The mean over the last `n` results (`last-5-avg`, `last-10-avg`).
    LastAvg(usize),
    /// The best result of the series.
    All,
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "last" => Ok(Scope::Last),
            "avg" => Ok(Scope::Avg),
            "all" => Ok(Scope::All),
            other => other
                .strip_prefix("last-")
                .and_then(|r| r.strip_suffix("-avg"))
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n > 0)
                .map(Scope::LastAvg)
                .ok_or_else(|| format!("scope must be last, avg, all or last-N-avg (e.g. last-5-avg), not {other:?}")),
        }
    }
}

/// Errors of result queries.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No metric or mode given and the experiment has none.
    #[error("no {0} given and the experiment sets none; pass --{0}")]
    Missing(&'static str),
    /// No trial reported the metric.
    #[error("no trial reported a finite `{0}`")]
    NoResults(String),
}

/// One trial's outcome: Ray Tune's `Result`.
#[derive(Debug, Clone)]
pub struct TrialOutcome {
    /// Trial id.
    pub trial_id: String,
    /// Its config.
    pub config: Config,
    /// Final (or current) state.
    pub status: TrialStatus,
    /// Why it failed.
    pub error: Option<String>,
    /// How many times it was restarted (after failures or a resume).
    pub restarts: u32,
    /// How many times it resumed after the scheduler paused it.
    pub resumes: u32,
    /// How many of its runs failed (and were restarted, or ended it).
    pub failures: u32,
    /// How many of its runs the infrastructure ended (a node lost under it).
    pub infrastructure_failures: u32,
    /// How many times it took over another trial's checkpoint (PBT).
    pub exploits: u32,
    /// How many times a resource-changing scheduler changed its number of workers.
    pub resizes: u32,
    /// Why its latest failed run failed.
    pub last_failure: Option<String>,
    /// The bundles of its latest run, one per rank.
    pub resources: Vec<trainer::WorkerBundle>,
    /// Its last result's metrics.
    pub metrics: Option<Metrics>,
    /// Its metric history (results superseded by a restart left out).
    pub history: Vec<TrialResult>,
    /// Its committed checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointRecord>,
    /// The trial's directory.
    pub path: PathBuf,
}

impl TrialOutcome {
    /// The latest committed checkpoint: a local directory or a URL.
    pub fn checkpoint(&self) -> Option<&str> {
        self.checkpoints.last().map(|c| c.uri.as_str())
    }

    /// The outcome of the trial `record` of the experiment in
    /// `experiment_dir`, with its stored results and checkpoints.
    pub(crate) fn from_record(
        experiment_dir: &Path,
        t: TrialRecord,
        results: Vec<TrialResult>,
        checkpoints: Vec<CheckpointRecord>,
    ) -> Self {
        let history = effective_history(results);
        TrialOutcome {
            metrics: history.last().map(|r| r.metrics.clone()),
            path: experiment_dir.join("trials").join(&t.id),
            trial_id: t.id,
            config: t.config,
            status: t.status,
            error: t.error,
            restarts: t.restarts,
            resumes: t.resumes,
            failures: t.failures,
            infrastructure_failures: t.infrastructure_failures,
            exploits: t.exploits,
            resizes: t.resizes,
            last_failure: t.last_failure.clone(),
            resources: t.resources,
            history,
            checkpoints,
        }
    }

    /// The committed checkpoints, best on `metric` first (NaN or missing
    /// last; ties: the newer first), each with the metrics reported with it.
    pub fn best_checkpoints(&self, metric: &str, mode: Mode) -> Vec<&CheckpointRecord> {
        let score = |c: &CheckpointRecord| {
            let v = if metric == "training_iteration" {
                Some(c.iteration as f64)
            } else {
                c.metrics.get(metric).copied().or_else(|| {
                    // Records from before metrics were kept with checkpoints.
                    self.history.iter().find(|r| r.training_iteration == c.iteration).and_then(|r| r.metric(metric))
                })
            };
            v.filter(|v| !v.is_nan()).map_or(f64::NEG_INFINITY, |v| mode.score(v))
        };
        let mut ranked: Vec<&CheckpointRecord> = self.checkpoints.iter().collect();
        ranked.sort_by(|a, b| score(b).total_cmp(&score(a)).then(b.iteration.cmp(&a.iteration)));
        ranked
    }

    /// The committed checkpoint whose result scores best on `metric`.
    pub fn best_checkpoint(&self, metric: &str, mode: Mode) -> Option<&CheckpointRecord> {
        self.best_checkpoints(metric, mode).into_iter().next()
    }

    /// This trial's score on `metric` under `scope`; `None` when it has no
    /// finite value to score.
    pub fn score(&self, metric: &str, mode: Mode, scope: Scope) -> Option<f64> {
        let values: Vec<f64> = self.history.iter().filter_map(|r| r.metric(metric)).collect();
        let finite = |v: f64| v.is_finite().then_some(v);
        let mean = |xs: &[f64]| if xs.is_empty() { None } else { finite(xs.iter().sum::<f64>() / xs.len() as f64) };
        let value = match scope {
            Scope::Last => finite(*values.last()?),
            Scope::Avg => mean(&values),
            Scope::LastAvg(n) => mean(&values[values.len().saturating_sub(n)..]),
            Scope::All => values.iter().copied().filter(|v| v.is_finite()).fold(None, |b: Option<f64>, v| match b {
                Some(b) if !mode.better(v, b) => Some(b),
                _ => Some(v),
            }),
        }?;
        Some(mode.score(value))
    }

    /// The metric's value under `scope` (not the signed score).
    pub fn value(&self, metric: &str, mode: Mode, scope: Scope) -> Option<f64> {
        self.score(metric, mode, scope).map(|s| if mode == Mode::Min { -s } else { s })
    }
}

/// Every trial of an experiment with its results.
#[derive(Debug, Clone)]
pub struct ResultGrid {
    /// The experiment directory.
    pub experiment_dir: PathBuf,
    /// The experiment's metric.
    pub metric: Option<String>,
    /// The experiment's mode.
    pub mode: Option<Mode>,
    trials: Vec<TrialOutcome>,
    /// Every exploit carried out (PBT), in order.
    pub exploits: Vec<ExploitRecord>,
    /// How many finished trials a simulation let go of (`nestor simulate
    /// --keep`): summed up as they ended, not in the store.
    pub let_go: u64,
}

impl ResultGrid {
    /// Reads an experiment's results from its store, writing nothing into
    /// the experiment (it may be on a full disk or a read-only copy).
    pub fn load(experiment_dir: &Path) -> Result<Self, QueryError> {
        let store = Store::open_read_only(&experiment_dir.join("store"))?;
        Self::from_store(experiment_dir, &store)
    }

    pub(crate) fn from_store(experiment_dir: &Path, store: &Store) -> Result<Self, QueryError> {
        let (metric, mode) = match store.experiment()? {
            Some(text) => match toml::from_str::<crate::experiment::ExperimentFile>(&text) {
                Ok(f) => (f.experiment.metric, f.experiment.mode),
                Err(_) => (None, None),
            },
            None => (None, None),
        };
        // One pass over each tree, not one scan per trial.
        // A trial at a time, the three trees side by side in id order:
        // nothing of a trial is held but its outcome.
        let mut results = store.each_trial_results();
        let mut all_checkpoints = store.each_trial_checkpoints();
        let mut trials = Vec::new();
        for t in store.each_trial() {
            let t = t?;
            let history = results.of(&t.id)?;
            let checkpoints = all_checkpoints.of(&t.id)?;
            trials.push((t.index, TrialOutcome::from_record(experiment_dir, t, history, checkpoints)));
        }
        // Creation order (ids need not sort so).
        trials.sort_by_key(|(index, _)| *index);
        let trials = trials.into_iter().map(|(_, t)| t).collect();
        let let_go = store.meta(crate::runner::keep::LET_GO)?.and_then(|v| v.as_u64()).unwrap_or(0);
        Ok(Self { experiment_dir: experiment_dir.to_path_buf(), metric, mode, trials, exploits: store.exploits()?, let_go })
    }

    /// Number of trials.
    pub fn len(&self) -> usize {
        self.trials.len()
    }

    /// True when there are no trials.
    pub fn is_empty(&self) -> bool {
        self.trials.is_empty()
    }

    /// The trials, in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &TrialOutcome> {
        self.trials.iter()
    }

    /// One trial by id.
    pub fn get(&self, trial_id: &str) -> Option<&TrialOutcome> {
        self.trials.iter().find(|t| t.trial_id == trial_id)
    }

    /// The trials that ended in ERROR.
    pub fn errors(&self) -> Vec<&TrialOutcome> {
        self.trials.iter().filter(|t| t.status == TrialStatus::Error).collect()
    }

    /// Number of trials in ERROR.
    pub fn num_errors(&self) -> usize {
        self.errors().len()
    }

    /// Number of trials in TERMINATED.
    pub fn num_terminated(&self) -> usize {
        self.trials.iter().filter(|t| t.status == TrialStatus::Terminated).count()
    }

    /// Trials per state.
    pub fn counts(&self) -> BTreeMap<TrialStatus, usize> {
        let mut m = BTreeMap::new();
        for t in &self.trials {
            *m.entry(t.status).or_insert(0) += 1;
        }
        m
    }

    /// The best trial by `metric` and `mode` (the experiment's when `None`)
    /// under `scope`. Trials with no finite value are skipped; ties go to the
    /// earlier trial.
    pub fn best_result(&self, metric: Option<&str>, mode: Option<Mode>, scope: Scope) -> Result<&TrialOutcome, QueryError> {
        let metric = metric.or(self.metric.as_deref()).ok_or(QueryError::Missing("metric"))?;
        let mode = mode.or(self.mode).ok_or(QueryError::Missing("mode"))?;
        let mut best: Option<(&TrialOutcome, f64)> = None;
        for t in &self.trials {
            if let Some(s) = t.score(metric, mode, scope) {
                if best.is_none_or(|(_, b)| s > b) {
                    best = Some((t, s));
                }
            }
        }
        best.map(|(t, _)| t).ok_or_else(|| QueryError::NoResults(metric.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: &str, losses: &[f64]) -> TrialOutcome {
        TrialOutcome {
            trial_id: id.into(),
            config: serde_json::json!({}),
            status: TrialStatus::Terminated,
            error: None,
            restarts: 0,
            resumes: 0,
            failures: 0,
            infrastructure_failures: 0,
            exploits: 0,
            resizes: 0,
            last_failure: None,
            resources: Vec::new(),
            metrics: None,
            history: losses
                .iter()
                .enumerate()
                .map(|(i, &l)| TrialResult {
                    extra: None,
                    trial_id: id.into(),
                    seq: i as u64,
                    training_iteration: i as u64 + 1,
                    metrics: [("loss".to_string(), l)].into_iter().collect(),
                    checkpoint: None,
                })
                .collect(),
            checkpoints: vec![],
            path: PathBuf::new(),
        }
    }

    fn grid(trials: Vec<TrialOutcome>) -> ResultGrid {
        ResultGrid {
            experiment_dir: PathBuf::new(),
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            trials,
            exploits: vec![],
            let_go: 0,
        }
    }

    #[test]
    fn scopes_pick_different_winners() {
        // a: best single point but ends badly; b: steady; c: NaN at the end.
        let g = grid(vec![outcome("a", &[5.0, 0.1, 3.0]), outcome("b", &[1.0, 1.0, 1.0]), outcome("c", &[0.5, f64::NAN])]);
        assert_eq!(g.best_result(None, None, Scope::Last).unwrap().trial_id, "b");
        assert_eq!(g.best_result(None, None, Scope::All).unwrap().trial_id, "a");
        assert_eq!(g.best_result(None, None, Scope::Avg).unwrap().trial_id, "b");
        assert_eq!(g.best_result(None, None, Scope::LastAvg(2)).unwrap().trial_id, "b");
        assert_eq!(g.best_result(None, Some(Mode::Max), Scope::All).unwrap().trial_id, "a");
        assert!(matches!(g.best_result(Some("acc"), None, Scope::Last), Err(QueryError::NoResults(_))));
        assert_eq!("last-5-avg".parse::<Scope>().unwrap(), Scope::LastAvg(5));
        assert!("last-0-avg".parse::<Scope>().is_err());
        assert!("best".parse::<Scope>().is_err());
    }

    #[test]
    fn ties_go_to_the_earlier_trial() {
        let g = grid(vec![outcome("a", &[1.0]), outcome("b", &[1.0])]);
        assert_eq!(g.best_result(None, None, Scope::Last).unwrap().trial_id, "a");
    }
}
