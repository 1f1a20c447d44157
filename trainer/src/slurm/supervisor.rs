//! A job step from its start to its run's end, in the local supervisors'
//! shape: one task whose `select!` names its events (a line of the step's
//! output, srun's exit, the next step of a stop), each handled
//! synchronously ([`StepWatch`] for lines); after srun's exit, what the
//! cluster says of the step's nodes ([`StepMonitor::settle`]: a probe of
//! the suspects, the nodes Slurm calls down); the run's outcome a pure
//! function of all that ([`step_outcome`]).
//!
//! Nothing in the loop waits on the controller: a graceful stop's
//! `squeue`/`scancel` run in a task of their own, so the step's lines and
//! its end keep flowing meanwhile. A step that lost a node and that Slurm
//! still lists once srun is gone is stuck: the run's bundles stay booked
//! (`EventKind::Stuck`, before the exit).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::commands::{srun, steps};
use super::output::{step_outcome, StepEnd, StepWatch};
use crate::backend::{Event, EventKind, ExitOutcome, StopLevel};
use crate::groups::signal_group;
use crate::process::log_tail;
use crate::service::Registration;
use crate::supervise::{Escalation, StopStep};

/// Failures of runs blamed on one node before it is set aside.
pub const FAILURES_BEFORE_SET_ASIDE: u32 = 3;

/// How long a node has to run a trivial job step before it counts as gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A pause before a run the cluster refused to start ends, when no node of
/// it is down: the cluster is settling (releasing a lost step's CPUs).
const REFUSAL_BACKOFF: Duration = Duration::from_secs(2);

/// What the steps' ends said of the nodes (one per backend, shared by its steps).
#[derive(Debug, Default)]
pub(super) struct Health {
    /// Failed runs blamed on each node.
    failures: BTreeMap<String, u32>,
    /// Nodes set aside, with why.
    lost: BTreeMap<String, String>,
}

impl Health {
    /// Marks `node` down; the node and why, the first time.
    pub(super) fn node_down(&mut self, node: &str, why: &str) -> Option<(String, String)> {
        if self.lost.contains_key(node) {
            return None;
        }
        self.lost.insert(node.to_string(), why.to_string());
        Some((node.to_string(), why.to_string()))
    }

    /// Counts a failed run against `node`; the node and why when that sets it aside.
    pub(super) fn blame(&mut self, node: &str) -> Option<(String, String)> {
        let n = self.failures.entry(node.to_string()).or_insert(0);
        *n += 1;
        if *n >= FAILURES_BEFORE_SET_ASIDE {
            let why = format!("{n} runs failed on it");
            return self.node_down(node, &why);
        }
        None
    }
}

/// One job step's run, as its supervisor holds it.
pub(super) struct StepMonitor {
    pub(super) trial_id: String,
    /// The Slurm job, and the step's name in it.
    pub(super) job: String,
    pub(super) step_name: String,
    /// srun, leader of its own process group.
    pub(super) child: tokio::process::Child,
    pub(super) pgid: i32,
    /// The step's output, line by line (stdout and stderr).
    pub(super) lines: mpsc::UnboundedReceiver<String>,
    pub(super) watch: StepWatch,
    pub(super) stopping: Escalation,
    /// Each rank's node, in rank order.
    pub(super) rank_nodes: Vec<String>,
    pub(super) log_paths: Vec<PathBuf>,
    pub(super) srun_log: PathBuf,
    /// The step's record (what it holds), gone once it ended on every node.
    pub(super) record: PathBuf,
    pub(super) rendezvous: PathBuf,
    pub(super) registration: Registration,
    /// Where lost nodes are told.
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) health: Arc<std::sync::Mutex<Health>>,
    /// The name of the node probes' steps.
    pub(super) probe_name: String,
    /// How long srun may wait for the step's resources before the run
    /// counts as one the cluster would not start.
    pub(super) start_timeout: Duration,
}

/// When every rank of the step must run (srun may wait for busy nodes
/// without a word for a minute): `None` once they do.
fn start_deadline(watch: &StepWatch, limit: Duration) -> Option<tokio::time::Instant> {
    let started = watch.started.load(std::sync::atomic::Ordering::Acquire);
    (!started && watch.refused.is_none()).then(|| tokio::time::Instant::from_std(watch.since + limit))
}

/// What the cluster said of a step's nodes after its end.
#[derive(Debug, Default)]
struct Settled {
    /// Suspects that ran no probe step in time.
    gone: Vec<String>,
    /// Nodes of a refused step Slurm calls down, with their state.
    down_here: Vec<(String, String)>,
}

impl StepMonitor {
    /// Runs the step to its end; its run's outcome.
    pub(super) async fn run(mut self) -> ExitOutcome {
        let mut lines_open = true;
        let status = loop {
            let deadline = start_deadline(&self.watch, self.start_timeout);
            tokio::select! {
                line = self.lines.recv(), if lines_open => match line {
                    Some(line) => self.watch.on_line(&line),
                    None => lines_open = false,
                },
                status = self.child.wait(), if !lines_open => break status,
                step = self.stopping.next() => self.on_stop(step),
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    // Never an endless wait: what the step needs is held (a stuck step, someone else's), so it
                    // counts as a step the cluster would not start, and the run is placed again or fails naming it.
                    let said = self.watch.waiting.clone().unwrap_or_else(|| "it said nothing".into());
                    self.watch.refused =
                        Some(format!("srun had not started every rank after {} s, waiting for the step's resources ({said})", self.start_timeout.as_secs_f64()));
                    tracing::warn!(trial = %self.trial_id, step = %self.step_name, "{}; ending srun", self.watch.refused.as_deref().unwrap_or_default());
                    signal_group(self.pgid, libc::SIGKILL);
                }
            }
        };
        let requested = self.stopping.asked();
        let _ = std::fs::remove_file(&self.rendezvous);
        let failed_here = matches!(&status, Ok(s) if !s.success()) && requested == StopLevel::Run;
        let settled = self.settle(failed_here, requested).await;
        for (node, why) in self.judge(&settled, failed_here) {
            // Set aside before the run's exit comes: its restart goes elsewhere.
            let _ = self.events.send(Event { trial_id: self.trial_id.clone(), kind: EventKind::NodeLost { node, why } });
        }
        let StepWatch { lost, refused, failed, .. } = self.watch;
        let lost = lost.or_else(|| settled.gone.first().map(|n| (n.clone(), "it stopped answering".to_string())));
        if lost.is_none() {
            // The step ended on every node: nothing of it can be left stuck.
            let _ = std::fs::remove_file(&self.record);
        } else if still_listed(&self.job, &self.step_name).await {
            // A rank on the lost node: Slurm keeps the step, and what it holds on the live nodes, until the job ends.
            tracing::warn!(trial = %self.trial_id, step = %self.step_name, "the job step outlives its run (a rank on a lost node): its CPUs stay held");
            let _ = self.events.send(Event { trial_id: self.trial_id.clone(), kind: EventKind::Stuck });
        }
        let end =
            StepEnd { status: &status, requested, lost, refused, down_here: &settled.down_here, failed, rank_nodes: &self.rank_nodes };
        let outcome = step_outcome(end, &self.log_paths, &self.srun_log, |log| log_tail(log, 20));
        let aggregator = self.registration.aggregator();
        if outcome == ExitOutcome::Completed {
            for r in 0..self.rank_nodes.len() {
                aggregator.rank_finished(r as u32);
            }
        } else {
            aggregator.fail();
        }
        // Its reports are refused from here on.
        drop(self.registration);
        outcome
    }

    /// The next step of a stop.
    fn on_stop(&self, step: StopStep) {
        match step {
            StopStep::Kill => {
                if self.stopping.requested < StopLevel::Kill {
                    tracing::warn!(trial = %self.trial_id, "the job step still runs after SIGTERM; ending it");
                }
                // srun ends the step on every node.
                signal_group(self.pgid, libc::SIGTERM);
            }
            StopStep::Terminate => {
                // The ranks get SIGTERM where they run; srun ends when they do. Off the loop:
                // squeue and scancel wait on the controller.
                let (job, step_name, pgid) = (self.job.clone(), self.step_name.clone(), self.pgid);
                tokio::spawn(async move {
                    match steps(&job).await.into_iter().find(|s| s.name == step_name).map(|s| s.id) {
                        Some(id) => {
                            let _ = tokio::process::Command::new("scancel").args(["--signal=TERM", &id]).status().await;
                        }
                        None => signal_group(pgid, libc::SIGTERM),
                    }
                });
            }
        }
    }

    /// Asks the cluster about the step's nodes, once srun is gone: the
    /// failed rank's node (or, after a kill, the nodes of the ranks the step
    /// waited for) must run a probe step in time; a refused step's nodes
    /// are looked up (and, none down, its end paced).
    async fn settle(&self, failed_here: bool, requested: StopLevel) -> Settled {
        let mut settled = Settled::default();
        let suspects: Vec<String> = match (&self.watch.failed, requested) {
            _ if self.watch.lost.is_some() => Vec::new(),
            (Some((_, node, _)), StopLevel::Run) if failed_here => vec![node.clone()],
            (_, StopLevel::Kill) => {
                let lagging = self.registration.aggregator().lagging_ranks();
                let mut nodes: Vec<String> = if lagging.is_empty() {
                    self.rank_nodes.clone()
                } else {
                    lagging.iter().filter_map(|&r| self.rank_nodes.get(r as usize).cloned()).collect()
                };
                nodes.dedup();
                nodes
            }
            _ => Vec::new(),
        };
        for node in suspects {
            if !answers(&self.job, &node, &self.probe_name).await {
                settled.gone.push(node);
            }
        }
        if self.watch.refused.is_some() && self.watch.lost.is_none() {
            let mut nodes = self.rank_nodes.clone();
            nodes.sort();
            nodes.dedup();
            settled.down_here = super::startup::down(&nodes).await;
            if settled.down_here.is_empty() {
                // None is down: the cluster is busy or settling. A pause before the run's end,
                // so its restart does not spend its retries at once.
                tokio::time::sleep(REFUSAL_BACKOFF).await;
            }
        }
        settled
    }

    /// The nodes this step's end sets aside, newly: one srun saw lost, the
    /// suspects that did not answer, those Slurm calls down, and the failed
    /// rank's once it has failed runs enough.
    fn judge(&self, settled: &Settled, failed_here: bool) -> Vec<(String, String)> {
        let mut h = self.health.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut newly = Vec::new();
        if let Some((node, why)) = &self.watch.lost {
            newly.extend(h.node_down(node, why));
        }
        for node in &settled.gone {
            newly.extend(h.node_down(node, &format!("it did not run a job step within {} s", PROBE_TIMEOUT.as_secs())));
        }
        for (node, state) in &settled.down_here {
            newly.extend(h.node_down(node, &format!("Slurm says it is {state}")));
        }
        if let (Some((_, node, _)), true, true) = (&self.watch.failed, failed_here, settled.gone.is_empty()) {
            newly.extend(h.blame(node));
        }
        newly
    }
}

/// How long a step whose srun has gone may take to leave Slurm's list.
const STEP_LEAVES: Duration = Duration::from_secs(2);

/// Whether Slurm still lists `job`'s step `name` after [`STEP_LEAVES`].
async fn still_listed(job: &str, name: &str) -> bool {
    let deadline = tokio::time::Instant::now() + STEP_LEAVES;
    loop {
        if !steps(job).await.iter().any(|s| s.name == name) {
            return false;
        }
        if tokio::time::Instant::now() >= deadline {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `node` of `job` still runs a job step (`true` on it): a healthy
/// node answers in well under a second, busy or not (the probe overlaps the
/// steps that hold its CPUs).
async fn answers(job: &str, node: &str, name: &str) -> bool {
    let probe = tokio::process::Command::from(srun(job))
        .arg(format!("--job-name={name}"))
        .args(["--overlap", "--nodes=1", "--ntasks=1", "--mem-per-cpu=1", "--quiet"])
        .arg(format!("--nodelist={node}"))
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Ok(s)) if s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_set_aside_after_repeated_failures_and_reported_once() {
        let mut h = Health::default();
        for _ in 1..FAILURES_BEFORE_SET_ASIDE {
            assert_eq!(h.blame("node1"), None);
        }
        assert!(h.lost.is_empty());
        assert_eq!(h.blame("node1"), Some(("node1".into(), "3 runs failed on it".into())));
        assert_eq!(h.lost["node1"], "3 runs failed on it");
        // Once set aside, a node is not reported again.
        assert_eq!(h.blame("node1"), None);
        assert_eq!(h.node_down("node1", "gone"), None);
        assert_eq!(h.node_down("node2", "gone"), Some(("node2".into(), "gone".into())));
    }
}
