//! A conformance suite every [`Backend`] must pass, as Optuna's storages
//! and samplers pass theirs: a new backend gets these checks for free. Each
//! backend's tests implement [`Subject`] (how to make a run that completes,
//! fails or hangs at a step, in that backend's terms) and call [`check`].
//!
//! What is checked, for each case the subject can make:
//! - `completes`: every step is reported once, in order, then exactly one
//!   [`EventKind::Exited`] with [`ExitOutcome::Completed`];
//! - `told to stop`: a [`Directive::Stop`] in a reply ends the run cleanly
//!   (`Completed` or `Stopped`), with no report after it;
//! - `stopped`: [`StopLevel::Graceful`] from the handle ends it `Stopped`;
//! - `killed`: [`StopLevel::Kill`] ends it `Stopped` within seconds;
//! - `fails`: a rank that fails ends the run `Failed`, the message naming
//!   the rank (of a run of several);
//! - `hangs`: a rank that stops reporting is named by
//!   [`TrialHandle::lagging_ranks`], and a kill ends the run.
//!
//! Lost nodes apply to cluster backends only; their own tests cover them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::backend::{Backend, Directive, Event, EventKind, ExitOutcome, LaunchSpec, StopLevel, TrialHandle};

/// How a conformance run behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Reports every step, then returns.
    Complete,
    /// The last rank fails (exits non-zero, returns an error) at this step, before reporting it.
    FailAt(u64),
    /// The last rank stops reporting (and ignores everything but a kill) at this step.
    HangAt(u64),
}

/// One conformance run: its steps, ranks, pace and behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// Steps it reports (when it completes).
    pub steps: u64,
    /// Ranks.
    pub world_size: u32,
    /// Time each step takes.
    pub step_ms: u64,
    /// What it does.
    pub behaviour: Behaviour,
}

/// A backend under test, and how to make runs of it.
pub trait Subject {
    /// The backend.
    fn backend(&self) -> Arc<dyn Backend>;

    /// A launch spec for `case`, with its trial directory under `dir`.
    /// Rank 0 reports a metric `loss` at every step.
    fn spec(&self, trial_id: &str, case: &Case, dir: &Path) -> LaunchSpec;

    /// Whether it can make runs that behave so, and with that many ranks
    /// (a simulation only replays one rank's curve).
    fn supports(&self, case: &Case) -> bool {
        let _ = case;
        true
    }

    /// Called while the suite waits for an event: a virtual clock moves on here.
    fn idle(&self) {}
}

/// How long a case may take before the suite calls it stuck.
const PATIENCE: Duration = Duration::from_secs(30);

struct Run<'a> {
    subject: &'a dyn Subject,
    handle: TrialHandle,
    events: mpsc::UnboundedReceiver<Event>,
    name: String,
}

impl Run<'_> {
    fn start<'a>(subject: &'a dyn Subject, name: &str, case: Case, dir: &Path) -> Run<'a> {
        let (tx, events) = mpsc::unbounded_channel();
        let spec = subject.spec(name, &case, dir);
        assert_eq!(spec.world_size(), case.world_size, "{name}: the subject's spec has the case's ranks");
        let handle = subject.backend().launch(spec, tx).unwrap_or_else(|e| panic!("{name}: launch failed: {e}"));
        Run { subject, handle, events, name: name.to_string() }
    }

    /// The next event, waiting up to `PATIENCE`.
    async fn next(&mut self) -> EventKind {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.events.try_recv() {
                Ok(ev) => {
                    assert_eq!(ev.trial_id, self.name, "an event of another run");
                    return ev.kind;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => panic!("{}: the backend dropped its events without an exit", self.name),
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            assert!(Instant::now() < deadline, "{}: no event within {PATIENCE:?}", self.name);
            self.subject.idle();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Events until the exit, answering reports with `answer(iteration)`;
    /// returns the iterations reported and the outcome.
    async fn until_exit(&mut self, mut answer: impl FnMut(u64) -> Directive) -> (Vec<u64>, ExitOutcome) {
        let mut reported = Vec::new();
        loop {
            match self.next().await {
                EventKind::Report { report, reply } => {
                    reported.push(report.training_iteration);
                    reply.send(answer(report.training_iteration)).durable();
                }
                EventKind::NodeLost { .. } | EventKind::Book { .. } | EventKind::RunTrainer { .. } | EventKind::Stuck => {}
                EventKind::Exited(outcome) => return (reported, outcome),
            }
        }
    }

    /// After the exit: nothing more comes.
    async fn quiet(&mut self) {
        for _ in 0..50 {
            self.subject.idle();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Ok(ev) = self.events.try_recv() {
            panic!("{}: an event after the exit: {:?}", self.name, ev.kind);
        }
    }
}

/// Runs every case `subject` supports; panics naming the first broken rule.
pub async fn check(subject: &dyn Subject, dir: &Path) {
    let world = if subject.supports(&Case { steps: 3, world_size: 2, step_ms: 10, behaviour: Behaviour::Complete }) { 2 } else { 1 };
    let case = |steps, step_ms, behaviour| Case { steps, world_size: world, step_ms, behaviour };

    // Completes: every step once, in order, then one exit.
    let c = case(3, 10, Behaviour::Complete);
    let mut run = Run::start(subject, "completes", c, dir);
    let (reported, outcome) = run.until_exit(|_| Directive::Continue).await;
    assert_eq!(reported, [1, 2, 3], "completes: the steps reported");
    assert_eq!(outcome, ExitOutcome::Completed, "completes");
    run.quiet().await;

    // Told to stop in a reply.
    let c = case(50, 10, Behaviour::Complete);
    let mut run = Run::start(subject, "told_to_stop", c, dir);
    let (reported, outcome) = run.until_exit(|i| if i >= 2 { Directive::Stop } else { Directive::Continue }).await;
    assert_eq!(reported, [1, 2], "told to stop: no report after the stop");
    assert!(matches!(outcome, ExitOutcome::Completed | ExitOutcome::Stopped), "told to stop: {outcome:?}");
    run.quiet().await;

    // Stopped gracefully, and killed, from the handle.
    for (name, level) in [("stopped", StopLevel::Graceful), ("killed", StopLevel::Kill)] {
        let c = case(10_000, 20, Behaviour::Complete);
        let mut run = Run::start(subject, name, c, dir);
        let EventKind::Report { reply, .. } = run.next().await else { panic!("{name}: a report first") };
        reply.send(Directive::Continue).durable();
        let asked = Instant::now();
        run.handle.stop(level);
        let (_, outcome) = run.until_exit(|_| Directive::Continue).await;
        assert_eq!(outcome, ExitOutcome::Stopped, "{name}");
        assert!(asked.elapsed() < Duration::from_secs(10), "{name}: took {:?}", asked.elapsed());
        run.quiet().await;
    }

    // A failing rank.
    let c = case(5, 10, Behaviour::FailAt(2));
    if subject.supports(&c) {
        let mut run = Run::start(subject, "fails", c, dir);
        let (reported, outcome) = run.until_exit(|_| Directive::Continue).await;
        assert_eq!(reported, [1], "fails: only the steps before the failure");
        let ExitOutcome::Failed(msg) = outcome else { panic!("fails: {outcome:?}") };
        if world > 1 {
            assert!(msg.contains(&format!("rank {}", world - 1)), "fails: the message names the rank: {msg}");
        }
        run.quiet().await;
    }

    // A hanging rank: named as the one the run waits for, and a kill ends it.
    let c = case(5, 10, Behaviour::HangAt(2));
    if subject.supports(&c) {
        let mut run = Run::start(subject, "hangs", c, dir);
        let EventKind::Report { reply, .. } = run.next().await else { panic!("hangs: a report first") };
        reply.send(Directive::Continue).durable();
        if world > 1 {
            let deadline = Instant::now() + PATIENCE;
            while run.handle.lagging_ranks() != [world - 1] {
                assert!(Instant::now() < deadline, "hangs: lagging ranks {:?}", run.handle.lagging_ranks());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run.handle.stop(StopLevel::Kill);
        let (reported, outcome) = run.until_exit(|_| Directive::Continue).await;
        assert!(reported.is_empty(), "hangs: reported {reported:?} after the hang");
        assert!(matches!(outcome, ExitOutcome::Stopped | ExitOutcome::Failed(_)), "hangs: {outcome:?}");
        run.quiet().await;
    }
}
