//! Slurm jobs of their own (a trial run as a job, not a step of the
//! allocation nestor runs in): their states, read for every job of an
//! experiment in one `squeue` call, paced so that a sweep of hundreds of
//! queued jobs does not flood `slurmctld`, and what each state means for
//! the run: still waiting, running, ended well, or ended by the cluster
//! (preempted, out of time, a node lost), by its own code, or out of memory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::SlurmError;

/// A job's state as `squeue --states=all` names it (`%T`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Queued (with Slurm's reason: `Priority`, `Resources`, `BeginTime` after a requeue, ...).
    Pending,
    /// Its nodes are being set up, or it runs.
    Running,
    /// Stopped by Slurm for a while (suspend-style preemption); it goes on.
    Suspended,
    /// Ending: its processes are being cleaned up.
    Completing,
    /// Ended with exit code 0.
    Completed,
    /// Ended with a non-zero exit code (the trial's code, or its launch).
    Failed,
    /// Cancelled (`scancel`, or the job's dependency).
    Cancelled,
    /// Its time limit ran out.
    Timeout,
    /// Preempted by a job of higher priority (cancelled or requeued).
    Preempted,
    /// A node it ran on failed.
    NodeFail,
    /// A node never booted for it.
    BootFail,
    /// Its deadline passed before it could run.
    Deadline,
    /// Killed for using more memory than it asked for.
    OutOfMemory,
    /// Being put back in the queue (`scontrol requeue`, or preemption with requeue).
    Requeued,
    /// Requeued and held (`REQUEUE_HOLD`, `SPECIAL_EXIT`): it waits for a release.
    Held,
    /// A state this list does not name (newer Slurm releases add some).
    Other(String),
}

/// How a job that ended ended, for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// Its ranks finished.
    Done,
    /// The trial's code (or its launch) failed: charged to `max_failures`.
    Failed,
    /// Out of memory: a failure of the trial, said as such.
    OutOfMemory,
    /// The cluster ended it (preemption, time limit, a node): the run goes
    /// on from its latest checkpoint, not charged to `max_failures`.
    Infrastructure(String),
    /// Cancelled from outside nestor.
    Cancelled,
}

impl JobState {
    /// `%T` of `squeue` (case and spacing aside).
    pub fn parse(text: &str) -> Self {
        match text.trim().to_ascii_uppercase().as_str() {
            "PENDING" => Self::Pending,
            "RUNNING" | "CONFIGURING" | "RESIZING" | "SIGNALING" | "STAGE_OUT" => Self::Running,
            "SUSPENDED" | "STOPPED" => Self::Suspended,
            "COMPLETING" => Self::Completing,
            "COMPLETED" => Self::Completed,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            "TIMEOUT" => Self::Timeout,
            "PREEMPTED" => Self::Preempted,
            "NODE_FAIL" => Self::NodeFail,
            "BOOT_FAIL" => Self::BootFail,
            "DEADLINE" => Self::Deadline,
            "OUT_OF_MEMORY" => Self::OutOfMemory,
            "REQUEUED" | "REQUEUE_FED" => Self::Requeued,
            "REQUEUE_HOLD" | "SPECIAL_EXIT" | "RESV_DEL_HOLD" => Self::Held,
            other => Self::Other(other.to_string()),
        }
    }

    /// How the job ended, or `None` while it may still run (queued,
    /// running, suspended, requeued, held).
    pub fn end(&self) -> Option<JobEnd> {
        Some(match self {
            Self::Pending | Self::Running | Self::Suspended | Self::Completing | Self::Requeued | Self::Held => return None,
            Self::Other(_) => return None,
            Self::Completed => JobEnd::Done,
            Self::Failed => JobEnd::Failed,
            Self::OutOfMemory => JobEnd::OutOfMemory,
            Self::Cancelled => JobEnd::Cancelled,
            Self::Timeout => JobEnd::Infrastructure("the job's time limit ran out".into()),
            Self::Preempted => JobEnd::Infrastructure("the job was preempted".into()),
            Self::NodeFail => JobEnd::Infrastructure("a node of the job failed".into()),
            Self::BootFail => JobEnd::Infrastructure("a node of the job did not boot".into()),
            Self::Deadline => JobEnd::Infrastructure("the job's deadline passed before it ran".into()),
        })
    }
}

/// One line of `squeue`: a job of the experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    /// Slurm's id (`123`, or `123_4` for an array task).
    pub id: String,
    /// Its name (nestor's `nestor-<experiment>-<trial>-<token>`).
    pub name: String,
    /// Its state.
    pub state: JobState,
    /// Slurm's reason (why it waits, or `None`).
    pub reason: String,
    /// Its nodes (empty while queued).
    pub nodes: String,
}

/// The `squeue` format [`parse_squeue`] reads: id, name, state, reason, nodes.
pub const SQUEUE_FORMAT: &str = "%i|%j|%T|%r|%N";

/// Reads `squeue --noheader --format=` [`SQUEUE_FORMAT`]. A job name may
/// hold `|`: the fields are split from both ends.
pub fn parse_squeue(text: &str) -> Result<Vec<JobRow>, SlurmError> {
    let mut rows = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (id, rest) = line.split_once('|').ok_or_else(|| SlurmError(format!("squeue gave {line:?}: expected {SQUEUE_FORMAT}")))?;
        let mut tail = rest.rsplitn(4, '|');
        let (Some(nodes), Some(reason), Some(state), Some(name)) = (tail.next(), tail.next(), tail.next(), tail.next()) else {
            return Err(SlurmError(format!("squeue gave {line:?}: expected {SQUEUE_FORMAT}")));
        };
        rows.push(JobRow {
            id: id.trim().to_string(),
            name: name.to_string(),
            state: JobState::parse(state),
            reason: if reason == "None" { String::new() } else { reason.to_string() },
            nodes: nodes.to_string(),
        });
    }
    Ok(rows)
}

/// Reads the states of an experiment's jobs, all of them in one `squeue`
/// call at most every `interval` (a call asked for sooner answers with the
/// last reading), and counts the calls made.
#[derive(Debug)]
pub struct JobWatch {
    /// The jobs' name prefix (`nestor-<experiment>-`).
    prefix: String,
    interval: Duration,
    /// Variables for `squeue` (`SLURM_CONF` of a cluster other than the default).
    env: Vec<(String, String)>,
    last: Option<(Instant, BTreeMap<String, JobRow>)>,
    calls: u64,
}

impl JobWatch {
    /// Whether a job named `name` is one of the experiment's trial runs:
    /// `<prefix><trial>-<token>`, the trial's id without a `-` and the token
    /// hex digits (the jobs of an experiment whose name extends this one's,
    /// `nestor-<experiment>-x-<trial>-<token>`, and a driver's job,
    /// `nestor-<experiment>`, are not).
    fn names_ours(&self, name: &str) -> bool {
        name.strip_prefix(&self.prefix).and_then(|rest| rest.rsplit_once('-')).is_some_and(|(trial, token)| {
            !trial.is_empty() && !trial.contains('-') && !token.is_empty() && token.chars().all(|c| c.is_ascii_hexdigit())
        })
    }

    /// Watches the jobs whose names start with `prefix`, reading at most every `interval`.
    pub fn new(prefix: impl Into<String>, interval: Duration) -> Self {
        Self { prefix: prefix.into(), interval, env: Vec::new(), last: None, calls: 0 }
    }

    /// Runs `squeue` with `key=value` in its environment.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How many times `squeue` was called.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The experiment's jobs by id: read now when the last reading is
    /// older than the interval, else that reading. Jobs that ended are
    /// listed while Slurm keeps them (`MinJobAge`).
    pub async fn jobs(&mut self) -> Result<&BTreeMap<String, JobRow>, SlurmError> {
        let fresh = self.last.as_ref().is_some_and(|(at, _)| at.elapsed() < self.interval);
        if !fresh {
            self.calls += 1;
            let out = tokio::process::Command::new("squeue")
                .args(["--noheader", "--states=all", "--me", "--format", SQUEUE_FORMAT])
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .output()
                .await
                .map_err(|e| SlurmError(format!("cannot run squeue: {e}")))?;
            if !out.status.success() {
                return Err(SlurmError(format!("squeue failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
            }
            let rows = parse_squeue(&String::from_utf8_lossy(&out.stdout))?;
            let mine = rows.into_iter().filter(|r| self.names_ours(&r.name)).map(|r| (r.id.clone(), r)).collect();
            self.last = Some((Instant::now(), mine));
        }
        match &self.last {
            Some((_, jobs)) => Ok(jobs),
            None => Err(SlurmError("squeue was not read".into())),
        }
    }
}

/// The addresses (Slurm's `NodeAddr`) of the nodes of `partition` (of
/// every partition where `None`), from `sinfo`; empty where it cannot say.
pub fn partition_node_addresses(partition: Option<&str>) -> Vec<String> {
    let mut c = std::process::Command::new("sinfo");
    c.args(["--noheader", "--Node", "--format=%o"]);
    if let Some(p) = partition {
        c.arg(format!("--partition={p}"));
    }
    let Ok(out) = c.output() else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    let mut addrs: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    addrs.dedup();
    addrs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn every_state_squeue_names_has_a_meaning_for_the_run() {
        for (text, end) in [
            ("PENDING", None),
            ("RUNNING", None),
            ("CONFIGURING", None),
            ("COMPLETING", None),
            ("SUSPENDED", None),
            ("REQUEUED", None),
            ("REQUEUE_HOLD", None),
            ("COMPLETED", Some(JobEnd::Done)),
            ("FAILED", Some(JobEnd::Failed)),
            ("OUT_OF_MEMORY", Some(JobEnd::OutOfMemory)),
            ("CANCELLED", Some(JobEnd::Cancelled)),
        ] {
            assert_eq!(JobState::parse(text).end(), end, "{text}");
        }
        for text in ["TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"] {
            assert!(matches!(JobState::parse(text).end(), Some(JobEnd::Infrastructure(_))), "{text}: the cluster's doing");
        }
        assert_eq!(JobState::parse(" timeout\n"), JobState::Timeout);
        assert_eq!(JobState::parse("NEW_STATE"), JobState::Other("NEW_STATE".into()));
        assert_eq!(JobState::parse("NEW_STATE").end(), None, "an unknown state is not taken for an end");
    }

    #[test]
    fn squeue_lines_are_read_from_both_ends() {
        let text = "17|nestor-sweep-trial_00001-ab12|RUNNING|None|node[1-2]\n\
                    18_3|nestor-a|b-trial_00002-cd34|PENDING|Priority|\n\n";
        let rows = parse_squeue(text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0],
            JobRow {
                id: "17".into(),
                name: "nestor-sweep-trial_00001-ab12".into(),
                state: JobState::Running,
                reason: String::new(),
                nodes: "node[1-2]".into(),
            }
        );
        assert_eq!(rows[1].id, "18_3");
        assert_eq!(rows[1].name, "nestor-a|b-trial_00002-cd34", "a name holding the separator");
        assert_eq!(rows[1].state, JobState::Pending);
        assert_eq!(rows[1].reason, "Priority");
        assert!(parse_squeue("garbage").is_err());
        assert!(parse_squeue("1|2|3").is_err());
    }
}
