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
