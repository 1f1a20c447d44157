//! Slurm: the allocation nestor runs inside (`salloc`, `sbatch`), read from
//! the job's environment and `scontrol show job -d`, as one
//! [`NodeResources`] per node.
//!
//! nestor talks to Slurm only through its command-line tools, whose output
//! is stable across releases (libslurm's ABI is not).

use std::collections::BTreeMap;
use std::process::Command;

use crate::resources::{Gpu, NodeResources, Source};

mod batch;
mod board;
mod commands;
mod config;
mod job;
mod jobs;
mod output;
mod relay;
mod startup;
mod step;
mod submit;
mod supervisor;

pub use batch::{cancel_leftover_jobs, check_job, SlurmJobsBackend};
pub use config::SlurmJobsConfig;
pub use jobs::{parse_squeue, partition_node_addresses, JobEnd, JobRow, JobState, JobWatch, SQUEUE_FORMAT};
pub use relay::{relay_output, RelayTarget};
pub use startup::{cancel_leftovers, probe_name, Held, Leftovers, NodeCheck, StuckStep};
pub use step::{SlurmBackend, DEFAULT_STEP_START_TIMEOUT};
pub use submit::{BatchJob, Shape as SubmitShape};

/// Why the allocation could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the Slurm allocation: {0}")]
pub struct SlurmError(pub String);

/// One node of the allocation: what the job holds on it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmNode {
    /// Slurm's name for it (what `--nodelist` takes).
    pub name: String,
    /// CPUs the job holds there.
    pub cpus: u32,
    /// Memory the job holds there, in bytes (`None`: Slurm gives no limit).
    pub memory_bytes: Option<f64>,
    /// The GPUs the job holds there (their indices on the node).
    pub gpus: Vec<u32>,
    /// The address other nodes reach it at (Slurm's `NodeAddr`; its name
    /// where Slurm gives none).
    pub addr: String,
}

/// The Slurm job nestor runs inside.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmAllocation {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// Its nodes, in Slurm's order.
    pub nodes: Vec<SlurmNode>,
}

impl SlurmAllocation {
    /// The allocation this process runs inside, or `None` outside one
    /// (`SLURM_JOB_ID` unset). The job is read with `scontrol show job -d`
    /// (per node CPUs, memory and GPUs); where `scontrol` cannot answer,
    /// from the job's environment (nodes and CPUs only).
    pub fn from_env() -> Result<Option<Self>, SlurmError> {
        let Some(job_id) = std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty()) else { return Ok(None) };
        let shown = Command::new("scontrol").args(["show", "job", "-d", &job_id]).output();
        match shown {
            Ok(out) if out.status.success() => {
                let mut a = Self::from_scontrol(&job_id, &String::from_utf8_lossy(&out.stdout))?;
                a.read_addresses();
                Ok(Some(a))
            }
            other => {
                let why = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!("scontrol show job {job_id}: {why}; reading the allocation from the environment");
                let vars: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("SLURM_")).collect();
                Self::from_vars(&vars).map(Some)
            }
        }
    }

    /// Reads `scontrol show job -d <job_id>`: one `Nodes=... CPU_IDs=...
    /// Mem=... GRES=...` line per group of nodes alike.
    pub fn from_scontrol(job_id: &str, text: &str) -> Result<Self, SlurmError> {
        let mut nodes = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("Nodes=") && l.contains("CPU_IDs=")) {
            let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')));
            let names = expand_hostlist(field("Nodes").unwrap_or_default())?;
            let cpus = parse_ids(field("CPU_IDs").unwrap_or_default())
                .map_err(|e| SlurmError(format!("job {job_id}: CPU_IDs in {line:?}: {e}")))?
                .len() as u32;
            let memory_bytes = match field("Mem") {
                Some(m) if !m.is_empty() => Some(
                    m.parse::<f64>().map_err(|_| SlurmError(format!("job {job_id}: Mem={m} in {line:?} is not a number of MB")))?
                        * 1024.0
                        * 1024.0,
                ),
                _ => None,
            };
            let gpus = parse_gres_gpus(field("GRES").unwrap_or_default())
                .map_err(|e| SlurmError(format!("job {job_id}: GRES in {line:?}: {e}")))?;
            for name in names {
                nodes.push(SlurmNode { addr: name.clone(), name, cpus, memory_bytes, gpus: gpus.clone() });
            }
        }
        if nodes.is_empty() {
            return Err(SlurmError(format!("scontrol shows no nodes for job {job_id} (is it running?)")));
        }
        Ok(Self { job_id: job_id.to_string(), nodes })
    }

    /// Reads the job's environment: `SLURM_JOB_NODELIST`,
    /// `SLURM_JOB_CPUS_PER_NODE` (`4(x2),2`), `SLURM_MEM_PER_NODE` (MB).
    pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Self, SlurmError> {
        let get = |k: &str| vars.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let job_id = get("SLURM_JOB_ID").ok_or_else(|| SlurmError("SLURM_JOB_ID is not set".into()))?;
        let list = get("SLURM_JOB_NODELIST")
            .or_else(|| get("SLURM_NODELIST"))
            .ok_or_else(|| SlurmError("SLURM_JOB_NODELIST is not set".into()))?;
        let names = expand_hostlist(list)?;
        let cpus = match get("SLURM_JOB_CPUS_PER_NODE") {
            Some(c) => parse_counts(c).map_err(|e| SlurmError(format!("SLURM_JOB_CPUS_PER_NODE={c}: {e}")))?,
            None => vec![1; names.len()],
        };
        if cpus.len() != names.len() {
            return Err(SlurmError(format!(
                "SLURM_JOB_CPUS_PER_NODE gives {} nodes, SLURM_JOB_NODELIST={list} {}",
                cpus.len(),
                names.len()
            )));
        }
        let memory_bytes = match get("SLURM_MEM_PER_NODE") {
            Some(m) => Some(m.parse::<f64>().map_err(|_| SlurmError(format!("SLURM_MEM_PER_NODE={m} is not a number of MB")))? * 1048576.0),
            None => None,
        };
        let nodes = names
            .into_iter()
            .zip(cpus)
            .map(|(name, cpus)| SlurmNode { addr: name.clone(), name, cpus, memory_bytes, gpus: Vec::new() })
            .collect();
        Ok(Self { job_id: job_id.to_string(), nodes })
    }

    /// Reads each node's `NodeAddr` (`scontrol show node -o`); a node
    /// Slurm says nothing of keeps its name as its address.
    pub fn read_addresses(&mut self) {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let Ok(out) = Command::new("scontrol").args(["show", "node", "-o", &names.join(",")]).output() else { return };
        let addrs = node_addresses(&String::from_utf8_lossy(&out.stdout));
        for n in &mut self.nodes {
            if let Some(a) = addrs.get(&n.name) {
                n.addr.clone_from(a);
            }
        }
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&SlurmNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Each node's resources, as the pool books them.
    pub fn node_resources(&self) -> Vec<(String, NodeResources)> {
        self.nodes
            .iter()
            .map(|n| {
                let mut r = NodeResources::declared(f64::from(n.cpus));
                r.source = Source::Detected;
                if let Some(m) = n.memory_bytes {
                    r.memory_bytes = m;
                }
                for &index in &n.gpus {
                    r.gpus.push(Gpu { index, name: "GPU".into(), memory_bytes: 0, nvlink_peers: Vec::new() });
                }
                r.gpu_note = if n.gpus.is_empty() {
                    "no GPUs in the allocation".into()
                } else {
                    format!("GPUs {} from the allocation", n.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                };
                (n.name.clone(), r)
            })
            .collect()
    }
}

/// Expands a Slurm host list: `node[1-3,7],gpu[01-02]-a,login` ->
/// `node1 node2 node3 node7 gpu01-a gpu02-a login` (zero padding kept;
/// several bracket groups in one name give every combination).
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, SlurmError> {
    let bad = |why: &str| SlurmError(format!("host list {list:?}: {why}"));
    let entries = split_outside(list, '[', ']').ok_or_else(|| bad("unbalanced or nested brackets"))?;
    let mut out = Vec::new();
    for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        let mut names = vec![String::new()];
        let mut rest = entry;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']').map(|c| open + c).ok_or_else(|| bad("unbalanced brackets"))?;
            let prefix = &rest[..open];
            let mut values = Vec::new();
            for range in rest[open + 1..close].split(',') {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let width = lo.len();
                let (a, b) = (
                    lo.parse::<u64>().map_err(|_| bad(&format!("{range:?} is not a number or a range")))?,
                    hi.parse::<u64>().map_err(|_| bad(&format!("{range:?} is not a number or a range")))?,
                );
                if a > b || b - a > 100_000 {
                    return Err(bad(&format!("range {range:?}")));
                }
                values.extend((a..=b).map(|v| format!("{v:0width$}")));
            }
            names = names.iter().flat_map(|n| values.iter().map(move |v| format!("{n}{prefix}{v}"))).collect();
            rest = &rest[close + 1..];
        }
        out.extend(names.into_iter().map(|n| format!("{n}{rest}")));
    }
    if out.is_empty() {
        return Err(bad("no hosts"));
    }
    Ok(out)
}

/// `NodeName=node1 ... NodeAddr=10.0.0.5 ...` lines -> name -> address.
fn node_addresses(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name)?.strip_prefix('=').map(str::to_string));
            Some((field("NodeName")?, field("NodeAddr")?))
        })
        .collect()
}

/// Splits `s` at the commas outside `open`/`close` pairs (not nested);
/// `None` when they are unbalanced or nested.
fn split_outside(s: &str, open: char, close: char) -> Option<Vec<&str>> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
        } else if c == ',' && depth == 0 {
            parts.push(&s[start..i]);
            start = i + 1;
        }
        if !(0..=1).contains(&depth) {
            return None;
        }
    }
    parts.push(&s[start..]);
    (depth == 0).then_some(parts)
}

/// `4(x2),2` -> `[4, 4, 2]` (Slurm's per-node counts).
fn parse_counts(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (n, times) = match part.split_once("(x") {
            Some((n, t)) => (n, t.strip_suffix(')').ok_or_else(|| format!("{part:?}: missing ')'"))?),
            None => (part, "1"),
        };
        let n: u32 = n.trim().parse().map_err(|_| format!("{part:?} is not a count"))?;
        let times: usize = times.parse().map_err(|_| format!("{part:?}: bad repeat"))?;
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// `0-3,6` -> `[0, 1, 2, 3, 6]`.
fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (lo.parse().map_err(|_| format!("{part:?}"))?, hi.parse().map_err(|_| format!("{part:?}"))?);
        if a > b {
            return Err(format!("{part:?}"));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// The GPU indices in a node's GRES: `gpu:2(IDX:0-1)`,
/// `gpu:a100:4(IDX:0-3),nic:1` -> `[0, 1]`, `[0, 1, 2, 3]`.
fn parse_gres_gpus(gres: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    let items = split_outside(gres, '(', ')').ok_or_else(|| format!("{gres:?}: unbalanced parentheses"))?;
    for item in items.into_iter().filter(|i| i.starts_with("gpu")) {
        match item.split_once("(IDX:") {
            Some((_, idx)) => out.extend(parse_ids(idx.trim_end_matches(')'))?),
            None => {
                // No indices shown: the count, numbered from 0.
                let n: u32 = item.rsplit(':').next().and_then(|n| n.parse().ok()).ok_or_else(|| format!("{item:?}"))?;
                out.extend(0..n);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        let e = |s: &str| expand_hostlist(s).unwrap();
        assert_eq!(e("node[1-3,7]"), ["node1", "node2", "node3", "node7"]);
        assert_eq!(e("gpu[08-10]-ib,login"), ["gpu08-ib", "gpu09-ib", "gpu10-ib", "login"]);
        assert_eq!(e("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(e("single"), ["single"]);
        assert!(expand_hostlist("node[1-").unwrap_err().0.contains("unbalanced"));
        assert!(expand_hostlist("node[3-1]").unwrap_err().0.contains("range"));
        assert!(expand_hostlist("node[a]").is_err());
    }

    #[test]
    fn per_node_counts_and_gpus_parse() {
        assert_eq!(parse_counts("4(x2),2").unwrap(), [4, 4, 2]);
        assert_eq!(parse_counts("3,1").unwrap(), [3, 1]);
        assert!(parse_counts("x").is_err());
        assert_eq!(parse_ids("0-3,6").unwrap(), [0, 1, 2, 3, 6]);
        assert_eq!(parse_gres_gpus("gpu:2(IDX:0-1)").unwrap(), [0, 1]);
        assert_eq!(parse_gres_gpus("gpu:a100:2(IDX:1,3),nic:1").unwrap(), [1, 3]);
        assert_eq!(parse_gres_gpus("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_gres_gpus("gpu:2").unwrap(), [0, 1]);
    }

    /// Slurm 22.05's `scontrol show job -d` of `salloc -N2 -n4` on two
    /// 4-CPU nodes (3 tasks on one, 1 on the other) with GPUs.
    const SHOWN: &str = "JobId=7 JobName=interactive
   NodeList=node[1-2]
   NumNodes=2 NumCPUs=4 NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:3
     Nodes=node1 CPU_IDs=0-2 Mem=3000 GRES=gpu:2(IDX:0-1)
     Nodes=node2 CPU_IDs=0 Mem=1000 GRES=gpu:1(IDX:1)
   MinCPUsNode=1 MinMemoryNode=1000M MinTmpDiskNode=0
";

    #[test]
    fn scontrol_gives_each_nodes_cpus_memory_and_gpus() {
        let a = SlurmAllocation::from_scontrol("7", SHOWN).unwrap();
        assert_eq!(a.nodes.len(), 2);
        let node = |name: &str, cpus, mb: f64, gpus: Vec<u32>| SlurmNode {
            name: name.into(),
            cpus,
            memory_bytes: Some(mb * 1048576.0),
            gpus,
            addr: name.into(),
        };
        assert_eq!(a.nodes[0], node("node1", 3, 3000.0, vec![0, 1]));
        assert_eq!(a.nodes[1], node("node2", 1, 1000.0, vec![1]));
        let addrs = node_addresses("NodeName=node1 Arch=x86_64 CoresPerSocket=1\nNodeName=node2 NodeAddr=10.0.0.2 NodeHostName=b\n");
        assert_eq!(addrs.len(), 1);
        assert_eq!(addrs["node2"], "10.0.0.2");
        let r = a.node_resources();
        assert_eq!(r[0].1.cpus, 3.0);
        assert_eq!(r[1].1.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [1]);
        // Nodes alike share one line.
        let alike = "   Nodes=n[1-3] CPU_IDs=0-7 Mem=16000 GRES=\n";
        let a = SlurmAllocation::from_scontrol("8", alike).unwrap();
        assert_eq!(a.nodes.iter().map(|n| (n.name.as_str(), n.cpus)).collect::<Vec<_>>(), [("n1", 8), ("n2", 8), ("n3", 8)]);
        assert!(SlurmAllocation::from_scontrol("9", "JobId=9 JobState=PENDING\n").unwrap_err().0.contains("no nodes"));
    }

    #[test]
    fn the_environment_gives_nodes_and_cpus() {
        let vars: BTreeMap<String, String> = [
            ("SLURM_JOB_ID", "12"),
            ("SLURM_JOB_NODELIST", "node[1-3]"),
            ("SLURM_JOB_CPUS_PER_NODE", "4(x2),2"),
            ("SLURM_MEM_PER_NODE", "1024"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let a = SlurmAllocation::from_vars(&vars).unwrap();
        assert_eq!(a.job_id, "12");
        assert_eq!(a.nodes.iter().map(|n| n.cpus).collect::<Vec<_>>(), [4, 4, 2]);
        assert_eq!(a.nodes[2].memory_bytes, Some(1024.0 * 1048576.0));
        let mut short = vars.clone();
        short.insert("SLURM_JOB_CPUS_PER_NODE".into(), "4".into());
        assert!(SlurmAllocation::from_vars(&short).unwrap_err().0.contains("gives 1 nodes"));
    }
}
