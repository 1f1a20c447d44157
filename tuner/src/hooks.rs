//! Python code a sweep calls: Ray's `tune.Callback`s, a stop function or
//! `Stopper`, and PBT's callable mutations and `custom_explore_fn`. The
//! user's objects stay in the user's process: the Python driver serves them
//! over three pipes it hands the binary (`NESTOR_HOOKS=<events>,<requests>,<replies>`,
//! file descriptors open in this process), and the loop stays here.
//!
//! - Events (one way, JSON lines): every event of the durable stream, fed
//!   to the callbacks by an [`Isolated`](crate::callback) consumer, so a
//!   callback never slows the loop: one that falls behind or hangs past its
//!   deadline is cut off and the sweep goes on. Results are written in
//!   batches (at most half a second late: a status tick flushes them).
//! - Requests (JSON lines, one reply each, in order): a stop after a result,
//!   an explore step. The loop waits for the answer (it decides with it); a
//!   driver that does not answer within [`REPLY_TIMEOUT`] is taken as "no
//!   change", logged once, and asked no more.
//!
//! The experiment file's `[python]` section says which hooks the sweep
//! has; a sweep that has some runs (or resumes) only where the channel is.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use schedulers::Stopper;
use search::TrialResult;

use crate::callback::{Callback, CallbackError, Event};

/// How long the loop waits for the driver to answer a request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// `[python]`: the Python hooks a sweep has (the Python driver writes it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonHooks {
    /// The `tune.Callback`s fed every event, by name (for messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callbacks: Vec<String>,
    /// A stop function or `Stopper`, asked after every result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop: bool,
    /// PBT's explore step runs Python: callable `hyperparam_mutations`, `custom_explore_fn`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explore: bool,
    /// Values of each new config computed by Python (`tune.sample_from`), after the searcher's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sample: bool,
    /// The searcher is the driver's (`OptunaSearch(space=fn)`: Optuna's define-by-run study).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub search: bool,
    /// Seconds a callback may take over one event before it is cut off (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_deadline_s: Option<f64>,
    /// Keep every rank's metrics with each result (`rank_metrics` beside its
    /// other values): a Ray Train `UserCallback` is given them all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rank_metrics: bool,
}

impl PythonHooks {
    /// Whether the sweep has no Python hook.
    pub fn is_empty(&self) -> bool {
        self.callbacks.is_empty() && !self.stop && !self.explore && !self.sample && !self.search
    }

    /// What the hooks are, for an error message.
    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if !self.callbacks.is_empty() {
            what.push(format!("callbacks {}", self.callbacks.join(", ")));
        }
        if self.stop {
            what.push("a stop function".to_string());
        }
        if self.explore {
            what.push("PBT's Python mutations".to_string());
        }
        if self.sample {
            what.push("tune.sample_from functions".to_string());
        }
        if self.search {
            what.push("a define-by-run search".to_string());
        }
        what.join(", ")
    }
}

/// The pipes to the Python driver.
#[derive(Debug)]
pub struct Channel {
    events: Mutex<Option<File>>,
    requests: Arc<Requests>,
}

#[derive(Debug)]
struct Requests {
    io: Mutex<Option<(File, BufReader<File>)>>,
    /// A request went unanswered: nobody asks again (its answer would be taken for the next one's).
    dead: std::sync::atomic::AtomicBool,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The driver's pipes are gone or broke.
    #[error("the Python driver's hooks channel is closed: {0}")]
    Closed(String),
    /// The driver did not answer in time.
    #[error("the Python driver did not answer within {0:?}")]
    Timeout(Duration),
    /// The Python code raised, or the answer is not what was asked.
    #[error("{0}")]
    Failed(String),
}

impl Channel {
    /// The channel the environment names (`NESTOR_HOOKS`), taken once per
    /// process; `None` when there is none.
    pub fn from_env() -> Result<Option<Arc<Channel>>, String> {
        static TAKEN: std::sync::OnceLock<Result<Option<Arc<Channel>>, String>> = std::sync::OnceLock::new();
        TAKEN.get_or_init(|| Self::open(std::env::var("NESTOR_HOOKS").ok().as_deref())).clone()
    }

    fn open(spec: Option<&str>) -> Result<Option<Arc<Channel>>, String> {
        let Some(spec) = spec.filter(|s| !s.is_empty()) else { return Ok(None) };
        let fds: Vec<i32> =
            spec.split(',').map(|s| s.trim().parse::<i32>()).collect::<Result<_, _>>().map_err(|e| format!("NESTOR_HOOKS={spec}: {e}"))?;
        let [events, requests, replies] = fds[..] else {
            return Err(format!("NESTOR_HOOKS={spec}: give three file descriptors (events, requests, replies)"));
        };
        let (events, requests, replies) = (take_fd(events)?, take_fd(requests)?, take_fd(replies)?);
        Ok(Some(Arc::new(Channel {
            events: Mutex::new(Some(events)),
            requests: Arc::new(Requests {
                io: Mutex::new(Some((requests, BufReader::new(replies)))),
                dead: std::sync::atomic::AtomicBool::new(false),
            }),
        })))
    }

    /// The consumer that writes every event to the driver (once: the events pipe goes with it).
    pub fn callback(&self, names: &[String]) -> Option<Box<dyn Callback>> {
        let out = self.events.lock().ok()?.take()?;
        Some(Box::new(PythonCallbacks { out: std::io::BufWriter::new(out), name: format!("Python callbacks ({})", names.join(", ")) }))
    }

    /// Asks the driver `request` and waits for its answer.
    pub fn call(&self, request: Value) -> Result<Value, HookError> {
        use std::sync::atomic::Ordering;
        if self.requests.dead.load(Ordering::Acquire) {
            return Err(HookError::Closed("an earlier request went unanswered".into()));
        }
        let requests = Arc::clone(&self.requests);
        let (tx, rx) = mpsc::sync_channel(1);
        // The exchange runs on a thread of its own, so a driver that never answers costs a timeout, not the sweep.
        let spawned = std::thread::Builder::new().name("nestor-hook".into()).spawn(move || {
            let _ = tx.send(requests.exchange(&request));
        });
        if let Err(e) = spawned {
            return Err(HookError::Closed(e.to_string()));
        }
        match rx.recv_timeout(REPLY_TIMEOUT) {
            Ok(answer) => answer,
            Err(_) => {
                self.requests.dead.store(true, Ordering::Release);
                Err(HookError::Timeout(REPLY_TIMEOUT))
            }
        }
    }
}

impl Requests {
    fn exchange(&self, request: &Value) -> Result<Value, HookError> {
        let mut guard = self.io.lock().map_err(|_| HookError::Closed("poisoned".into()))?;
        let Some((out, replies)) = guard.as_mut() else { return Err(HookError::Closed("an earlier request timed out".into())) };
        let mut line = serde_json::to_vec(request).map_err(|e| HookError::Failed(e.to_string()))?;
        line.push(b'\n');
        let mut answer = String::new();
        let io = out.write_all(&line).and_then(|()| out.flush()).and_then(|()| replies.read_line(&mut answer));
        match io {
            Ok(0) => {
                guard.take();
                Err(HookError::Closed("end of file".into()))
            }
            Ok(_) => {
                let v: Value = serde_json::from_str(&answer).map_err(|e| HookError::Failed(format!("a reply that is not JSON: {e}")))?;
                match v.get("error").and_then(Value::as_str) {
                    Some(err) => Err(HookError::Failed(err.to_string())),
                    None => Ok(v),
                }
            }
            Err(e) => {
                guard.take();
                Err(HookError::Closed(e.to_string()))
            }
        }
    }
}

/// Owns the open file descriptor `fd`, closed on exec (the trials' processes do not inherit it).
fn take_fd(fd: i32) -> Result<File, String> {
    trainer::take_inherited_fd(fd, "NESTOR_HOOKS").map(File::from)
}

/// The event stream, written to the driver as JSON lines.
struct PythonCallbacks {
    out: std::io::BufWriter<File>,
    name: String,
}

impl Callback for PythonCallbacks {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        let Some(v) = event_json(event) else { return Ok(()) };
        serde_json::to_writer(&mut self.out, &v)?;
        self.out.write_all(b"\n")?;
        // Results go out in batches (the buffer's size, or at the next other
        // event: a status tick comes twice a second); the rest at once.
        if !matches!(event, Event::Result(_)) {
            self.out.flush()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), CallbackError> {
        self.out.flush()?;
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// An event as the driver's callbacks read it: `events.jsonl`'s line, and
/// results and status ticks, which that file leaves to files of their own.
fn event_json(event: &Event) -> Option<Value> {
    match event {
        Event::Result(r) => Some(json!({"event": "result", "trial_id": r.trial_id, "result": result_json(r)})),
        Event::Status(s) => Some(json!({"event": "status", "running": s.running.len()})),
        other => other.to_json(),
    }
}

/// A result as Ray's callbacks and stoppers get it: its metrics, its other
/// values, `training_iteration`, `trial_id`, `done`.
pub(crate) fn result_json(r: &TrialResult) -> Value {
    let mut m = search::metrics_serde::to_json(&r.metrics);
    if let (Some(obj), Some(Value::Object(extra))) = (m.as_object_mut(), &r.extra) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    if let Some(obj) = m.as_object_mut() {
        obj.insert("training_iteration".into(), json!(r.training_iteration));
        obj.insert("trial_id".into(), json!(r.trial_id));
        obj.entry("done").or_insert(json!(false));
        if let Some(c) = &r.checkpoint {
            obj.insert("checkpoint".into(), json!(c));
        }
    }
    m
}

/// A stop function or `Stopper` of the driver's: asked after every result
/// (`stop_all` comes with the same answer).
pub(crate) struct PythonStopper {
    channel: Arc<Channel>,
    stop_all: bool,
    failed: bool,
}

impl PythonStopper {
    pub(crate) fn new(channel: Arc<Channel>) -> Self {
        Self { channel, stop_all: false, failed: false }
    }
}

impl Stopper for PythonStopper {
    fn should_stop_trial(&mut self, trial_id: &str, result: &TrialResult) -> bool {
        if self.failed {
            return false;
        }
        match self.channel.call(json!({"hook": "stop", "trial_id": trial_id, "result": result_json(result)})) {
            Ok(v) => {
                self.stop_all |= v.get("stop_all").and_then(Value::as_bool).unwrap_or(false);
                v.get("stop").and_then(Value::as_bool).unwrap_or(false)
            }
            Err(HookError::Failed(msg)) => {
                tracing::warn!(trial = trial_id, "the stop function raised (the trial goes on): {msg}");
                false
            }
            Err(e) => {
                tracing::error!("the stop function is not asked any more: {e}");
                self.failed = true;
                false
            }
        }
    }

    fn should_stop_all(&mut self) -> bool {
        self.stop_all
    }
}

/// Gives the PBT scheduler (itself, or the base of a resource-changing one)
/// the driver's explore step; `false` when there is no PBT to give it to.
pub(crate) fn give_explore(scheduler: &mut schedulers::SchedulerConfig, channel: &Arc<Channel>) -> bool {
    match scheduler {
        schedulers::SchedulerConfig::Pbt(c) => {
            let settings = json!({"resample_probability": c.resample_probability, "perturbation_factors": c.perturbation_factors});
            c.custom_explore = Some(schedulers::CustomExplore::new(explore(Arc::clone(channel), settings)));
            true
        }
        schedulers::SchedulerConfig::ResourceChanging(r) => give_explore(&mut r.base, channel),
        _ => false,
    }
}

/// PBT's explore step in Python: the explored config, with a seed drawn
/// from the perturbation's generator (so the draws are the same again) and
/// the scheduler's `settings` the step needs (resample probability, factors).
fn explore(channel: Arc<Channel>, settings: Value) -> impl Fn(&mut search::Config, &mut dyn rand::RngCore) + Send + Sync + 'static {
    move |config: &mut search::Config, rng: &mut dyn rand::RngCore| {
        let seed = rng.next_u64() >> 11;
        let mut request = json!({"hook": "explore", "config": config, "seed": seed});
        if let (Some(r), Some(s)) = (request.as_object_mut(), settings.as_object()) {
            r.extend(s.clone());
        }
        match channel.call(request) {
            Ok(v) => match v.get("config") {
                Some(new @ Value::Object(_)) => *config = new.clone(),
                _ => tracing::warn!("the Python explore step answered no config: {v}"),
            },
            Err(e) => tracing::warn!("the Python explore step failed (the built-in one stands): {e}"),
        }
    }
}

/// A searcher whose suggestions the driver completes: the values of
/// `tune.sample_from` functions, computed from the rest of the config (Ray's
/// `spec.config`), with Python's generators seeded by the experiment's seed
/// and the trial's id. Everything else passes through: the searcher learns
/// from the parameters it sampled, and its state is its own.
pub(crate) struct PythonSampled {
    inner: Box<dyn search::Searcher>,
    channel: Arc<Channel>,
    seed: u64,
}

impl PythonSampled {
    pub(crate) fn new(inner: Box<dyn search::Searcher>, channel: Arc<Channel>, seed: u64) -> Self {
        Self { inner, channel, seed }
    }
}

impl search::Searcher for PythonSampled {
    fn suggest(&mut self, trial_id: &str) -> search::Suggestion {
        match self.inner.suggest(trial_id) {
            search::Suggestion::Config(config) => {
                // FNV-1a of the trial's id: its own draws, the same on every run of the sweep.
                let id_hash = trial_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
                let seed = (self.seed ^ id_hash) >> 11;
                match self.channel.call(json!({"hook": "sample", "trial_id": trial_id, "config": config, "seed": seed})) {
                    Ok(v) => match v.get("config") {
                        Some(c @ Value::Object(_)) => search::Suggestion::Config(c.clone()),
                        _ => {
                            tracing::error!(trial = trial_id, "tune.sample_from answered no config: {v}");
                            search::Suggestion::Config(config)
                        }
                    },
                    Err(e) => {
                        // A config without its sample_from values would run silently wrong: none is made.
                        tracing::error!(trial = trial_id, "tune.sample_from failed, no more trials start: {e}");
                        search::Suggestion::Finished
                    }
                }
            }
            other => other,
        }
    }
    fn on_trial_result(&mut self, trial_id: &str, result: &TrialResult) {
        self.inner.on_trial_result(trial_id, result);
    }
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        self.inner.on_trial_complete(trial_id, result, error);
    }
    fn on_trial_pause(&mut self, trial_id: &str) {
        self.inner.on_trial_pause(trial_id);
    }
    fn on_trial_resume(&mut self, trial_id: &str) {
        self.inner.on_trial_resume(trial_id);
    }
    fn total_trials(&self) -> Option<u64> {
        self.inner.total_trials()
    }
    fn save(&self) -> Value {
        self.inner.save()
    }
    fn restore(&mut self, state: &Value) -> Result<(), search::SearchError> {
        self.inner.restore(state)
    }
}

/// The driver's searcher (Optuna's define-by-run study): suggestions
/// and trial ends go to it; its state is the driver's (saved beside the
/// experiment after each, and restored by `Tuner.restore`).
pub(crate) struct PythonSearcher {
    channel: Arc<Channel>,
}

impl PythonSearcher {
    pub(crate) fn new(channel: Arc<Channel>) -> Self {
        Self { channel }
    }
}

impl search::Searcher for PythonSearcher {
    fn suggest(&mut self, trial_id: &str) -> search::Suggestion {
        match self.channel.call(json!({"hook": "suggest", "trial_id": trial_id})) {
            Ok(v) => match v.get("config") {
                Some(c @ Value::Object(_)) => search::Suggestion::Config(c.clone()),
                _ => search::Suggestion::Finished,
            },
            Err(e) => {
                tracing::error!(trial = trial_id, "the define-by-run search failed, no more trials start: {e}");
                search::Suggestion::Finished
            }
        }
    }
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        let result = result.map(result_json);
        if let Err(e) = self.channel.call(json!({"hook": "complete", "trial_id": trial_id, "result": result, "error": error})) {
            tracing::warn!(trial = trial_id, "the define-by-run search did not take the trial's end: {e}");
        }
    }
    fn save(&self) -> Value {
        json!({"version": 1, "kind": "python"})
    }
    fn restore(&mut self, _state: &Value) -> Result<(), search::SearchError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_channel_is_refused_naming_the_variable() {
        assert!(Channel::open(None).unwrap().is_none());
        assert!(Channel::open(Some("")).unwrap().is_none());
        assert!(Channel::open(Some("a,b,c")).unwrap_err().contains("NESTOR_HOOKS=a,b,c"));
        assert!(Channel::open(Some("7,8")).unwrap_err().contains("three file descriptors"));
        assert!(Channel::open(Some("900,901,902")).unwrap_err().contains("900 is not open"));
    }

    #[test]
    fn results_carry_their_metrics_extras_and_iteration() {
        let r = TrialResult {
            trial_id: "t".into(),
            seq: 0,
            training_iteration: 3,
            metrics: [("loss".to_string(), f64::NAN)].into_iter().collect(),
            checkpoint: Some("/c".into()),
            extra: Some(json!({"phase": "warm", "done": true})),
        };
        let v = result_json(&r);
        assert_eq!(v["loss"], "NaN");
        assert_eq!((v["phase"].as_str(), v["done"].as_bool(), v["training_iteration"].as_u64()), (Some("warm"), Some(true), Some(3)));
        assert_eq!(v["checkpoint"], "/c");
    }
}
