//! What every process backend's run supervisor shares: the task is owned
//! (spawned and joined here, so a panic in it becomes the run's failure and
//! its exit event always comes), and the way a stop escalates (the level
//! asked for, then a kill once the grace period is over).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::backend::{Event, EventKind, ExitOutcome, StopLevel};
use crate::groups::{signal_group, wait_groups_gone};

/// The process groups of a run, as its supervisor learns them (a warm
/// pool's ranks are forked one by one).
pub(crate) type Groups = Arc<Mutex<Vec<i32>>>;

/// Spawns `supervisor`, which returns the run's outcome once nothing of the
/// run is left, and sends that outcome as the run's exit. If the
/// supervisor panics, the run's process groups get `kill_signal`, and once
/// they are gone the exit is a failure naming the panic: the loop never
/// waits for an exit that does not come.
pub(crate) fn supervise<F>(trial_id: String, events: mpsc::UnboundedSender<Event>, groups: Groups, kill_signal: i32, supervisor: F)
where
    F: Future<Output = ExitOutcome> + Send + 'static,
{
    let task = tokio::spawn(supervisor);
    tokio::spawn(async move {
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(e) => {
                let pgids: Vec<i32> = groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
                pgids.iter().filter(|&&g| g > 0).for_each(|&g| signal_group(g, kill_signal));
                wait_groups_gone(&pgids).await;
                let why = if e.is_panic() { format!("panicked: {}", panic_message(e.into_panic())) } else { e.to_string() };
                tracing::error!(trial = %trial_id, "the task supervising a run {why}");
                ExitOutcome::Failed(format!("the task supervising this run {why}; its processes were stopped"))
            }
        };
        // The loop may be gone already (a second Ctrl-C): nobody to tell.
        let _ = events.send(Event { trial_id, kind: EventKind::Exited(outcome) });
    });
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// What a supervisor does next to stop its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopStep {
    /// Ask the ranks to finish (SIGTERM where they run).
    Terminate,
    /// End them now.
    Kill,
}

/// A run's stop, as it escalates: the level asked for through the run's
/// handle, and the kill that follows a graceful stop (or a failed rank)
/// once the grace period is over.
pub(crate) struct Escalation {
    asked: watch::Receiver<StopLevel>,
    /// The highest level asked for so far.
    pub(crate) requested: StopLevel,
    grace: Duration,
    kill_at: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
}

impl Escalation {
    pub(crate) fn new(asked: watch::Receiver<StopLevel>, grace: Duration) -> Self {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        Self { asked, requested: StopLevel::Run, grace, kill_at: Box::pin(tokio::time::sleep_until(far)), armed: false }
    }

    /// The highest level asked for, including one not yet taken up by
    /// [`Escalation::next`] (a rank may die of a kill before its request
    /// is seen: that is a stop, not a failure).
    pub(crate) fn asked(&self) -> StopLevel {
        self.requested.max(*self.asked.borrow())
    }

    /// Kills the run `within` from now (or sooner, if already due sooner).
    pub(crate) fn kill_within(&mut self, within: Duration) {
        let at = tokio::time::Instant::now() + within;
        if !self.armed || at < self.kill_at.deadline() {
            self.kill_at.as_mut().reset(at);
            self.armed = true;
        }
    }

    /// The next thing to do to stop the run: a stop asked for (a level
    /// above any before; a handle dropped counts as a kill), or the kill
    /// once a graceful stop's grace period is over. Pending while neither
    /// can come.
    pub(crate) async fn next(&mut self) -> StopStep {
        loop {
            if self.requested == StopLevel::Kill && !self.armed {
                // Killed already: nothing more to do.
                return std::future::pending().await;
            }
            tokio::select! {
                changed = self.asked.changed(), if self.requested < StopLevel::Kill => {
                    let level = if changed.is_ok() { *self.asked.borrow_and_update() } else { StopLevel::Kill };
                    if level <= self.requested {
                        continue;
                    }
                    self.requested = level;
                    if level == StopLevel::Kill {
                        return StopStep::Kill;
                    }
                    self.kill_within(self.grace);
                    return StopStep::Terminate;
                }
                () = &mut self.kill_at, if self.armed => {
                    self.armed = false;
                    return StopStep::Kill;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::backend::TrialHandle;

    #[tokio::test]
    async fn a_panicking_supervisor_stops_its_processes_and_fails_the_run() {
        let mut sleeper = tokio::process::Command::new("sleep").arg("60").process_group(0).spawn().unwrap();
        let pgid = sleeper.id().unwrap() as i32;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let groups: Groups = Arc::new(Mutex::new(vec![pgid]));
        supervise("t0".into(), tx.clone(), groups, libc::SIGKILL, async {
            tokio::task::yield_now().await;
            panic!("a bug in the supervisor");
        });
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        assert_eq!(ev.trial_id, "t0");
        let EventKind::Exited(ExitOutcome::Failed(msg)) = ev.kind else { panic!("a failed exit, got {:?}", ev.kind) };
        assert!(msg.contains("panicked: a bug in the supervisor"), "{msg}");
        let status = tokio::time::timeout(Duration::from_secs(5), sleeper.wait()).await.unwrap().unwrap();
        assert!(!status.success(), "the run's process was killed");
        // A supervisor that returns sends its own outcome, once.
        supervise("t1".into(), tx, Arc::default(), libc::SIGKILL, async { ExitOutcome::Completed });
        let ev = rx.recv().await.unwrap();
        assert!(matches!(ev.kind, EventKind::Exited(ExitOutcome::Completed)));
        assert!(rx.recv().await.is_none(), "one exit per run");
    }

    #[tokio::test(start_paused = true)]
    async fn a_graceful_stop_becomes_a_kill_after_the_grace_period() {
        let (handle, asked) = TrialHandle::detached();
        let mut e = Escalation::new(asked, Duration::from_secs(5));
        handle.stop(StopLevel::Graceful);
        assert_eq!(e.next().await, StopStep::Terminate);
        let t0 = tokio::time::Instant::now();
        assert_eq!(e.next().await, StopStep::Kill);
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        // An explicit kill after that is still carried out; then nothing more comes.
        handle.stop(StopLevel::Kill);
        assert_eq!(e.next().await, StopStep::Kill);
        assert!(tokio::time::timeout(Duration::from_secs(3600), e.next()).await.is_err());
        // A failed rank's stop: killed within its own, shorter, delay.
        let (_handle, asked) = TrialHandle::detached();
        let mut e = Escalation::new(asked, Duration::from_secs(5));
        e.kill_within(Duration::from_secs(1));
        let t0 = tokio::time::Instant::now();
        assert_eq!(e.next().await, StopStep::Kill);
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        // A dropped handle is a kill.
        let (handle, asked) = TrialHandle::detached();
        let mut e = Escalation::new(asked, Duration::from_secs(5));
        drop(handle);
        assert_eq!(e.next().await, StopStep::Kill);
    }
}
