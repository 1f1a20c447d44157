//! What a sweep finds in its allocation when it starts: job steps an
//! earlier driver of the experiment left, and which nodes can run a step
//! and see the experiment's directory.
//!
//! A step with a rank on a node that died cannot end: Slurm waits for that
//! node to say its part is over, lists the step until the job ends, and
//! keeps what the step holds on the live nodes (CPUs, memory, GPUs) from
//! every later step. So a resume in the same allocation cancels the
//! leftovers, and those still listed after a wait are *stuck*: what each
//! holds, read from the record its launch wrote
//! (`trials/<id>/logs/step-<token>.json`, its ranks' bundles), is taken
//! out of the pool; where no record is found, its nodes are left alone.
//!
//! Each node is then probed on its own (a one-task step, in parallel, with
//! a deadline): a node that runs none in time, or that Slurm calls down,
//! is set aside before the sweep starts; the others say whether they see
//! the experiment's directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::commands::{cpus_per_task, srun, step_prefix, steps};
use super::output::{is_down, node_states};
use super::{expand_hostlist, SlurmAllocation, SlurmError};
use crate::WorkerBundle;

/// How long cancelled steps have to go before they count as stuck.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// How long a node has to run the start-up probe.
const PROBE_DEADLINE: Duration = Duration::from_secs(10);

/// The job steps an earlier driver of the experiment left.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leftovers {
    /// Cancelled, and gone.
    pub cancelled: Vec<String>,
    /// Cancelled, and still listed: they hold what they held until the job ends.
    pub stuck: Vec<StuckStep>,
}

/// A job step Slurm cannot end.
#[derive(Debug, Clone, PartialEq)]
pub struct StuckStep {
    /// `job.step`.
    pub id: String,
    /// Its name (`nestor-<experiment>-<trial>-<token>`).
    pub name: String,
    /// The nodes it was given.
    pub nodes: Vec<String>,
    /// Its ranks' bundles, as its launch recorded them (`None`: no record).
    pub ranks: Option<Vec<WorkerBundle>>,
}

/// What stuck steps hold on one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// Whole CPUs (Slurm books whole CPUs per task).
    pub cpus: u32,
    /// Memory in bytes, where the ranks asked for some.
    pub memory_bytes: f64,
    /// GPUs, by index.
    pub gpus: Vec<u32>,
    /// A stuck step without a record runs there: what it holds is unknown.
    pub unknown: bool,
}

impl Leftovers {
    /// What the stuck steps hold, node by node.
    pub fn held(&self) -> BTreeMap<String, Held> {
        let mut held: BTreeMap<String, Held> = BTreeMap::new();
        for s in &self.stuck {
            match &s.ranks {
                Some(ranks) => {
                    let per_task = cpus_per_task(ranks);
                    for b in ranks {
                        let h = held.entry(b.node.clone()).or_default();
                        h.cpus += per_task;
                        h.memory_bytes += b.memory_bytes;
                        h.gpus.extend(&b.gpus);
                    }
                }
                None => {
                    for n in &s.nodes {
                        held.entry(n.clone()).or_default().unknown = true;
                    }
                }
            }
        }
        held
    }
}

/// The name of the experiment in `exp_dir`'s node probes (`nestor-<experiment>-probe`).
pub fn probe_name(exp_dir: &Path) -> String {
    format!("{}probe", step_prefix(exp_dir))
}

/// Where the launch of the step `token` of a trial records its ranks' bundles.
pub(super) fn record_path(trial_dir: &Path, token: &str) -> PathBuf {
    trial_dir.join("logs").join(format!("step-{token}.json"))
}

/// Records what the step `token` of the trial in `trial_dir` is given
/// (read back should it outlive its driver and be stuck).
pub(super) fn write_record(trial_dir: &Path, token: &str, ranks: &[WorkerBundle]) {
    if let Ok(text) = serde_json::to_vec(ranks) {
        let _ = std::fs::write(record_path(trial_dir, token), text);
    }
}

/// The record of the step named `name` of the experiment in `exp_dir`.
fn read_record(exp_dir: &Path, name: &str) -> Option<Vec<WorkerBundle>> {
    let rest = name.strip_prefix(&step_prefix(exp_dir))?;
    let (trial, token) = rest.rsplit_once('-')?;
    let text = std::fs::read(record_path(&exp_dir.join("trials").join(trial), token)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Cancels the job steps an earlier driver of the experiment in `exp_dir`
/// left in `job` (named `nestor-<experiment>-...`: its trials' and its node
/// probes'), and waits (up to 10 s) until Slurm has them gone; those it
/// still lists then, or sooner when each has a node Slurm calls down, are
/// stuck. Before anything else of a resumed sweep
/// uses the nodes.
pub async fn cancel_leftovers(job: &str, exp_dir: &Path) -> Leftovers {
    let prefix = step_prefix(exp_dir);
    let mine = || async { steps(job).await.into_iter().filter(|s| s.name.starts_with(&prefix)).collect::<Vec<_>>() };
    let left = mine().await;
    if left.is_empty() {
        return Leftovers::default();
    }
    let ids: Vec<String> = left.iter().map(|s| s.id.clone()).collect();
    tracing::warn!(steps = ?ids, "cancelling job steps an earlier run of this experiment left running");
    let _ = tokio::process::Command::new("scancel").args(&ids).status().await;
    let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
    let mut listed = left;
    let mut polls = 0u32;
    while !listed.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        listed = mine().await.into_iter().filter(|s| ids.contains(&s.id)).collect();
        polls += 1;
        // Each second: when every step left has a node Slurm calls down, none will go.
        if polls == 10 && !listed.is_empty() {
            polls = 0;
            let per_step: Vec<Vec<String>> = listed.iter().map(|s| expand_hostlist(&s.nodes).unwrap_or_default()).collect();
            let mut nodes: Vec<String> = per_step.concat();
            nodes.sort();
            nodes.dedup();
            let gone: Vec<String> = down(&nodes).await.into_iter().map(|(n, _)| n).collect();
            if per_step.iter().all(|step| step.iter().any(|n| gone.contains(n))) {
                break;
            }
        }
    }
    let cancelled = ids.iter().filter(|id| !listed.iter().any(|s| &s.id == *id)).cloned().collect();
    let stuck = listed
        .into_iter()
        .map(|s| StuckStep {
            ranks: read_record(exp_dir, &s.name),
            nodes: expand_hostlist(&s.nodes).unwrap_or_default(),
            id: s.id,
            name: s.name,
        })
        .collect::<Vec<_>>();
    if !stuck.is_empty() {
        tracing::warn!(
            steps = ?stuck.iter().map(|s| &s.id).collect::<Vec<_>>(),
            "job steps Slurm cannot end (a rank on a node that is gone): what they hold stays out of the sweep's reach until the job ends"
        );
    }
    Leftovers { cancelled, stuck }
}

/// What the start-up probe found of the nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCheck {
    /// Nodes that run a step but do not see the directory.
    pub unshared: Vec<String>,
    /// Nodes to set aside, with why: Slurm calls them down, or they ran no step in time.
    pub lost: Vec<(String, String)>,
}

impl SlurmAllocation {
    /// Probes every node of the allocation but `skip`, each with a one-task
    /// job step of its own (in parallel, 10 s each; it overlaps the steps
    /// that hold the node's CPUs): whether it runs one at all, and whether it
    /// sees `dir` as this machine does (a file written here is read back).
    /// An error when no node runs the probe.
    pub async fn check_nodes(&self, dir: &Path, probe_name: &str, skip: &[String]) -> Result<NodeCheck, SlurmError> {
        let token = format!(
            "{:x}{:x}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        let probe = dir.join(format!(".nestor-shared-{token}"));
        std::fs::write(&probe, &token).map_err(|e| SlurmError(format!("cannot write {}: {e}", probe.display())))?;
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).filter(|n| !skip.contains(n)).collect();
        let mut check = NodeCheck::default();
        // Nodes Slurm itself calls down are not asked.
        for (node, state) in down(&names).await {
            check.lost.push((node, format!("Slurm says it is {state}")));
        }
        let asked: Vec<String> = names.into_iter().filter(|n| !check.lost.iter().any(|(l, _)| l == n)).collect();
        let mut probes = tokio::task::JoinSet::new();
        for node in asked.clone() {
            let job_id = self.job_id.clone();
            let (probe_name, probe) = (probe_name.to_string(), probe.clone());
            probes.spawn(async move {
                // A step Slurm refuses at once (a launch error, memory a cancelled step has not
                // given back yet) is asked again, a little later, until the deadline: a busy
                // slurmd is not a lost node.
                let deadline = tokio::time::Instant::now() + PROBE_DEADLINE;
                let mut pause = std::time::Duration::from_millis(250);
                let answer = loop {
                    let mut cmd = tokio::process::Command::from(srun(&job_id));
                    cmd.arg(format!("--job-name={probe_name}"))
                        .args(["--overlap", "--nodes=1", "--ntasks=1", "--mem-per-cpu=1", "--quiet"])
                        .arg(format!("--nodelist={node}"))
                        .args(["/bin/sh", "-c", "cat \"$1\" 2>/dev/null; true", "probe"])
                        .arg(&probe)
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .kill_on_drop(true);
                    let refused = match tokio::time::timeout_at(deadline, cmd.output()).await {
                        Err(_) => break Err(format!("it did not run a job step within {} s", PROBE_DEADLINE.as_secs())),
                        Ok(Err(e)) => break Err(format!("cannot run srun: {e}")),
                        Ok(Ok(out)) if out.status.success() => break Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
                        Ok(Ok(out)) => format!("Slurm did not run a job step there: {}", srun_words(&String::from_utf8_lossy(&out.stderr))),
                    };
                    if tokio::time::Instant::now() + pause >= deadline {
                        break Err(refused);
                    }
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                };
                (node, answer)
            });
        }
        let mut answered = 0;
        while let Some(done) = probes.join_next().await {
            let Ok((node, answer)) = done else { continue };
            match answer {
                Ok(seen) => {
                    answered += 1;
                    if seen != token {
                        check.unshared.push(node);
                    }
                }
                Err(why) => check.lost.push((node, why)),
            }
        }
        let _ = std::fs::remove_file(&probe);
        if answered == 0 {
            let why: Vec<String> = check.lost.iter().map(|(n, w)| format!("{n}: {w}")).collect();
            return Err(SlurmError(format!("no node of Slurm job {} runs a job step: {}", self.job_id, why.join("; "))));
        }
        check.unshared.sort();
        check.lost.sort();
        Ok(check)
    }
}

/// srun's own error lines, as one line (`Unable to create step for job 7: ...`).
fn srun_words(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(|l| l.trim().trim_start_matches("srun: error: ").trim_start_matches("srun: ")).collect();
    if lines.is_empty() {
        "srun failed".into()
    } else {
        lines.join("; ")
    }
}

/// The nodes of `nodes` Slurm calls down, drained, failing or not
/// responding, with their state (`scontrol show node -o`).
pub(super) async fn down(nodes: &[String]) -> Vec<(String, String)> {
    if nodes.is_empty() {
        return Vec::new();
    }
    let Ok(out) = tokio::process::Command::new("scontrol").args(["show", "node", "-o", &nodes.join(",")]).output().await else {
        return Vec::new();
    };
    node_states(&String::from_utf8_lossy(&out.stdout)).into_iter().filter(|(_, state)| is_down(state)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(node: &str, cpus: f64, memory: f64, gpus: &[u32]) -> WorkerBundle {
        WorkerBundle { node: node.into(), gpus: gpus.to_vec(), gpu_share: 1.0, memory_bytes: memory, ..WorkerBundle::cpus(cpus) }
    }

    #[test]
    fn stuck_steps_hold_their_ranks_whole_cpus_memory_and_gpus_node_by_node() {
        let left = Leftovers {
            cancelled: vec!["7.1".into()],
            stuck: vec![
                StuckStep {
                    id: "7.2".into(),
                    name: "nestor-e-trial_00000-0123abcd".into(),
                    nodes: vec!["n1".into(), "n2".into()],
                    ranks: Some(vec![rank("n1", 1.5, 100.0, &[0]), rank("n2", 1.0, 100.0, &[1])]),
                },
                StuckStep {
                    id: "7.3".into(),
                    name: "nestor-e-trial_00001-4567abcd".into(),
                    nodes: vec!["n1".into(), "n3".into()],
                    ranks: Some(vec![rank("n1", 1.0, 0.0, &[]), rank("n3", 1.0, 0.0, &[])]),
                },
                StuckStep { id: "7.4".into(), name: "someone-else".into(), nodes: vec!["n4".into()], ranks: None },
            ],
        };
        let held = left.held();
        // Slurm books whole CPUs, as many per task as the step's largest rank asks for.
        assert_eq!(held["n1"], Held { cpus: 3, memory_bytes: 100.0, gpus: vec![0], unknown: false });
        assert_eq!(held["n2"], Held { cpus: 2, memory_bytes: 100.0, gpus: vec![1], unknown: false });
        assert_eq!(held["n3"], Held { cpus: 1, memory_bytes: 0.0, gpus: vec![], unknown: false });
        assert!(held["n4"].unknown);
    }

    #[test]
    fn a_steps_record_is_found_from_its_name() {
        let exp = tempfile::tempdir().unwrap();
        let exp_dir = exp.path().join("sweep-1");
        let trial = exp_dir.join("trials/trial_00003");
        std::fs::create_dir_all(trial.join("logs")).unwrap();
        let ranks = vec![rank("n1", 2.0, 0.0, &[]), rank("n2", 2.0, 0.0, &[])];
        write_record(&trial, "89abcdef", &ranks);
        assert_eq!(read_record(&exp_dir, "nestor-sweep-1-trial_00003-89abcdef"), Some(ranks));
        assert_eq!(read_record(&exp_dir, "nestor-sweep-1-trial_00003-00000000"), None);
        assert_eq!(read_record(&exp_dir, "nestor-other-trial_00003-89abcdef"), None);
    }

    #[test]
    fn srun_words_keep_what_srun_said() {
        assert_eq!(
            srun_words("srun: error: Unable to create step for job 1: Memory required by task is not available\n"),
            "Unable to create step for job 1: Memory required by task is not available"
        );
        assert_eq!(srun_words(""), "srun failed");
    }
}
