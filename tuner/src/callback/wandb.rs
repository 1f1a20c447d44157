//! The Weights & Biases logger (Ray Tune's `WandbLoggerCallback`). W&B has
//! no Rust client, so the logging is done by W&B's own Python package in
//! one helper process per sweep (assets/wandb_sidecar.py, embedded in the
//! binary), fed a JSON line per trial start, durable result, exploit and
//! end. Each trial is one W&B run grouped under the sweep; `mode =
//! "offline"` (or `WANDB_MODE=offline`) writes the runs under the
//! experiment directory with no network, for `wandb sync` later.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Callback, CallbackError, Event};
use crate::store::TrialRecord;

const SIDECAR: &str = include_str!("../../assets/wandb_sidecar.py");

/// `[[callbacks]] type = "wandb"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WandbConfig {
    /// The W&B project; else the sweep's `experiment.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The W&B entity (team or user); else W&B's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// `online`, `offline` or `disabled`; else `WANDB_MODE`, else online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Tags on every run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The Python with `wandb` installed; `python3` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

/// How long the helper may take to import wandb, and to finish at the end.
const START: Duration = Duration::from_secs(60);
const FINISH: Duration = Duration::from_secs(120);

/// Logs a sweep's trials to Weights & Biases through W&B's Python package.
pub struct WandbLogger {
    exp_dir: PathBuf,
    name: String,
    config: WandbConfig,
    child: Option<(Child, BufWriter<ChildStdin>)>,
    /// Why the helper could not start: it is not tried again.
    failed: Option<String>,
}

impl WandbLogger {
    /// A logger for the experiment `name` at `exp_dir`.
    pub fn new(exp_dir: impl Into<PathBuf>, name: &str, config: &WandbConfig) -> Result<Self, String> {
        if let Some(m) = &config.mode {
            if !matches!(m.as_str(), "online" | "offline" | "disabled") {
                return Err(format!("mode: {m:?} is not one of \"online\", \"offline\", \"disabled\""));
            }
        }
        Ok(Self { exp_dir: exp_dir.into(), name: name.to_string(), config: config.clone(), child: None, failed: None })
    }

    /// The helper, started (and waited for until wandb is imported) on first use.
    fn helper(&mut self) -> Result<&mut BufWriter<ChildStdin>, CallbackError> {
        if let Some(why) = &self.failed {
            return Err(why.clone().into());
        }
        if self.child.is_none() {
            if let Err(e) = self.start() {
                self.failed = Some(e.clone());
                return Err(e.into());
            }
        }
        Ok(&mut self.child.as_mut().ok_or("no helper")?.1)
    }

    fn start(&mut self) -> Result<(), String> {
        {
            let opts = json!({
                "project": self.config.project.clone().unwrap_or_else(|| self.name.clone()),
                "entity": self.config.entity,
                "group": self.name,
                "mode": self.config.mode,
                "tags": self.config.tags,
                "dir": self.exp_dir,
            });
            let log = self.exp_dir.join("wandb.log");
            let python = self.config.python.clone().unwrap_or_else(|| "python3".into());
            let mut child = Command::new(&python)
                .arg("-c")
                .arg(SIDECAR)
                .arg(opts.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?)
                .spawn()
                .map_err(|e| format!("cannot start {python} for W&B: {e}"))?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            });
            let line = rx.recv_timeout(START).unwrap_or_default();
            if line.trim() != "ready" {
                let _ = child.kill();
                let _ = child.wait();
                let why = if line.is_empty() { format!("it did not start; see {}", log.display()) } else { line.trim().to_string() };
                return Err(format!("W&B's helper ({python}): {why}"));
            }
            let stdin = BufWriter::new(child.stdin.take().ok_or("no stdin")?);
            self.child = Some((child, stdin));
        }
        Ok(())
    }

    fn send(&mut self, msg: Value) -> Result<(), CallbackError> {
        let w = self.helper()?;
        writeln!(w, "{msg}")?;
        Ok(())
    }

    fn ended(&mut self, t: &TrialRecord, state: &str, exit_code: i32) -> Result<(), CallbackError> {
        self.send(json!({"op": "end", "trial": t.id, "state": state, "exit_code": exit_code}))?;
        self.flush()
    }

    fn flush(&mut self) -> Result<(), CallbackError> {
        if let Some((_, w)) = &mut self.child {
            w.flush()?;
        }
        Ok(())
    }
}

impl Callback for WandbLogger {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        match event {
            Event::TrialStarted { trial, .. } => self.send(json!({"op": "start", "trial": trial.id, "config": trial.config})),
            Event::Result(r) => {
                let metrics: serde_json::Map<String, Value> = r
                    .metrics
                    .iter()
                    .filter(|(k, v)| v.is_finite() && !matches!(k.as_str(), "training_iteration" | "timestamp"))
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                self.send(json!({"op": "log", "trial": r.trial_id, "step": r.training_iteration, "metrics": metrics}))
            }
            Event::Exploited(e) => self.send(json!({"op": "config", "trial": e.trial_id, "config": e.new_config})),
            Event::TrialCompleted(t) => self.ended(t, "TERMINATED", 0),
            Event::TrialErrored(t) => self.ended(t, "ERROR", 1),
            Event::TrialPaused(t) => self.ended(t, "PAUSED", 0),
            Event::TrialInterrupted(t) => self.ended(t, "PENDING", 1),
            Event::Status(_) => self.flush(),
            _ => Ok(()),
        }
    }

    /// Tells the helper to finish its runs and waits for it (at most two minutes).
    fn close(&mut self) -> Result<(), CallbackError> {
        let Some((mut child, mut stdin)) = self.child.take() else { return Ok(()) };
        let _ = writeln!(stdin, "{}", json!({"op": "close"}));
        let _ = stdin.flush();
        drop(stdin);
        let until = Instant::now() + FINISH;
        while Instant::now() < until {
            if let Some(status) = child.try_wait()? {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("W&B's helper exited with {status}; see {}", self.exp_dir.join("wandb.log").display()).into())
                };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err("W&B's helper did not finish within two minutes; killed".into())
    }

    fn name(&self) -> String {
        "wandb".into()
    }
}
