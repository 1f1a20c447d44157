//! The MLflow logger: one MLflow run per trial, under a parent run for the
//! sweep, through MLflow's REST API (Ray Tune's `MLflowLoggerCallback`).
//!
//! A trial's run gets its config as params when it starts, every numeric
//! metric of every durable result with its step (`training_iteration`),
//! its state as the tag `nestor.state`, and MLflow's status at its end
//! (FINISHED, FAILED, or KILLED when the sweep stopped it). MLflow's params
//! cannot change, so a PBT exploit logs the new values of numeric
//! hyperparameters as `config/<key>` metrics at the iteration it took
//! effect (and the whole new config as a tag), where Ray's callback fails
//! with "Changing param values is not allowed".
//!
//! Calls are made twice a second (at each status tick), at a trial's end
//! and at the close, from the callback's own thread. When the server does
//! not answer, what is not yet sent waits for the next try; the trial to
//! run mapping is kept in `<experiment>/mlflow.json`, so a resumed sweep
//! logs into the same runs.
// Built without the `mlflow` feature, only the settings parse (and refuse to run).
#![cfg_attr(not(feature = "mlflow"), allow(unused_imports, dead_code))]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use search::TrialResult;

use super::{Callback, CallbackError, Event};
use crate::store::TrialRecord;

/// `[[callbacks]] type = "mlflow"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlflowConfig {
    /// The tracking server (`http://host:5000`); else `MLFLOW_TRACKING_URI`.
    /// No credentials here (the file is kept with the experiment): MLflow's
    /// own `MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD` or
    /// `MLFLOW_TRACKING_TOKEN` are read from the environment instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_uri: Option<String>,
    /// The MLflow experiment the runs go to (made if missing); else the
    /// sweep's `experiment.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment_name: Option<String>,
    /// Tags put on every run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// MLflow's limits on one `log-batch` call.
const MAX_METRICS: usize = 1000;
const MAX_PARAMS: usize = 100;

/// Points kept for a server that does not answer, before the oldest go.
const MAX_PENDING: usize = 1_000_000;

/// What is left to tell the server, in order.
#[derive(Debug)]
enum Op {
    Start { trial: String, config: Value, at: f64 },
    Exploit { trial: String, config: Value, iteration: u64, donor: String, at: f64 },
    End { trial: String, state: &'static str, status: &'static str, at: f64 },
    Finish { status: &'static str, at: f64 },
}

#[cfg(feature = "mlflow")]
/// What `<experiment>/mlflow.json` keeps.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Runs {
    tracking_uri: String,
    experiment_id: String,
    parent_run_id: String,
    runs: BTreeMap<String, String>,
}

#[cfg(feature = "mlflow")]
/// Logs a sweep's trials to an MLflow tracking server.
pub struct MlflowLogger {
    exp_dir: PathBuf,
    /// The server, without credentials: what requests go to and messages show.
    uri: String,
    auth: Auth,
    experiment_name: String,
    tags: BTreeMap<String, String>,
    runtime: Option<tokio::runtime::Runtime>,
    client: reqwest::Client,
    state: Runs,
    ops: VecDeque<Op>,
    /// Metrics not yet sent, per trial.
    metrics: HashMap<String, Vec<Value>>,
    pending_points: usize,
}

#[cfg(feature = "mlflow")]
impl MlflowLogger {
    /// A logger for the experiment at `exp_dir` (named `name`).
    pub fn new(exp_dir: impl Into<PathBuf>, name: &str, config: &MlflowConfig) -> Result<Self, String> {
        if let Some(given) = &config.tracking_uri {
            if crate::text::split_userinfo(given).1.is_some() {
                return Err(format!(
                    "tracking_uri: {:?} carries credentials, which would be written with the experiment; \
                     set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment instead",
                    crate::text::redact_url(given)
                ));
            }
        }
        let given = config
            .tracking_uri
            .clone()
            .or_else(|| std::env::var("MLFLOW_TRACKING_URI").ok())
            .ok_or("tracking_uri: required (or set MLFLOW_TRACKING_URI)")?;
        if !(given.starts_with("http://") || given.starts_with("https://")) {
            return Err(format!("tracking_uri: {:?} is not an http(s) URL of a tracking server", crate::text::redact_url(&given)));
        }
        let (uri, userinfo) = crate::text::split_userinfo(&given);
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let auth = match (env("MLFLOW_TRACKING_TOKEN"), env("MLFLOW_TRACKING_USERNAME"), userinfo) {
            (Some(token), _, _) => Auth::Bearer(token),
            (None, Some(user), _) => Auth::Basic(user, env("MLFLOW_TRACKING_PASSWORD")),
            (None, None, Some((user, password))) => Auth::Basic(user, password),
            (None, None, None) => Auth::None,
        };
        let exp_dir = exp_dir.into();
        let experiment_name = config.experiment_name.clone().unwrap_or_else(|| name.to_string());
        trainer::tls::install_crypto();
        let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build().map_err(|e| e.to_string())?;
        let uri = uri.trim_end_matches('/').to_string();
        let state = std::fs::read(exp_dir.join(FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<Runs>(&b).ok())
            .filter(|r| r.tracking_uri == uri)
            .unwrap_or_default();
        Ok(Self {
            exp_dir,
            uri,
            auth,
            experiment_name,
            tags: config.tags.clone(),
            runtime: None,
            client,
            state,
            ops: VecDeque::new(),
            metrics: HashMap::new(),
            pending_points: 0,
        })
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.uri);
        let resp = self
            .auth
            .apply(self.client.post(&url))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("{url}: {}", e.without_url()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("{url}: {}", e.without_url()))?;
        if !status.is_success() {
            return Err(format!("{url}: {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))
    }

    async fn experiment_id(&self) -> Result<String, String> {
        let url = format!("{}/api/2.0/mlflow/experiments/get-by-name", self.uri);
        let with_name =
            reqwest::Url::parse_with_params(&url, [("experiment_name", &self.experiment_name)]).map_err(|e| format!("{url}: {e}"))?;
        let resp = self.auth.apply(self.client.get(with_name)).send().await.map_err(|e| format!("{url}: {}", e.without_url()))?;
        if resp.status().is_success() {
            let text = resp.text().await.map_err(|e| format!("{url}: {}", e.without_url()))?;
            let v: Value = serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))?;
            return v["experiment"]["experiment_id"].as_str().map(String::from).ok_or_else(|| format!("{url}: no experiment_id in {v}"));
        }
        let v = self.call("experiments/create", json!({"name": self.experiment_name})).await?;
        v["experiment_id"].as_str().map(String::from).ok_or_else(|| format!("experiments/create: no experiment_id in {v}"))
    }

    async fn create_run(&self, name: &str, parent: Option<&str>, trial: Option<&str>, at: f64) -> Result<String, String> {
        let mut tags: Vec<Value> = self.tags.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
        tags.push(json!({"key": "mlflow.runName", "value": name}));
        tags.push(json!({"key": "nestor.experiment_dir", "value": self.exp_dir.display().to_string()}));
        if let Some(p) = parent {
            tags.push(json!({"key": "mlflow.parentRunId", "value": p}));
        }
        if let Some(t) = trial {
            tags.push(json!({"key": "nestor.trial_id", "value": t}));
        }
        let body = json!({"experiment_id": self.state.experiment_id, "run_name": name, "start_time": ms(at), "tags": tags});
        let v = self.call("runs/create", body).await?;
        v["run"]["info"]["run_id"].as_str().map(String::from).ok_or_else(|| format!("runs/create: no run_id in {v}"))
    }

    async fn log_batch(&self, run_id: &str, metrics: &[Value], params: &[Value], tags: &[Value]) -> Result<(), String> {
        for chunk in metrics.chunks(MAX_METRICS) {
            self.call("runs/log-batch", json!({"run_id": run_id, "metrics": chunk})).await?;
        }
        for chunk in params.chunks(MAX_PARAMS) {
            self.call("runs/log-batch", json!({"run_id": run_id, "params": chunk})).await?;
        }
        for chunk in tags.chunks(MAX_PARAMS) {
            self.call("runs/log-batch", json!({"run_id": run_id, "tags": chunk})).await?;
        }
        Ok(())
    }

    async fn update(&self, run_id: &str, status: &str, at: Option<f64>) -> Result<(), String> {
        let mut body = json!({"run_id": run_id, "status": status});
        if let Some(at) = at {
            body["end_time"] = json!(ms(at));
        }
        self.call("runs/update", body).await.map(|_| ())
    }

    /// The experiment and the sweep's parent run, once.
    async fn setup(&mut self) -> Result<(), String> {
        if self.state.experiment_id.is_empty() {
            self.state.experiment_id = self.experiment_id().await?;
        }
        if self.state.parent_run_id.is_empty() {
            let name = self.exp_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            self.state.parent_run_id = self.create_run(&name, None, None, crate::clock::now_unix()).await?;
            self.state.tracking_uri = self.uri.clone();
            self.save();
        } else {
            self.update(&self.state.parent_run_id, "RUNNING", None).await?;
        }
        Ok(())
    }

    fn save(&self) {
        if let Ok(text) = serde_json::to_vec_pretty(&self.state) {
            let tmp = self.exp_dir.join(format!("{FILE}.tmp"));
            if std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, self.exp_dir.join(FILE))).is_err() {
                tracing::warn!("could not write {}", self.exp_dir.join(FILE).display());
            }
        }
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Start { trial, config, at } => {
                if let Some(run) = self.state.runs.get(trial) {
                    // A run of it again (a restart, a resume): the same MLflow run.
                    self.update(run, "RUNNING", None).await?;
                    return self.log_batch(run, &[], &[], &[tag("nestor.state", "RUNNING")]).await;
                }
                let run = self.create_run(trial, Some(&self.state.parent_run_id.clone()), Some(trial), *at).await?;
                let params: Vec<Value> = flatten(config).into_iter().map(|(k, v)| json!({"key": k, "value": truncate(&v, 6000)})).collect();
                self.log_batch(&run, &[], &params, &[tag("nestor.state", "RUNNING")]).await?;
                self.state.runs.insert(trial.clone(), run);
                self.save();
            }
            Op::Exploit { trial, config, iteration, donor, at } => {
                let Some(run) = self.state.runs.get(trial).cloned() else { return Ok(()) };
                let metrics: Vec<Value> = flatten(config)
                    .into_iter()
                    .filter_map(|(k, v)| {
                        let x: f64 = v.parse().ok()?;
                        Some(json!({"key": format!("config/{k}"), "value": x, "timestamp": ms(*at), "step": iteration}))
                    })
                    .collect();
                let tags = [
                    tag("nestor.config", &truncate(&config.to_string(), 5000)),
                    tag("nestor.last_exploit", &format!("{donor} at {iteration}")),
                ];
                self.log_batch(&run, &metrics, &[], &tags).await?;
            }
            Op::End { trial, state, status, at } => {
                let Some(run) = self.state.runs.get(trial).cloned() else { return Ok(()) };
                self.send_metrics(trial).await?;
                self.log_batch(&run, &[], &[], &[tag("nestor.state", state)]).await?;
                self.update(&run, status, (*status != "RUNNING").then_some(*at)).await?;
            }
            Op::Finish { status, at } => {
                self.update(&self.state.parent_run_id, status, Some(*at)).await?;
            }
        }
        Ok(())
    }

    async fn send_metrics(&mut self, trial: &str) -> Result<(), String> {
        let Some(run) = self.state.runs.get(trial).cloned() else { return Ok(()) };
        let Some(points) = self.metrics.remove(trial) else { return Ok(()) };
        let n = points.len();
        if let Err(e) = self.log_batch(&run, &points, &[], &[]).await {
            self.metrics.insert(trial.to_string(), points);
            return Err(e);
        }
        self.pending_points -= n;
        Ok(())
    }

    /// Tells the server what is queued, in order; stops at the first call that fails.
    async fn flush_async(&mut self) -> Result<(), String> {
        if self.state.parent_run_id.is_empty() || self.state.experiment_id.is_empty() {
            self.setup().await?;
        }
        while let Some(op) = self.ops.pop_front() {
            if let Err(e) = self.apply(&op).await {
                self.ops.push_front(op);
                return Err(e);
            }
        }
        let trials: Vec<String> = self.metrics.keys().cloned().collect();
        for t in trials {
            self.send_metrics(&t).await?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), CallbackError> {
        if self.ops.is_empty() && self.metrics.is_empty() && !self.state.parent_run_id.is_empty() {
            return Ok(());
        }
        if self.runtime.is_none() {
            self.runtime = Some(tokio::runtime::Builder::new_current_thread().enable_all().build()?);
        }
        let runtime = self.runtime.take().ok_or("no runtime")?;
        let outcome = runtime.block_on(self.flush_async());
        self.runtime = Some(runtime);
        outcome.map_err(Into::into)
    }

    fn result(&mut self, r: &TrialResult) {
        let at = r.metrics.get("timestamp").copied().unwrap_or_else(crate::clock::now_unix);
        let points = self.metrics.entry(r.trial_id.clone()).or_default();
        for (k, v) in &r.metrics {
            if v.is_finite() && !matches!(k.as_str(), "training_iteration" | "timestamp") {
                points.push(json!({"key": k, "value": v, "timestamp": ms(at), "step": r.training_iteration}));
                self.pending_points += 1;
            }
        }
        if self.pending_points > MAX_PENDING {
            // The server has not answered for long: the oldest points go, so memory stays bounded.
            if let Some(biggest) = self.metrics.values_mut().max_by_key(|v| v.len()) {
                let drop = biggest.len() / 2;
                biggest.drain(..drop);
                self.pending_points -= drop;
                tracing::warn!("mlflow: the server at {} has not taken results for long; {drop} points dropped", self.uri);
            }
        }
    }

    fn ended(&mut self, t: &TrialRecord, state: &'static str, status: &'static str) -> Result<(), CallbackError> {
        self.ops.push_back(Op::End { trial: t.id.clone(), state, status, at: t.ended_at.unwrap_or_else(crate::clock::now_unix) });
        self.flush()
    }
}

#[cfg(feature = "mlflow")]
/// Where the trial to run mapping is kept.
const FILE: &str = "mlflow.json";

#[cfg(feature = "mlflow")]
impl Callback for MlflowLogger {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        match event {
            Event::TrialStarted { trial, .. } => {
                let at = trial.started_at.unwrap_or_else(crate::clock::now_unix);
                self.ops.push_back(Op::Start { trial: trial.id.clone(), config: trial.config.clone(), at });
            }
            Event::Result(r) => self.result(r),
            Event::Exploited(e) => self.ops.push_back(Op::Exploit {
                trial: e.trial_id.clone(),
                config: e.new_config.clone(),
                iteration: e.donor_iteration,
                donor: e.donor.clone(),
                at: e.at,
            }),
            Event::TrialCompleted(t) => return self.ended(t, "TERMINATED", "FINISHED"),
            Event::TrialErrored(t) => return self.ended(t, "ERROR", "FAILED"),
            Event::TrialPaused(t) => return self.ended(t, "PAUSED", "RUNNING"),
            Event::TrialInterrupted(t) => return self.ended(t, "PENDING", "KILLED"),
            Event::ExperimentEnded(s) => {
                let status = if s.stopped_early { "KILLED" } else { "FINISHED" };
                self.ops.push_back(Op::Finish { status, at: crate::clock::now_unix() });
            }
            Event::Status(_) => return self.flush(),
            _ => {}
        }
        Ok(())
    }

    /// Sends what is left; a server that does not answer is given up on.
    fn close(&mut self) -> Result<(), CallbackError> {
        self.flush()
    }

    fn name(&self) -> String {
        "mlflow".into()
    }
}

/// How requests authenticate to the tracking server.
#[cfg(feature = "mlflow")]
enum Auth {
    None,
    Basic(String, Option<String>),
    Bearer(String),
}

#[cfg(feature = "mlflow")]
impl Auth {
    fn apply(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Auth::None => r,
            Auth::Basic(user, password) => r.basic_auth(user, password.as_ref()),
            Auth::Bearer(token) => r.bearer_auth(token),
        }
    }
}

#[cfg(feature = "mlflow")]
fn tag(key: &str, value: &str) -> Value {
    json!({"key": key, "value": value})
}

#[cfg(feature = "mlflow")]
fn ms(unix: f64) -> i64 {
    (unix * 1000.0) as i64
}

#[cfg(feature = "mlflow")]
fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => s[..at].to_string(),
        None => s.to_string(),
    }
}

#[cfg(feature = "mlflow")]
/// `model.width` -> `64`: a config's leaves as MLflow params (strings unquoted).
fn flatten(config: &Value) -> Vec<(String, String)> {
    crate::text::leaves(config)
        .into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => (k, s.clone()),
            other => (k, other.to_string()),
        })
        .collect()
}

#[cfg(feature = "mlflow")]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_flatten_to_params() {
        let p = flatten(&json!({"lr": 0.1, "model": {"width": 64}, "opt": "adam", "on": true}));
        assert_eq!(
            p,
            [("lr".into(), "0.1".into()), ("model.width".into(), "64".into()), ("on".into(), "true".into()), ("opt".into(), "adam".into())]
        );
    }

    #[test]
    fn credentials_are_never_in_the_file_nor_shown() {
        let (uri, info) = crate::text::split_userinfo("https://me:pa55@mlflow.example:5000/prefix?x=1");
        assert_eq!(uri, "https://mlflow.example:5000/prefix?x=1");
        assert_eq!(info, Some(("me".into(), Some("pa55".into()))));
        assert_eq!(crate::text::split_userinfo("http://host/a@b").1, None, "an @ in the path is not userinfo");
        let c = MlflowConfig { tracking_uri: Some("https://me:pa55@mlflow.example".into()), ..Default::default() };
        #[cfg(feature = "mlflow")]
        {
            let e = MlflowLogger::new("/tmp/x", "x", &c).err().unwrap();
            assert!(e.starts_with("tracking_uri:") && e.contains("MLFLOW_TRACKING_PASSWORD") && !e.contains("pa55"), "{e}");
        }
        let _ = c;
    }

    #[test]
    fn a_bad_tracking_uri_is_refused_by_name() {
        let c = MlflowConfig { tracking_uri: Some("file:///tmp/mlruns".into()), ..Default::default() };
        let e = MlflowLogger::new("/tmp/x", "x", &c).err().unwrap_or_default();
        assert!(e.starts_with("tracking_uri:"), "{e}");
    }
}
