//! How one training run scales: Ray Train's `ScalingConfig` and
//! `TorchConfig`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Resource amounts by name: `CPU`, `GPU` (fractional allowed below 1),
/// `memory` (bytes), or any custom name the node declares.
pub type Resources = BTreeMap<String, f64>;

/// Where a trial's workers go. On one node the strategies differ only in
/// which GPUs are chosen:
///
/// - `PACK` (default): GPUs close together (NVLink peers first); fractional
///   workers share a GPU when they can.
/// - `STRICT_PACK`: as PACK, and all of the trial's GPUs must be NVLink peers
///   (when the node's topology is known); otherwise the trial waits.
/// - `SPREAD`: fractional workers on different GPUs when they can.
/// - `STRICT_SPREAD`: no two workers of the trial share a GPU; otherwise the
///   trial waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PlacementStrategy {
    /// Close together.
    #[default]
    Pack,
    /// Close together, or wait.
    StrictPack,
    /// Apart.
    Spread,
    /// Apart, or wait.
    StrictSpread,
}

/// The most workers one run may have: far past any cluster's run, and small
/// enough that its bundles are checked before they are built.
pub const MAX_WORKERS: u32 = 65_536;
/// The most resource names one bundle may have.
pub const MAX_RESOURCE_NAMES: usize = 64;

/// How many workers a run has and what each needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingConfig {
    /// Data-parallel workers (ranks).
    pub num_workers: u32,
    /// Give each worker a GPU (unless `resources_per_worker` says how many).
    pub use_gpu: bool,
    /// What each worker needs. Default: `{ CPU = 1 }`, plus `GPU = 1` with `use_gpu`.
    pub resources_per_worker: Option<Resources>,
    /// Which GPUs the workers get.
    pub placement_strategy: PlacementStrategy,
    /// Reserved for the run as a whole, beside its workers (default nothing).
    pub trainer_resources: Resources,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        Self {
            num_workers: 1,
            use_gpu: false,
            resources_per_worker: None,
            placement_strategy: PlacementStrategy::Pack,
            trainer_resources: Resources::new(),
        }
    }
}

/// A scaling setting that can never work; `key` names it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ScalingError {
    /// The setting (`num_workers`, `resources_per_worker.GPU`, ...).
    pub key: String,
    /// The rule it breaks.
    pub message: String,
}

impl ScalingConfig {
    /// `n` CPU workers.
    pub fn workers(n: u32) -> Self {
        Self { num_workers: n, ..Self::default() }
    }

    /// `n` workers with one GPU each.
    pub fn gpu_workers(n: u32) -> Self {
        Self { num_workers: n, use_gpu: true, ..Self::default() }
    }

    /// What one worker needs, defaults filled in.
    pub fn worker_resources(&self) -> Resources {
        let mut r = self.resources_per_worker.clone().unwrap_or_default();
        r.entry("CPU".into()).or_insert(1.0);
        if self.use_gpu {
            r.entry("GPU".into()).or_insert(1.0);
        }
        r
    }

    /// GPUs per worker.
    pub fn gpus_per_worker(&self) -> f64 {
        self.worker_resources().get("GPU").copied().unwrap_or(0.0)
    }

    /// Checks the rules that do not depend on the node (bounds first, before
    /// anything is built from the numbers).
    pub fn validate(&self) -> Result<(), ScalingError> {
        let err = |key: &str, message: String| Err(ScalingError { key: key.into(), message });
        if self.num_workers == 0 {
            return err("num_workers", "must be at least 1".into());
        }
        if self.num_workers > MAX_WORKERS {
            return err("num_workers", format!("must be at most {MAX_WORKERS}, got {}", self.num_workers));
        }
        for (prefix, res) in
            [("resources_per_worker", self.resources_per_worker.as_ref()), ("trainer_resources", Some(&self.trainer_resources))]
        {
            if let Some(n) = res.map(|r| r.len()).filter(|&n| n > MAX_RESOURCE_NAMES) {
                return err(prefix, format!("names at most {MAX_RESOURCE_NAMES} resources, got {n}"));
            }
            for (name, &amount) in res.into_iter().flatten() {
                if !(amount >= 0.0 && amount.is_finite()) {
                    return err(&format!("{prefix}.{name}"), format!("must be a finite amount >= 0, got {amount}"));
                }
                if name.is_empty() {
                    return err(prefix, "resource names must not be empty".into());
                }
            }
        }
        let gpu = self.resources_per_worker.as_ref().and_then(|r| r.get("GPU").copied());
        match gpu {
            Some(g) if g > 0.0 && !self.use_gpu => {
                return err("use_gpu", format!("is false, but resources_per_worker.GPU = {g}; set use_gpu = true"))
            }
            Some(g) if g == 0.0 && self.use_gpu => {
                return err("resources_per_worker.GPU", "is 0, but use_gpu = true; give each worker a GPU or a fraction of one".into())
            }
            _ => {}
        }
        let g = self.gpus_per_worker();
        if g > 1.0 && g.fract() != 0.0 {
            return err("resources_per_worker.GPU", format!("fractions are allowed below 1 only, got {g}"));
        }
        if self.trainer_resources.get("GPU").is_some_and(|&g| g > 0.0) {
            return err("trainer_resources.GPU", "the trainer itself gets no GPU; give GPUs to the workers".into());
        }
        Ok(())
    }
}

/// The collective backend the workers' framework uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistBackend {
    /// CPU (and GPU) collectives over TCP.
    Gloo,
    /// NVIDIA's GPU collectives.
    Nccl,
}

impl DistBackend {
    /// `gloo` or `nccl`.
    pub fn as_str(self) -> &'static str {
        match self {
            DistBackend::Gloo => "gloo",
            DistBackend::Nccl => "nccl",
        }
    }
}

/// Ray Train's `TorchConfig`: how PyTorch workers set up their process group
/// (read by `nestor.torch` from `NESTOR_TORCH_BACKEND` and
/// `NESTOR_COLLECTIVE_TIMEOUT_S`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TorchConfig {
    /// `None`: NCCL with `use_gpu`, gloo without.
    pub backend: Option<DistBackend>,
    /// Seconds a collective may wait before it fails.
    pub timeout_s: f64,
}

impl Default for TorchConfig {
    fn default() -> Self {
        Self { backend: None, timeout_s: 1800.0 }
    }
}

impl TorchConfig {
    /// The backend to use for a run with `use_gpu`.
    pub fn backend_for(&self, use_gpu: bool) -> DistBackend {
        self.backend.unwrap_or(if use_gpu { DistBackend::Nccl } else { DistBackend::Gloo })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_rules() {
        let s = ScalingConfig::workers(2);
        assert_eq!(s.worker_resources(), Resources::from([("CPU".into(), 1.0)]));
        assert_eq!(ScalingConfig::gpu_workers(4).gpus_per_worker(), 1.0);
        assert_eq!(ScalingConfig::workers(0).validate().unwrap_err().to_string(), "num_workers: must be at least 1");
        assert_eq!(
            ScalingConfig::workers(u32::MAX).validate().unwrap_err().to_string(),
            "num_workers: must be at most 65536, got 4294967295"
        );
        let many = (0..100).map(|i| (format!("r{i}"), 1.0)).collect();
        let e = ScalingConfig { resources_per_worker: Some(many), ..ScalingConfig::workers(1) }.validate().unwrap_err();
        assert_eq!(e.to_string(), "resources_per_worker: names at most 64 resources, got 100");
        let frac = ScalingConfig { resources_per_worker: Some(Resources::from([("GPU".into(), 1.5)])), ..ScalingConfig::gpu_workers(1) };
        assert_eq!(frac.validate().unwrap_err().key, "resources_per_worker.GPU");
        let half = ScalingConfig { resources_per_worker: Some(Resources::from([("GPU".into(), 0.5)])), ..ScalingConfig::gpu_workers(1) };
        assert!(half.validate().is_ok());
        let no_gpu = ScalingConfig { resources_per_worker: Some(Resources::from([("GPU".into(), 1.0)])), ..ScalingConfig::workers(1) };
        assert_eq!(no_gpu.validate().unwrap_err().key, "use_gpu");
        let negative = ScalingConfig { resources_per_worker: Some(Resources::from([("CPU".into(), -1.0)])), ..ScalingConfig::workers(1) };
        assert_eq!(negative.validate().unwrap_err().key, "resources_per_worker.CPU");
        assert_eq!(TorchConfig::default().backend_for(true), DistBackend::Nccl);
        assert_eq!(TorchConfig::default().backend_for(false), DistBackend::Gloo);
    }
}

/// What happens when a run's workers fail: Ray's `FailureConfig` (TOML
/// `[failure]`; `Trainer::failure` for a run on its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConfig {
    /// Restarts of a failed trial from its latest committed checkpoint
    /// before it is ERROR (`-1`: no limit; default 0). Counts the failures
    /// of the trial's own code: a rank that died, exited non-zero or hung.
    #[serde(default)]
    pub max_failures: i64,
    /// Restarts of a trial whose run the infrastructure ended (a node lost
    /// under it, a job step the cluster killed or would not start) before
    /// it is ERROR (`-1`: no limit; default 5). They do not count against
    /// `max_failures`.
    #[serde(default = "FailureConfig::default_infrastructure", skip_serializing_if = "FailureConfig::is_default_infrastructure")]
    pub max_infrastructure_failures: i64,
    /// A trial some rank of which has not reported for this long is hung:
    /// its group is killed and counts as failed (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_timeout_s: Option<f64>,
}

impl Default for FailureConfig {
    fn default() -> Self {
        Self { max_failures: 0, max_infrastructure_failures: Self::default_infrastructure(), hang_timeout_s: None }
    }
}

impl FailureConfig {
    /// Infrastructure failures a trial survives by default.
    pub const DEFAULT_INFRASTRUCTURE_FAILURES: i64 = 5;

    fn default_infrastructure() -> i64 {
        Self::DEFAULT_INFRASTRUCTURE_FAILURES
    }

    fn is_default_infrastructure(n: &i64) -> bool {
        *n == Self::DEFAULT_INFRASTRUCTURE_FAILURES
    }

    /// Whether a trial whose runs the infrastructure ended `failures` times may restart.
    pub fn may_restart_after_infrastructure(&self, failures: u32) -> bool {
        self.max_infrastructure_failures < 0 || i64::from(failures) < self.max_infrastructure_failures
    }

    /// Whether every field has its default (nothing to write to a file).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a trial that has failed `failures` times may restart.
    pub fn may_restart(&self, failures: u32) -> bool {
        self.max_failures < 0 || i64::from(failures) < self.max_failures
    }
}
