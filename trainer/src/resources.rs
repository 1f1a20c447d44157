//! The node's resources and their gang allocation to trials.
//!
//! [`NodeResources`] is what the node has: detected (CPUs within the cgroup
//! limit, memory, GPUs through NVML) or declared. [`ResourcePool`] hands a
//! run's bundles out all together or not at all, and never books anything
//! twice. Amounts are kept in integer units (milli-CPUs, 1/10000 of a GPU,
//! bytes), so fractional GPUs add up exactly.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::scaling::{PlacementStrategy, Resources, ScalingConfig};

const CPU_UNITS: f64 = 1000.0;
const GPU_UNITS: f64 = 10_000.0;
const CUSTOM_UNITS: f64 = 1000.0;
const WHOLE_GPU: u64 = 10_000;

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    /// Model name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Indices of the GPUs this one reaches over an active NVLink.
    pub nvlink_peers: Vec<u32>,
}

/// Where the node's figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Read from the machine.
    Detected,
    /// Given by the user (they override detection).
    Declared,
}

/// What one node offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeResources {
    /// CPUs (fractional when the cgroup quota is).
    pub cpus: f64,
    /// Memory in bytes.
    pub memory_bytes: f64,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
    /// Custom resources by name.
    pub custom: BTreeMap<String, f64>,
    /// Detected or declared.
    pub source: Source,
    /// What GPU detection found, for people: the GPUs, or why there are none.
    pub gpu_note: String,
}

/// Errors of declaring resources or of a run that can never fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResourceError {
    /// A declared amount is invalid.
    #[error("resources.{name}: {message}")]
    Invalid {
        /// The resource.
        name: String,
        /// The rule.
        message: String,
    },
    /// The run needs more than the whole node has.
    #[error("a trial asks for {asked}, but {has}; it can never start")]
    NeverFits {
        /// What the run asks for.
        asked: String,
        /// What the node (or the allocation's nodes) has.
        has: String,
    },
}

impl NodeResources {
    /// The machine's resources, detected once per process (NVML's absence is
    /// reported once).
    pub fn detect() -> Self {
        static DETECTED: OnceLock<NodeResources> = OnceLock::new();
        DETECTED.get_or_init(detect_now).clone()
    }

    /// A declared node with `cpus` CPUs, the detected memory, and no GPUs
    /// or custom resources until added.
    pub fn declared(cpus: f64) -> Self {
        Self {
            cpus,
            memory_bytes: detect_memory(),
            gpus: Vec::new(),
            custom: BTreeMap::new(),
            source: Source::Declared,
            gpu_note: "declared".into(),
        }
    }

    /// Adds `n` GPUs (no NVLink between them), numbered after those present.
    pub fn with_gpus(mut self, n: u32) -> Self {
        let start = self.gpus.len() as u32;
        self.gpus.extend((start..start + n).map(|index| Gpu {
            index,
            name: "declared GPU".into(),
            memory_bytes: 0,
            nvlink_peers: Vec::new(),
        }));
        self
    }

    /// Adds a GPU as given (its topology too).
    pub fn with_gpu(mut self, gpu: Gpu) -> Self {
        self.gpus.push(gpu);
        self
    }

    /// Sets the memory, in bytes.
    pub fn with_memory(mut self, bytes: f64) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Adds a custom resource.
    pub fn with_custom(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.custom.insert(name.into(), amount);
        self
    }

    /// A declared node from `{ CPU = 16, GPU = 8, memory = ..., other = n }`
    /// (TOML `[resources]`); what is not declared is detected.
    pub fn from_declared(declared: &Resources) -> Result<Self, ResourceError> {
        let detected = Self::detect();
        let mut node = Self { source: Source::Declared, custom: BTreeMap::new(), gpu_note: "declared".into(), ..detected };
        for (name, &amount) in declared {
            let invalid = |message: String| ResourceError::Invalid { name: name.clone(), message };
            if !(amount >= 0.0 && amount.is_finite()) {
                return Err(invalid(format!("must be a finite amount >= 0, got {amount}")));
            }
            match name.as_str() {
                "CPU" => node.cpus = amount,
                "memory" => node.memory_bytes = amount,
                "GPU" => {
                    if amount.fract() != 0.0 {
                        return Err(invalid(format!("must be a whole number of GPUs, got {amount}")));
                    }
                    let n = amount as usize;
                    let have = node.gpus.len();
                    node.gpus.truncate(n);
                    if n > have {
                        node = node.with_gpus((n - have) as u32);
                    }
                }
                _ => {
                    node.custom.insert(name.clone(), amount);
                }
            }
        }
        Ok(node)
    }

    /// `{CPU: 2, GPU: 0, memory: 23.4 GiB}` and custom resources.
    pub fn describe(&self) -> String {
        let mut s = format!("{{CPU: {}, GPU: {}, memory: {}", num(self.cpus), self.gpus.len(), gib(self.memory_bytes));
        for (k, v) in &self.custom {
            let _ = write!(s, ", {k}: {}", num(*v));
        }
        s.push('}');
        s
    }
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / (1u64 << 30) as f64)
}

fn detect_now() -> NodeResources {
    let (gpus, gpu_note) = detect_gpus();
    NodeResources { cpus: detect_cpus(), memory_bytes: detect_memory(), gpus, custom: BTreeMap::new(), source: Source::Detected, gpu_note }
}

/// CPUs: the scheduler affinity, capped by a cgroup CPU quota (v2 `cpu.max`
/// or v1 `cpu.cfs_quota_us`), which may be fractional.
fn detect_cpus() -> f64 {
    let online = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let quota = cgroup_cpu_quota().unwrap_or(f64::INFINITY);
    online.min(quota).max(0.001)
}

fn cgroup_cpu_quota() -> Option<f64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    if let Some(text) = read("/sys/fs/cgroup/cpu.max") {
        return parse_cpu_max(&text);
    }
    parse_cfs_quota(&read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")?, &read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")?)
}

/// cgroup v2 `cpu.max`: `"150000 100000"` is 1.5 CPUs; `"max 100000"` no limit.
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: f64 = parts.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        None
    } else {
        Some(quota.parse::<f64>().ok()? / period)
    }
}

/// cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (quota -1: no limit).
fn parse_cfs_quota(quota: &str, period: &str) -> Option<f64> {
    let (quota, period): (f64, f64) = (quota.trim().parse().ok()?, period.trim().parse().ok()?);
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// Memory: `MemTotal`, capped by a cgroup memory limit.
fn detect_memory() -> f64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()))
        .map_or(0.0, |kib| kib * 1024.0);
    let limit = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<f64>().ok())
        .unwrap_or(f64::INFINITY);
    if total > 0.0 {
        total.min(limit)
    } else if limit.is_finite() {
        limit
    } else {
        0.0
    }
}

/// GPUs through NVML (loaded at run time), and a note for people: the GPUs
/// found, or why there are none (no NVIDIA driver: CPU-only).
fn detect_gpus() -> (Vec<Gpu>, String) {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            let note = format!("no NVIDIA GPUs (NVML: {e}); running CPU-only");
            tracing::info!("{note}");
            return (Vec::new(), note);
        }
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            let note = format!("NVML could not count the GPUs ({e}); running CPU-only");
            tracing::warn!("{note}");
            return (Vec::new(), note);
        }
    };
    let mut gpus = Vec::new();
    let mut bus_ids = Vec::new();
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    for index in 0..count {
        let Ok(dev) = nvml.device_by_index(index) else { continue };
        if let Some(list) = &visible {
            if !is_visible(list, index, dev.uuid().ok().as_deref()) {
                continue;
            }
        }
        let name = dev.name().unwrap_or_else(|_| "unknown GPU".into());
        let memory_bytes = dev.memory_info().map_or(0, |m| m.total);
        bus_ids.push((index, dev.pci_info().map(|p| p.bus_id).unwrap_or_default()));
        gpus.push(Gpu { index, name, memory_bytes, nvlink_peers: Vec::new() });
    }
    // NVLink: each active link's remote PCI bus id names a peer GPU.
    let mut links: Vec<(u32, Vec<String>)> = Vec::new();
    for gpu in &gpus {
        let Ok(dev) = nvml.device_by_index(gpu.index) else { continue };
        let mut remote = Vec::new();
        for link in 0..18 {
            let l = dev.link_wrapper_for(link);
            match l.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => break,
            }
            if let Ok(pci) = l.remote_pci_info() {
                remote.push(pci.bus_id);
            }
        }
        links.push((gpu.index, remote));
    }
    let peers = nvlink_peers(&bus_ids, &links);
    for gpu in &mut gpus {
        gpu.nvlink_peers = peers.get(&gpu.index).cloned().unwrap_or_default();
    }
    let only = visible.map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v})"));
    let note = format!(
        "{} GPU(s){only}: {}",
        gpus.len(),
        gpus.iter()
            .map(|g| {
                let links = if g.nvlink_peers.is_empty() { String::new() } else { format!(", NVLink to {:?}", g.nvlink_peers) };
                format!("{} {} ({}{links})", g.index, g.name, gib(g.memory_bytes as f64))
            })
            .collect::<Vec<_>>()
            .join("; ")
    );
    tracing::info!("{note}");
    (gpus, note)
}

/// Whether GPU `index` (NVML's numbering, by PCI bus) with `uuid` is in
/// `CUDA_VISIBLE_DEVICES` (`list`): named by index or by UUID (`GPU-...`,
/// or a prefix of one, as CUDA takes it). As in Ray, a process started with
/// the variable set uses those GPUs only; set empty, none.
fn is_visible(list: &str, index: u32, uuid: Option<&str>) -> bool {
    list.split(',').map(str::trim).filter(|e| !e.is_empty()).any(|entry| match entry.parse::<u32>() {
        Ok(i) => i == index,
        Err(_) => uuid.is_some_and(|u| entry.starts_with("GPU-") && u.starts_with(entry)),
    })
}

/// Each GPU's NVLink peers, from every GPU's PCI bus id and the remote bus
/// ids of its active links (a link to an NVSwitch or the CPU names no GPU).
/// Bus ids compare case-insensitively; NVML pads them differently by call.
fn nvlink_peers(bus_ids: &[(u32, String)], links: &[(u32, Vec<String>)]) -> BTreeMap<u32, Vec<u32>> {
    let norm = |b: &str| {
        let b = b.trim().to_ascii_lowercase();
        // `00000000:1B:00.0` and `0000:1b:00.0` name the same device.
        match b.split_once(':') {
            Some((domain, rest)) => format!("{:0>8}:{rest}", domain.trim_start_matches('0')),
            None => b,
        }
    };
    let by_bus: BTreeMap<String, u32> = bus_ids.iter().filter(|(_, b)| !b.is_empty()).map(|(i, b)| (norm(b), *i)).collect();
    let mut out = BTreeMap::new();
    for (gpu, remotes) in links {
        let mut peers: Vec<u32> = remotes.iter().filter_map(|r| by_bus.get(&norm(r)).copied()).filter(|p| p != gpu).collect();
        peers.sort_unstable();
        peers.dedup();
        out.insert(*gpu, peers);
    }
    out
}

/// What one worker was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerBundle {
    /// The node it runs on (empty on a one-node pool).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// CPUs.
    pub cpus: f64,
    /// The GPUs it may use (NVML indices), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Its share of each of `gpus` (1 for whole GPUs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_share: f64,
    /// Memory in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_bytes: f64,
    /// Custom resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, f64>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl WorkerBundle {
    /// A worker with `cpus` CPUs and nothing else.
    pub fn cpus(cpus: f64) -> Self {
        Self { node: String::new(), cpus, gpus: Vec::new(), gpu_share: 0.0, memory_bytes: 0.0, custom: BTreeMap::new() }
    }

    /// `CUDA_VISIBLE_DEVICES` for this worker (empty without GPUs).
    pub fn cuda_visible_devices(&self) -> String {
        self.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    }

    /// `OMP_NUM_THREADS` for this worker: its whole CPUs, at least 1.
    pub fn omp_threads(&self) -> u32 {
        (self.cpus.floor() as u32).max(1)
    }
}

/// A run's whole request: one bundle per worker plus the trainer's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Per worker.
    pub workers: Vec<Resources>,
    /// Beside the workers.
    pub trainer: Resources,
    /// Which GPUs.
    pub strategy: PlacementStrategy,
}

impl Request {
    /// The request of a run scaled by `scaling`.
    pub fn from_scaling(scaling: &ScalingConfig) -> Self {
        Self {
            workers: vec![scaling.worker_resources(); scaling.num_workers as usize],
            trainer: scaling.trainer_resources.clone(),
            strategy: scaling.placement_strategy,
        }
    }

    fn describe(&self) -> String {
        let one = |r: &Resources| {
            let parts: Vec<String> = r.iter().map(|(k, v)| format!("{k}: {}", if k == "memory" { gib(*v) } else { num(*v) })).collect();
            format!("{{{}}}", parts.join(", "))
        };
        let mut s = match self.workers.first() {
            Some(w) if self.workers.iter().all(|x| x == w) => format!("{} worker(s) x {}", self.workers.len(), one(w)),
            _ => self.workers.iter().map(one).collect::<Vec<_>>().join(" + "),
        };
        if self.trainer.values().any(|v| *v > 0.0) {
            let _ = write!(s, " plus trainer {}", one(&self.trainer));
        }
        s
    }
}

/// A run's allocation: one bundle per worker, returned with
/// [`ResourcePool::release`].
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Per worker, in rank order (a node's ranks together, rank 0's node first).
    pub workers: Vec<WorkerBundle>,
    /// What it holds on each node it uses.
    parts: Vec<Part>,
    /// It holds one of a jobs pool's slots (its nodes are the cluster's to choose).
    job: bool,
}

/// What an allocation holds on one node, in integer units.
#[derive(Debug, Clone, PartialEq, Default)]
struct Part {
    /// The node's position in the pool.
    node: usize,
    cpu: u64,
    memory: u64,
    custom: BTreeMap<String, u64>,
    /// (GPU position on the node, units).
    gpu: Vec<(usize, u64)>,
}

impl Allocation {
    /// An allocation that holds nothing (a run that gave its bundles back
    /// and waits for others); releasing it changes nothing.
    pub fn empty() -> Self {
        Self { workers: Vec::new(), parts: Vec::new(), job: false }
    }

    /// The names of the nodes it uses, rank 0's first (empty names on a
    /// one-node pool).
    pub fn nodes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for w in &self.workers {
            if !out.contains(&w.node.as_str()) {
                out.push(&w.node);
            }
        }
        out
    }
}

/// Free amounts, in integer units.
#[derive(Debug, Clone, PartialEq)]
struct Free {
    cpu: u64,
    memory: u64,
    custom: BTreeMap<String, u64>,
    /// Free units per GPU (WHOLE_GPU = untouched).
    gpu: Vec<u64>,
}

/// One node of the pool.
#[derive(Debug, Clone)]
struct NodePool {
    /// Its name ("" for the one node of a local pool).
    name: String,
    node: NodeResources,
    total: Free,
    free: Free,
}

/// The nodes' resources and who holds them: one node on a machine of its
/// own, or every node of an allocation. Not thread-safe by design: the
/// experiment loop owns it.
#[derive(Debug, Clone)]
pub struct ResourcePool {
    nodes: Vec<NodePool>,
    /// A pool of cluster jobs instead of nodes: each run is a job of its
    /// own, the cluster picks its nodes, and at most this many run or queue
    /// at once.
    jobs: Option<JobSlots>,
}

/// A jobs pool's slots.
#[derive(Debug, Clone, PartialEq)]
struct JobSlots {
    max: usize,
    held: usize,
}

/// A jobs pool's bundles for `request`: each worker's CPUs, memory and
/// custom amounts as asked, its GPUs counted from 0 (the cluster binds
/// the ones it gives), the trainer's share with rank 0. Refused: a share
/// of a GPU (a cluster job gets whole GPUs).
fn job_bundles(request: &Request) -> Result<Vec<WorkerBundle>, ResourceError> {
    let mut workers = Vec::with_capacity(request.workers.len().max(1));
    for (rank, r) in request.workers.iter().enumerate() {
        let gpu = r.get("GPU").copied().unwrap_or(0.0);
        if gpu > 0.0 && gpu.fract() != 0.0 {
            return Err(ResourceError::Invalid {
                name: "GPU".into(),
                message: format!(
                    "worker {rank} asks for {gpu} GPU: a Slurm job gets whole GPUs (ask 1 or more, or run the sweep inside one allocation, where workers may share one)"
                ),
            });
        }
        let extra = |k: &str| if rank == 0 { request.trainer.get(k).copied().unwrap_or(0.0) } else { 0.0 };
        let mut b = WorkerBundle::cpus(r.get("CPU").copied().unwrap_or(0.0) + extra("CPU"));
        b.gpus = (0..gpu as u32).collect();
        b.gpu_share = if gpu > 0.0 { 1.0 } else { 0.0 };
        b.memory_bytes = r.get("memory").copied().unwrap_or(0.0) + extra("memory");
        b.custom = r.iter().filter(|(k, _)| !matches!(k.as_str(), "CPU" | "GPU" | "memory")).map(|(k, v)| (k.clone(), *v)).collect();
        workers.push(b);
    }
    Ok(workers)
}

/// Books a bundle's CPU, memory and custom resources from `free` (its GPUs are
/// placed apart); `None` when one does not fit. Returns the custom amounts.
fn take_non_gpu(free: &mut Free, part: &mut Part, r: &Resources) -> Option<BTreeMap<String, f64>> {
    let cpu = units(r.get("CPU").copied().unwrap_or(0.0), CPU_UNITS);
    let memory = r.get("memory").copied().unwrap_or(0.0).max(0.0) as u64;
    free.cpu = free.cpu.checked_sub(cpu)?;
    free.memory = free.memory.checked_sub(memory)?;
    part.cpu += cpu;
    part.memory += memory;
    let mut custom = BTreeMap::new();
    for (name, &amount) in r.iter().filter(|(k, _)| !matches!(k.as_str(), "CPU" | "GPU" | "memory")) {
        let u = units(amount, CUSTOM_UNITS);
        if u == 0 {
            continue;
        }
        let slot = free.custom.get_mut(name)?;
        *slot = slot.checked_sub(u)?;
        *part.custom.entry(name.clone()).or_insert(0) += u;
        custom.insert(name.clone(), amount);
    }
    Some(custom)
}

fn units(v: f64, scale: f64) -> u64 {
    (v * scale).round().max(0.0) as u64
}

impl NodePool {
    fn new(name: String, node: NodeResources) -> Self {
        let total = Free {
            cpu: units(node.cpus, CPU_UNITS),
            memory: node.memory_bytes.max(0.0) as u64,
            custom: node.custom.iter().map(|(k, v)| (k.clone(), units(*v, CUSTOM_UNITS))).collect(),
            gpu: vec![WHOLE_GPU; node.gpus.len()],
        };
        Self { name, node, free: total.clone(), total }
    }

    /// Books one worker's bundle `r` on this node from `free` into `part`.
    fn take_worker(&self, free: &mut Free, part: &mut Part, r: &Resources, strategy: PlacementStrategy) -> Option<WorkerBundle> {
        let custom = take_non_gpu(free, part, r)?;
        let gpu = r.get("GPU").copied().unwrap_or(0.0);
        let (gpus, share) = self.place_gpus(free, part, gpu, strategy)?;
        Some(WorkerBundle {
            node: self.name.clone(),
            cpus: r.get("CPU").copied().unwrap_or(0.0),
            gpus,
            gpu_share: share,
            memory_bytes: r.get("memory").copied().unwrap_or(0.0).max(0.0),
            custom,
        })
    }

    /// How many bundles `r` fit on this node now (at most `limit`).
    fn room_for(&self, r: &Resources, strategy: PlacementStrategy, limit: usize) -> usize {
        let (mut free, mut part) = (self.free.clone(), Part::default());
        (0..limit).take_while(|_| self.take_worker(&mut free, &mut part, r, strategy).is_some()).count()
    }

    /// Picks GPUs for one worker needing `amount` of them.
    fn place_gpus(&self, free: &mut Free, alloc: &mut Part, amount: f64, strategy: PlacementStrategy) -> Option<(Vec<u32>, f64)> {
        let need = units(amount, GPU_UNITS);
        if need == 0 {
            return Some((Vec::new(), 0.0));
        }
        let trial_gpus: Vec<usize> = alloc.gpu.iter().map(|(i, _)| *i).collect();
        let linked = |a: usize, b: usize| self.node.gpus[a].nvlink_peers.contains(&self.node.gpus[b].index);
        let closeness = |i: usize| trial_gpus.iter().filter(|&&t| t == i || linked(i, t)).count();
        let topology_known = self.node.gpus.iter().any(|g| !g.nvlink_peers.is_empty());
        let mut chosen: Vec<usize> = Vec::new();
        if need < WHOLE_GPU {
            let mut candidates: Vec<usize> = (0..free.gpu.len()).filter(|&i| free.gpu[i] >= need).collect();
            match strategy {
                PlacementStrategy::Pack | PlacementStrategy::StrictPack => {
                    // Best fit, next to the trial's other GPUs.
                    candidates.sort_by_key(|&i| (std::cmp::Reverse(closeness(i)), free.gpu[i], i));
                }
                PlacementStrategy::Spread | PlacementStrategy::StrictSpread => {
                    candidates.sort_by_key(|&i| (trial_gpus.contains(&i), std::cmp::Reverse(free.gpu[i]), i));
                    if strategy == PlacementStrategy::StrictSpread {
                        candidates.retain(|i| !trial_gpus.contains(i));
                    }
                }
            }
            if strategy == PlacementStrategy::StrictPack && topology_known && !trial_gpus.is_empty() {
                candidates.retain(|&i| trial_gpus.iter().all(|&t| t == i || linked(i, t)));
            }
            chosen.push(*candidates.first()?);
        } else {
            let whole = need / WHOLE_GPU;
            for _ in 0..whole {
                let mut candidates: Vec<usize> =
                    (0..free.gpu.len()).filter(|&i| free.gpu[i] == WHOLE_GPU && !chosen.contains(&i)).collect();
                let near = |i: usize| closeness(i) + chosen.iter().filter(|&&c| linked(i, c)).count();
                if matches!(strategy, PlacementStrategy::Pack | PlacementStrategy::StrictPack) {
                    // Prefer NVLink peers of what is chosen, then GPUs with many free peers.
                    let free_peers = |i: usize| (0..free.gpu.len()).filter(|&j| free.gpu[j] == WHOLE_GPU && linked(i, j)).count();
                    candidates.sort_by_key(|&i| (std::cmp::Reverse(near(i)), std::cmp::Reverse(free_peers(i)), i));
                }
                if strategy == PlacementStrategy::StrictPack && topology_known {
                    candidates.retain(|&i| trial_gpus.iter().chain(&chosen).all(|&t| linked(i, t)));
                }
                let pick = *candidates.first()?;
                chosen.push(pick);
                free.gpu[pick] = 0;
                alloc.gpu.push((pick, WHOLE_GPU));
            }
            let gpus = chosen.iter().map(|&i| self.node.gpus[i].index).collect();
            return Some((gpus, 1.0));
        }
        let i = chosen[0];
        free.gpu[i] -= need;
        alloc.gpu.push((i, need));
        Some((vec![self.node.gpus[i].index], amount))
    }
}

impl ResourcePool {
    /// A pool holding all of one machine, `node`.
    pub fn new(node: NodeResources) -> Self {
        Self { nodes: vec![NodePool::new(String::new(), node)], jobs: None }
    }

    /// A pool of several named nodes (an allocation's); a trial's workers
    /// may span them, as its `placement_strategy` says.
    pub fn cluster(nodes: Vec<(String, NodeResources)>) -> Self {
        Self { nodes: nodes.into_iter().map(|(name, node)| NodePool::new(name, node)).collect(), jobs: None }
    }

    /// A pool of cluster jobs: each run is a job of its own whose nodes the
    /// cluster picks; at most `max_jobs` run or wait in its queue at once.
    /// Its bundles name no node, and their GPUs are counts (indices from
    /// 0), for the cluster binds the ones it gives. A request the cluster
    /// cannot hold is refused by the cluster, when the job is submitted.
    pub fn jobs(max_jobs: usize) -> Self {
        let mut node = NodeResources::declared(0.0);
        node.gpu_note = "GPUs as each job asks the cluster".into();
        Self { nodes: vec![NodePool::new("jobs".into(), node)], jobs: Some(JobSlots { max: max_jobs.max(1), held: 0 }) }
    }

    /// How many runs a jobs pool holds at once (`None`: a pool of nodes).
    pub fn job_slots(&self) -> Option<usize> {
        self.jobs.as_ref().map(|j| j.max)
    }

    /// The first node (the only one of a local pool).
    pub fn node(&self) -> &NodeResources {
        &self.nodes[0].node
    }

    /// Every node, with its name.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeResources)> {
        self.nodes.iter().map(|n| (n.name.as_str(), &n.node))
    }

    /// True when trials may span nodes.
    pub fn is_cluster(&self) -> bool {
        self.nodes.len() > 1 || self.nodes.first().is_some_and(|n| !n.name.is_empty())
    }

    /// True when nothing is allocated.
    pub fn is_idle(&self) -> bool {
        match &self.jobs {
            Some(j) => j.held == 0,
            None => self.nodes.iter().all(|n| n.free == n.total),
        }
    }

    /// Refuses a request that would not fit even on the idle nodes.
    pub fn check(&self, request: &Request) -> Result<(), ResourceError> {
        if self.jobs.is_some() {
            return job_bundles(request).map(|_| ());
        }
        let mut idle = self.clone();
        for n in &mut idle.nodes {
            n.free = n.total.clone();
        }
        idle.try_allocate(request).map(|_| ()).ok_or_else(|| self.never_fits(request))
    }

    /// The error for a request the idle nodes cannot hold.
    pub fn never_fits(&self, request: &Request) -> ResourceError {
        if !self.is_cluster() {
            return ResourceError::NeverFits { asked: request.describe(), has: format!("the node has {}", self.node().describe()) };
        }
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("{} {}", n.name, n.node.describe())).collect();
        let mut asked = request.describe();
        match request.strategy {
            PlacementStrategy::StrictSpread => {
                let _ = write!(asked, " with STRICT_SPREAD (each worker on a node of its own)");
            }
            PlacementStrategy::StrictPack => {
                let _ = write!(asked, " with STRICT_PACK (all workers on one node)");
            }
            _ => {}
        }
        ResourceError::NeverFits { asked, has: format!("the allocation has {} node(s): {}", nodes.len(), nodes.join(", ")) }
    }

    /// Allocates every bundle of `request`, or nothing (`None`: not now).
    /// On several nodes: STRICT_PACK puts every worker on one node; PACK
    /// uses as few nodes as it can; SPREAD puts each worker on the node with
    /// fewest of the trial's workers that has room; STRICT_SPREAD puts each
    /// on a node of its own. Within a node, GPUs are chosen by the strategy too.
    pub fn try_allocate(&mut self, request: &Request) -> Option<Allocation> {
        if let Some(j) = &mut self.jobs {
            if j.held >= j.max {
                return None;
            }
            let workers = job_bundles(request).ok()?;
            j.held += 1;
            return Some(Allocation { workers, parts: Vec::new(), job: true });
        }
        let strategy = request.strategy;
        let plan: Vec<usize> = if self.nodes.len() == 1 { vec![0; request.workers.len()] } else { self.plan(request)? };
        let mut free: Vec<Free> = self.nodes.iter().map(|n| n.free.clone()).collect();
        let mut parts: Vec<Part> = (0..self.nodes.len()).map(|node| Part { node, ..Part::default() }).collect();
        // Rank order: node by node, in the order the plan first uses them.
        let mut order: Vec<usize> = Vec::new();
        for &n in &plan {
            if !order.contains(&n) {
                order.push(n);
            }
        }
        let first = *order.first().unwrap_or(&0);
        // The trainer's share (no GPU, refused by ScalingConfig::validate) goes with rank 0.
        take_non_gpu(&mut free[first], &mut parts[first], &request.trainer)?;
        let mut workers = Vec::with_capacity(request.workers.len());
        for &n in &order {
            for (r, _) in request.workers.iter().zip(&plan).filter(|(_, &p)| p == n) {
                workers.push(self.nodes[n].take_worker(&mut free[n], &mut parts[n], r, strategy)?);
            }
        }
        for (n, f) in free.into_iter().enumerate() {
            self.nodes[n].free = f;
        }
        let parts = parts.into_iter().filter(|p| order.contains(&p.node) || p.cpu > 0 || p.memory > 0).collect();
        Some(Allocation { workers, parts, job: false })
    }

    /// Which node each worker of `request` goes to, on several nodes.
    fn plan(&self, request: &Request) -> Option<Vec<usize>> {
        let n = request.workers.len();
        let strategy = request.strategy;
        let worker = request.workers.first()?;
        // The trainer's share needs room on the first node too: counted as part of the room check below.
        let room: Vec<usize> = self.nodes.iter().map(|node| node.room_for(worker, strategy, n)).collect();
        let free_cpu = |i: usize| self.nodes[i].free.cpu;
        match strategy {
            PlacementStrategy::StrictPack | PlacementStrategy::Pack => {
                // One node if any holds them all: the one with the least room left (best fit).
                let whole = (0..self.nodes.len()).filter(|&i| room[i] >= n).min_by_key(|&i| (room[i], free_cpu(i), i));
                if let Some(i) = whole {
                    return Some(vec![i; n]);
                }
                if strategy == PlacementStrategy::StrictPack {
                    return None;
                }
                // Else the nodes with the most room first: as few as can hold them.
                let mut by_room: Vec<usize> = (0..self.nodes.len()).filter(|&i| room[i] > 0).collect();
                by_room.sort_by_key(|&i| (std::cmp::Reverse(room[i]), i));
                let mut plan = Vec::with_capacity(n);
                for i in by_room {
                    let take = room[i].min(n - plan.len());
                    plan.extend(std::iter::repeat_n(i, take));
                    if plan.len() == n {
                        return Some(plan);
                    }
                }
                None
            }
            PlacementStrategy::Spread | PlacementStrategy::StrictSpread => {
                let mut used = vec![0usize; self.nodes.len()];
                let mut plan = Vec::with_capacity(n);
                for _ in 0..n {
                    let pick = (0..self.nodes.len())
                        .filter(|&i| used[i] < room[i])
                        .filter(|&i| strategy == PlacementStrategy::Spread || used[i] == 0)
                        .min_by_key(|&i| (used[i], std::cmp::Reverse(room[i] - used[i]), i))?;
                    used[pick] += 1;
                    plan.push(pick);
                }
                Some(plan)
            }
        }
    }

    /// Takes node `name` out of the pool for good (it went down): nothing
    /// more is placed on it, and what runs there now is not given back.
    /// False when there is no such node or it was set aside already.
    pub fn set_aside(&mut self, name: &str) -> bool {
        let Some(node) = self.nodes.iter_mut().find(|n| n.name == name) else { return false };
        let none = Free {
            cpu: 0,
            memory: 0,
            custom: node.total.custom.keys().map(|k| (k.clone(), 0)).collect(),
            gpu: vec![0; node.total.gpu.len()],
        };
        if node.total == none {
            return false;
        }
        node.total = none.clone();
        node.free = none;
        true
    }

    /// Keeps an allocation's resources out of the pool for good (a run
    /// whose job step the cluster cannot end holds them): they leave the
    /// nodes' totals, so what can never fit is judged without them.
    pub fn keep_booked(&mut self, alloc: &Allocation) {
        for p in &alloc.parts {
            let Some(node) = self.nodes.get_mut(p.node) else { continue };
            let total = &mut node.total;
            total.cpu = total.cpu.saturating_sub(p.cpu);
            total.memory = total.memory.saturating_sub(p.memory);
            for (name, u) in &p.custom {
                if let Some(t) = total.custom.get_mut(name) {
                    *t = t.saturating_sub(*u);
                }
            }
            for &(i, u) in &p.gpu {
                if let Some(t) = total.gpu.get_mut(i) {
                    *t = t.saturating_sub(u);
                }
            }
            // What was free stays free, within the new total.
            let free = &mut node.free;
            free.cpu = free.cpu.min(total.cpu);
            free.memory = free.memory.min(total.memory);
            for (name, f) in &mut free.custom {
                *f = (*f).min(total.custom.get(name).copied().unwrap_or(0));
            }
            for (f, t) in free.gpu.iter_mut().zip(&total.gpu) {
                *f = (*f).min(*t);
            }
        }
    }

    /// Returns an allocation's resources to the pool.
    pub fn release(&mut self, alloc: &Allocation) {
        if let (Some(j), true) = (&mut self.jobs, alloc.job) {
            j.held = j.held.saturating_sub(1);
        }
        for p in &alloc.parts {
            let Some(node) = self.nodes.get_mut(p.node) else { continue };
            let (free, total) = (&mut node.free, &node.total);
            free.cpu = (free.cpu + p.cpu).min(total.cpu);
            free.memory = (free.memory + p.memory).min(total.memory);
            for (name, u) in &p.custom {
                if let (Some(f), Some(t)) = (free.custom.get_mut(name), total.custom.get(name)) {
                    *f = (*f + u).min(*t);
                }
            }
            for &(i, u) in &p.gpu {
                if let Some(f) = free.gpu.get_mut(i) {
                    *f = (*f + u).min(WHOLE_GPU);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cuda_visible_devices_names_gpus_by_index_or_uuid() {
        let uuid = Some("GPU-5b1d9a2e-0000-1111-2222-333344445555");
        assert!(is_visible("2,3", 3, uuid));
        assert!(!is_visible("2,3", 1, uuid));
        assert!(is_visible(" 0 , 1", 1, None));
        assert!(is_visible("GPU-5b1d9a2e", 7, uuid), "a UUID prefix names the GPU");
        assert!(!is_visible("GPU-aaaa", 7, uuid));
        assert!(!is_visible("", 0, uuid), "set empty: no GPU");
        assert!(!is_visible("MIG-1234", 0, uuid));
    }

    fn req(workers: usize, cpu: f64, gpu: f64, strategy: PlacementStrategy) -> Request {
        let mut r = Resources::from([("CPU".to_string(), cpu)]);
        if gpu > 0.0 {
            r.insert("GPU".into(), gpu);
        }
        Request { workers: vec![r; workers], trainer: Resources::new(), strategy }
    }

    #[test]
    fn what_a_stuck_run_held_stays_out_of_the_pool_for_good() {
        let node = || NodeResources::declared(2.0).with_gpus(1);
        let mut pool = ResourcePool::cluster(vec![("n1".into(), node()), ("n2".into(), node())]);
        let spread = req(2, 1.0, 0.0, PlacementStrategy::StrictSpread);
        let stuck = pool.try_allocate(&req(2, 1.0, 1.0, PlacementStrategy::StrictSpread)).unwrap();
        let other = pool.try_allocate(&spread).unwrap();
        pool.keep_booked(&stuck);
        // Never given back: one CPU a node and no GPU left, whatever ends.
        pool.release(&other);
        assert!(pool.is_idle(), "everything else is free again");
        assert!(pool.check(&req(2, 2.0, 0.0, PlacementStrategy::StrictSpread)).is_err(), "two CPUs a node can never fit now");
        assert!(pool.check(&req(1, 1.0, 1.0, PlacementStrategy::Pack)).is_err(), "nor a GPU");
        let a = pool.try_allocate(&spread).unwrap();
        assert!(pool.try_allocate(&spread).is_none(), "one such run at a time");
        pool.release(&a);
        pool.release(&stuck);
        assert!(pool.try_allocate(&spread).is_some() && pool.try_allocate(&spread).is_none(), "releasing it later changes nothing");
    }

    #[test]
    fn gpus_are_assigned_per_worker_and_returned() {
        let mut pool = ResourcePool::new(NodeResources::declared(16.0).with_gpus(4));
        let a = pool.try_allocate(&req(2, 1.0, 1.0, PlacementStrategy::Pack)).unwrap();
        assert_eq!(a.workers.iter().map(|w| w.cuda_visible_devices()).collect::<Vec<_>>(), ["0", "1"]);
        let b = pool.try_allocate(&req(1, 1.0, 2.0, PlacementStrategy::Pack)).unwrap();
        assert_eq!(b.workers[0].cuda_visible_devices(), "2,3");
        assert!(pool.try_allocate(&req(1, 1.0, 0.5, PlacementStrategy::Pack)).is_none(), "every GPU is taken");
        pool.release(&a);
        let c = pool.try_allocate(&req(2, 1.0, 0.5, PlacementStrategy::Pack)).unwrap();
        assert_eq!(c.workers.iter().map(|w| w.cuda_visible_devices()).collect::<Vec<_>>(), ["0", "0"], "PACK shares a GPU");
        pool.release(&c);
        let d = pool.try_allocate(&req(2, 1.0, 0.5, PlacementStrategy::Spread)).unwrap();
        assert_eq!(d.workers.iter().map(|w| w.cuda_visible_devices()).collect::<Vec<_>>(), ["0", "1"], "SPREAD does not");
        pool.release(&d);
        pool.release(&b);
        assert!(pool.is_idle());
    }

    #[test]
    fn pack_prefers_nvlink_peers() {
        // GPUs 0-1 and 2-3 are NVLink pairs; 1 is busy: a 2-GPU worker gets the pair 2,3, not 0 and 2.
        let gpu = |index: u32, peer: u32| Gpu { index, name: "g".into(), memory_bytes: 0, nvlink_peers: vec![peer] };
        let node = NodeResources::declared(8.0).with_gpu(gpu(0, 1)).with_gpu(gpu(1, 0)).with_gpu(gpu(2, 3)).with_gpu(gpu(3, 2));
        let mut pool = ResourcePool::new(node);
        let first = pool.try_allocate(&req(1, 1.0, 1.0, PlacementStrategy::Pack)).unwrap();
        assert_eq!(first.workers[0].gpus, [0]);
        let pair = pool.try_allocate(&req(2, 1.0, 1.0, PlacementStrategy::StrictPack)).unwrap();
        assert_eq!(pair.workers.iter().flat_map(|w| w.gpus.clone()).collect::<Vec<_>>(), [2, 3]);
        pool.release(&first);
        // STRICT_PACK will not split a trial across the two pairs.
        assert!(pool.try_allocate(&req(2, 1.0, 1.0, PlacementStrategy::StrictPack)).is_some());
        assert!(pool.try_allocate(&req(1, 1.0, 1.0, PlacementStrategy::StrictPack)).is_none());
    }

    #[test]
    fn a_request_that_can_never_fit_is_refused_with_both_sides() {
        let pool = ResourcePool::new(NodeResources::declared(2.0).with_memory(8.0 * (1u64 << 30) as f64));
        let err = pool.check(&req(2, 1.0, 1.0, PlacementStrategy::Pack)).unwrap_err().to_string();
        assert_eq!(
            err,
            "a trial asks for 2 worker(s) x {CPU: 1, GPU: 1}, but the node has {CPU: 2, GPU: 0, memory: 8.0 GiB}; it can never start"
        );
        assert!(pool.check(&req(3, 1.0, 0.0, PlacementStrategy::Pack)).is_err());
        assert!(pool.check(&req(2, 1.0, 0.0, PlacementStrategy::Pack)).is_ok());
        let strict = ResourcePool::new(NodeResources::declared(8.0).with_gpus(1));
        assert!(strict.check(&req(2, 1.0, 0.5, PlacementStrategy::StrictSpread)).is_err(), "two workers cannot avoid sharing one GPU");
        assert!(strict.check(&req(2, 1.0, 0.5, PlacementStrategy::Pack)).is_ok());
    }

    #[test]
    fn cgroup_quotas_and_nvlink_topology_parse() {
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cfs_quota("200000\n", "100000\n"), Some(2.0));
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
        // Two NVLink pairs (0-1, 2-3); GPU 3 also links to an NVSwitch (no GPU); ids padded two ways.
        let bus = |i: u32, b: &str| (i, b.to_string());
        let ids = [bus(0, "00000000:1B:00.0"), bus(1, "00000000:1C:00.0"), bus(2, "00000000:3D:00.0"), bus(3, "00000000:3E:00.0")];
        let links = [
            (0, vec!["0000:1c:00.0".to_string(), "00000000:1C:00.0".to_string()]),
            (1, vec!["00000000:1B:00.0".to_string()]),
            (2, vec!["00000000:3E:00.0".to_string()]),
            (3, vec!["00000000:3D:00.0".to_string(), "00000000:C5:00.0".to_string()]),
        ];
        let peers = nvlink_peers(&ids, &links);
        assert_eq!(peers[&0], [1]);
        assert_eq!(peers[&1], [0]);
        assert_eq!(peers[&2], [3]);
        assert_eq!(peers[&3], [2]);
    }

    #[test]
    fn declared_resources_override_detection() {
        let node =
            NodeResources::from_declared(&Resources::from([("CPU".into(), 16.0), ("GPU".into(), 8.0), ("tpu".into(), 2.0)])).unwrap();
        assert_eq!((node.cpus, node.gpus.len(), node.custom["tpu"]), (16.0, 8, 2.0));
        let err = NodeResources::from_declared(&Resources::from([("GPU".into(), 1.5)])).unwrap_err();
        assert_eq!(err.to_string(), "resources.GPU: must be a whole number of GPUs, got 1.5");
        let mut pool = ResourcePool::new(node);
        let mut r = req(1, 1.0, 0.0, PlacementStrategy::Pack);
        r.workers[0].insert("tpu".into(), 2.0);
        let a = pool.try_allocate(&r).unwrap();
        assert!(pool.try_allocate(&r).is_none(), "custom resources are booked too");
        pool.release(&a);
        assert!(pool.try_allocate(&r).is_some());
    }

    fn three_nodes(cpus: f64, gpus: u32) -> ResourcePool {
        ResourcePool::cluster(
            (1..=3).map(|i| (format!("node{i}"), NodeResources::declared(cpus).with_gpus(gpus).with_memory(1e12))).collect(),
        )
    }

    fn nodes_of(a: &Allocation) -> Vec<&str> {
        a.workers.iter().map(|w| w.node.as_str()).collect()
    }

    #[test]
    fn trials_span_nodes_as_their_strategy_says() {
        let mut pool = three_nodes(4.0, 0);
        // PACK: one node when one holds them all, else as few as can.
        let a = pool.try_allocate(&req(2, 1.0, 0.0, PlacementStrategy::Pack)).unwrap();
        assert_eq!(nodes_of(&a), ["node1", "node1"]);
        let b = pool.try_allocate(&req(6, 1.0, 0.0, PlacementStrategy::Pack)).unwrap();
        // Two nodes (the emptiest first), rank 0's node first, a node's ranks together.
        assert_eq!(nodes_of(&b), ["node2", "node2", "node2", "node2", "node3", "node3"]);
        assert_eq!(b.nodes(), ["node2", "node3"]);
        pool.release(&a);
        pool.release(&b);
        // SPREAD: a node each while there are nodes, then round again.
        let c = pool.try_allocate(&req(4, 1.0, 0.0, PlacementStrategy::Spread)).unwrap();
        let mut spread = nodes_of(&c);
        spread.sort_unstable();
        assert_eq!(spread, ["node1", "node1", "node2", "node3"]);
        pool.release(&c);
        // STRICT_SPREAD: a node each, or nothing.
        let d = pool.try_allocate(&req(3, 4.0, 0.0, PlacementStrategy::StrictSpread)).unwrap();
        assert_eq!(d.nodes().len(), 3);
        assert!(pool.try_allocate(&req(1, 1.0, 0.0, PlacementStrategy::Pack)).is_none(), "every CPU is taken");
        pool.release(&d);
        assert!(pool.is_idle());
        // STRICT_PACK: one node, or nothing.
        let e = pool.try_allocate(&req(4, 1.0, 0.0, PlacementStrategy::StrictPack)).unwrap();
        assert_eq!(e.nodes().len(), 1);
        let f = pool.try_allocate(&req(3, 1.0, 0.0, PlacementStrategy::StrictPack)).unwrap();
        assert_eq!(f.nodes().len(), 1);
        assert_ne!(e.nodes(), f.nodes());
        // A node set aside takes nothing more, and what ran there is not given back.
        let on = e.nodes()[0].to_string();
        assert!(pool.set_aside(&on));
        assert!(!pool.set_aside(&on), "once");
        pool.release(&e);
        pool.release(&f);
        let g = pool.try_allocate(&req(2, 1.0, 0.0, PlacementStrategy::StrictSpread)).unwrap();
        assert!(!g.nodes().contains(&on.as_str()), "{:?}", g.nodes());
        assert!(pool.check(&req(3, 1.0, 0.0, PlacementStrategy::StrictSpread)).is_err(), "two nodes are left");
    }

    #[test]
    fn what_never_fits_on_the_nodes_is_refused_with_the_numbers() {
        let pool = three_nodes(4.0, 1);
        let err = pool.check(&req(4, 1.0, 0.0, PlacementStrategy::StrictSpread)).unwrap_err().to_string();
        assert_eq!(
            err,
            "a trial asks for 4 worker(s) x {CPU: 1} with STRICT_SPREAD (each worker on a node of its own), but the allocation \
             has 3 node(s): node1 {CPU: 4, GPU: 1, memory: 931.3 GiB}, node2 {CPU: 4, GPU: 1, memory: 931.3 GiB}, node3 {CPU: 4, \
             GPU: 1, memory: 931.3 GiB}; it can never start"
        );
        assert!(pool.check(&req(5, 1.0, 0.0, PlacementStrategy::StrictPack)).unwrap_err().to_string().contains("STRICT_PACK"));
        assert!(pool.check(&req(2, 1.0, 1.0, PlacementStrategy::StrictPack)).is_err(), "two GPUs on one node");
        assert!(pool.check(&req(3, 1.0, 1.0, PlacementStrategy::Pack)).is_ok(), "a GPU on each of three nodes");
        assert!(pool.check(&req(12, 1.0, 0.0, PlacementStrategy::Spread)).is_ok());
        assert!(pool.check(&req(13, 1.0, 0.0, PlacementStrategy::Pack)).is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Start { workers: usize, cpu: u8, gpu_tenths: u8, strategy: u8 },
        End(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..5, 0u8..4, 0u8..25, 0u8..4).prop_map(|(workers, cpu, gpu_tenths, strategy)| Op::Start {
                workers,
                cpu,
                gpu_tenths,
                strategy
            }),
            (0usize..8).prop_map(Op::End),
        ]
    }

    proptest! {
        /// Gang allocation: a request gets all its bundles or none; the sum of
        /// what is held never exceeds the node, per resource and per GPU; ends
        /// give everything back.
        #[test]
        fn never_double_booked(ops in proptest::collection::vec(op(), 1..60), cpus in 1u8..12, gpus in 0u32..5) {
            let node = NodeResources::declared(f64::from(cpus)).with_gpus(gpus).with_memory(1e12);
            let mut pool = ResourcePool::new(node);
            let mut held: Vec<(Request, Allocation)> = Vec::new();
            for op in ops {
                match op {
                    Op::Start { workers, cpu, gpu_tenths, strategy } => {
                        // Fractions below 1, whole GPUs above.
                        let gpu = if gpu_tenths <= 10 { f64::from(gpu_tenths) / 10.0 } else { f64::from(gpu_tenths / 10) };
                        let strategy = [PlacementStrategy::Pack, PlacementStrategy::Spread, PlacementStrategy::StrictPack, PlacementStrategy::StrictSpread][strategy as usize];
                        let r = req(workers, f64::from(cpu) / 2.0, gpu, strategy);
                        let before = pool.nodes[0].free.clone();
                        match pool.try_allocate(&r) {
                            Some(a) => {
                                prop_assert_eq!(a.workers.len(), workers, "all bundles or none");
                                for w in &a.workers {
                                    let expected = if gpu == 0.0 { 0 } else if gpu < 1.0 { 1 } else { gpu as usize };
                                    prop_assert_eq!(w.gpus.len(), expected);
                                }
                                held.push((r, a));
                            }
                            None => prop_assert_eq!(&pool.nodes[0].free, &before, "a refused request takes nothing"),
                        }
                    }
                    Op::End(i) => {
                        if !held.is_empty() {
                            let (_, a) = held.remove(i % held.len());
                            pool.release(&a);
                        }
                    }
                }
                // What the holders have adds up to exactly what the pool lacks.
                let cpu_held: u64 = held.iter().flat_map(|(_, a)| &a.parts).map(|p| p.cpu).sum();
                prop_assert_eq!(cpu_held + pool.nodes[0].free.cpu, pool.nodes[0].total.cpu);
                for g in 0..gpus as usize {
                    let used: u64 = held.iter().flat_map(|(_, a)| &a.parts).flat_map(|p| p.gpu.iter()).filter(|(i, _)| *i == g).map(|(_, u)| u).sum();
                    prop_assert!(used <= WHOLE_GPU, "GPU {} booked {} units", g, used);
                    prop_assert_eq!(used + pool.nodes[0].free.gpu[g], WHOLE_GPU);
                }
            }
            for (_, a) in held.drain(..) {
                pool.release(&a);
            }
            prop_assert!(pool.is_idle());
        }
    }

    proptest! {
        /// Across nodes: all bundles or none, nothing booked twice on any
        /// node, STRICT_PACK on one node and STRICT_SPREAD on distinct ones,
        /// a node's ranks together; ends give everything back.
        #[test]
        fn never_double_booked_across_nodes(ops in proptest::collection::vec(op(), 1..60), nodes in 1usize..5, cpus in 1u8..8, gpus in 0u32..3) {
            let mut pool = ResourcePool::cluster(
                (0..nodes).map(|i| (format!("n{i}"), NodeResources::declared(f64::from(cpus)).with_gpus(gpus).with_memory(1e12))).collect(),
            );
            let mut held: Vec<Allocation> = Vec::new();
            for op in ops {
                match op {
                    Op::Start { workers, cpu, gpu_tenths, strategy } => {
                        let gpu = if gpu_tenths <= 10 { f64::from(gpu_tenths) / 10.0 } else { f64::from(gpu_tenths / 10) };
                        let strategy = [PlacementStrategy::Pack, PlacementStrategy::Spread, PlacementStrategy::StrictPack, PlacementStrategy::StrictSpread][strategy as usize];
                        let before: Vec<Free> = pool.nodes.iter().map(|n| n.free.clone()).collect();
                        match pool.try_allocate(&req(workers, f64::from(cpu) / 2.0, gpu, strategy)) {
                            Some(a) => {
                                prop_assert_eq!(a.workers.len(), workers);
                                let used = a.nodes();
                                if strategy == PlacementStrategy::StrictPack {
                                    prop_assert_eq!(used.len(), 1);
                                }
                                if strategy == PlacementStrategy::StrictSpread && nodes > 1 {
                                    prop_assert_eq!(used.len(), workers);
                                }
                                // A node's ranks are contiguous.
                                let runs = a.workers.windows(2).filter(|w| w[0].node != w[1].node).count() + 1;
                                prop_assert_eq!(runs, used.len());
                                held.push(a);
                            }
                            None => {
                                let after: Vec<Free> = pool.nodes.iter().map(|n| n.free.clone()).collect();
                                prop_assert_eq!(after, before, "a refused request takes nothing");
                            }
                        }
                    }
                    Op::End(i) => {
                        if !held.is_empty() {
                            let a = held.remove(i % held.len());
                            pool.release(&a);
                        }
                    }
                }
                for (n, node) in pool.nodes.iter().enumerate() {
                    let parts = || held.iter().flat_map(|a| &a.parts).filter(move |p| p.node == n);
                    let cpu_held: u64 = parts().map(|p| p.cpu).sum();
                    prop_assert_eq!(cpu_held + node.free.cpu, node.total.cpu);
                    for g in 0..gpus as usize {
                        let used: u64 = parts().flat_map(|p| p.gpu.iter()).filter(|(i, _)| *i == g).map(|(_, u)| u).sum();
                        prop_assert_eq!(used + node.free.gpu[g], WHOLE_GPU);
                    }
                }
            }
            for a in held.drain(..) {
                pool.release(&a);
            }
            prop_assert!(pool.is_idle());
        }
    }
}
