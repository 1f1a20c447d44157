//! What the dashboard shows of one experiment, kept in memory and brought
//! up to date without touching the store's lock.
//!
//! A finished experiment is read from its store (a private copy, like
//! `nestor status`): every trial, its effective history, checkpoints and
//! exploits. A running sweep holds its store, so its board is read from the
//! files it writes for people, which hold everything durable: each trial's
//! `result.jsonl`, or the experiment's `results.jsonl` when it writes no
//! per-trial files (read from where the last read stopped), the experiment's
//! `events.jsonl` (starts, ends, restarts, exploits) and `status.json`
//! (the running trials' latest iteration). When the sweep ends the board
//! is read again from the store, which then has the last word.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use search::Mode;

use crate::callback::Status;
use crate::result_grid::{QueryError, ResultGrid};
use crate::store::StoreError;

/// One trial's row in the table.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub id: String,
    pub status: String,
    pub iteration: u64,
    /// Its latest metrics.
    pub metrics: BTreeMap<String, f64>,
    pub config: Value,
    pub restarts: u64,
    pub failures: u64,
    pub exploits: u64,
    pub error: Option<String>,
    pub nodes: Vec<String>,
    /// Its committed checkpoints (retention may have removed the oldest since).
    pub checkpoints: Vec<String>,
}

/// One trial's points, a column per metric (NaN where a result lacks it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Curve {
    pub iter: Vec<u64>,
    pub time: Vec<f64>,
    pub values: BTreeMap<String, Vec<f64>>,
}

impl Curve {
    fn push(&mut self, iteration: u64, metrics: &BTreeMap<String, f64>) {
        let n = self.iter.len();
        self.iter.push(iteration);
        self.time.push(metrics.get("time_total_s").copied().unwrap_or(f64::NAN));
        for (k, v) in metrics {
            if matches!(k.as_str(), "training_iteration" | "timestamp") {
                continue;
            }
            let col = self.values.entry(k.clone()).or_insert_with(|| vec![f64::NAN; n]);
            col.resize(n, f64::NAN);
            col.push(*v);
        }
        for col in self.values.values_mut() {
            col.resize(n + 1, f64::NAN);
        }
    }
}

/// The board of one experiment.
#[derive(Debug, Default)]
pub(crate) struct Board {
    pub dir: PathBuf,
    pub name: String,
    pub metric: Option<String>,
    pub mode: Option<Mode>,
    /// Parameters drawn on a log scale.
    pub log_params: BTreeSet<String>,
    /// A sweep is running it.
    pub live: bool,
    /// Bumped when the board is read anew: clients start over.
    pub epoch: u64,
    /// Bumped on every change.
    pub version: u64,
    pub rows: Vec<Row>,
    index: HashMap<String, usize>,
    pub curves: Vec<Curve>,
    /// Every point in the order it came: (trial, its position in the curve).
    pub log: Vec<(u32, u32)>,
    pub exploits: Vec<Value>,
    pub status: Option<Status>,
    /// Live reading: bytes of each trial's `result.jsonl` read, and of `events.jsonl`.
    offsets: HashMap<String, u64>,
    events_offset: u64,
}

/// Why a directory cannot be shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BoardError {
    #[error("{0}: not an experiment directory (no store/ and no status.json; give the directory `nestor run` printed)")]
    NotAnExperiment(PathBuf),
    #[error(transparent)]
    Query(#[from] QueryError),
}

impl Board {
    /// The board of the experiment at `dir`, read from its store or, while
    /// a sweep runs it, from its files.
    pub(crate) fn open(dir: &Path) -> Result<Self, BoardError> {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        if !dir.join("store").join("db").exists() && !dir.join(Status::FILE).exists() {
            return Err(BoardError::NotAnExperiment(dir));
        }
        let mut b = Board { dir, ..Default::default() };
        b.read_settings();
        b.reload()?;
        Ok(b)
    }

    fn read_settings(&mut self) {
        self.name = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Ok(text) = std::fs::read_to_string(self.dir.join("experiment.toml")) else { return };
        let Ok(file) = toml::from_str::<toml::Table>(&text) else { return };
        if let Some(e) = file.get("experiment").and_then(|e| e.as_table()) {
            self.name = e.get("name").and_then(|v| v.as_str()).map(String::from).unwrap_or_else(|| self.name.clone());
            self.metric = e.get("metric").and_then(|v| v.as_str()).map(String::from);
            self.mode = e.get("mode").and_then(|v| v.as_str()).and_then(|m| serde_json::from_value(Value::from(m)).ok());
        }
        fn walk(prefix: &str, t: &toml::Table, out: &mut BTreeSet<String>) {
            for (k, v) in t {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                if let Some(inner) = v.as_table() {
                    if inner.len() == 1 && inner.keys().all(|d| search::DOMAIN_KINDS.contains(&d.as_str())) {
                        if inner.keys().any(|d| d.contains("log")) {
                            out.insert(path);
                        }
                    } else {
                        walk(&path, inner, out);
                    }
                }
            }
        }
        if let Some(space) = file.get("space").and_then(|s| s.as_table()) {
            walk("", space, &mut self.log_params);
        }
    }

    /// Reads the board anew: from the store when no sweep holds it, else from the files.
    pub(crate) fn reload(&mut self) -> Result<(), BoardError> {
        self.rows.clear();
        self.index.clear();
        self.curves.clear();
        self.log.clear();
        self.exploits.clear();
        self.offsets.clear();
        self.events_offset = 0;
        self.epoch += 1;
        self.version += 1;
        match ResultGrid::load(&self.dir) {
            Ok(grid) => {
                self.live = false;
                self.status = None;
                self.read_grid(&grid);
                Ok(())
            }
            Err(QueryError::Store(StoreError::Locked(_))) => {
                self.live = true;
                self.refresh();
                Ok(())
            }
            // A sweep just started, before its store exists.
            Err(QueryError::Store(StoreError::Missing(_))) if self.dir.join(Status::FILE).exists() => {
                self.live = true;
                self.refresh();
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn read_grid(&mut self, grid: &ResultGrid) {
        if self.metric.is_none() {
            self.metric = grid.metric.clone();
            self.mode = grid.mode;
        }
        for t in grid.iter() {
            let i = self.row_index(&t.trial_id);
            let row = &mut self.rows[i];
            row.status = t.status.as_str().to_string();
            row.config = t.config.clone();
            row.restarts = t.restarts.into();
            row.failures = (t.failures + t.infrastructure_failures).into();
            row.exploits = t.exploits.into();
            row.error = t.error.clone();
            row.nodes = nodes(t.resources.iter().map(|b| b.node.as_str()));
            row.checkpoints = t.checkpoints.iter().map(|c| c.uri.clone()).collect();
            for r in &t.history {
                self.add_point(i, r.training_iteration, &r.metrics);
            }
        }
        self.exploits = grid.exploits.iter().filter_map(|e| serde_json::to_value(e).ok()).collect();
    }

    fn row_index(&mut self, id: &str) -> usize {
        if let Some(&i) = self.index.get(id) {
            return i;
        }
        self.rows.push(Row {
            id: id.to_string(),
            status: "PENDING".into(),
            iteration: 0,
            metrics: BTreeMap::new(),
            config: Value::Null,
            restarts: 0,
            failures: 0,
            exploits: 0,
            error: None,
            nodes: Vec::new(),
            checkpoints: Vec::new(),
        });
        self.curves.push(Curve::default());
        self.index.insert(id.to_string(), self.rows.len() - 1);
        self.rows.len() - 1
    }

    fn add_point(&mut self, i: usize, iteration: u64, metrics: &BTreeMap<String, f64>) {
        let c = &mut self.curves[i];
        self.log.push((i as u32, c.iter.len() as u32));
        c.push(iteration, metrics);
        let row = &mut self.rows[i];
        row.iteration = iteration;
        row.metrics = metrics.clone();
    }

    /// The board of a running sweep, brought up to date from its files.
    /// Whether anything changed. A sweep that ended is read from its store.
    pub(crate) fn refresh(&mut self) -> bool {
        let status = Status::read(&self.dir).ok().flatten();
        if !self.live {
            // A finished experiment starts again (nestor resume): read it from its files.
            if status.is_some() {
                let _ = self.reload();
                return true;
            }
            return false;
        }
        let Some(status) = status else {
            // The sweep ended (status.json goes at its end): the store has the last word.
            if ResultGrid::load(&self.dir).is_ok() {
                let _ = self.reload();
                return true;
            }
            return false;
        };
        let before = (self.log.len(), self.rows.len(), self.events_offset);
        self.read_events();
        self.read_results();
        for r in &status.running {
            let i = self.row_index(&r.trial_id);
            let row = &mut self.rows[i];
            row.status = "RUNNING".into();
            if row.config.is_null() {
                row.config = r.config.clone();
            }
            let nodes = nodes(r.resources.iter().map(|b| b.node.as_str()));
            if !nodes.is_empty() {
                row.nodes = nodes;
            }
        }
        let changed = before != (self.log.len(), self.rows.len(), self.events_offset) || self.status.as_ref() != Some(&status);
        self.status = Some(status);
        if changed {
            self.version += 1;
        }
        changed
    }

    fn read_events(&mut self) {
        let path = self.dir.join(crate::files::EVENTS);
        let Some((text, read)) = read_from(&path, self.events_offset) else { return };
        self.events_offset += read;
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            let Some(id) = v["trial_id"].as_str() else { continue };
            let i = self.row_index(id);
            let row = &mut self.rows[i];
            match v["event"].as_str().unwrap_or_default() {
                "trial_started" | "trial_completed" | "trial_errored" | "trial_paused" | "trial_interrupted" => {
                    row.status = v["status"].as_str().unwrap_or("PENDING").to_string();
                    row.config = v["config"].clone();
                    row.restarts = v["restarts"].as_u64().unwrap_or(0);
                    row.failures = v["failures"].as_u64().unwrap_or(0);
                    row.exploits = v["exploits"].as_u64().unwrap_or(0);
                    row.error = v["error"].as_str().map(String::from);
                    let nodes = nodes(v["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str));
                    if !nodes.is_empty() {
                        row.nodes = nodes;
                    }
                }
                "checkpoint_committed" => {
                    if let Some(uri) = v["uri"].as_str() {
                        row.checkpoints.push(uri.to_string());
                    }
                }
                "exploited" => {
                    row.config = v["new_config"].clone();
                    self.exploits.push(v);
                }
                _ => {}
            }
        }
    }

    fn read_results(&mut self) {
        // A sweep without per-trial files writes every result to one file.
        let all = self.dir.join(crate::files::RESULTS);
        if all.exists() {
            let offset = self.offsets.get(crate::files::RESULTS).copied().unwrap_or(0);
            let Some((text, read)) = read_from(&all, offset) else { return };
            self.offsets.insert(crate::files::RESULTS.to_string(), offset + read);
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
                let Some(id) = v["trial_id"].as_str() else { continue };
                let i = self.row_index(id);
                self.add_line(i, &v);
            }
            return;
        }
        let trials = self.dir.join("trials");
        let Ok(entries) = std::fs::read_dir(&trials) else { return };
        let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        for id in names {
            let path = trials.join(&id).join("result.jsonl");
            let offset = self.offsets.get(&id).copied().unwrap_or(0);
            let Some((text, read)) = read_from(&path, offset) else { continue };
            self.offsets.insert(id.clone(), offset + read);
            let i = self.row_index(&id);
            if self.rows[i].config.is_null() {
                if let Ok(c) = std::fs::read_to_string(trials.join(&id).join("params.json")) {
                    self.rows[i].config = serde_json::from_str(&c).unwrap_or(Value::Null);
                }
            }
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
                self.add_line(i, &v);
            }
        }
    }

    /// One line of a results file as a point of trial `i`'s curve.
    fn add_line(&mut self, i: usize, v: &Value) {
        let metrics: BTreeMap<String, f64> =
            v["metrics"].as_object().into_iter().flatten().filter_map(|(k, x)| Some((k.clone(), number(x)?))).collect();
        self.add_point(i, v["training_iteration"].as_u64().unwrap_or(0), &metrics);
    }

    /// Names of the metrics some result carries.
    pub(crate) fn metric_names(&self) -> Vec<String> {
        let mut names: BTreeSet<&String> = BTreeSet::new();
        for c in &self.curves {
            names.extend(c.values.keys());
        }
        names.into_iter().cloned().collect()
    }

    /// A trial's row by id.
    pub(crate) fn row(&self, id: &str) -> Option<(&Row, &Curve)> {
        self.index.get(id).map(|&i| (&self.rows[i], &self.curves[i]))
    }

    /// The value of `metric` each trial is judged by: its best under the mode.
    pub(crate) fn scores(&self, metric: &str) -> Vec<Option<f64>> {
        let max = self.mode == Some(Mode::Max);
        self.curves
            .iter()
            .map(|c| {
                let col = c.values.get(metric)?;
                col.iter().copied().filter(|v| v.is_finite()).reduce(|a, b| if (b > a) == max { b } else { a })
            })
            .collect()
    }
}

/// Text of `path` from byte `offset` up to its last whole line, and how many bytes that is.
fn read_from(path: &Path, offset: u64) -> Option<(String, u64)> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len <= offset {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = Vec::with_capacity((len - offset) as usize);
    f.take(len - offset).read_to_end(&mut buf).ok()?;
    let end = buf.iter().rposition(|&b| b == b'\n')? + 1;
    buf.truncate(end);
    Some((String::from_utf8_lossy(&buf).into_owned(), end as u64))
}

/// A metric's value as the result files write it (`"NaN"` and the infinities as strings).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn nodes<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let set: BTreeSet<&str> = names.filter(|n| !n.is_empty()).collect();
    set.into_iter().map(String::from).collect()
}

/// How much of the metric's spread each parameter explains: the share of
/// the scores' variance between groups of trials with like values (one-way
/// ANOVA's eta squared; numbers in up to four quantile bins), normalised
/// to sum to one. A quick, model-free cousin of fANOVA.
pub(crate) fn importance(configs: &[&Value], scores: &[f64]) -> Vec<(String, f64)> {
    let n = scores.len();
    if n < 3 {
        return Vec::new();
    }
    let flats: Vec<BTreeMap<String, &Value>> = configs.iter().map(|c| crate::text::leaves(c).into_iter().collect()).collect();
    let mean = scores.iter().sum::<f64>() / n as f64;
    let total: f64 = scores.iter().map(|s| (s - mean).powi(2)).sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let keys: BTreeSet<&String> = flats.iter().flat_map(|m| m.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        let values: Vec<Option<&Value>> = flats.iter().map(|m| m.get(key).copied()).collect();
        let distinct: BTreeSet<String> = values.iter().map(|v| v.map(|v| v.to_string()).unwrap_or_default()).collect();
        if distinct.len() < 2 {
            continue;
        }
        let numeric: Option<Vec<f64>> = values.iter().map(|v| v.and_then(Value::as_f64)).collect();
        let groups: Vec<String> = match numeric {
            Some(xs) if distinct.len() > 4 => {
                let mut sorted = xs.clone();
                sorted.sort_by(f64::total_cmp);
                let cuts: Vec<f64> = (1..4).map(|q| sorted[q * n / 4]).collect();
                xs.iter().map(|x| cuts.iter().filter(|c| x >= c).count().to_string()).collect()
            }
            _ => values.iter().map(|v| v.map(|v| v.to_string()).unwrap_or_default()).collect(),
        };
        let mut sums: HashMap<&str, (f64, f64)> = HashMap::new();
        for (g, s) in groups.iter().zip(scores) {
            let e = sums.entry(g.as_str()).or_default();
            e.0 += s;
            e.1 += 1.0;
        }
        let between: f64 = sums.values().map(|(sum, count)| count * (sum / count - mean).powi(2)).sum();
        out.push((key.clone(), between / total));
    }
    let sum: f64 = out.iter().map(|(_, v)| v).sum();
    if sum > 0.0 {
        for (_, v) in &mut out {
            *v /= sum;
        }
    }
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(what: &str, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed().as_secs() < 60, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn a_sweep_without_trial_files_is_followed_live_from_its_results_file() {
        use crate::{Domain, Mode, ProgressMode, RunConfig, Space, Trainable, TuneConfig, Tuner};
        let dir = tempfile::tempdir().unwrap();
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let trainable = Trainable::function(|ctx| {
            for i in 0..30 {
                ctx.report([("loss", 1.0 / (f64::from(i) + 1.0))], None)?;
                std::thread::sleep(std::time::Duration::from_millis(40));
            }
            Ok(())
        });
        let storage = dir.path().to_path_buf();
        let run = std::thread::spawn(move || {
            Tuner::new(trainable, space)
                .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 2, ..Default::default() })
                .run_config(RunConfig {
                    name: "live".into(),
                    storage,
                    trial_files: false,
                    progress: ProgressMode::Quiet,
                    ..Default::default()
                })
                .fit()
        });
        let exp = dir.path().join("live");
        wait("the sweep's status.json", || exp.join(Status::FILE).exists());
        let mut board = Board::open(&exp).unwrap();
        assert!(board.live, "a running sweep is read from its files");
        wait("points of the running trials", || {
            board.refresh();
            !board.log.is_empty() && board.rows.iter().any(|r| r.status == "RUNNING")
        });
        assert!(!exp.join("trials/trial_00000/result.jsonl").exists(), "no per-trial files");
        let grid = run.join().unwrap().unwrap();
        wait("the store's last word", || {
            board.refresh();
            !board.live
        });
        let stored: usize = grid.iter().map(|t| t.history.len()).sum();
        assert_eq!(board.log.len(), stored, "every stored result is a point");
    }

    #[test]
    fn importance_finds_the_parameter_that_matters() {
        let configs: Vec<Value> =
            (0..40).map(|i| serde_json::json!({"lr": i as f64 / 40.0, "noise": (i * 7919 % 13) as f64, "opt": "sgd"})).collect();
        let scores: Vec<f64> = configs.iter().map(|c| (c["lr"].as_f64().unwrap() - 0.2).powi(2)).collect();
        let refs: Vec<&Value> = configs.iter().collect();
        let imp = importance(&refs, &scores);
        assert_eq!(imp[0].0, "lr", "{imp:?}");
        assert!(imp[0].1 > 0.7, "{imp:?}");
        assert!(imp.iter().all(|(k, _)| k != "opt"), "a constant explains nothing");
        assert!((imp.iter().map(|(_, v)| v).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_curve_keeps_its_columns_aligned() {
        let mut c = Curve::default();
        c.push(1, &[("loss".to_string(), 1.0)].into_iter().collect());
        c.push(2, &[("acc".to_string(), 0.5)].into_iter().collect());
        assert_eq!(c.iter, [1, 2]);
        assert_eq!(c.values["loss"].len(), 2);
        assert!(c.values["loss"][1].is_nan() && c.values["acc"][0].is_nan());
    }

    #[test]
    fn a_path_that_is_no_experiment_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let e = Board::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not an experiment directory") && e.contains(&dir.path().display().to_string()), "{e}");
    }
}
