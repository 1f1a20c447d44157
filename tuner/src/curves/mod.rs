//! The simulator's engine: a backend for the real Tuner loop that replays learning
//! curves under a virtual clock, so a sweep of a thousand trials with real
//! scheduling decisions (stops, pauses, promotions, resumes from
//! checkpoints) runs in well under a second.
//!
//! Each trial's curve comes from a Rust function of its config or from a
//! JSON-lines file (gzipped or not), one configuration per line:
//! `{"config": {...}, "metrics": [v1, v2, ...], "seconds_per_iteration": s}`.
//! A run reports iteration `i` at `start + i * seconds_per_iteration`
//! (virtual seconds) with the curve's `i`-th value as the experiment's
//! metric. Other arrays on the line, one number per point, are columns:
//! `"seconds": [...]` gives each iteration its own virtual duration, and
//! any other name (`"samples_seen": [...]`) is reported with each result,
//! so a scheduler can place its rungs in it (`time_attr`) and the
//! simulation can count compute in it ([`Curves::cost`]). A run carries a checkpoint every `[checkpoint] frequency`
//! iterations (`sim://<trial>/checkpoint_<i>`, a name with no files behind
//! it), so a paused trial resumes where its checkpoint left off. A
//! simulation writes the result store only: no per-trial files.
//!
//! The clock advances one event at a time, and only when the Tuner has
//! acted on every event before it: the backend is also the loop's clock,
//! and moves when the loop is idle. Decisions are made in virtual-time
//! order, and the same seed gives the same sweep.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use search::{Config, SearchError, Searcher, Suggestion, TrialResult};
use trainer::{
    Backend, CheckpointRef, Directive, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, Reply, Report, StopLevel, TrialHandle,
};

/// One learning curve: the metric after each iteration, how long each
/// iteration takes, and other values reported with each point (what the
/// training had cost by then: `samples_seen`, `flops`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The metric after iterations 1, 2, ...
    pub metrics: Vec<f64>,
    /// Virtual seconds per iteration (when `seconds` is empty).
    pub seconds_per_iteration: f64,
    /// Each iteration's own virtual seconds, one per point (empty: every
    /// iteration takes `seconds_per_iteration`).
    pub seconds: Vec<f64>,
    /// Other values reported with each point, by name, one per point.
    /// A cost attribute (`samples_seen`) is cumulative: it never decreases.
    pub attrs: BTreeMap<String, Vec<f64>>,
}

impl Default for Curve {
    fn default() -> Self {
        Self { metrics: Vec::new(), seconds_per_iteration: 1.0, seconds: Vec::new(), attrs: BTreeMap::new() }
    }
}

impl Curve {
    /// A curve of `metrics`, each iteration taking `seconds_per_iteration`.
    pub fn new(metrics: Vec<f64>, seconds_per_iteration: f64) -> Self {
        Self { metrics, seconds_per_iteration, ..Default::default() }
    }

    /// With a value of `name` reported at each point.
    pub fn attr(mut self, name: impl Into<String>, values: Vec<f64>) -> Self {
        self.attrs.insert(name.into(), values);
        self
    }

    /// The virtual seconds iteration `i` (1-based) takes.
    fn duration(&self, i: u64) -> f64 {
        self.seconds.get(i as usize - 1).copied().unwrap_or(self.seconds_per_iteration)
    }

    /// What the curve had cost after `i` iterations (0 at the start): the
    /// attribute `cost`, or the iterations when `cost` is none.
    pub fn cost_at(&self, cost: Option<&str>, i: u64) -> f64 {
        match cost {
            None => i as f64,
            Some(_) if i == 0 => 0.0,
            Some(name) => self.attrs.get(name).and_then(|v| v.get(i as usize - 1)).copied().unwrap_or(f64::NAN),
        }
    }
}

type CurveFn = dyn Fn(&Config) -> Curve + Send + Sync;

/// Where a simulation's curves come from.
#[derive(Clone)]
pub struct Curves {
    metric: String,
    source: Source,
    /// The attribute compute is counted in (none: iterations).
    cost: Option<String>,
    /// The compute spent by the runs replayed from this value and its clones.
    spent: Arc<Mutex<f64>>,
}

#[derive(Clone)]
enum Source {
    Table(Arc<Table>),
    Function(Arc<CurveFn>),
}

/// A table of curves, each found by its config in constant time.
struct Table {
    /// The file it was read from, for errors.
    origin: String,
    rows: Vec<(Config, Curve)>,
    /// Canonical text of each config -> its row.
    index: HashMap<String, usize>,
}

impl Table {
    /// The table of `rows`; a config given twice finds its first row.
    fn new(rows: Vec<(Config, Curve)>) -> Self {
        let mut index = HashMap::with_capacity(rows.len());
        for (i, (config, _)) in rows.iter().enumerate() {
            index.entry(canonical(config)).or_insert(i);
        }
        Self { origin: "curves".into(), rows, index }
    }

    fn get(&self, config: &Config) -> Option<&Curve> {
        self.index.get(&canonical(config)).map(|&i| &self.rows[i].1)
    }
}

/// A config's text with object keys sorted: equal configs, equal texts.
fn canonical(config: &Config) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(config, &mut out);
    out
}

impl std::fmt::Debug for Curves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = match &self.source {
            Source::Table(t) => Some(t.rows.len()),
            Source::Function(_) => None,
        };
        f.debug_struct("Curves").field("metric", &self.metric).field("table", &n).finish()
    }
}

/// A curves file that cannot be used: the file, the line, and why.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct CurvesError {
    /// The file.
    pub origin: String,
    /// What is wrong, with the line number.
    pub message: String,
}

/// Names a curve line may not give an attribute: the metric and what
/// every result carries already.
const RESERVED: [&str; 7] =
    ["config", "training_iteration", "time_total_s", "time_this_iter_s", "timestamp", "done", "iterations_since_restore"];

/// One line of a curves file: its config and curve, or what is wrong.
fn parse_line(line: &str, metric: &str) -> Result<(Config, Curve), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(fields) = v else { return Err("not a JSON object".into()) };
    let config = fields.get("config").filter(|c| c.is_object()).ok_or("`config` must be an object")?;
    let numbers = |key: &str, m: &Value| -> Result<Vec<f64>, String> {
        m.as_array()
            .and_then(|a| {
                a.iter()
                    .map(|m| match m {
                        Value::Number(x) => x.as_f64(),
                        Value::String(s) if s == "NaN" => Some(f64::NAN),
                        Value::Null => Some(f64::NAN),
                        _ => None,
                    })
                    .collect::<Option<Vec<f64>>>()
            })
            .ok_or_else(|| format!("`{key}` must be an array of numbers"))
    };
    let metrics = numbers("metrics", fields.get("metrics").unwrap_or(&Value::Null))?;
    if metrics.is_empty() {
        return Err("`metrics` is empty".into());
    }
    let spi = fields.get("seconds_per_iteration").map_or(Some(1.0), Value::as_f64);
    let spi = spi.filter(|s| *s > 0.0 && s.is_finite()).ok_or("`seconds_per_iteration` must be a positive number")?;
    let mut curve = Curve::new(metrics, spi);
    for (key, value) in &fields {
        if matches!(key.as_str(), "config" | "metrics" | "seconds_per_iteration") || !value.is_array() {
            continue;
        }
        let values = numbers(key, value)?;
        if values.len() != curve.metrics.len() {
            return Err(format!("`{key}` has {} values for {} points of `metrics`", values.len(), curve.metrics.len()));
        }
        if key == "seconds" {
            if values.iter().any(|s| !(*s >= 0.0 && s.is_finite())) {
                return Err("`seconds` must be 0 or more, and finite".into());
            }
            curve.seconds = values;
        } else if key == metric || RESERVED.contains(&key.as_str()) {
            return Err(format!("`{key}` cannot be a column: every result carries it already"));
        } else {
            curve.attrs.insert(key.clone(), values);
        }
    }
    Ok((config.clone(), curve))
}

impl Curves {
    /// Curves computed from each trial's config; `metric` names the values.
    pub fn from_fn<F>(metric: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Config) -> Curve + Send + Sync + 'static,
    {
        Self::with_source(metric.into(), Source::Function(Arc::new(f)))
    }

    /// Curves from a table of configs and their curves (each config once).
    pub fn from_table(metric: impl Into<String>, table: Vec<(Config, Curve)>) -> Self {
        Self::with_source(metric.into(), Source::Table(Arc::new(Table::new(table))))
    }

    fn with_source(metric: String, source: Source) -> Self {
        Self { metric, source, cost: None, spent: Arc::new(Mutex::new(0.0)) }
    }

    /// Counts compute in the attribute `name` (a cumulative value every
    /// curve reports at every point, such as `samples_seen`) rather than
    /// in iterations. A table's curves are checked: each must carry it,
    /// never decreasing.
    pub fn cost(mut self, name: impl Into<String>) -> Result<Self, CurvesError> {
        let name = name.into();
        if let Source::Table(t) = &self.source {
            for (config, curve) in &t.rows {
                let values = curve.attrs.get(&name).ok_or_else(|| CurvesError {
                    origin: t.origin.clone(),
                    message: format!("the curve of config {config} has no `{name}` (the cost attribute) column"),
                })?;
                if values.windows(2).any(|w| w[1] < w[0]) || values.iter().any(|v| !v.is_finite() || *v < 0.0) {
                    return Err(CurvesError {
                        origin: t.origin.clone(),
                        message: format!(
                            "`{name}` of config {config} is not a cumulative cost: it must be finite, 0 or more, and never decrease"
                        ),
                    });
                }
            }
        }
        self.cost = Some(name);
        Ok(self)
    }

    /// The attribute compute is counted in (none: iterations).
    pub fn cost_attr(&self) -> Option<&str> {
        self.cost.as_deref()
    }

    /// The same curves with a meter of their own, at zero.
    pub fn metered(&self) -> Self {
        Self { spent: Arc::new(Mutex::new(0.0)), ..self.clone() }
    }

    /// The compute the runs replayed so far have spent, in the cost
    /// attribute's units: each reported point adds what it cost over the
    /// point before it, so a trial resumed from a checkpoint pays again
    /// for what it trains again.
    pub fn spent(&self) -> f64 {
        *self.spent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn charge(&self, amount: f64) {
        *self.spent.lock().unwrap_or_else(|p| p.into_inner()) += amount;
    }

    /// The attribute names every curve of a table carries, sorted.
    pub fn attrs(&self) -> Vec<String> {
        match &self.source {
            Source::Table(t) => {
                let mut names: Vec<String> = t.rows.first().map(|(_, c)| c.attrs.keys().cloned().collect()).unwrap_or_default();
                names.retain(|n| t.rows.iter().all(|(_, c)| c.attrs.contains_key(n)));
                names
            }
            Source::Function(_) => Vec::new(),
        }
    }

    /// Where a table's curves end in `attr` (`training_iteration`: their
    /// length): the largest last value, or none for computed curves or an
    /// attribute some curve lacks.
    pub fn end(&self, attr: &str) -> Option<f64> {
        let Source::Table(t) = &self.source else { return None };
        t.rows
            .iter()
            .map(|(_, c)| match attr {
                "training_iteration" => Some(c.metrics.len() as f64),
                _ => c.attrs.get(attr).and_then(|v| v.last().copied()),
            })
            .try_fold(f64::NEG_INFINITY, |m, v| v.map(|v| m.max(v)))
    }

    /// How many points the curve of `config` has, and its last value (its
    /// final metric), if it has a curve.
    pub fn last_point(&self, config: &Config) -> Option<(u64, f64)> {
        self.with_curve(config, |c| (c.metrics.len() as u64, c.metrics.last().copied().unwrap_or(f64::NAN))).ok()
    }

    /// Curves from a JSON-lines file (see the module documentation),
    /// gzipped or not.
    pub fn from_jsonl(path: &Path, metric: impl Into<String>) -> Result<Self, CurvesError> {
        let origin = path.display().to_string();
        let cannot = |e: std::io::Error| CurvesError { origin: origin.clone(), message: format!("cannot read: {e}") };
        let bytes = std::fs::read(path).map_err(cannot)?;
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&bytes[..]), &mut text).map_err(cannot)?;
            text
        } else {
            String::from_utf8(bytes).map_err(|e| CurvesError { origin: origin.clone(), message: format!("not UTF-8 text: {e}") })?
        };
        Self::parse_jsonl(&text, &origin, metric)
    }

    /// Curves from JSON-lines text; `origin` names it in errors.
    pub fn parse_jsonl(text: &str, origin: &str, metric: impl Into<String>) -> Result<Self, CurvesError> {
        let metric = metric.into();
        let err = |line: usize, message: String| CurvesError { origin: origin.to_string(), message: format!("line {line}: {message}") };
        let mut table = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let (config, curve) = parse_line(line, &metric).map_err(|m| err(n, m))?;
            if !seen.insert(canonical(&config)) {
                return Err(err(n, format!("config {config} appears twice")));
            }
            table.push((config, curve));
        }
        if table.is_empty() {
            return Err(CurvesError { origin: origin.to_string(), message: "holds no curve".into() });
        }
        let mut table = Table::new(table);
        table.origin = origin.to_string();
        Ok(Self::with_source(metric, Source::Table(Arc::new(table))))
    }

    /// The metric the curves are values of.
    pub fn metric(&self) -> &str {
        &self.metric
    }

    /// The file's configs, when the curves come from one.
    pub fn configs(&self) -> Option<Vec<Config>> {
        match &self.source {
            Source::Table(t) => Some(t.rows.iter().map(|(c, _)| c.clone()).collect()),
            Source::Function(_) => None,
        }
    }

    fn curve(&self, config: &Config) -> Result<Curve, String> {
        self.with_curve(config, Curve::clone)
    }

    /// `f` of the curve of `config`, without copying a table's curve.
    fn with_curve<R>(&self, config: &Config, f: impl FnOnce(&Curve) -> R) -> Result<R, String> {
        // A repeat's index is no part of the configuration the curve belongs to.
        let stripped;
        let config = match config.get(search::TRIAL_INDEX) {
            Some(_) => {
                let mut c = config.clone();
                if let Value::Object(m) = &mut c {
                    m.remove(search::TRIAL_INDEX);
                }
                stripped = c;
                &stripped
            }
            None => config,
        };
        match &self.source {
            Source::Function(make) => Ok(f(&make(config))),
            Source::Table(t) => t.get(config).map(f).ok_or_else(|| format!("the curves file has no curve for config {config}")),
        }
    }
}

/// Picks among a curves file's configurations: a searcher over one
/// categorical parameter (the index of a line) whose suggestions are the
/// lines' configs themselves.
pub(crate) struct ArmSearcher<S> {
    inner: S,
    configs: Vec<Config>,
}

impl<S: Searcher> ArmSearcher<S> {
    pub(crate) const PARAM: &'static str = "curve";

    pub(crate) fn new(inner: S, configs: Vec<Config>) -> Self {
        Self { inner, configs }
    }

    fn arm(&self, config: &Config) -> Config {
        config.get(Self::PARAM).and_then(Value::as_u64).and_then(|i| self.configs.get(i as usize)).cloned().unwrap_or(Value::Null)
    }
}

impl<S: Searcher> Searcher for ArmSearcher<S> {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        match self.inner.suggest(trial_id) {
            Suggestion::Config(c) => Suggestion::Config(self.arm(&c)),
            other => other,
        }
    }
    fn on_trial_result(&mut self, trial_id: &str, result: &TrialResult) {
        self.inner.on_trial_result(trial_id, result)
    }
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        self.inner.on_trial_complete(trial_id, result, error)
    }
    fn on_trial_pause(&mut self, trial_id: &str) {
        self.inner.on_trial_pause(trial_id)
    }
    fn on_trial_resume(&mut self, trial_id: &str) {
        self.inner.on_trial_resume(trial_id)
    }
    fn total_trials(&self) -> Option<u64> {
        self.inner.total_trials()
    }
    fn save(&self) -> Value {
        self.inner.save()
    }
    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        self.inner.restore(state)
    }
}

/// A virtual time, ordered (never NaN: times are sums of positive finite steps).
#[derive(Debug, Clone, Copy)]
struct At(f64);
impl PartialEq for At {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for At {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

struct Run {
    trial_id: String,
    curve: Curve,
    /// The next iteration it reports.
    next: u64,
    /// Checkpoint every this many iterations (0: never).
    every: u64,
    events: mpsc::UnboundedSender<Event>,
    stop: watch::Receiver<StopLevel>,
}

#[derive(Default)]
struct Clock {
    now: f64,
    seq: u64,
    /// (time, order of scheduling, run): the next report of each live run.
    queue: BinaryHeap<Reverse<(At, u64, u64)>>,
    runs: HashMap<u64, Run>,
    next_run: u64,
    /// The report the Tuner is deciding on.
    waiting: Option<(u64, oneshot::Receiver<Directive>)>,
}

impl Clock {
    fn schedule(&mut self, run: u64, at: f64) {
        self.seq += 1;
        self.queue.push(Reverse((At(at), self.seq, run)));
    }

    fn exit(&mut self, run: u64, outcome: ExitOutcome) {
        if let Some(r) = self.runs.remove(&run) {
            let _ = r.events.send(Event { trial_id: r.trial_id, kind: EventKind::Exited(outcome) });
        }
    }
}

/// The simulation backend (see the module documentation).
pub struct SimBackend {
    curves: Curves,
    clock: Mutex<Clock>,
    /// Unix time at virtual time 0.
    unix_origin: f64,
}

impl SimBackend {
    /// A backend replaying `curves`.
    pub fn new(curves: Curves) -> Self {
        Self { curves, clock: Mutex::new(Clock::default()), unix_origin: crate::clock::now_unix() }
    }
}

impl Backend for SimBackend {
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let curve = self.curves.curve(&spec.config).map_err(LaunchError::Refused)?;
        let (handle, stop) = TrialHandle::detached();
        let mut clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let id = clock.next_run;
        clock.next_run += 1;
        let at = clock.now + curve.duration(spec.start_iteration + 1);
        let every = spec.checkpoint_frequency;
        let run = Run { trial_id: spec.trial_id, curve, next: spec.start_iteration + 1, every, events, stop };
        clock.runs.insert(id, run);
        clock.schedule(id, at);
        Ok(handle)
    }
}

impl crate::clock::Clock for SimBackend {
    fn now(&self) -> f64 {
        self.clock.lock().unwrap_or_else(|p| p.into_inner()).now
    }

    fn unix_now(&self) -> f64 {
        self.unix_origin + self.now()
    }

    fn is_virtual(&self) -> bool {
        true
    }

    fn idle(&self) {
        let mut clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut *clock;
        // Runs the Tuner stopped (Ctrl-C, a broken rule) end now.
        let stopped: Vec<u64> = c.runs.iter().filter(|(_, r)| *r.stop.borrow() > StopLevel::Run).map(|(&id, _)| id).collect();
        let mut acted = !stopped.is_empty();
        for id in stopped {
            c.exit(id, ExitOutcome::Stopped);
        }
        // The answer to the last report: go on, or end.
        if let Some((id, mut rx)) = c.waiting.take() {
            match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => {
                    c.waiting = Some((id, rx));
                    return;
                }
                Ok(Directive::Continue) => {
                    if let Some(r) = c.runs.get(&id) {
                        if r.next as usize > r.curve.metrics.len() {
                            c.exit(id, ExitOutcome::Completed);
                            acted = true;
                        } else {
                            let at = c.now + r.curve.duration(r.next);
                            c.schedule(id, at);
                        }
                    }
                }
                Ok(Directive::Stop) | Err(oneshot::error::TryRecvError::Closed) => {
                    acted |= c.runs.contains_key(&id);
                    c.exit(id, ExitOutcome::Stopped);
                }
            }
        }
        if acted {
            // Let the Tuner act on the ends (and start trials) at this time.
            return;
        }
        while let Some(Reverse((At(at), _, id))) = c.queue.pop() {
            let Some(r) = c.runs.get_mut(&id) else { continue };
            c.now = at;
            let iteration = r.next;
            if iteration as usize > r.curve.metrics.len() {
                // Resumed past the end of its curve: nothing left to report.
                c.exit(id, ExitOutcome::Completed);
                return;
            }
            r.next += 1;
            let value = r.curve.metrics.get(iteration as usize - 1).copied().unwrap_or(f64::NAN);
            let mut metrics = BTreeMap::from([(self.curves.metric.clone(), value)]);
            for (name, values) in &r.curve.attrs {
                metrics.insert(name.clone(), values.get(iteration as usize - 1).copied().unwrap_or(f64::NAN));
            }
            let cost = self.curves.cost_attr();
            self.curves.charge(r.curve.cost_at(cost, iteration) - r.curve.cost_at(cost, iteration - 1));
            let (reply, rx) = Reply::channel();
            let report = Report {
                rank: 0,
                training_iteration: iteration,
                metrics,
                extra: None,
                rank_metrics: Vec::new(),
                checkpoint: (r.every > 0 && iteration.is_multiple_of(r.every)).then(|| CheckpointRef {
                    uri: format!("sim://{}/checkpoint_{iteration:06}", r.trial_id),
                    ranks: vec![0],
                    world_size: 1,
                }),
            };
            let _ = r.events.send(Event { trial_id: r.trial_id.clone(), kind: EventKind::Report { report, reply } });
            c.waiting = Some((id, rx));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The simulator under the backend conformance suite: one rank
    /// replaying its curve; it neither fails nor hangs.
    struct Simulated(Arc<SimBackend>);

    impl trainer::conformance::Subject for Simulated {
        fn backend(&self) -> Arc<dyn Backend> {
            self.0.clone()
        }

        fn spec(&self, trial_id: &str, case: &trainer::conformance::Case, dir: &std::path::Path) -> LaunchSpec {
            LaunchSpec::new(trial_id, serde_json::json!({ "steps": case.steps }), dir.join(trial_id))
        }

        fn supports(&self, case: &trainer::conformance::Case) -> bool {
            case.world_size == 1 && case.behaviour == trainer::conformance::Behaviour::Complete
        }

        fn idle(&self) {
            crate::clock::Clock::idle(&*self.0);
        }
    }

    #[tokio::test]
    async fn the_simulator_passes_the_backend_conformance_suite() {
        let curves = Curves::from_fn("loss", |c| Curve {
            metrics: (1..=c["steps"].as_u64().unwrap_or(1)).map(|i| 1.0 / i as f64).collect(),
            ..Default::default()
        });
        let dir = tempfile::tempdir().unwrap();
        trainer::conformance::check(&Simulated(Arc::new(SimBackend::new(curves))), dir.path()).await;
    }

    use super::*;

    #[test]
    fn curves_files_are_checked_line_by_line() {
        let ok = "{\"config\": {\"lr\": 0.1}, \"metrics\": [3, 2, 1], \"seconds_per_iteration\": 2}\n\n{\"config\": {\"lr\": 0.2}, \"metrics\": [1, null]}\n";
        let c = Curves::parse_jsonl(ok, "c.jsonl", "loss").unwrap();
        assert_eq!(c.configs().unwrap().len(), 2);
        let second = c.curve(&serde_json::json!({"lr": 0.2})).unwrap();
        assert_eq!(second.seconds_per_iteration, 1.0);
        assert!(second.metrics[1].is_nan());
        assert!(c.curve(&serde_json::json!({"lr": 0.3})).unwrap_err().contains("no curve for config"));
        let bad = |text: &str| Curves::parse_jsonl(text, "c.jsonl", "loss").unwrap_err().to_string();
        assert_eq!(bad("{\"config\": 1, \"metrics\": [1]}"), "c.jsonl: line 1: `config` must be an object");
        assert!(bad("{\"config\": {}, \"metrics\": [1]}\n{\"config\": {}, \"metrics\": [\"x\"]}").starts_with("c.jsonl: line 2: `metrics`"));
        assert!(bad("{\"config\": {}, \"metrics\": [1], \"seconds_per_iteration\": 0}").contains("seconds_per_iteration"));
        assert!(bad("{\"config\": {}, \"metrics\": [1]}\n{\"config\": {}, \"metrics\": [2]}").contains("appears twice"));
        assert_eq!(bad(""), "c.jsonl: holds no curve");
        assert!(bad("nope").starts_with("c.jsonl: line 1: not JSON"));
    }

    #[test]
    fn a_curve_is_found_by_its_config_whatever_the_key_order() {
        let mut a = serde_json::Map::new();
        a.insert("b".into(), serde_json::json!({"y": 1, "x": [1.5, "s"]}));
        a.insert("a".into(), serde_json::json!(2));
        let mut b = serde_json::Map::new();
        b.insert("a".into(), serde_json::json!(2));
        b.insert("b".into(), serde_json::json!({"x": [1.5, "s"], "y": 1}));
        assert_eq!(canonical(&Value::Object(a.clone())), canonical(&Value::Object(b.clone())));
        // 2 and 2.0 are different configs, as they are different JSON values.
        assert_ne!(canonical(&serde_json::json!({"a": 2})), canonical(&serde_json::json!({"a": 2.0})));
        let curve = Curve::new(vec![1.0], 1.0);
        let table = Table::new(vec![(Value::Object(a), curve.clone())]);
        assert_eq!(table.get(&Value::Object(b)), Some(&curve));
        assert_eq!(table.get(&serde_json::json!({"a": 2})), None);
    }
}
