//! `nestor gpu-sample`: the GPU sampler of one node of a run on a cluster.
//!
//! On a Slurm node no nestor process runs beside the ranks: the step's (or
//! the job's) prologue starts this sampler next to the node's first rank,
//! as that rank's child, when the run holds GPUs there. Once a period it
//! reads the node's GPUs of the run (through NVML), takes the run's share
//! of them ([`crate::gpu_usage::share`]: the memory its processes hold,
//! their utilisation where the GPU samples it per process) and sends it to
//! the driver (`GpuFigures`), which adds it to the trial's next result as
//! it does its own node's reads.
//!
//! The run's processes on the node are those started by the same Slurm
//! step on the same node: their environment (`/proc/<pid>/environ`, as
//! they were started, so a data loader worker counts with its rank) names
//! the same `SLURM_JOB_ID`, `SLURM_STEP_ID` and `SLURMD_NODENAME`.
//!
//! The sampler ends with its rank (the kernel's parent-death signal, and
//! a check of its parent each period), when the driver no longer knows the
//! run, or after a minute of a driver that does not answer. It never
//! writes to the rank's output: a node that cannot sample (no NVML) says so
//! once to the driver, which logs it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::gpu_usage::{share, DeviceRead, Holding, NvmlReader, ProcessRead};
use crate::proto::{self, GpuFiguresRequest};

/// What `nestor gpu-sample` is told by the prologue that starts it.
#[derive(Debug, Clone)]
pub struct SamplerArgs {
    /// The node's GPUs of the run (NVML indices).
    pub gpus: Vec<u32>,
    /// Whether other runs share them (fractional GPUs): a GPU's own
    /// figures are then not the run's alone.
    pub shared: bool,
    /// How often to read.
    pub period: Duration,
}

/// The GPU list a prologue passes (`0,1` or Slurm's `0-1,3`), as indices.
pub fn parse_gpus(list: &str) -> Result<Vec<u32>, String> {
    let mut out = BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| s.parse::<u32>().map_err(|_| format!("--gpus {list:?}: `{part}` is not a GPU index or range"));
        match part.split_once('-') {
            Some((a, b)) => out.extend(num(a)?..=num(b)?),
            None => {
                out.insert(num(part)?);
            }
        }
    }
    if out.is_empty() {
        return Err(format!("--gpus {list:?}: no GPU index"));
    }
    Ok(out.into_iter().collect())
}

/// Which processes are the run's on this node: those whose environment
/// names this sampler's Slurm job, step and node.
#[derive(Debug)]
pub struct StepProcesses {
    marks: Vec<(String, String)>,
    seen: HashMap<u32, bool>,
}

/// The variables that say which step, on which node, a process belongs to.
const MARKS: [&str; 3] = ["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME"];

impl StepProcesses {
    /// The marks of `var` (this process's environment, in practice).
    pub fn new(var: impl Fn(&str) -> Option<String>) -> Self {
        let marks = MARKS.iter().filter_map(|k| var(k).map(|v| (k.to_string(), v))).collect();
        Self { marks, seen: HashMap::new() }
    }

    /// Whether `pid` is one of the run's: its environment carries every mark.
    pub fn contains(&mut self, pid: u32) -> bool {
        if self.marks.is_empty() {
            return false;
        }
        if let Some(&known) = self.seen.get(&pid) {
            return known;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
        let vars: HashMap<&[u8], &[u8]> =
            environ.split(|b| *b == 0).filter_map(|kv| kv.iter().position(|b| *b == b'=').map(|i| (&kv[..i], &kv[i + 1..]))).collect();
        let ours = self.marks.iter().all(|(k, v)| vars.get(k.as_bytes()) == Some(&v.as_bytes()));
        self.seen.insert(pid, ours);
        ours
    }
}

/// Where reads come from: NVML, or (`NESTOR_GPU_READS`, for tests and for
/// replaying a node's figures without its GPUs) a directory of JSON files,
/// one compute process each: `{"index", "pid", "memory_bytes", "sm_percent"}`.
pub enum Reads {
    /// The node's GPUs.
    Nvml(Box<NvmlReader>),
    /// Processes as files say.
    Files(PathBuf),
}

#[derive(serde::Deserialize)]
struct ProcessFile {
    index: u32,
    pid: u32,
    memory_bytes: u64,
    sm_percent: f64,
}

impl Reads {
    /// `NESTOR_GPU_READS`'s directory when set, else NVML; `None` without either.
    pub fn open() -> Option<Self> {
        match std::env::var_os("NESTOR_GPU_READS") {
            Some(dir) if !dir.is_empty() => Some(Self::Files(dir.into())),
            _ => NvmlReader::open().map(|r| Self::Nvml(Box::new(r))),
        }
    }

    /// One read of each of `indices`.
    pub fn read(&mut self, indices: &[u32]) -> Vec<DeviceRead> {
        match self {
            Self::Nvml(nvml) => nvml.read(indices),
            Self::Files(dir) => {
                let mut devices: BTreeMap<u32, DeviceRead> = BTreeMap::new();
                for entry in std::fs::read_dir(&*dir).into_iter().flatten().flatten() {
                    let Ok(text) = std::fs::read(entry.path()) else { continue };
                    let Ok(p) = serde_json::from_slice::<ProcessFile>(&text) else { continue };
                    if !indices.contains(&p.index) {
                        continue;
                    }
                    let d = devices.entry(p.index).or_insert_with(|| DeviceRead {
                        index: p.index,
                        util_percent: 0.0,
                        memory_used: 0,
                        processes: Vec::new(),
                        per_process_util: true,
                    });
                    d.util_percent = (d.util_percent + p.sm_percent).min(100.0);
                    d.memory_used += p.memory_bytes;
                    d.processes.push(ProcessRead { pid: p.pid, memory_bytes: Some(p.memory_bytes), sm_percent: Some(p.sm_percent) });
                }
                devices.into_values().collect()
            }
        }
    }
}

/// The run's share of one read: `None` when no GPU of the run answered.
pub fn node_share(reads: &[DeviceRead], args: &SamplerArgs, step: &mut StepProcesses) -> Option<(f64, u64)> {
    let holding = Holding { gpus: args.gpus.iter().copied().collect(), groups: BTreeSet::from([0]) };
    let holders = if args.shared { 2 } else { 1 };
    let ours: BTreeSet<u32> = reads.iter().flat_map(|d| &d.processes).map(|p| p.pid).filter(|&pid| step.contains(pid)).collect();
    share(reads, &holding, |_| holders, |pid| ours.contains(&pid).then_some(0))
}

/// How long the sampler keeps trying a driver that does not answer.
const PATIENCE: Duration = Duration::from_secs(60);

/// Samples until the rank ends (see the module's text); the run is named
/// by its plan (`NESTOR_RUN`, `NESTOR_TOKEN`), the sender by `RANK` and
/// `NODE_RANK`.
pub fn run(args: &SamplerArgs) -> Result<(), String> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's own attribute.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let (plan, token) = crate::contract::RunPlan::from_env().map_err(|e| format!("{e} (run beside a nestor trial's rank)"))?;
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    let (rank, node) = (num("RANK"), num("NODE_RANK"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let endpoint = crate::tls::endpoint(&plan.channel.addr, plan.channel.tls_ca.as_deref())?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10));
    let channel = {
        let _guard = rt.enter();
        endpoint.connect_lazy()
    };
    let mut client = proto::reporter_client::ReporterClient::new(channel);
    let request = |gpus: u32, util: f64, memory: u64, note: String| GpuFiguresRequest {
        version: 1,
        trial_id: plan.trial.id.clone(),
        token: token.clone(),
        rank,
        node,
        gpus,
        util_percent: util,
        memory_bytes: memory,
        note,
    };
    let Some(mut reads) = Reads::open() else {
        let note = "no GPU figures from this node: NVML (the NVIDIA driver's libnvidia-ml.so) is not there".to_string();
        let _ = rt.block_on(client.gpu_figures(request(0, 0.0, 0, note)));
        return Ok(());
    };
    let mut step = StepProcesses::new(|k| std::env::var(k).ok());
    let gpus = u32::try_from(args.gpus.len()).unwrap_or(u32::MAX);
    let mut answered = Instant::now();
    loop {
        std::thread::sleep(args.period);
        // SAFETY: as above.
        if unsafe { libc::getppid() } != parent {
            return Ok(()); // the rank is gone
        }
        let Some((util, memory)) = node_share(&reads.read(&args.gpus), args, &mut step) else { continue };
        match rt.block_on(client.gpu_figures(request(gpus, util, memory, String::new()))) {
            Ok(_) => answered = Instant::now(),
            // The run is over, or this is not a run the driver knows: nothing more to send.
            Err(s) if matches!(s.code(), tonic::Code::Unauthenticated | tonic::Code::InvalidArgument) => return Ok(()),
            Err(s) if answered.elapsed() > PATIENCE => {
                return Err(format!("the driver at {} does not answer: {}", plan.channel.addr, s.message()))
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn gpu_lists_read_as_slurm_and_nestor_write_them() {
        assert_eq!(parse_gpus("0").unwrap(), vec![0]);
        assert_eq!(parse_gpus("3,1").unwrap(), vec![1, 3]);
        assert_eq!(parse_gpus("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        for bad in ["", "x", "1-", "a-3"] {
            assert!(parse_gpus(bad).unwrap_err().starts_with("--gpus"), "{bad}");
        }
    }

    /// A process started with `SLURM_STEP_ID=<step>` (a rank of that step, for the test).
    fn rank_of(step: &str) -> std::process::Child {
        std::process::Command::new("sleep").arg("30").env("SLURM_JOB_ID", "7").env("SLURM_STEP_ID", step).spawn().unwrap()
    }

    fn step(id: &str) -> StepProcesses {
        StepProcesses::new(|k| match k {
            "SLURM_JOB_ID" => Some("7".into()),
            "SLURM_STEP_ID" => Some(id.into()),
            _ => None,
        })
    }

    #[test]
    fn the_runs_processes_are_those_its_step_started_on_this_node() {
        let (mut a, mut b) = (rank_of("0"), rank_of("1"));
        let mut ours = step("0");
        assert!(ours.contains(a.id()));
        assert!(!ours.contains(b.id()), "another step's rank");
        assert!(!ours.contains(std::process::id()), "a process of no step");
        assert!(!ours.contains(u32::MAX), "no such process");
        // Outside a Slurm step there are no marks, and no process is the run's.
        assert!(!StepProcesses::new(|_| None).contains(a.id()));
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn a_node_counts_its_steps_processes_and_no_other_steps() {
        let (mut a, mut b) = (rank_of("0"), rank_of("1"));
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, index: u32, pid: u32, gib: u64, sm: f64| {
            let body = serde_json::json!({"index": index, "pid": pid, "memory_bytes": gib << 30, "sm_percent": sm});
            std::fs::write(dir.path().join(name), body.to_string()).unwrap();
        };
        write("ours.json", 0, a.id(), 2, 30.0);
        write("theirs.json", 0, b.id(), 5, 50.0);
        write("elsewhere.json", 3, a.id(), 1, 90.0); // a GPU of the node the run does not hold
        std::fs::write(dir.path().join("torn.json"), "{\"index\": 0, \"pi").unwrap();
        let mut reads = Reads::Files(dir.path().to_path_buf());
        let read = reads.read(&[0]);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].processes.len(), 2);
        assert_eq!((read[0].util_percent, read[0].memory_used), (80.0, 7 << 30));
        let args = SamplerArgs { gpus: vec![0], shared: true, period: Duration::from_secs(1) };
        assert_eq!(node_share(&read, &args, &mut step("0")), Some((30.0, 2 << 30)));
        assert_eq!(node_share(&read, &args, &mut step("1")), Some((50.0, 5 << 30)));
        // A GPU of another run only: nothing to send.
        assert_eq!(node_share(&reads.read(&[7]), &args, &mut step("0")), None);
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
