//! Experiment files: the TOML form of a sweep, `--set` overrides, and the
//! checks that refuse a bad file before anything is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use schedulers::{Scheduler, SchedulerConfig};
use search::{Algorithm, Config, Mode, SearchConfig, Space};

use crate::config::{CheckpointConfig, FailureConfig};
use trainer::{ClusterConfig, NodeResources, TrainerConfig};

/// Errors in an experiment file or its overrides. Each names the file and the
/// key (with line and column where the TOML parser gives them).
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys or wrong types.
    #[error("{file}: {message}")]
    Parse {
        /// The file (or `--set`).
        file: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key's value breaks a rule.
    #[error("{file}: {key}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Dotted key.
        key: String,
        /// The rule.
        message: String,
    },
    /// A `--set` argument is malformed.
    #[error("--set {arg}: {message}")]
    Set {
        /// The argument.
        arg: String,
        /// What is wrong.
        message: String,
    },
}

/// A whole experiment file. Unknown sections and keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    /// `[experiment]`.
    pub experiment: ExperimentSection,
    /// `[space]`: the search space.
    #[serde(default)]
    pub space: toml::Table,
    /// `[search]`: the search crate's own settings type.
    #[serde(default)]
    pub search: SearchConfig,
    /// `[scheduler]`: `type = "fifo" | "asha" | "hyperband" | "median_stopping"`
    /// and that scheduler's settings.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// `[stop]`: Ray's dict form, metric -> threshold (stop when `>=`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stop: BTreeMap<String, f64>,
    /// `[trainer]`: how trials run (the trainer crate's own settings type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerConfig>,
    /// `[resources]`: the node's resources, declared (`CPU = 16, GPU = 8`,
    /// `memory` in bytes, custom names); what is not declared is detected.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, f64>,
    /// `[checkpoint]`: which checkpoints to keep, where workers may save them.
    #[serde(default, skip_serializing_if = "CheckpointConfig::is_default")]
    pub checkpoint: CheckpointConfig,
    /// `[failure]`: restarts after failures, hang detection.
    #[serde(default, skip_serializing_if = "FailureConfig::is_default")]
    pub failure: FailureConfig,
    /// `[cluster]`: this machine, or the Slurm allocation nestor runs inside.
    #[serde(default, skip_serializing_if = "ClusterConfig::is_default")]
    pub cluster: ClusterConfig,
    /// `[[callbacks]]`: loggers fed the sweep's events (`type = "tensorboard"`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callbacks: Vec<crate::callback::CallbackConfig>,
    /// `[datasets]`: data sets split across each trial's ranks, by name
    /// (`train = "data/train/*.parquet"`, or a table with `path`, `format`,
    /// `shuffle`, `split`, `seed`); planned once before any trial runs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub datasets: BTreeMap<String, trainer::data::DatasetSpec>,
    /// `[python]`: Python code the sweep calls, served by the Python driver (crate::hooks).
    #[serde(default, skip_serializing_if = "crate::hooks::PythonHooks::is_empty")]
    pub python: crate::hooks::PythonHooks,
}

/// `[experiment]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSection {
    /// The experiment's name: its directory under the storage path.
    pub name: String,
    /// The metric to optimise (required by `best` unless given there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Samples from the space (each expanded over the grid axes).
    #[serde(default = "one")]
    pub num_samples: u64,
    /// Trials running at once (default: the number of CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_trials: Option<usize>,
    /// Stop the sweep after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_budget_s: Option<f64>,
    /// Sampling seed; chosen at random (and recorded) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Where experiments go (default `./nestor-runs`): a local directory, or
    /// `s3://bucket/prefix` (`gs://`, `az://`) for checkpoints, with the
    /// result store and logs under `local_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// The local directory when `storage` is a URL (default `./nestor-runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_dir: Option<String>,
    /// Stop the whole sweep at the first trial error.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fail_fast: bool,
    /// Write each trial's files for people (`params.json`, `result.jsonl`,
    /// `progress.csv`; default true). The store holds every result either
    /// way (`nestor export`); turning them off saves four file creations
    /// per trial, which on a slow file system is most of a short trial's cost.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub trial_files: bool,
    /// Show each rank's output on the driver's console as it comes, a
    /// line at a time behind `(trial_00003 rank 1)` (default true; Ray's
    /// `log_to_driver`). The rank logs hold it either way.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub log_to_driver: bool,
    /// The experiment's directory is its owner's alone (0700: logs, the
    /// pickled training function, checkpoints); `true` lets the owner's
    /// group read it too (0750).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub group_readable: bool,
}

impl Default for ExperimentSection {
    fn default() -> Self {
        Self {
            name: "experiment".into(),
            metric: None,
            mode: None,
            num_samples: 1,
            max_concurrent_trials: None,
            time_budget_s: None,
            seed: None,
            storage: None,
            local_dir: None,
            fail_fast: false,
            trial_files: true,
            log_to_driver: true,
            group_readable: false,
        }
    }
}

impl ExperimentSection {
    /// Where the experiment's local directory goes: `storage` when it is a
    /// path, else `local_dir`; a leading `~` is the home directory, as in
    /// a shell (and in Ray's `storage_path="~/ray_results"`).
    pub fn local_root(&self) -> String {
        let root = match &self.storage {
            Some(s) if !s.contains("://") => s.as_str(),
            _ => self.local_dir.as_deref().unwrap_or("nestor-runs"),
        };
        expand_home(root)
    }

    /// The object-store URL checkpoints go to, when `storage` is one.
    pub fn storage_url(&self) -> Option<&str> {
        self.storage.as_deref().filter(|s| s.contains("://") && !s.starts_with("file://"))
    }
}

/// `path` with a leading `~` (alone or before a `/`) replaced by `$HOME`.
fn expand_home(path: &str) -> String {
    let rest = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => return path.to_string(),
    };
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => format!("{}{rest}", home.to_string_lossy()),
        _ => path.to_string(),
    }
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An experiment whose every part has been checked, built once: what a
/// sweep runs.
pub struct Resolved {
    /// Where it came from (a file name), for error messages.
    pub origin: String,
    /// The file, with overrides applied.
    pub file: ExperimentFile,
    /// Its space.
    pub space: Space,
    /// Its points to evaluate, as JSON.
    pub points: Vec<Config>,
    /// Its scheduler, built from `[scheduler]` (seeded by the experiment's
    /// seed where the section sets none).
    pub scheduler: Box<dyn Scheduler>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("origin", &self.origin)
            .field("file", &self.file)
            .field("space", &self.space)
            .finish_non_exhaustive()
    }
}

impl ExperimentFile {
    /// BOHB's budget: the scheduler's `time_attr`.
    pub fn bohb_budget(&self) -> String {
        match &self.scheduler {
            SchedulerConfig::HyperbandBohb(h) | SchedulerConfig::Hyperband(h) => h.time_attr.clone(),
            _ => search::BohbOptions::default().time_attr,
        }
    }

    /// Reads, overrides (`--set key=value`) and checks an experiment file.
    pub fn load(path: &Path, sets: &[String]) -> Result<Resolved, ExperimentError> {
        Self::read(path, sets)?.resolve(&path.display().to_string())
    }

    /// Parses TOML text (`origin` names it in errors), applies overrides, checks.
    pub fn parse(text: &str, origin: &str, sets: &[String]) -> Result<Resolved, ExperimentError> {
        Self::from_toml(text, origin, sets)?.resolve(origin)
    }

    /// Reads an experiment file and applies overrides (`--set key=value`):
    /// its syntax, keys and types are checked, its rules not yet (that is
    /// [`ExperimentFile::resolve`], which a sweep runs once, at its start).
    pub fn read(path: &Path, sets: &[String]) -> Result<ExperimentFile, ExperimentError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read { path: path.to_path_buf(), source })?;
        Self::from_toml(&text, &path.display().to_string(), sets)
    }

    /// The file as a TOML table, `sets` applied, before defaults are filled
    /// in: what the user wrote.
    pub fn raw_table(path: &Path, sets: &[String]) -> Result<toml::Table, ExperimentError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read { path: path.to_path_buf(), source })?;
        let mut table: toml::Table =
            text.parse().map_err(|e| ExperimentError::Parse { file: origin.clone(), message: one_line(&e, Some(&text)) })?;
        for arg in sets {
            apply_set(&mut table, arg)?;
        }
        Ok(table)
    }

    /// [`ExperimentFile::read`] from TOML text (`origin` names it in errors).
    pub fn from_toml(text: &str, origin: &str, sets: &[String]) -> Result<ExperimentFile, ExperimentError> {
        let parse_err = |file: &str, e: toml::de::Error| ExperimentError::Parse { file: file.to_string(), message: one_line(&e, None) };
        let file: ExperimentFile =
            toml::from_str(text).map_err(|e| ExperimentError::Parse { file: origin.to_string(), message: one_line(&e, Some(text)) })?;
        if sets.is_empty() {
            return Ok(file);
        }
        let mut table: toml::Table =
            text.parse().map_err(|e| ExperimentError::Parse { file: origin.to_string(), message: one_line(&e, Some(text)) })?;
        for arg in sets {
            apply_set(&mut table, arg)?;
        }
        let joined = sets.iter().map(|s| format!("--set {s}")).collect::<Vec<_>>().join(" ");
        ExperimentFile::deserialize(table).map_err(|e| parse_err(&joined, e))
    }

    /// Checks every part; the error names the key and the rule.
    pub fn resolve(self, origin: &str) -> Result<Resolved, ExperimentError> {
        self.resolve_with(origin, None)
    }

    /// [`ExperimentFile::resolve`] with the space already built (in Rust):
    /// it is checked against the rest of the file and used as it is, not
    /// read back from the file's `[space]`.
    pub fn resolve_with(mut self, origin: &str, space: Option<Space>) -> Result<Resolved, ExperimentError> {
        // `frequency = "auto"`: the scheduler's need decides (the same rule for every front end).
        if let Some(crate::config::Frequency::Auto(_)) = self.checkpoint.frequency {
            self.checkpoint.frequency = self.scheduler.pauses_trials().then_some(crate::config::Frequency::Every(1));
        }
        let invalid = |key: &str, message: String| ExperimentError::Invalid { file: origin.to_string(), key: key.to_string(), message };
        let e = &self.experiment;
        if e.name.is_empty() || e.name.contains('/') || e.name == "." || e.name == ".." {
            return Err(invalid("experiment.name", format!("{:?} is not a valid directory name", e.name)));
        }
        // A name goes into paths, job names, log lines and shell scripts: no control characters.
        if let Some(c) = e.name.chars().find(|c| c.is_control()) {
            return Err(invalid("experiment.name", format!("{:?} has a control character ({:?})", e.name, c.to_string())));
        }
        for (key, value) in [("experiment.storage", &e.storage), ("experiment.local_dir", &e.local_dir)] {
            if let Some(c) = value.as_deref().and_then(|p| p.chars().find(|c| c.is_control())) {
                return Err(invalid(key, format!("has a control character ({:?})", c.to_string())));
            }
        }
        match (&e.metric, e.mode) {
            (Some(_), None) => {
                return Err(invalid("experiment.mode", "required when experiment.metric is set (\"min\" or \"max\")".into()))
            }
            (None, Some(_)) => return Err(invalid("experiment.metric", "required when experiment.mode is set".into())),
            _ => {}
        }
        if e.num_samples == 0 {
            return Err(invalid("experiment.num_samples", "must be at least 1".into()));
        }
        if e.max_concurrent_trials == Some(0) {
            return Err(invalid("experiment.max_concurrent_trials", "must be at least 1".into()));
        }
        if let Some(t) = e.time_budget_s {
            if !(t > 0.0 && t.is_finite()) {
                return Err(invalid("experiment.time_budget_s", format!("must be a positive number of seconds, got {t}")));
            }
        }
        if let Some(url) = e.storage_url() {
            trainer::Storage::parse(url).map_err(|err| invalid("experiment.storage", err.to_string()))?;
        }
        for (name, spec) in &self.datasets {
            if !trainer::data::can_plan() {
                return Err(invalid(&format!("datasets.{name}"), trainer::data::DataError::NotBuilt.to_string()));
            }
            spec.check().map_err(|m| invalid(&format!("datasets.{name}"), m))?;
        }
        for (i, cb) in self.callbacks.iter().enumerate() {
            // Built once to check its settings; the sweep builds its own.
            cb.build(Path::new("."), &e.name).map_err(|m| match m.split_once(": ") {
                Some((key, msg)) if !key.contains(' ') => invalid(&format!("callbacks[{i}].{key}"), msg.to_string()),
                _ => invalid(&format!("callbacks[{i}]"), format!("({}) {m}", cb.kind())),
            })?;
        }
        let c = &self.checkpoint;
        if c.num_to_keep == Some(0) {
            return Err(invalid("checkpoint.num_to_keep", "must be at least 1 (leave it out to keep every checkpoint)".into()));
        }
        if c.score_attribute.as_deref() == Some("") {
            return Err(invalid("checkpoint.score_attribute", "must name a metric".into()));
        }
        for (i, d) in c.allowed_dirs.iter().enumerate() {
            if !d.is_dir() {
                return Err(invalid(&format!("checkpoint.allowed_dirs[{i}]"), format!("{} is not a directory", d.display())));
            }
        }
        let f = &self.failure;
        if f.max_failures < -1 {
            return Err(invalid("failure.max_failures", format!("must be -1 (no limit) or more, got {}", f.max_failures)));
        }
        if f.max_infrastructure_failures < -1 {
            return Err(invalid(
                "failure.max_infrastructure_failures",
                format!("must be -1 (no limit) or more, got {}", f.max_infrastructure_failures),
            ));
        }
        if let Some(t) = f.hang_timeout_s {
            if !(t > 0.0 && t.is_finite()) {
                return Err(invalid("failure.hang_timeout_s", format!("must be a positive number of seconds, got {t}")));
            }
        }
        if c.every() == Some(0) {
            return Err(invalid("checkpoint.frequency", "must be at least 1 (leave it out when trials checkpoint as they choose)".into()));
        }
        // The scheduler is built (and so checked) here, once, to refuse it before anything is written.
        let scheduler = self
            .scheduler
            .clone()
            .with_default_seed(e.seed)
            .build(e.metric.as_deref(), e.mode)
            .map_err(|err| invalid(&format!("scheduler.{}", err.key), err.message.clone()))?;
        if self.scheduler.pauses_trials() && c.frequency.is_none() {
            let what = match &self.scheduler {
                SchedulerConfig::Asha(_) => "asha_type = \"promotion\" pauses trials and resumes them from their checkpoints",
                SchedulerConfig::MedianStopping(_) => {
                    "median_stopping with hard_stop = false pauses trials and resumes them from their checkpoints"
                }
                SchedulerConfig::Pbt(_) => "pbt restarts trials from the checkpoints of better ones",
                SchedulerConfig::Pb2(_) => "pb2 restarts trials from the checkpoints of better ones",
                SchedulerConfig::ResourceChanging(_) => {
                    "resource_changing restarts trials from their checkpoints with another number of workers"
                }
                _ => "hyperband pauses trials and resumes them from their checkpoints",
            };
            let key = match &self.scheduler {
                SchedulerConfig::Asha(_) => "scheduler.asha_type",
                SchedulerConfig::MedianStopping(_) => "scheduler.hard_stop",
                _ => "scheduler.type",
            };
            return Err(invalid(key, format!("{what}: set checkpoint.frequency (how often, in iterations, trials save one)")));
        }
        let s = &self.search;
        s.check(e.metric.as_deref()).map_err(|err| {
            let key = if err.key.contains('.') { err.key.clone() } else { format!("search.{}", err.key) };
            invalid(&key, err.message)
        })?;
        if s.algorithm == Algorithm::Bohb && !matches!(self.scheduler, SchedulerConfig::HyperbandBohb(_) | SchedulerConfig::Hyperband(_)) {
            return Err(invalid(
                "search.algorithm",
                format!(
                    "bohb learns from the budgets of HyperBand's brackets: set scheduler.type = \"hyperband_bohb\" (not \"{}\")",
                    self.scheduler.name()
                ),
            ));
        }
        if let Some(t) = &self.trainer {
            t.check().map_err(|e| invalid(&format!("trainer.{}", e.key), e.message))?;
        }
        if !self.resources.is_empty() {
            NodeResources::from_declared(&self.resources).map_err(|e| match e {
                trainer::ResourceError::Invalid { name, message } => invalid(&format!("resources.{name}"), message),
                other => invalid("resources", other.to_string()),
            })?;
        }
        for (k, v) in &self.stop {
            if v.is_nan() {
                return Err(invalid(&format!("stop.{k}"), "threshold must be a number".into()));
            }
        }
        let space = match space {
            Some(space) => space,
            None => Space::from_toml(&self.space).map_err(|err| invalid(&format!("space.{}", err.path), err.message))?,
        };
        self.scheduler.check_space(&space).map_err(|err| invalid(&format!("scheduler.{}", err.key), err.message.clone()))?;
        let points: Vec<Config> = self.search.points();
        for (i, p) in points.iter().enumerate() {
            space.check_point(p, &format!("search.points_to_evaluate[{i}]")).map_err(|err| invalid(&err.path, err.message))?;
        }
        Ok(Resolved { origin: origin.to_string(), file: self, space, points, scheduler })
    }

    /// The file as TOML text (what `experiment.toml` and the store keep).
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// A TOML error as one line: `line L, column C: message`.
fn one_line(e: &toml::de::Error, text: Option<&str>) -> String {
    let message = e.message().trim().replace('\n', " ");
    match (e.span(), text) {
        (Some(span), Some(text)) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        _ => message,
    }
}

/// Applies one `key=value` override: the value is read as TOML (`8`,
/// `"adam"`, `[1, 2]`, `{ uniform = [0, 1] }`), or as a string if it is not TOML.
fn apply_set(table: &mut toml::Table, arg: &str) -> Result<(), ExperimentError> {
    let set_err = |message: &str| ExperimentError::Set { arg: arg.to_string(), message: message.to_string() };
    let (key, raw) = arg.split_once('=').ok_or_else(|| set_err("expected key=value, e.g. experiment.num_samples=8"))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    let value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    // A whole section may be replaced by a table: --set 'scheduler={ type = "hyperband" }'.
    let whole_section = parts.len() == 1 && value.is_table();
    if (parts.len() < 2 && !whole_section) || parts.iter().any(|p| p.is_empty()) {
        return Err(set_err("the key must name a section and a field (e.g. experiment.num_samples), or a section and a table"));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(set_err(&format!("`{p}` is not a table"))),
        };
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[experiment]
name = "demo"
metric = "loss"
mode = "min"
num_samples = 4

[space]
lr = { loguniform = [1e-4, 1e-1] }
[space.model]
width = { choice = [16, 32] }

[stop]
training_iteration = 5

[trainer]
command = ["worker"]
"#;

    #[test]
    fn a_leading_tilde_in_storage_is_the_home_directory() {
        let home = std::env::var("HOME").unwrap();
        let at = |storage: Option<&str>, local_dir: Option<&str>| {
            ExperimentSection { storage: storage.map(Into::into), local_dir: local_dir.map(Into::into), ..Default::default() }.local_root()
        };
        assert_eq!(at(Some("~/ray_results"), None), format!("{home}/ray_results"));
        assert_eq!(at(Some("~"), None), home);
        assert_eq!(at(Some("runs/~x"), None), "runs/~x");
        assert_eq!(at(Some("~other/x"), None), "~other/x", "another user's home is not ours");
        assert_eq!(at(Some("s3://b/p"), Some("~/local")), format!("{home}/local"));
        assert_eq!(at(None, None), "nestor-runs");
    }

    fn err(text: &str, sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        ExperimentFile::parse(text, "sweep.toml", &sets).unwrap_err().to_string()
    }

    #[test]
    fn a_good_file_resolves_and_round_trips() {
        let r = ExperimentFile::parse(GOOD, "sweep.toml", &[]).unwrap();
        assert_eq!(r.file.experiment.num_samples, 4);
        assert_eq!(r.space.len(), 2);
        let again = ExperimentFile::parse(&r.file.to_toml_string(), "stored", &[]).unwrap();
        assert_eq!(again.file, r.file);
    }

    #[test]
    fn bad_files_name_the_problem() {
        let unknown_key = err(&GOOD.replace("num_samples = 4", "num_sample = 4"), &[]);
        assert!(unknown_key.starts_with("sweep.toml: line 6, column 1: unknown field `num_sample`"), "{unknown_key}");
        assert_eq!(unknown_key.lines().count(), 1);
        assert!(unknown_key.contains("unknown field `num_sample`"), "{unknown_key}");
        let wrong_type = err(&GOOD.replace("num_samples = 4", "num_samples = \"four\""), &[]);
        assert!(wrong_type.starts_with("sweep.toml: line 6, column 15: invalid type: string \"four\", expected u64"), "{wrong_type}");
        let section = err(&format!("{GOOD}\n[bogus]\nx = 1\n"), &[]);
        assert!(section.contains("unknown field `bogus`"), "{section}");
        assert_eq!(err(&GOOD.replace("1e-4, 1e-1", "0.0, 1e-1"), &[]), "sweep.toml: space.lr: loguniform low must be > 0, got 0");
        assert_eq!(err(&GOOD.replace("[16, 32]", "[]"), &[]), "sweep.toml: space.model.width: choice needs at least one value");
        assert_eq!(
            err(&GOOD.replace("mode = \"min\"\n", ""), &[]),
            "sweep.toml: experiment.mode: required when experiment.metric is set (\"min\" or \"max\")"
        );
        let bad_mode = err(&GOOD.replace("\"min\"", "\"up\""), &[]);
        assert!(bad_mode.contains("unknown variant `up`, expected `min` or `max`"), "{bad_mode}");
    }

    #[test]
    fn set_overrides_with_the_same_checks() {
        let sets = vec!["experiment.num_samples=9".to_string(), "space.lr={ uniform = [0.1, 0.2] }".into(), "experiment.name=other".into()];
        let r = ExperimentFile::parse(GOOD, "sweep.toml", &sets).unwrap();
        assert_eq!(r.file.experiment.num_samples, 9);
        assert_eq!(r.file.experiment.name, "other");
        assert_eq!(r.space.entries().next().map(|(k, _)| k), Some("lr"));
        let e = err(GOOD, &["experiment.num_samples=many"]);
        assert!(e.starts_with("--set experiment.num_samples=many: ") && e.contains("expected u64"), "{e}");
        assert!(err(GOOD, &["experiment.nope=1"]).contains("unknown field `nope`"));
        assert_eq!(err(GOOD, &["nonsense"]), "--set nonsense: expected key=value, e.g. experiment.num_samples=8");
        assert_eq!(err(GOOD, &["space.lr={ uniform = [1, 0] }"]), "sweep.toml: space.lr: uniform low 1.0 > high 0.0");
    }

    #[test]
    fn a_whole_section_can_be_replaced_by_a_table() {
        let sets = ["scheduler={ type = \"hyperband\", max_t = 9 }".into(), "checkpoint.frequency=1".into()];
        let r = ExperimentFile::parse(GOOD, "f.toml", &sets).unwrap();
        assert!(matches!(r.file.scheduler, SchedulerConfig::Hyperband(ref h) if h.max_t == 9.0));
        let err = ExperimentFile::parse(GOOD, "f.toml", &["scheduler=3".into()]).unwrap_err().to_string();
        assert!(err.contains("must name a section and a field"), "{err}");
    }
}
