//! What a job step's output and exit say: srun's lines (a rank's, or
//! srun's own about a failed task, a lost node, a step it would not create),
//! read by a synchronous handler ([`StepWatch`]) the step's supervisor
//! calls for each line, and the run's outcome from how the step ended
//! ([`step_outcome`]), a pure function of what the supervisor saw; and
//! what `scontrol` says of the nodes.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::{ExitOutcome, StopLevel};
use crate::groups::describe_exit;

/// A node srun says is gone: `srun: error: Node failure on node2`, or
/// `srun: error: Task launch for StepId=4.1 failed on node node2: Communication connection failure`.
pub(super) fn node_lost(line: &str) -> Option<(String, String)> {
    if let Some((_, node)) = line.split_once("Node failure on ") {
        return Some((node.trim().to_string(), "Slurm reports a node failure".into()));
    }
    let (_, rest) = line.split_once(" failed on node ")?;
    let (node, why) = rest.split_once(": ")?;
    Some((node.trim().to_string(), format!("a job step could not start there: {}", why.trim())))
}

/// A failed task as srun says it: `srun: error: node2: task 1: Exited with exit code 3`.
pub(super) fn failed_task(line: &str) -> Option<(u32, String, String)> {
    let (before, after) = line.split_once(": task ")?;
    let (task, how) = after.split_once(": ")?;
    let node = before.rsplit(": ").next().unwrap_or_default().to_string();
    Some((task.trim().parse().ok()?, node, how.trim().to_string()))
}

/// srun's word for how a task ended, as a rank's failure reads it.
pub(super) fn ended(how: &str) -> String {
    match how {
        "Killed" => "was killed (SIGKILL)".into(),
        "Terminated" => "was terminated (SIGTERM)".into(),
        // srun's word for a task its step's memory cgroup's OOM killer ended.
        "Out Of Memory" => "was killed by the out-of-memory killer (srun: Out Of Memory): it used more memory than its \
                            node or its step's limit allows; give the trial fewer workers or less to hold, or ask for more \
                            with the workers' `memory`"
            .into(),
        _ => match how.strip_prefix("Exited with exit code ") {
            Some(code) => format!("exited with code {code}"),
            None => how.to_lowercase(),
        },
    }
}

/// `  3: text` -> (3, "text") for a line srun labelled with its task.
pub(super) fn labelled(line: &str) -> Option<(u32, &str)> {
    let (task, text) = line.trim_start().split_once(": ")?;
    Some((task.parse().ok()?, text))
}

/// Whether srun says it could not create the step (`srun: error: Unable to
/// create step for job 7: Requested node configuration is not available`).
pub(super) fn step_refused(line: &str) -> bool {
    line.contains("Unable to create step") || line.contains("Requested node configuration is not available")
}

/// Whether srun says it waits for what the step needs (`srun: Job 7 step
/// creation temporarily disabled, retrying (Requested nodes are busy)`).
pub(super) fn step_waiting(line: &str) -> bool {
    // `Job 7 step creation ...` (or `Job step creation ...` in older releases).
    line.contains("step creation temporarily disabled") || line.contains("step creation still disabled")
}

/// What a job step's output says, line by line: each rank's lines go to its
/// log (a rank's first line means it runs), srun's own to `srun.log`, read
/// for a refused step, a lost node and the rank that failed.
pub(super) struct StepWatch {
    pub(super) rank_files: Vec<std::fs::File>,
    pub(super) srun_file: std::fs::File,
    /// Ranks that have printed their first line (the prologue's).
    pub(super) running: Vec<bool>,
    /// Set once every rank runs.
    pub(super) started: Arc<std::sync::atomic::AtomicBool>,
    /// srun could not create the step: what it said.
    pub(super) refused: Option<String>,
    /// When srun was started: its step's ranks must all run within the
    /// step start bound.
    pub(super) since: std::time::Instant,
    /// What srun said of waiting for the step's resources, if it did.
    pub(super) waiting: Option<String>,
    /// A node lost under the step, and why.
    pub(super) lost: Option<(String, String)>,
    /// The rank that failed first: its rank, node and how it ended.
    pub(super) failed: Option<(u32, String, String)>,
}

impl StepWatch {
    pub(super) fn new(rank_files: Vec<std::fs::File>, srun_file: std::fs::File, started: Arc<std::sync::atomic::AtomicBool>) -> Self {
        let running = vec![false; rank_files.len()];
        let since = std::time::Instant::now();
        Self { rank_files, srun_file, running, started, refused: None, since, waiting: None, lost: None, failed: None }
    }

    /// One line of srun's output.
    pub(super) fn on_line(&mut self, line: &str) {
        match labelled(line) {
            Some((r, text)) if (r as usize) < self.rank_files.len() => {
                let _ = writeln!(self.rank_files[r as usize], "{text}");
                if !self.running[r as usize] {
                    self.running[r as usize] = true;
                    if self.running.iter().all(|&r| r) {
                        self.started.store(true, std::sync::atomic::Ordering::Release);
                    }
                }
            }
            _ => {
                let _ = writeln!(self.srun_file, "{line}");
                if self.refused.is_none() && step_refused(line) {
                    self.refused = Some(line.trim().to_string());
                }
                if self.waiting.is_none() && step_waiting(line) {
                    self.waiting = Some(line.trim().to_string());
                }
                if let Some(l) = node_lost(line) {
                    self.lost.get_or_insert(l);
                }
                // The rank that failed, not one the step's end terminated after it.
                if let Some(f) = failed_task(line) {
                    if self.failed.as_ref().is_none_or(|(_, _, how)| how == "Terminated" && f.2 != "Terminated") {
                        self.failed = Some(f);
                    }
                }
            }
        }
    }
}

/// The logs a run's step writes below `logs`: each rank's
/// (`rank-<r>.log`) and the one for the rest (`name`), opened to append;
/// their paths and files.
pub(super) fn open_logs(
    logs: &Path,
    world: u32,
    name: &str,
) -> Result<(Vec<PathBuf>, Vec<std::fs::File>, PathBuf, std::fs::File), crate::backend::LaunchError> {
    let open = |p: &PathBuf| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|source| crate::backend::LaunchError::Io { path: p.clone(), source })
    };
    let paths: Vec<PathBuf> = (0..world).map(|r| logs.join(format!("rank-{r}.log"))).collect();
    let files = paths.iter().map(open).collect::<Result<Vec<_>, _>>()?;
    let other = logs.join(name);
    let file = open(&other)?;
    Ok((paths, files, other, file))
}

/// How a job step ended, as its supervisor saw it.
pub(super) struct StepEnd<'a> {
    /// srun's exit.
    pub(super) status: &'a std::io::Result<std::process::ExitStatus>,
    /// How hard the driver had asked it to stop.
    pub(super) requested: StopLevel,
    /// A node lost under it, and why.
    pub(super) lost: Option<(String, String)>,
    /// What srun said when the cluster would not create the step.
    pub(super) refused: Option<String>,
    /// The step's nodes Slurm calls down, with their state.
    pub(super) down_here: &'a [(String, String)],
    /// The rank that failed first: its rank, node and how it ended.
    pub(super) failed: Option<(u32, String, String)>,
    /// Each rank's node.
    pub(super) rank_nodes: &'a [String],
}

/// The run's outcome from how its step ended: a pure function of what the
/// supervisor saw (`tail(log)`: the end of a log file, for the message).
pub(super) fn step_outcome(end: StepEnd<'_>, log_paths: &[PathBuf], srun_log: &Path, tail: impl Fn(&Path) -> String) -> ExitOutcome {
    let StepEnd { status, requested, lost, refused, down_here, failed, rank_nodes } = end;
    match status {
        // A node lost under a step ends the run, whatever srun's status: not the code's doing.
        _ if lost.is_some() && requested != StopLevel::Graceful => {
            let (node, why) = lost.unwrap_or_default();
            let ranks: Vec<String> = rank_nodes.iter().enumerate().filter(|(_, n)| **n == node).map(|(r, _)| r.to_string()).collect();
            ExitOutcome::Infrastructure(format!(
                "node {node} was lost under rank {} ({why}); it is set aside for the rest of the sweep",
                ranks.join(", ")
            ))
        }
        Ok(s) if s.success() => ExitOutcome::Completed,
        // The cluster would not start it: not the code's doing.
        Ok(_) if refused.is_some() && requested == StopLevel::Run => {
            let said = refused.unwrap_or_default();
            let why = if down_here.is_empty() {
                "no node of it is down; it is tried again".to_string()
            } else {
                let down: Vec<String> = down_here.iter().map(|(n, st)| format!("{n} ({st})")).collect();
                format!("Slurm calls {} down; set aside for the rest of the sweep", down.join(", "))
            };
            ExitOutcome::Infrastructure(format!("the cluster would not start the job step on {}: {said}; {why}", rank_nodes.join(",")))
        }
        _ if requested > StopLevel::Run => ExitOutcome::Stopped,
        Ok(s) => match failed {
            Some((rank, node, how)) => {
                let log = log_paths.get(rank as usize).map_or(srun_log, PathBuf::as_path);
                let tail = tail(log);
                let tail = if tail.is_empty() { String::new() } else { format!("; last log lines ({}):\n{tail}", log.display()) };
                ExitOutcome::Failed(format!("rank {rank} (on {node}) {}{tail}", ended(&how)))
            }
            None => ExitOutcome::Failed(format!(
                "the job step {}; {}:\n{}",
                if s.signal().is_some() { describe_exit(*s) } else { format!("ended: srun {}", describe_exit(*s)) },
                srun_log.display(),
                tail(srun_log)
            )),
        },
        Err(e) => ExitOutcome::Failed(format!("failed to wait for srun: {e}")),
    }
}

/// `NodeName=node1 ... State=DOWN+NOT_RESPONDING ...` lines -> (name, state).
pub(super) fn node_states(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name)?.strip_prefix('=').map(str::to_string));
            Some((field("NodeName")?, field("State")?))
        })
        .collect()
}

/// Whether a node in `state` can run nothing now.
pub(super) fn is_down(state: &str) -> bool {
    ["DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN"].iter().any(|s| state.contains(s)) || state.ends_with('*')
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_task_srun_reports_out_of_memory_is_named_as_killed_by_the_oom_killer() {
        assert!(super::ended("Out Of Memory").starts_with("was killed by the out-of-memory killer"));
        assert_eq!(super::ended("Exited with exit code 3"), "exited with code 3");
        assert_eq!(super::ended("Killed"), "was killed (SIGKILL)");
    }

    use super::*;

    /// How a step ended, for [`step_outcome`]: srun's exit code (`None`: it could not be waited for).
    fn outcome_of(code: Option<i32>, requested: StopLevel, f: impl FnOnce(&mut StepEnd<'_>)) -> ExitOutcome {
        outcome_down(code, requested, false, f)
    }

    /// [`outcome_of`], with n2 down when `down`.
    fn outcome_down(code: Option<i32>, requested: StopLevel, down: bool, f: impl FnOnce(&mut StepEnd<'_>)) -> ExitOutcome {
        use std::os::unix::process::ExitStatusExt;
        let status = code.map(|c| std::process::ExitStatus::from_raw(c << 8)).ok_or_else(|| std::io::Error::other("no child"));
        let nodes = vec!["n1".to_string(), "n1".to_string(), "n2".to_string()];
        let down_here = if down { vec![("n2".to_string(), "DOWN".to_string())] } else { Vec::new() };
        let mut end =
            StepEnd { status: &status, requested, lost: None, refused: None, down_here: &down_here, failed: None, rank_nodes: &nodes };
        f(&mut end);
        let logs = vec![PathBuf::from("/logs/rank-0.log"), PathBuf::from("/logs/rank-1.log")];
        step_outcome(end, &logs, Path::new("/logs/srun.log"), |p| format!("tail of {}", p.display()))
    }

    #[test]
    fn a_steps_lines_go_to_their_logs_and_say_how_it_went() {
        let dir = tempfile::tempdir().unwrap();
        let file = |n: &str| std::fs::File::create(dir.path().join(n)).unwrap();
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut w = StepWatch::new(vec![file("rank-0.log"), file("rank-1.log")], file("srun.log"), Arc::clone(&started));
        w.on_line("0: nestor: rank 0 starts");
        assert!(!started.load(std::sync::atomic::Ordering::Acquire), "rank 1 has not printed yet");
        w.on_line("1: nestor: rank 1 starts");
        assert!(started.load(std::sync::atomic::Ordering::Acquire), "every rank has printed: the step runs");
        // A rank terminated by the step's end does not hide the one that failed first, nor the other way round.
        w.on_line("srun: error: node2: task 1: Terminated");
        w.on_line("srun: error: node1: task 0: Exited with exit code 3");
        w.on_line("srun: error: node2: task 1: Killed");
        assert_eq!(w.failed, Some((0, "node1".into(), "Exited with exit code 3".into())));
        w.on_line("srun: error: Node failure on node2");
        w.on_line("srun: error: Node failure on node3");
        assert_eq!(w.lost.as_ref().map(|(n, _)| n.as_str()), Some("node2"), "the first node lost");
        w.on_line("srun: error: Unable to create step for job 7: Memory required by task is not available");
        assert!(w.refused.as_deref().is_some_and(|r| r.contains("Memory required")));
        drop(w);
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(read("rank-1.log"), "nestor: rank 1 starts\n");
        assert_eq!(read("srun.log").lines().count(), 6, "srun's own lines");
    }

    #[test]
    fn a_steps_outcome_follows_from_how_it_ended() {
        assert_eq!(outcome_of(Some(0), StopLevel::Run, |_| {}), ExitOutcome::Completed);
        // A node lost under it: the infrastructure's doing, naming the node and its ranks.
        let lost = |e: &mut StepEnd<'_>| e.lost = Some(("n1".into(), "it stopped answering".into()));
        let ExitOutcome::Infrastructure(msg) = outcome_of(Some(1), StopLevel::Run, lost) else { panic!("infrastructure") };
        assert!(msg.contains("node n1 was lost under rank 0, 1 (it stopped answering)"), "{msg}");
        assert!(matches!(outcome_of(Some(0), StopLevel::Kill, lost), ExitOutcome::Infrastructure(_)), "a kill after the loss");
        // Asked to stop gracefully, the loss is not the run's end: it stopped, or completed.
        assert_eq!(outcome_of(Some(1), StopLevel::Graceful, lost), ExitOutcome::Stopped);
        assert_eq!(outcome_of(Some(0), StopLevel::Graceful, lost), ExitOutcome::Completed);
        // The cluster would not create the step: tried again, or its down nodes set aside.
        let refused = |e: &mut StepEnd<'_>| e.refused = Some("srun: error: Unable to create step".into());
        let ExitOutcome::Infrastructure(msg) = outcome_of(Some(1), StopLevel::Run, refused) else { panic!("infrastructure") };
        assert!(msg.contains("would not start the job step on n1,n1,n2") && msg.contains("tried again"), "{msg}");
        let ExitOutcome::Infrastructure(msg) = outcome_down(Some(1), StopLevel::Run, true, refused) else { panic!("infrastructure") };
        assert!(msg.contains("Slurm calls n2 (DOWN) down"), "{msg}");
        // Stopped by the driver: stopped, whatever srun says.
        assert_eq!(outcome_of(Some(1), StopLevel::Kill, |_| {}), ExitOutcome::Stopped);
        assert_eq!(outcome_of(Some(1), StopLevel::Graceful, refused), ExitOutcome::Stopped);
        // The code failed: the first failed rank, its node and its log's tail.
        let failed = |e: &mut StepEnd<'_>| e.failed = Some((1, "n1".into(), "Exited with exit code 3".into()));
        let ExitOutcome::Failed(msg) = outcome_of(Some(1), StopLevel::Run, failed) else { panic!("failed") };
        assert!(msg.starts_with("rank 1 (on n1) exited with code 3") && msg.contains("tail of /logs/rank-1.log"), "{msg}");
        let ExitOutcome::Failed(msg) = outcome_of(Some(2), StopLevel::Run, |_| {}) else { panic!("failed") };
        assert!(msg.starts_with("the job step ended: srun exited with code 2") && msg.contains("tail of /logs/srun.log"), "{msg}");
        let ExitOutcome::Failed(msg) = outcome_of(None, StopLevel::Run, |_| {}) else { panic!("failed") };
        assert!(msg.starts_with("failed to wait for srun"), "{msg}");
    }

    #[test]
    fn srun_lines_name_their_task() {
        assert_eq!(labelled("0: hello: world"), Some((0, "hello: world")));
        assert_eq!(labelled(" 12: x"), Some((12, "x")));
        assert_eq!(labelled("srun: error: node2: task 1: Exited with exit code 3"), None);
        assert_eq!(
            failed_task("srun: error: node2: task 1: Exited with exit code 3"),
            Some((1, "node2".into(), "Exited with exit code 3".into()))
        );
        assert_eq!(failed_task("srun: error: node1: task 0: Killed"), Some((0, "node1".into(), "Killed".into())));
        assert_eq!(failed_task("srun: Job step aborted"), None);
        assert_eq!(ended("Exited with exit code 3"), "exited with code 3");
        assert_eq!(ended("Killed"), "was killed (SIGKILL)");
        assert_eq!(ended("Segmentation fault"), "segmentation fault");
        assert_eq!(node_lost("srun: error: Node failure on node2"), Some(("node2".into(), "Slurm reports a node failure".into())));
        let launch = "srun: error: Task launch for StepId=11.0 failed on node node3: Communication connection failure";
        assert_eq!(node_lost(launch).unwrap().0, "node3");
        assert_eq!(node_lost("srun: error: node2: task 1: Killed"), None);
        assert!(step_refused("srun: error: Unable to create step for job 7: Requested node configuration is not available"));
        assert!(!step_refused("srun: Job step creation temporarily disabled, retrying (Requested nodes are busy)"));
        assert!(step_waiting("srun: Job step creation temporarily disabled, retrying (Requested nodes are busy)"));
        assert!(step_waiting("srun: Job 12 step creation temporarily disabled, retrying (Requested nodes are busy)"));
        assert!(step_waiting("srun: Job 12 step creation still disabled, retrying (Requested nodes are busy)"));
        assert!(!step_waiting("srun: Step created for StepId=7.3"));
        let shown = "NodeName=node1 Arch=x86_64 State=MIXED ThreadsPerCore=1\nNodeName=node2 State=DOWN+NOT_RESPONDING Reason=x\n\
                     NodeName=node3 State=IDLE* CPUTot=2\nNodeName=node4 State=ALLOCATED+DRAIN\n";
        let down: Vec<String> = node_states(shown).into_iter().filter(|(_, st)| is_down(st)).map(|(n, _)| n).collect();
        assert_eq!(down, ["node2", "node3", "node4"]);
    }
}
