//! Process groups: a child that dies with the driver, signals to whole
//! groups, waiting until a group is gone, and how a process ended. A leaf:
//! the process backends, the warm pool and the supervisors use it.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

pub(crate) fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

pub(crate) fn describe_exit(s: std::process::ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".to_string(),
    }
}

/// How many processes the kernel's out-of-memory killer has ended: in this
/// process's memory cgroup (v2 `memory.events`, v1 `memory.oom_control`,
/// where its children are too) and on the whole machine (`/proc/vmstat`).
/// Read when a run starts and when a rank of it dies by SIGKILL: a count
/// that grew in between names the OOM killer as what ended it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OomKills {
    cgroup: Option<u64>,
    machine: Option<u64>,
}

impl OomKills {
    /// The counts now (`None` where this system has none to read).
    pub(crate) fn now() -> Self {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self { cgroup: cgroup_oom_kills(&cgroups, std::path::Path::new("/sys/fs/cgroup")), machine: vmstat_oom_kills() }
    }

    /// Whether the OOM killer ended a process since `self` was read.
    pub(crate) fn grew_since(self, before: Self) -> bool {
        let grew = |a: Option<u64>, b: Option<u64>| matches!((a, b), (Some(a), Some(b)) if a > b);
        grew(self.cgroup, before.cgroup) || grew(self.machine, before.machine)
    }
}

/// The OOM kills of the memory cgroup `/proc/self/cgroup` names, below the cgroup file system at `root`.
fn cgroup_oom_kills(proc_cgroup: &str, root: &std::path::Path) -> Option<u64> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let file = if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.oom_control")
        } else if controllers.is_empty() {
            let unified = if root.join("unified").is_dir() { root.join("unified") } else { root.to_path_buf() };
            unified.join(rel).join("memory.events")
        } else {
            continue;
        };
        if let Some(n) = std::fs::read_to_string(&file).ok().as_deref().and_then(|t| counter(t, "oom_kill")) {
            return Some(n);
        }
    }
    None
}

fn vmstat_oom_kills() -> Option<u64> {
    counter(&std::fs::read_to_string("/proc/vmstat").ok()?, "oom_kill")
}

/// The number after `name` on its own line of `text` (`oom_kill 3`).
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// How a rank ended, naming the OOM killer when it ended it (a SIGKILL
/// while the counts of `before`, read at the run's start, grew).
pub(crate) fn describe_exit_since(s: std::process::ExitStatus, before: OomKills) -> String {
    if s.signal() == Some(libc::SIGKILL) && OomKills::now().grew_since(before) {
        return "was killed by the kernel's out-of-memory killer (signal 9): the machine (or its memory cgroup) ran out \
                of memory; give the trial fewer workers or less to hold, or book memory with resources_per_worker"
            .to_string();
    }
    describe_exit(s)
}

/// Waits (bounded) until no process of `pgids` is left, so what they held
/// (a GPU's memory above all) is free before the bundle is handed on.
pub(crate) async fn wait_groups_gone(pgids: &[i32]) {
    let mut delay = Duration::from_micros(200);
    for _ in 0..40 {
        // SAFETY: signal 0 only checks that the group exists.
        let alive = pgids.iter().any(|&g| g > 0 && unsafe { libc::killpg(g, 0) } == 0);
        if !alive {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
    tracing::warn!(?pgids, "processes of a finished trial are still exiting");
}

/// Has the child get `signal` when the thread that spawned it (the
/// driver's) goes, and not start at all if the driver is gone already.
pub(crate) fn dies_with_driver(cmd: &mut tokio::process::Command, signal: i32) {
    let parent = std::process::id() as i32;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, signal);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_a_v1_or_v2_memory_cgroup() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("memory/jobs/a")).unwrap();
        std::fs::write(root.path().join("memory/jobs/a/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n").unwrap();
        assert_eq!(cgroup_oom_kills("4:memory:/jobs/a\n0::/\n", root.path()), Some(4));
        let v2 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v2.path().join("user.slice/x")).unwrap();
        std::fs::write(v2.path().join("user.slice/x/memory.events"), "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(cgroup_oom_kills("0::/user.slice/x\n", v2.path()), Some(1));
        assert_eq!(cgroup_oom_kills("0::/nowhere\n", v2.path()), None);
        assert_eq!(counter("oom_kill_disable 0\noom_kill 7", "oom_kill"), Some(7), "not the line of another name");
    }

    #[test]
    fn only_a_count_that_grew_names_the_oom_killer() {
        let before = OomKills { cgroup: Some(1), machine: Some(5) };
        assert!(!OomKills { cgroup: Some(1), machine: Some(5) }.grew_since(before));
        assert!(OomKills { cgroup: Some(2), machine: Some(5) }.grew_since(before));
        assert!(OomKills { cgroup: None, machine: Some(6) }.grew_since(before));
        assert!(!OomKills::default().grew_since(before), "nothing to read is no evidence");
    }
}
