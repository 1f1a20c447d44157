//! The `[trainer]` section of an experiment file, for a trainer that runs
//! a worker command per trial.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{DistBackend, PlacementStrategy, ProcessConfig, Resources, ScalingConfig, ScalingError, TorchConfig, Warm};

/// `[trainer]` of an experiment file: a worker command per trial, how many
/// workers it runs and what each needs, their collectives. Checked here
/// ([`TrainerConfig::check`]) and turned into the [`ProcessConfig`] and
/// [`ScalingConfig`] a run uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// Program and arguments, e.g. `["python", "train.py"]`.
    pub command: Vec<String>,
    /// Extra environment variables for the workers (written with the
    /// experiment: no secrets here; see `pass_env`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of variables of nestor's own environment the workers get too
    /// (`["WANDB_API_KEY", "HF_TOKEN"]`): their values are read when the
    /// sweep starts (or resumes) and never written anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// Working directory of the workers (default: where nestor runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when a trial is stopped.
    #[serde(default = "default_grace")]
    pub grace_period_s: f64,
    /// Data-parallel workers (processes) per trial.
    #[serde(default = "one_u32")]
    pub num_workers: u32,
    /// Give each worker a GPU (unless `resources_per_worker` says otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_gpu: bool,
    /// What each worker needs: `{ CPU = 2, GPU = 0.5, memory = ..., custom = n }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_per_worker: Option<Resources>,
    /// `PACK` (default), `SPREAD`, `STRICT_PACK` or `STRICT_SPREAD`.
    #[serde(default)]
    pub placement_strategy: PlacementStrategy,
    /// Reserved per trial beside its workers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trainer_resources: Resources,
    /// Collective backend for PyTorch workers: `gloo` or `nccl` (default: nccl with use_gpu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<DistBackend>,
    /// Seconds a collective may wait before it fails.
    #[serde(default = "default_collective_timeout")]
    pub collective_timeout_s: f64,
    /// Where the report server listens (default: loopback, a free port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_bind: Option<std::net::SocketAddr>,
    /// Fork every rank from a warm process started once, instead of
    /// starting `command` per rank (on this machine only; see [`Warm::of`]):
    /// unset, a command that runs a Python script or module is warm (its
    /// imports loaded once); `false`, every rank starts cold; `true`, a
    /// command that is not Python speaks the warm protocol itself
    /// (`NESTOR_ZYGOTE=1`: the Python driver's function trainables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<bool>,
    /// Files every rank needs that the driver sends (`GetFile`) to nodes
    /// that do not see them (the Python driver's pickled function).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PathBuf>,
    /// Each trial's number of workers is the integer at this dotted path of
    /// its config (Ray's `ScalingConfig` in `param_space`:
    /// `scaling_config.num_workers`); `num_workers` is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_workers_from: Option<String>,
}

fn default_grace() -> f64 {
    5.0
}

fn one_u32() -> u32 {
    1
}

fn default_collective_timeout() -> f64 {
    TorchConfig::default().timeout_s
}

impl TrainerConfig {
    /// A section running `command` with one worker and every default.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            working_dir: None,
            grace_period_s: default_grace(),
            num_workers: 1,
            use_gpu: false,
            resources_per_worker: None,
            placement_strategy: PlacementStrategy::Pack,
            trainer_resources: Resources::new(),
            backend: None,
            collective_timeout_s: default_collective_timeout(),
            report_bind: None,
            warm: None,
            files: Vec::new(),
            num_workers_from: None,
        }
    }

    /// Its scaling keys as a `ScalingConfig`.
    pub fn scaling(&self) -> ScalingConfig {
        ScalingConfig {
            num_workers: self.num_workers,
            use_gpu: self.use_gpu,
            resources_per_worker: self.resources_per_worker.clone(),
            placement_strategy: self.placement_strategy,
            trainer_resources: self.trainer_resources.clone(),
        }
    }

    /// Its backend keys as a `TorchConfig`.
    pub fn torch(&self) -> TorchConfig {
        TorchConfig { backend: self.backend, timeout_s: self.collective_timeout_s }
    }
    /// Checks the settings that need nothing outside the section: the key
    /// (within `[trainer]`) and the rule it breaks.
    pub fn check(&self) -> Result<(), ScalingError> {
        let err = |key: &str, message: String| Err(ScalingError { key: key.to_string(), message });
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return err("command", "must name a program, e.g. [\"python\", \"train.py\"]".into());
        }
        if !(self.grace_period_s >= 0.0 && self.grace_period_s.is_finite()) {
            return err("grace_period_s", format!("must be >= 0, got {}", self.grace_period_s));
        }
        if !(self.collective_timeout_s > 0.0 && self.collective_timeout_s.is_finite()) {
            return err("collective_timeout_s", format!("must be > 0, got {}", self.collective_timeout_s));
        }
        self.scaling().validate()
    }

    /// What a run of the command needs, once the program and the working
    /// directory are found (refused before the first trial, not once per
    /// trial).
    pub fn process_config(&self) -> Result<ProcessConfig, ScalingError> {
        let err = |key: &str, message: String| Err(ScalingError { key: key.to_string(), message });
        if let Some(dir) = &self.working_dir {
            if !dir.is_dir() {
                return err("working_dir", format!("{} is not a directory", dir.display()));
            }
        }
        let Some(first) = self.command.first() else { return err("command", "must name a program".into()) };
        let program = Path::new(first);
        let found = if program.components().count() > 1 {
            self.working_dir.as_deref().unwrap_or(Path::new(".")).join(program).is_file()
        } else {
            std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        };
        if !found {
            return err("command", format!("program {first:?} not found (relative paths are from the working directory)"));
        }
        let mut c = ProcessConfig::new(self.command.clone());
        c.env = self.env.clone();
        for name in &self.pass_env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return err("pass_env", format!("{name:?} is not a variable name"));
            }
            if self.env.contains_key(name) {
                return err("pass_env", format!("{name} is in trainer.env too; name it in one of them"));
            }
            match std::env::var(name) {
                Ok(value) => {
                    c.env.insert(name.clone(), value);
                }
                Err(_) => return err("pass_env", format!("{name} is not set (or not UTF-8) in nestor's environment")),
            }
        }
        c.working_dir = self.working_dir.clone();
        c.grace_period = Duration::from_secs_f64(self.grace_period_s);
        c.torch = self.torch();
        c.warm = Warm::of(&self.command, self.warm);
        c.files = self.files.clone();
        if let Some(bind) = self.report_bind {
            c.report_bind = bind;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_checks_its_keys_and_finds_its_program() {
        let mut t = TrainerConfig::new(vec!["sh".into(), "-c".into(), "true".into()]);
        assert_eq!(t.check(), Ok(()));
        let c = t.process_config().unwrap();
        assert_eq!((c.command.len(), c.grace_period), (3, Duration::from_secs(5)));
        t.collective_timeout_s = 0.0;
        assert_eq!(t.check().unwrap_err().key, "collective_timeout_s");
        t.collective_timeout_s = 30.0;
        t.num_workers = 0;
        assert_eq!(t.check().unwrap_err().key, "num_workers");
        let missing = TrainerConfig::new(vec!["no-such-program-anywhere".into()]);
        let e = missing.process_config().unwrap_err();
        assert_eq!(e.key, "command");
        assert!(e.message.contains("not found"), "{}", e.message);
        // pass_env: the value comes from nestor's environment, and only the name is written.
        std::env::set_var("NESTOR_TEST_SECRET_PASSED", "s3cr3t");
        let passing = TrainerConfig { pass_env: vec!["NESTOR_TEST_SECRET_PASSED".into()], ..TrainerConfig::new(vec!["sh".into()]) };
        assert_eq!(passing.process_config().unwrap().env["NESTOR_TEST_SECRET_PASSED"], "s3cr3t");
        let written = serde_json::to_string(&passing).unwrap();
        assert!(written.contains("NESTOR_TEST_SECRET_PASSED") && !written.contains("s3cr3t"), "{written}");
        let unset = TrainerConfig { pass_env: vec!["NESTOR_TEST_NEVER_SET".into()], ..TrainerConfig::new(vec!["sh".into()]) };
        let e = unset.process_config().unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.message.as_str()),
            ("pass_env", "NESTOR_TEST_NEVER_SET is not set (or not UTF-8) in nestor's environment")
        );
        let nowhere = TrainerConfig { working_dir: Some("/no/such/dir".into()), ..TrainerConfig::new(vec!["sh".into()]) };
        assert_eq!(nowhere.process_config().unwrap_err().key, "working_dir");
        assert_eq!(TrainerConfig::new(Vec::new()).check().unwrap_err().key, "command");
        // Its settings survive being written and read back; a misspelt key is refused.
        let t = TrainerConfig { num_workers: 4, use_gpu: true, backend: Some(DistBackend::Gloo), ..TrainerConfig::new(vec!["sh".into()]) };
        let back: TrainerConfig = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert!(serde_json::from_str::<TrainerConfig>(r#"{"command": ["sh"], "num_worker": 2}"#).is_err());
    }
}
