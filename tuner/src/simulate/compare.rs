//! `nestor simulate --compare`: the same curves through several
//! schedulers, each over the same configs in the same order on the same
//! slots, so that a user can pick a scheduler for their own curves before
//! spending a GPU hour on it.
//!
//! Per seed, FIFO runs first: it trains every config to the end and so
//! knows the best. Each scheduler is then scored by
//! - its compute: what its runs spent in the cost attribute (or in
//!   iterations), as a share of FIFO's on that seed;
//! - its regret: the final metric of the config it chose minus the best
//!   config's (both read off the curves' last points). The config it chose
//!   is the best among its trials that ran their whole curve, as a user
//!   would pick it; when none did, the best last result of any trial.

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use search::{Config, Mode, TrialResult};
use serde::Deserialize as _;

use crate::curves::{ArmSearcher, Curves};
use crate::{ExperimentFile, ProgressMode, ResultGrid, Trainable, TuneError, Tuner};

/// One scheduler to compare: its label (as given) and its experiment file.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `asha` or `asha:asha_type=promotion`, as given.
    pub label: String,
    /// The experiment with this scheduler in place of the file's.
    pub file: ExperimentFile,
}

/// One simulated sweep, scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The compute its runs spent.
    pub spent: f64,
    /// The final metric of the config it chose (NaN when it chose none).
    pub chosen: f64,
    /// The best final metric among the configs it was given.
    pub best: f64,
    /// `chosen - best` (for `max`, `best - chosen`); 0 is the best config.
    pub regret: f64,
}

/// A scheduler's outcomes over the seeds.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scheduler, as given.
    pub label: String,
    /// Per seed: its compute as a share of FIFO's.
    pub shares: Vec<f64>,
    /// Per seed: its regret.
    pub regrets: Vec<f64>,
}

impl Row {
    /// The mean compute share.
    pub fn mean_share(&self) -> f64 {
        mean(&self.shares)
    }
    /// The mean regret.
    pub fn mean_regret(&self) -> f64 {
        mean(&self.regrets)
    }
    /// The largest regret.
    pub fn max_regret(&self) -> f64 {
        self.regrets.iter().copied().fold(0.0, f64::max)
    }
    /// On how many seeds it chose the best config.
    pub fn best_chosen(&self) -> usize {
        self.regrets.iter().filter(|r| **r <= 1e-12).count()
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The entries for `list` (`fifo,asha,asha:asha_type=promotion,...`)
/// over the experiment `base` (a TOML table, `--set`s applied). Each
/// scheduler takes the keys of the file's `[scheduler]` that it has
/// (`time_attr`, `max_t`, `grace_period`, ...), then those given after its
/// name; `max_t`, when neither gives it, is where the curves end in its
/// `time_attr`. `hyperband_bohb` searches with BOHB; the others with the
/// file's searcher (random when that is BOHB).
pub fn entries(list: &str, base: &toml::Table, origin: &str, curves: &Curves) -> Result<Vec<Entry>, String> {
    let file_scheduler = base.get("scheduler").and_then(toml::Value::as_table).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for spec in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut parts = spec.split(':');
        let name = parts.next().unwrap_or_default();
        let mut table = toml::Table::new();
        table.insert("type".into(), toml::Value::String(name.into()));
        if name == "fifo" {
            // FIFO has no settings.
        } else {
            for (k, v) in &file_scheduler {
                if k != "type" && accepts(&table, k, v) {
                    table.insert(k.clone(), v.clone());
                }
            }
            for kv in parts {
                let (k, raw) = kv.split_once('=').ok_or_else(|| format!("--compare {spec}: expected NAME:KEY=VALUE, got `{kv}`"))?;
                let value = match format!("v = {raw}").parse::<toml::Table>() {
                    Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.into())),
                    Err(_) => toml::Value::String(raw.into()),
                };
                table.insert(k.trim().to_string(), value);
            }
            if !table.contains_key("max_t") {
                let attr = table.get("time_attr").and_then(toml::Value::as_str).unwrap_or("training_iteration").to_string();
                if let Some(end) = curves.end(&attr) {
                    let end = toml::Value::Float(end);
                    if accepts(&table, "max_t", &end) {
                        table.insert("max_t".into(), end);
                    }
                }
            }
        }
        let mut whole = base.clone();
        whole.insert("scheduler".into(), toml::Value::Table(table));
        let search = whole.entry("search").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(search) = search {
            let bohb = search.get("algorithm").and_then(toml::Value::as_str) == Some("bohb");
            if name == "hyperband_bohb" {
                search.insert("algorithm".into(), "bohb".into());
            } else if bohb {
                search.retain(|k, _| k == "points_to_evaluate" || k == "max_concurrent" || k == "repeat");
                search.insert("algorithm".into(), "random".into());
            }
        }
        let text = toml::to_string(&whole).map_err(|e| format!("--compare {spec}: {e}"))?;
        let file = ExperimentFile::from_toml(&text, origin, &[]).map_err(|e| format!("--compare {spec}: {e}"))?;
        // Checked as a run would check it: an impossible scheduler is named now.
        file.clone().resolve(origin).map_err(|e| format!("--compare {spec}: {e}"))?;
        out.push(Entry { label: spec.to_string(), file });
    }
    if out.is_empty() {
        return Err("--compare: name at least one scheduler (fifo,asha,hyperband,...)".into());
    }
    Ok(out)
}

/// Whether the scheduler `table` would take the key `k`.
fn accepts(table: &toml::Table, k: &str, v: &toml::Value) -> bool {
    let mut t = table.clone();
    t.insert(k.to_string(), v.clone());
    match schedulers::SchedulerConfig::deserialize(toml::Value::Table(t)) {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown field"),
    }
}

/// Runs FIFO and every entry over `seeds` seeds into `dir`, calling
/// `progress` after each sweep, and returns FIFO's row first.
pub fn run(
    entries: &[Entry],
    curves: &Curves,
    seeds: u64,
    dir: &Path,
    mut progress: impl FnMut(&str, u64, &Outcome),
) -> Result<Vec<Row>, TuneError> {
    let Some(first) = entries.first() else { return Ok(Vec::new()) };
    let fifo = Entry { label: "fifo".into(), file: ExperimentFile { scheduler: schedulers::SchedulerConfig::Fifo, ..first.file.clone() } };
    let mut all: Vec<&Entry> = vec![&fifo];
    all.extend(entries.iter().filter(|e| e.file.scheduler != schedulers::SchedulerConfig::Fifo));
    let mut rows: Vec<Row> = all.iter().map(|e| Row { label: e.label.clone(), shares: Vec::new(), regrets: Vec::new() }).collect();
    let base_seed = first.file.experiment.seed.unwrap_or(0);
    for k in 0..seeds {
        let seed = base_seed + k;
        let mut fifo_spent = f64::NAN;
        for (i, entry) in all.iter().enumerate() {
            let outcome = sweep(entry, curves, seed, &dir.join(format!("{}-seed{seed}", slug(&entry.label))))?;
            if i == 0 {
                fifo_spent = outcome.spent;
            }
            progress(&entry.label, seed, &outcome);
            rows[i].shares.push(outcome.spent / fifo_spent);
            rows[i].regrets.push(outcome.regret);
        }
    }
    Ok(rows)
}

fn slug(label: &str) -> String {
    label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' }).collect()
}

/// One sweep of `entry` on `seed`: a random order of the curves' configs
/// (a table with no `[space]`: `num_samples` of them, each once), or the
/// space's searcher with that seed.
fn sweep(entry: &Entry, curves: &Curves, seed: u64, storage: &Path) -> Result<Outcome, TuneError> {
    let mut file = entry.file.clone();
    file.experiment.seed = Some(seed);
    file.experiment.storage = Some(storage.display().to_string());
    file.experiment.name = "sweep".into();
    let metered = curves.metered();
    let mut points = None;
    let given: Option<Vec<Config>> = match curves.configs() {
        Some(configs) if file.space.is_empty() => {
            let mut order: Vec<usize> = (0..configs.len()).collect();
            order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
            order.truncate((file.experiment.num_samples as usize).clamp(1, configs.len()));
            file.experiment.num_samples = order.len() as u64;
            points = Some(order.iter().map(|&i| serde_json::json!({ ArmSearcher::<search::BasicVariantGenerator>::PARAM: i })).collect());
            Some(order.into_iter().map(|i| configs[i].clone()).collect())
        }
        _ => None,
    };
    let mut tuner = Tuner::from_file(file.clone(), "compare", Some(Trainable::simulated(metered.clone()))).progress(ProgressMode::Quiet);
    if let Some(points) = points {
        tuner = tuner.points(points);
    }
    let grid = tuner.fit()?;
    let mode = file.experiment.mode.unwrap_or(Mode::Min);
    Ok(score(&grid, &metered, mode, given.as_deref()))
}

/// Scores a finished sweep: the config it chose against the best of
/// `given` (or of its own trials' configs).
pub fn score(grid: &ResultGrid, curves: &Curves, mode: Mode, given: Option<&[Config]>) -> Outcome {
    let mut scorer = Scorer::new(curves, mode);
    for (i, t) in grid.iter().enumerate() {
        scorer.add(i as u64, &t.config, t.history.last());
    }
    scorer.finish(given)
}

/// [`score`], one trial at a time: what it keeps does not grow with the
/// trials, and the trials may come in any order (of equals, the earlier
/// trial is chosen).
pub struct Scorer {
    curves: Curves,
    mode: Mode,
    /// The best last value among trials that ran their whole curve, with
    /// the trial's index and config.
    complete: Option<(f64, u64, Config)>,
    /// The best last value among the others.
    partial: Option<(f64, u64, Config)>,
    /// The best final value of the configs seen.
    best: f64,
}

impl Scorer {
    /// Nothing scored yet.
    pub fn new(curves: &Curves, mode: Mode) -> Self {
        Self { curves: curves.clone(), mode, complete: None, partial: None, best: f64::NAN }
    }

    fn final_of(&self, config: &Config) -> f64 {
        self.curves.last_point(config).map_or(f64::NAN, |(_, v)| v)
    }

    /// Trial number `index`, of `config`, whose last result was `last`.
    pub fn add(&mut self, index: u64, config: &Config, last: Option<&TrialResult>) {
        let end = self.curves.last_point(config);
        if let Some(v) = end.map(|(_, v)| v).filter(|v| v.is_finite()) {
            if self.best.is_nan() || self.mode.better(v, self.best) {
                self.best = v;
            }
        }
        let Some(last) = last else { return };
        let Some(v) = last.metrics.get(self.curves.metric()).copied().filter(|v| v.is_finite()) else { return };
        // The chosen config: the best of the trials that ran their whole curve.
        let whole = end.is_some_and(|(n, _)| last.training_iteration >= n);
        let held = if whole { &self.complete } else { &self.partial };
        if held.as_ref().is_none_or(|(b, i, _)| self.mode.better(v, *b) || (v == *b && index < *i)) {
            let slot = if whole { &mut self.complete } else { &mut self.partial };
            *slot = Some((v, index, config.clone()));
        }
    }

    /// The outcome: the chosen config's final value against the best of
    /// `given` (or of the configs added).
    pub fn finish(self, given: Option<&[Config]>) -> Outcome {
        let chosen = self.complete.as_ref().or(self.partial.as_ref()).map_or(f64::NAN, |(_, _, c)| self.final_of(c));
        let best = match given {
            Some(configs) => configs.iter().map(|c| self.final_of(c)).filter(|v| v.is_finite()).fold(f64::NAN, |b, v| {
                if b.is_nan() || self.mode.better(v, b) {
                    v
                } else {
                    b
                }
            }),
            None => self.best,
        };
        let regret = match self.mode {
            Mode::Min => chosen - best,
            Mode::Max => best - chosen,
        };
        Outcome { spent: self.curves.spent(), chosen, best, regret: if regret.is_nan() { f64::INFINITY } else { regret.max(0.0) } }
    }
}

/// The comparison as a table: a row per scheduler.
pub fn table(rows: &[Row], cost: Option<&str>, seeds: u64) -> String {
    let mut out = String::new();
    let unit = cost.unwrap_or("iterations");
    let w = rows.iter().map(|r| r.label.len()).max().unwrap_or(0).max(40);
    out.push_str(&format!(
        "{:<w$} {:>16} {:>12} {:>12} {:>8}\n",
        "scheduler",
        "compute vs FIFO",
        "regret mean",
        "regret max",
        format!("best/{seeds}")
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<w$} {:>16} {:>12.4} {:>12.4} {:>8}\n",
            r.label,
            format!("{:.1}%", 100.0 * r.mean_share()),
            r.mean_regret(),
            r.max_regret(),
            r.best_chosen()
        ));
    }
    out.push_str(&format!("(compute in {unit}; regret: the chosen config's final metric minus the best config's)\n"));
    out
}
