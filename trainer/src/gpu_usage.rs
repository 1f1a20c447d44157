//! Per-trial GPU figures: how busy each trial keeps its GPUs and how much
//! of their memory it holds, so a user sees at a glance whether the GPUs
//! are used.
//!
//! A node's sampler reads every GPU once a `period` (through NVML, in a
//! thread of its own: NVML's calls block) and hands each read to
//! [`Usage::record`], which gives every trial running on the node its
//! share:
//!
//! - **memory**: what the trial's processes hold on its GPUs (NVML's
//!   compute processes, matched to the trial by process group: a rank's
//!   group is its pid, and its children's, data loader workers', is the
//!   same). Where NVML names no process of the node's (a container that
//!   sees other process ids), a GPU held by one trial alone counts wholly
//!   to it.
//! - **utilisation**: the SM utilisation NVML samples per process, summed
//!   over the trial's processes, where the GPU reports it; otherwise the
//!   GPU's own utilisation, which for a GPU shared by several trials
//!   (`GPU = 0.25`) is theirs together. A trial on several GPUs gets the
//!   mean of them.
//!
//! Each trial's figures accumulate twice: since its last result (taken
//! with that result) and over its whole life.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One read of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRead {
    /// NVML's index (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    /// Percent of the period a kernel ran.
    pub util_percent: f64,
    /// Memory in use on the device, bytes.
    pub memory_used: u64,
    /// The compute processes on it.
    pub processes: Vec<ProcessRead>,
    /// Whether the device samples utilisation per process.
    pub per_process_util: bool,
}

/// One compute process on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessRead {
    /// Its id, as NVML sees it.
    pub pid: u32,
    /// The memory it holds, when NVML says.
    pub memory_bytes: Option<u64>,
    /// Its SM utilisation over the period (percent), when sampled.
    pub sm_percent: Option<f64>,
}

/// What runs where: a trial's GPUs and its ranks' process groups.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holding {
    /// NVML indices of the GPUs its bundles hold.
    pub gpus: BTreeSet<u32>,
    /// Its ranks' process groups.
    pub groups: BTreeSet<i32>,
}

/// Peak and mean of a trial's utilisation and memory over a stretch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Reads counted.
    pub reads: u64,
    util_sum: f64,
    /// Highest utilisation, percent.
    pub util_peak: f64,
    mem_sum: f64,
    /// Most memory held, bytes.
    pub memory_peak: u64,
}

impl Figures {
    fn add(&mut self, util: f64, memory: u64) {
        self.reads += 1;
        self.util_sum += util;
        self.util_peak = self.util_peak.max(util);
        self.mem_sum += memory as f64;
        self.memory_peak = self.memory_peak.max(memory);
    }

    /// Mean utilisation, percent.
    pub fn util_mean(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.util_sum / self.reads as f64
        }
    }

    /// Mean memory held, bytes.
    pub fn memory_mean(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.mem_sum / self.reads as f64
        }
    }
}

/// Mean utilisation since the trial's last result, percent.
pub const UTIL: &str = "gpu_util_percent";
/// Mean memory held since the trial's last result, bytes.
pub const MEMORY: &str = "gpu_memory_bytes";
/// Mean utilisation over the trial's life so far, percent.
pub const UTIL_MEAN: &str = "gpu_util_mean_percent";
/// Peak utilisation over the trial's life so far, percent.
pub const UTIL_PEAK: &str = "gpu_util_peak_percent";
/// Mean memory held over the trial's life so far, bytes.
pub const MEMORY_MEAN: &str = "gpu_memory_mean_bytes";
/// Most memory held over the trial's life so far, bytes.
pub const MEMORY_PEAK: &str = "gpu_memory_peak_bytes";
/// Every metric the figures add to a result.
pub const METRICS: [&str; 6] = [UTIL, MEMORY, UTIL_MEAN, UTIL_PEAK, MEMORY_MEAN, MEMORY_PEAK];

/// The figures a result carries: since the trial's last result, and over
/// its life so far. Nothing while no read has counted (no GPU, or none yet).
pub fn metrics(since_last: &Figures, life: &Figures) -> Vec<(String, f64)> {
    if life.reads == 0 {
        return Vec::new();
    }
    let mut m = Vec::with_capacity(6);
    if since_last.reads > 0 {
        m.push((UTIL.to_string(), since_last.util_mean()));
        m.push((MEMORY.to_string(), since_last.memory_mean().round()));
    }
    m.push((UTIL_MEAN.to_string(), life.util_mean()));
    m.push((UTIL_PEAK.to_string(), life.util_peak));
    m.push((MEMORY_MEAN.to_string(), life.memory_mean().round()));
    m.push((MEMORY_PEAK.to_string(), life.memory_peak as f64));
    m
}

/// A trial's life figures for people, from its latest metrics:
/// `utilisation mean 63% (peak 98%), memory mean 2.1 GiB (peak 3.4 GiB)`;
/// `None` without them.
pub fn summary(metrics: &BTreeMap<String, f64>) -> Option<String> {
    let get = |k: &str| metrics.get(k).copied();
    let gib = |b: f64| b / f64::from(1u32 << 30);
    Some(format!(
        "utilisation mean {:.0}% (peak {:.0}%), memory mean {:.1} GiB (peak {:.1} GiB)",
        get(UTIL_MEAN)?,
        get(UTIL_PEAK)?,
        gib(get(MEMORY_MEAN)?),
        gib(get(MEMORY_PEAK)?)
    ))
}

/// One trial's share of a read of the node's GPUs: (utilisation percent,
/// memory bytes), or `None` when it holds no GPU that was read.
/// `holders(gpu)` counts the trials holding a GPU; `group_of(pid)` is a
/// process's group.
pub fn share(
    reads: &[DeviceRead],
    holding: &Holding,
    holders: impl Fn(u32) -> usize,
    group_of: impl Fn(u32) -> Option<i32>,
) -> Option<(f64, u64)> {
    let mine: Vec<&DeviceRead> = reads.iter().filter(|d| holding.gpus.contains(&d.index)).collect();
    if mine.is_empty() {
        return None;
    }
    let ours = |p: &ProcessRead| group_of(p.pid).is_some_and(|g| holding.groups.contains(&g));
    let mut util = 0.0;
    let mut memory = 0u64;
    for d in &mine {
        let procs: Vec<&ProcessRead> = d.processes.iter().filter(|p| ours(p)).collect();
        let alone = holders(d.index) <= 1;
        // Memory: our processes' own; a device whose processes NVML names none of ours (ids from
        // another namespace), held by us alone, wholly ours.
        let known = procs.iter().filter_map(|p| p.memory_bytes).sum::<u64>();
        memory += if procs.is_empty() && alone && d.processes.iter().all(|p| group_of(p.pid).is_none()) { d.memory_used } else { known };
        util += if d.per_process_util && !procs.is_empty() {
            procs.iter().filter_map(|p| p.sm_percent).sum::<f64>().min(100.0)
        } else if d.per_process_util && !alone {
            0.0 // the device samples per process and none of ours ran a kernel
        } else {
            d.util_percent
        };
    }
    Some((util / mine.len() as f64, memory))
}

/// The figures of one source of reads: the driver's own node, or one node of a
/// run on a cluster (whose sampler sends its share, [`Usage::record_node`]).
#[derive(Debug, Clone, Copy, Default)]
struct Source {
    /// How many GPUs its reads cover (the weight of its utilisation).
    gpus: u32,
    since_last: Figures,
    life: Figures,
}

impl Source {
    fn add(&mut self, gpus: u32, util: f64, memory: u64) {
        self.gpus = gpus.max(1);
        self.since_last.add(util, memory);
        self.life.add(util, memory);
    }
}

/// The source key of the driver's own node's reads.
const HERE: u32 = u32::MAX;

/// One trial's figures from several nodes as one: utilisation the mean over
/// their GPUs (each node's weighted by its GPUs), memory their sum. Means
/// are exact; the peaks are the nodes' peaks so combined, which is the
/// trial's own peak when its nodes peak together (as data-parallel ranks
/// do) and above it otherwise. One node: its figures as they are.
fn combine(parts: &[(u32, Figures)]) -> Figures {
    let parts: Vec<&(u32, Figures)> = parts.iter().filter(|(_, f)| f.reads > 0).collect();
    match parts.as_slice() {
        [] => Figures::default(),
        [(_, only)] => *only,
        many => {
            let reads = many.iter().map(|(_, f)| f.reads).max().unwrap_or(1);
            let weight: f64 = many.iter().map(|(g, _)| f64::from(*g)).sum();
            let weighted = |v: &dyn Fn(&Figures) -> f64| many.iter().map(|(g, f)| f64::from(*g) * v(f)).sum::<f64>() / weight;
            Figures {
                reads,
                util_sum: weighted(&Figures::util_mean) * reads as f64,
                util_peak: weighted(&|f| f.util_peak),
                mem_sum: many.iter().map(|(_, f)| f.memory_mean()).sum::<f64>() * reads as f64,
                memory_peak: many.iter().map(|(_, f)| f.memory_peak).sum(),
            }
        }
    }
}

/// The node's trials' figures, read by read.
#[derive(Debug, Default)]
pub struct Usage {
    holdings: BTreeMap<String, Holding>,
    /// Per trial, per source (a node's rank, or [`HERE`]).
    figures: HashMap<String, BTreeMap<u32, Source>>,
}

impl Usage {
    /// A run of `trial` started holding `holding` (a restarted group replaces the last).
    pub fn start(&mut self, trial: &str, holding: Holding) {
        self.holdings.insert(trial.to_string(), holding);
    }

    /// The run of `trial` ended: its GPUs are no longer its (its figures stay until taken).
    pub fn end(&mut self, trial: &str) {
        self.holdings.remove(trial);
    }

    /// Counts a read of the node's GPUs towards every running trial.
    pub fn record(&mut self, reads: &[DeviceRead], group_of: impl Fn(u32) -> Option<i32>) {
        let mut count: HashMap<u32, usize> = HashMap::new();
        for h in self.holdings.values() {
            for g in &h.gpus {
                *count.entry(*g).or_default() += 1;
            }
        }
        for (trial, holding) in &self.holdings {
            let Some((util, memory)) = share(reads, holding, |g| count.get(&g).copied().unwrap_or(0), &group_of) else { continue };
            let gpus = u32::try_from(holding.gpus.len()).unwrap_or(u32::MAX);
            self.figures.entry(trial.clone()).or_default().entry(HERE).or_default().add(gpus, util, memory);
        }
    }

    /// Counts the share of `trial` that node `node` of its run read on its
    /// `gpus` GPUs (utilisation their mean, memory their sum).
    pub fn record_node(&mut self, trial: &str, node: u32, gpus: u32, util: f64, memory: u64) {
        self.figures.entry(trial.to_string()).or_default().entry(node).or_default().add(gpus, util, memory);
    }

    /// The metrics a result of `trial` carries now; the stretch since its last result starts again.
    pub fn take(&mut self, trial: &str) -> Vec<(String, f64)> {
        let Some(sources) = self.figures.get_mut(trial) else { return Vec::new() };
        let since: Vec<(u32, Figures)> = sources.values_mut().map(|s| (s.gpus, std::mem::take(&mut s.since_last))).collect();
        let life: Vec<(u32, Figures)> = sources.values().map(|s| (s.gpus, s.life)).collect();
        metrics(&combine(&since), &combine(&life))
    }

    /// The GPUs some run holds.
    pub fn held(&self) -> Vec<u32> {
        let all: BTreeSet<u32> = self.holdings.values().flat_map(|h| h.gpus.iter().copied()).collect();
        all.into_iter().collect()
    }

    /// Forgets a trial that will not report again.
    pub fn forget(&mut self, trial: &str) {
        self.holdings.remove(trial);
        self.figures.remove(trial);
    }
}

/// The driver's node's figures, shared by its report server (which adds
/// them to each trial's results) and its engine (which says what runs
/// where). The sampler thread starts with the first run that holds a GPU,
/// when NVML is there, and ends with the last handle.
#[derive(Debug)]
pub struct GpuUsage {
    usage: std::sync::Mutex<Usage>,
    sampler: std::sync::OnceLock<()>,
    period: std::time::Duration,
    /// Whether any read has counted: until then a report's `take` is a load, no lock.
    counted: std::sync::atomic::AtomicBool,
}

impl Default for GpuUsage {
    fn default() -> Self {
        Self::new(std::time::Duration::from_secs(1))
    }
}

impl GpuUsage {
    /// Reads every `period` while runs hold GPUs.
    pub fn new(period: std::time::Duration) -> Self {
        Self {
            usage: std::sync::Mutex::new(Usage::default()),
            sampler: std::sync::OnceLock::new(),
            period,
            counted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, Usage> {
        self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A run of `trial` holds `holding`; starts the sampler on the first GPU.
    pub fn start(self: &std::sync::Arc<Self>, trial: &str, holding: Holding) {
        if holding.gpus.is_empty() {
            return;
        }
        self.usage().start(trial, holding);
        self.sampler.get_or_init(|| {
            let Some(mut reader) = NvmlReader::open() else { return };
            let weak = std::sync::Arc::downgrade(self);
            let period = self.period;
            let spawned = std::thread::Builder::new().name("nestor-gpu-usage".into()).spawn(move || loop {
                std::thread::sleep(period);
                let Some(me) = weak.upgrade() else { return };
                let held: Vec<u32> = me.usage().held();
                if held.is_empty() {
                    continue;
                }
                let reads = reader.read(&held);
                me.record(&reads, process_group);
            });
            if let Err(e) = spawned {
                tracing::warn!("no per-trial GPU figures: cannot start the sampler thread: {e}");
            }
        });
    }

    /// The run of `trial` ended.
    pub fn end(&self, trial: &str) {
        self.usage().end(trial);
    }

    /// The metrics a result of `trial` carries now (see [`metrics`]).
    pub fn take(&self, trial: &str) -> Vec<(String, f64)> {
        if !self.counted.load(std::sync::atomic::Ordering::Acquire) {
            return Vec::new(); // every report of a sweep without GPUs comes here
        }
        self.usage().take(trial)
    }

    /// Counts a read as the sampler does (for runs whose reads come from elsewhere, and tests).
    pub fn record(&self, reads: &[DeviceRead], group_of: impl Fn(u32) -> Option<i32>) {
        self.usage().record(reads, group_of);
        self.counted.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Counts what the sampler of node `node` of a run of `trial` sent
    /// ([`Usage::record_node`]).
    pub fn record_node(&self, trial: &str, node: u32, gpus: u32, util: f64, memory: u64) {
        self.usage().record_node(trial, node, gpus, util, memory);
        self.counted.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A process's group, from `/proc/<pid>/stat` (its fifth field).
pub fn process_group(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Reads the node's GPUs through NVML: `None` when there is no NVML.
pub struct NvmlReader {
    nvml: nvml_wrapper::Nvml,
    /// The last process-utilisation timestamp seen, per device.
    seen: HashMap<u32, u64>,
}

impl NvmlReader {
    /// NVML, when the driver is there.
    pub fn open() -> Option<Self> {
        nvml_wrapper::Nvml::init().ok().map(|nvml| Self { nvml, seen: HashMap::new() })
    }

    /// One read of each of `indices` (those that answer).
    pub fn read(&mut self, indices: &[u32]) -> Vec<DeviceRead> {
        let mut out = Vec::with_capacity(indices.len());
        for &index in indices {
            let Ok(dev) = self.nvml.device_by_index(index) else { continue };
            let util_percent = dev.utilization_rates().map_or(0.0, |u| f64::from(u.gpu));
            let memory_used = dev.memory_info().map_or(0, |m| m.used);
            let mut processes: Vec<ProcessRead> = dev
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| ProcessRead {
                    pid: p.pid,
                    memory_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                    },
                    sm_percent: None,
                })
                .collect();
            let since = self.seen.get(&index).copied();
            let per_process_util = match dev.process_utilization_stats(since) {
                Ok(samples) => {
                    let mut latest: HashMap<u32, (u64, u32)> = HashMap::new();
                    for s in samples {
                        let e = latest.entry(s.pid).or_insert((s.timestamp, s.sm_util));
                        if s.timestamp >= e.0 {
                            *e = (s.timestamp, s.sm_util);
                        }
                        self.seen.insert(index, self.seen.get(&index).copied().unwrap_or(0).max(s.timestamp));
                    }
                    for p in &mut processes {
                        p.sm_percent = Some(latest.get(&p.pid).map_or(0.0, |(_, u)| f64::from(*u)));
                    }
                    true
                }
                Err(_) => false,
            };
            out.push(DeviceRead { index, util_percent, memory_used, processes, per_process_util });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn device(index: u32, util: f64, used: u64, procs: &[(u32, u64, Option<f64>)], per_process: bool) -> DeviceRead {
        DeviceRead {
            index,
            util_percent: util,
            memory_used: used,
            processes: procs.iter().map(|&(pid, mem, sm)| ProcessRead { pid, memory_bytes: Some(mem), sm_percent: sm }).collect(),
            per_process_util: per_process,
        }
    }

    fn holding(gpus: &[u32], groups: &[i32]) -> Holding {
        Holding { gpus: gpus.iter().copied().collect(), groups: groups.iter().copied().collect() }
    }

    /// pid -> group: 100 and 101 (a data loader worker of 100) in group 100; 200 in 200; 300 in 300.
    fn groups(pid: u32) -> Option<i32> {
        match pid {
            100 | 101 => Some(100),
            200 => Some(200),
            300 => Some(300),
            _ => None,
        }
    }

    #[test]
    fn four_trials_sharing_a_gpu_each_get_their_own_memory_and_utilisation() {
        let mut u = Usage::default();
        u.start("a", holding(&[0], &[100]));
        u.start("b", holding(&[0], &[200]));
        u.start("c", holding(&[0], &[300]));
        u.start("d", holding(&[0], &[400]));
        let read = device(0, 90.0, 7 << 30, &[(100, 1 << 30, Some(30.0)), (101, 1 << 29, Some(10.0)), (200, 2 << 30, Some(50.0))], true);
        u.record(&[read], groups);
        let a = u.take("a");
        let get = |m: &[(String, f64)], k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap();
        assert_eq!(get(&a, "gpu_util_percent"), 40.0, "a rank and its loader worker, summed");
        assert_eq!(get(&a, "gpu_memory_bytes"), (1u64 << 30 | 1 << 29) as f64);
        let b = u.take("b");
        assert_eq!((get(&b, "gpu_util_percent"), get(&b, "gpu_memory_bytes")), (50.0, (2u64 << 30) as f64));
        // c's process holds nothing on the GPU yet, d's is not a process NVML names: neither gets another's share.
        for t in ["c", "d"] {
            let m = u.take(t);
            assert_eq!((get(&m, "gpu_util_percent"), get(&m, "gpu_memory_bytes")), (0.0, 0.0), "{t}");
        }
    }

    #[test]
    fn a_gpu_held_alone_counts_wholly_when_nvml_names_no_process_of_ours() {
        // A container: NVML's pids are the host's; the device is the trial's alone.
        let h = holding(&[1], &[100]);
        let read = device(1, 75.0, 3 << 30, &[(99_999, 3 << 30, None)], false);
        assert_eq!(share(std::slice::from_ref(&read), &h, |_| 1, groups), Some((75.0, 3 << 30)));
        // Shared with another trial, the device's memory is not given to either.
        assert_eq!(share(&[read], &h, |_| 2, groups), Some((75.0, 0)));
        // A trial on another GPU gets nothing of this read.
        assert_eq!(share(&[device(0, 10.0, 1, &[], false)], &h, |_| 1, groups), None);
    }

    #[test]
    fn a_trial_on_two_gpus_gets_their_mean_utilisation_and_their_memory_summed() {
        let h = holding(&[0, 1], &[100, 200]);
        let reads = [device(0, 80.0, 0, &[(100, 4 << 30, None)], false), device(1, 40.0, 0, &[(200, 2 << 30, None)], false)];
        assert_eq!(share(&reads, &h, |_| 1, groups), Some((60.0, 6 << 30)));
    }

    #[test]
    fn figures_since_the_last_result_start_again_and_the_life_figures_keep_peak_and_mean() {
        let mut u = Usage::default();
        assert!(u.take("a").is_empty(), "no read yet: no GPU figures");
        u.start("a", holding(&[0], &[100]));
        for (util, gib) in [(20.0, 1u64), (60.0, 3), (40.0, 2)] {
            u.record(&[device(0, util, gib << 30, &[(100, gib << 30, None)], false)], groups);
        }
        let first = u.take("a");
        let get = |m: &[(String, f64)], k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get(&first, "gpu_util_percent"), Some(40.0));
        assert_eq!(get(&first, "gpu_util_peak_percent"), Some(60.0));
        assert_eq!(get(&first, "gpu_memory_peak_bytes"), Some((3u64 << 30) as f64));
        // No read since: the life figures, and no stretch of its own.
        let again = u.take("a");
        assert_eq!((get(&again, "gpu_util_percent"), get(&again, "gpu_util_mean_percent")), (None, Some(40.0)));
        u.record(&[device(0, 100.0, 1 << 30, &[(100, 1 << 30, None)], false)], groups);
        let later = u.take("a");
        assert_eq!(get(&later, "gpu_util_percent"), Some(100.0));
        assert_eq!(get(&later, "gpu_util_mean_percent"), Some(55.0));
        // Its run ended: later reads are not its; its figures stay until forgotten.
        u.end("a");
        u.record(&[device(0, 0.0, 0, &[], false)], groups);
        assert_eq!(get(&u.take("a"), "gpu_util_mean_percent"), Some(55.0));
        u.forget("a");
        assert!(u.take("a").is_empty());
    }

    #[test]
    fn a_run_across_nodes_gets_its_nodes_utilisation_weighted_by_gpus_and_their_memory_summed() {
        let mut u = Usage::default();
        let get = |m: &[(String, f64)], k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        // Node 0: 2 GPUs at 30% then 50% (mean 40), 4 GiB; node 1: 1 GPU at 70%, 2 GiB, read once.
        u.record_node("a", 0, 2, 30.0, 4 << 30);
        u.record_node("a", 0, 2, 50.0, 4 << 30);
        u.record_node("a", 1, 1, 70.0, 2 << 30);
        let m = u.take("a");
        assert_eq!(get(&m, UTIL), Some(50.0), "(2 x 40 + 1 x 70) / 3");
        assert_eq!(get(&m, MEMORY), Some((6u64 << 30) as f64));
        assert_eq!(get(&m, UTIL_PEAK), Some(170.0 / 3.0), "(2 x 50 + 1 x 70) / 3");
        assert_eq!(get(&m, MEMORY_PEAK), Some((6u64 << 30) as f64));
        // The next stretch: node 1 alone read; its figures are the stretch's, the life's keep both nodes.
        u.record_node("a", 1, 1, 10.0, 1 << 30);
        let m = u.take("a");
        assert_eq!((get(&m, UTIL), get(&m, MEMORY)), (Some(10.0), Some((1u64 << 30) as f64)));
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0));
        assert!(close(get(&m, UTIL_MEAN), 40.0), "(2 x 40 + 1 x (70 + 10) / 2) / 3: {m:?}");
        assert!(close(get(&m, MEMORY_MEAN), (4u64 << 30) as f64 + 1.5 * f64::from(1u32 << 30)), "{m:?}");
        // One node alone is its own figures, as the driver's node's reads are.
        u.record_node("b", 3, 4, 25.0, 1 << 30);
        u.record_node("b", 3, 4, 75.0, 3 << 30);
        let m = u.take("b");
        assert_eq!((get(&m, UTIL), get(&m, UTIL_PEAK), get(&m, MEMORY_PEAK)), (Some(50.0), Some(75.0), Some((3u64 << 30) as f64)));
        u.forget("a");
        assert!(u.take("a").is_empty());
    }

    #[test]
    fn a_trials_figures_read_as_one_line_for_people() {
        let mut u = Usage::default();
        u.start("a", holding(&[0], &[100]));
        for util in [50.0, 90.0] {
            u.record(&[device(0, util, 0, &[(100, 3 << 30, None)], false)], groups);
        }
        let m: BTreeMap<String, f64> = u.take("a").into_iter().collect();
        assert_eq!(summary(&m).unwrap(), "utilisation mean 70% (peak 90%), memory mean 3.0 GiB (peak 3.0 GiB)");
        assert!(m.keys().all(|k| METRICS.contains(&k.as_str())), "{m:?}");
        assert_eq!(summary(&BTreeMap::from([("loss".to_string(), 1.0)])), None);
    }

    #[test]
    fn a_process_group_is_read_from_proc() {
        let me = std::process::id();
        let group = unsafe { libc::getpgid(0) };
        assert_eq!(process_group(me), Some(group));
        assert_eq!(process_group(u32::MAX), None);
    }
}
