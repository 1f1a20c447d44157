//! Unit tests of the loop: a scripted backend that launches nothing, a real
//! sled store in a temporary directory, and events handed to
//! [`Runner::handle`] one at a time, as the dispatcher would.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};

use schedulers::{Decision, Fifo, MetricThresholds, Scheduler, Stopper, TrialStatus, TrialView};
use search::{BasicVariantGenerator, Domain, Space, TrialResult};
use trainer::{
    Acknowledged, Backend, CheckpointRef, Directive, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, NodeResources, Reply, Report,
    Request, ResourcePool, ScalingConfig, StopLevel, Storage, TrialHandle,
};

use super::*;
use crate::config::ProgressMode;
use crate::progress::Progress;

/// A launched run: its spec, and what the loop asked of it (the test sends its events).
struct Launched {
    spec: LaunchSpec,
    stop: watch::Receiver<StopLevel>,
}

/// A backend that starts nothing: the test plays the trial's part.
#[derive(Clone, Default)]
struct Scripted {
    launched: Arc<Mutex<Vec<Launched>>>,
}

impl Backend for Scripted {
    fn launch(&self, spec: LaunchSpec, _events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let (handle, stop) = TrialHandle::detached();
        self.launched.lock().unwrap().push(Launched { spec, stop });
        Ok(handle)
    }

    fn launch_inner(
        &self,
        spec: LaunchSpec,
        _: &trainer::ProcessConfig,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<TrialHandle, LaunchError> {
        self.launch(spec, events)
    }
}

/// A scheduler that returns what the test queued, then `Continue`.
#[derive(Clone, Default)]
struct Queued(Arc<Mutex<std::collections::VecDeque<Decision>>>);

impl Scheduler for Queued {
    fn on_trial_result(&mut self, _: &TrialView<'_>, _: &TrialResult) -> Decision {
        self.0.lock().unwrap().pop_front().unwrap_or(Decision::Continue)
    }
}

/// Ends the whole sweep once it has seen `after` results.
struct StopAllAfter {
    after: usize,
    seen: usize,
}

impl Stopper for StopAllAfter {
    fn should_stop_trial(&mut self, _: &str, _: &TrialResult) -> bool {
        self.seen += 1;
        false
    }
    fn should_stop_all(&mut self) -> bool {
        self.seen >= self.after
    }
}

struct Harness {
    runner: Runner,
    inputs: Inputs,
    backend: Scripted,
    store: Store,
    _dir: tempfile::TempDir,
}

struct Options {
    trials: u64,
    cpus: f64,
    max_concurrent: usize,
    scheduler: Box<dyn Scheduler>,
    stopper: Box<dyn Stopper>,
    failure: FailureConfig,
    /// Named nodes of `cpus` CPUs each (an allocation's), instead of one machine.
    nodes: Vec<&'static str>,
    /// The store holds the sweep's opening, not yet durable (a new sweep's).
    unflushed: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            trials: 1,
            cpus: 4.0,
            max_concurrent: 4,
            scheduler: Box::new(Fifo),
            stopper: Box::new(MetricThresholds::default()),
            failure: FailureConfig::default(),
            nodes: Vec::new(),
            unflushed: false,
        }
    }
}

fn harness(o: Options) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let exp_dir = dir.path().join("exp");
    std::fs::create_dir_all(&exp_dir).unwrap();
    let store = Store::open(&exp_dir.join("store")).unwrap();
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let backend = Scripted::default();
    let settings = Settings {
        rank_metrics: false,
        exp_dir: exp_dir.clone(),
        metric: Some("loss".into()),
        max_concurrent: o.max_concurrent,
        max_trials: o.trials,
        time_budget: None,
        fail_fast: false,
        request: Request::from_scaling(&ScalingConfig::default()),
        checkpoint: CheckpointConfig::default(),
        failure: o.failure,
        stop_thresholds: MetricThresholds::default(),
        durability: Durability::EveryBatch,
        workers_from: None,
        datasets: None,
    };
    let info = crate::callback::ExperimentInfo {
        name: "t".into(),
        dir: exp_dir.clone(),
        metric: Some("loss".into()),
        mode: None,
        planned: 100,
        time_budget_s: None,
        resumed: false,
    };
    let reporter = Reporter::new(
        info,
        Progress::new(ProgressMode::Quiet, None),
        Some(FilesForPeople::PerTrial),
        (0, 0),
        Vec::new(),
        Duration::from_secs(5),
    );
    let (runner, inputs) = Runner::new(Parts {
        settings,
        store: store.clone(),
        keep: None,
        backend: Arc::new(backend.clone()),
        clock: Arc::new(WallClock::new()),
        searcher: Box::new(BasicVariantGenerator::new(space, o.trials, 0)),
        scheduler: Journaled::new(o.scheduler, &store, true),
        stopper: o.stopper,
        pool: if o.nodes.is_empty() {
            ResourcePool::new(NodeResources::declared(o.cpus))
        } else {
            ResourcePool::cluster(o.nodes.iter().map(|n| (n.to_string(), NodeResources::declared(o.cpus))).collect())
        },
        storage: Storage::local(&exp_dir),
        pending: Default::default(),
        paused: Vec::new(),
        next_index: 0,
        reporter,
        unflushed: o.unflushed,
    });
    Harness { runner, inputs, backend, store, _dir: dir }
}

impl Harness {
    fn launched(&self) -> usize {
        self.backend.launched.lock().unwrap().len()
    }

    fn trial_of(&self, run: usize) -> String {
        self.backend.launched.lock().unwrap()[run].spec.trial_id.clone()
    }

    fn stop_level(&self, run: usize) -> StopLevel {
        *self.backend.launched.lock().unwrap()[run].stop.borrow()
    }

    /// Run `run` reports `iteration` with `loss` (and a checkpoint named
    /// after it, when asked); returns where the answer arrives.
    fn report(&mut self, run: usize, iteration: u64, loss: f64, checkpoint: bool) -> oneshot::Receiver<Directive> {
        self.report_watched(run, iteration, loss, checkpoint).0
    }

    /// [`Harness::report`], and what watches the report's acknowledgement.
    fn report_watched(&mut self, run: usize, iteration: u64, loss: f64, checkpoint: bool) -> (oneshot::Receiver<Directive>, Acknowledged) {
        let trial = self.trial_of(run);
        let (reply, rx, acks) = Reply::watched(iteration);
        let report = Report {
            rank: 0,
            training_iteration: iteration,
            metrics: [("loss".to_string(), loss)].into_iter().collect(),
            extra: None,
            rank_metrics: Vec::new(),
            checkpoint: checkpoint.then(|| CheckpointRef {
                uri: format!("{}/trials/{trial}/checkpoint_{iteration:06}", self.runner.settings.exp_dir.display()),
                ranks: vec![0],
                world_size: 1,
            }),
        };
        let ev = Event { trial_id: trial, kind: EventKind::Report { report, reply } };
        assert_eq!(self.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
        (rx, acks)
    }

    /// Waits for the group commit under way off the loop, and hands its end to the loop.
    async fn flushed(&mut self) {
        let (batch, result) = self.inputs.flushed.recv().await.unwrap();
        assert_eq!(self.runner.handle(LoopEvent::Flushed { batch, result }).unwrap(), Control::Go);
    }

    fn node_lost(&mut self, run: usize, node: &str) {
        let ev =
            Event { trial_id: self.trial_of(run), kind: EventKind::NodeLost { node: node.into(), why: "it stopped answering".into() } };
        assert_eq!(self.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
    }

    /// Turns the loop, handing it each restore it waits for, until `n` runs were launched.
    async fn launched_after_restores(&mut self, n: usize) {
        while self.launched() < n {
            assert!(!self.advance());
            if self.launched() < n {
                let done = self.runner.restores.tasks.join_next_with_id().await.unwrap();
                self.runner.handle(LoopEvent::Restored(done)).unwrap();
            }
        }
    }

    fn record(&self, trial: &str) -> crate::store::TrialRecord {
        self.store.trial(trial).unwrap().unwrap()
    }

    fn exit(&mut self, run: usize, outcome: ExitOutcome) {
        let ev = Event { trial_id: self.trial_of(run), kind: EventKind::Exited(outcome) };
        assert_eq!(self.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
    }

    /// One turn after an event; true once the sweep is over.
    fn advance(&mut self) -> bool {
        self.runner.advance().unwrap()
    }

    fn status(&self, trial: &str) -> TrialStatus {
        self.store.trial(trial).unwrap().unwrap().status
    }
}

fn answer(rx: &mut oneshot::Receiver<Directive>) -> Directive {
    rx.try_recv().expect("the worker got no answer yet")
}

#[tokio::test]
async fn a_trial_is_answered_at_once_acknowledged_once_durable_and_ends_terminated() {
    let mut h = harness(Options::default());
    assert!(!h.advance());
    assert_eq!(h.launched(), 1);
    let trial = h.trial_of(0);
    assert_eq!(h.status(&trial), TrialStatus::Running);
    let (mut rx, acks) = h.report_watched(0, 1, 0.5, false);
    // Stored and decided on: the worker goes on, without waiting for the disk.
    assert_eq!(answer(&mut rx), Directive::Continue);
    assert_eq!(h.store.results(&trial).unwrap().len(), 1);
    assert_eq!(acks.through(), 0, "not durable yet: not acknowledged");
    // The group commit runs off the loop; the loop goes on meanwhile.
    assert!(!h.advance());
    assert!(h.runner.commits.in_flight());
    let (mut rx, second) = h.report_watched(0, 2, 0.4, false);
    assert_eq!(answer(&mut rx), Directive::Continue, "answered while a flush is under way");
    h.flushed().await;
    assert_eq!(acks.through(), 1, "acknowledged once durable");
    h.exit(0, ExitOutcome::Completed);
    assert!(h.advance(), "one trial, finished: the sweep is over");
    assert_eq!(h.status(&trial), TrialStatus::Terminated);
    // Its end is shown once durable: with the next flush, or the sweep's last.
    assert_eq!(h.runner.reporter.finished(), (0, 0));
    h.flushed().await;
    assert_eq!(h.runner.reporter.finished(), (1, 0));
    assert_eq!(second.through(), 2, "the second result rode on the flush of the trial's end");
}

/// A new sweep's opening (its experiment, the searcher's first state) is
/// made durable by a flush off the loop that starts with the first trials,
/// not before them; the first result waits for it like any other.
#[tokio::test]
async fn a_new_sweeps_opening_is_flushed_off_the_loop_as_its_first_trials_start() {
    let mut h = harness(Options { unflushed: true, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 1, "the trial starts at once");
    assert!(h.runner.commits.in_flight(), "with the opening's flush under way, nothing else stored yet");
    let (mut rx, acks) = h.report_watched(0, 1, 0.5, false);
    assert_eq!(answer(&mut rx), Directive::Continue);
    h.flushed().await;
    assert_eq!(acks.through(), 0, "the opening's flush began before the result: it does not cover it");
    assert!(!h.advance());
    h.flushed().await;
    assert_eq!(acks.through(), 1, "the next flush does");
    // Without an opening to flush, nothing starts a flush before something is stored.
    let mut h = harness(Options::default());
    assert!(!h.advance());
    assert!(!h.runner.commits.in_flight());
}

#[tokio::test]
async fn admission_keeps_to_max_concurrent_and_refills_a_freed_slot() {
    let mut h = harness(Options { trials: 5, max_concurrent: 2, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    h.exit(0, ExitOutcome::Completed);
    assert!(!h.advance());
    assert_eq!(h.launched(), 3, "the freed slot is taken at once");
    // Resources bound it too: one CPU, one trial at a time.
    let mut h = harness(Options { trials: 3, cpus: 1.0, max_concurrent: 8, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 1);
}

#[tokio::test]
async fn a_pause_at_the_last_iteration_completes_the_trial() {
    let decisions = Queued::default();
    decisions.0.lock().unwrap().extend([Decision::Continue, Decision::Pause]);
    let stop = MetricThresholds([("training_iteration".to_string(), 2.0)].into_iter().collect());
    let mut h = harness(Options { scheduler: Box::new(decisions), stopper: Box::new(stop), ..Default::default() });
    assert!(!h.advance());
    let mut rx = h.report(0, 1, 0.5, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Continue);
    let mut rx = h.report(0, 2, 0.4, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    h.exit(0, ExitOutcome::Completed);
    assert!(h.advance());
    let trial = h.trial_of(0);
    assert_eq!(h.status(&trial), TrialStatus::Terminated, "paused at its end: nothing would be left to resume");
    assert!(h.runner.trials.paused.is_empty());
    assert_eq!(h.launched(), 1, "never resumed");
}

#[tokio::test]
async fn a_pause_before_the_end_pauses_and_the_trial_resumes() {
    let decisions = Queued::default();
    decisions.0.lock().unwrap().push_back(Decision::Pause);
    let stop = MetricThresholds([("training_iteration".to_string(), 3.0)].into_iter().collect());
    let mut h = harness(Options { scheduler: Box::new(decisions), stopper: Box::new(stop), ..Default::default() });
    assert!(!h.advance());
    let mut rx = h.report(0, 1, 0.5, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    // Until its run exits, its record keeps the decision (a crash now leaves it for the resume).
    let trial = h.trial_of(0);
    let stored = h.store.trial(&trial).unwrap().unwrap();
    assert_eq!((stored.status, stored.decided), (TrialStatus::Running, Some(Decision::Pause)));
    h.exit(0, ExitOutcome::Stopped);
    let stored = h.store.trial(&trial).unwrap().unwrap();
    assert_eq!((stored.status, stored.decided), (TrialStatus::Paused, None), "carried out by the exit");
    // Nothing else can start: the default choice resumes it, from its checkpoint.
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    let resumed = h.backend.launched.lock().unwrap()[1].spec.clone();
    assert_eq!(resumed.start_iteration, 1);
    assert!(resumed.checkpoint.as_ref().is_some_and(|c| c.ends_with("checkpoint_000001")));
    let trial = h.trial_of(1);
    assert_eq!(h.store.trial(&trial).unwrap().unwrap().resumes, 1);
}

#[tokio::test]
async fn a_resize_that_cannot_restore_its_checkpoint_lets_the_trial_go_on() {
    let decisions = Queued::default();
    decisions.0.lock().unwrap().extend([Decision::Resize { num_workers: 2 }, Decision::Resize { num_workers: 2 }]);
    let mut h = harness(Options { scheduler: Box::new(decisions), ..Default::default() });
    assert!(!h.advance());
    // No checkpoint with the result: nothing to restart from.
    let mut rx = h.report(0, 1, 0.5, false);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Continue);
    // With one, the trial stops and restarts first in line with 2 workers.
    let mut rx = h.report(0, 2, 0.5, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    h.exit(0, ExitOutcome::Stopped);
    assert!(!h.advance());
    let launched = h.backend.launched.lock().unwrap();
    assert_eq!(launched.len(), 2);
    assert_eq!(launched[1].spec.workers.len(), 2);
    assert_eq!(launched[1].spec.start_iteration, 2);
}

/// Two trials; the second reports a checkpoint, the first is told to
/// exploit it and exits. Returns the recipient, the donor and the donor's checkpoint.
fn exploit_decided(h: &mut Harness, decisions: &Queued) -> (String, String, std::path::PathBuf) {
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    let (a, b) = (h.trial_of(0), h.trial_of(1));
    // The donor's checkpoint must exist: the exploit copies its files.
    let donor_ckpt = h.runner.settings.exp_dir.join("trials").join(&b).join("checkpoint_000001");
    std::fs::create_dir_all(donor_ckpt.join("rank-0")).unwrap();
    std::fs::write(donor_ckpt.join("rank-0").join("w"), b"weights").unwrap();
    let mut rx = h.report(1, 1, 0.1, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Continue);
    let config = serde_json::json!({ "x": 0.25 });
    decisions.0.lock().unwrap().push_back(Decision::Exploit(Box::new(schedulers::Exploit {
        trial_id: a.clone(),
        donor: b.clone(),
        checkpoint: donor_ckpt.display().to_string(),
        checkpoint_iteration: 1,
        config,
    })));
    let mut rx = h.report(0, 1, 0.9, true);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    h.exit(0, ExitOutcome::Stopped);
    (a, b, donor_ckpt)
}

#[tokio::test]
async fn an_exploit_is_carried_out_before_the_recipient_runs_again() {
    let decisions = Queued::default();
    let mut h = harness(Options { trials: 2, scheduler: Box::new(decisions.clone()), ..Default::default() });
    let (a, _, donor_ckpt) = exploit_decided(&mut h, &decisions);
    let record = h.store.trial(&a).unwrap().unwrap();
    assert!(record.pending_exploit.is_some(), "written into its record before it runs again");
    assert!(!h.advance());
    assert_eq!(h.runner.restores.len(), 1, "the copy runs off the loop");
    assert!(h.runner.checkpoints.is_pinned(&donor_ckpt.display().to_string()), "num_to_keep spares it meanwhile");
    let done = h.runner.restores.tasks.join_next_with_id().await.unwrap();
    assert_eq!(h.runner.handle(LoopEvent::Restored(done)).unwrap(), Control::Go);
    assert!(!h.runner.checkpoints.is_pinned(&donor_ckpt.display().to_string()));
    // It runs again from its copy of the donor's checkpoint, with the explored config.
    assert_eq!(h.launched(), 3);
    let run = &h.backend.launched.lock().unwrap()[2].spec;
    assert_eq!(run.trial_id, a);
    assert_eq!(run.config, serde_json::json!({ "x": 0.25 }));
    assert_eq!(run.start_iteration, 1);
    let copy = run.checkpoint.clone().unwrap();
    assert!(copy.starts_with(h.runner.settings.exp_dir.join("trials").join(&a)), "{}", copy.display());
    assert_eq!(std::fs::read(copy.join("rank-0").join("w")).unwrap(), b"weights");
}

#[tokio::test]
async fn an_exploit_whose_copy_panics_gives_back_its_donors_checkpoint() {
    let decisions = Queued::default();
    let mut h = harness(Options { trials: 2, scheduler: Box::new(decisions.clone()), ..Default::default() });
    let (a, _, donor_ckpt) = exploit_decided(&mut h, &decisions);
    h.runner.restore_panics = true;
    assert!(!h.advance());
    let donor = donor_ckpt.display().to_string();
    assert!(h.runner.checkpoints.is_pinned(&donor));
    let done = h.runner.restores.tasks.join_next_with_id().await.unwrap();
    assert!(done.as_ref().is_err_and(|e| e.is_panic()));
    assert_eq!(h.runner.handle(LoopEvent::Restored(done)).unwrap(), Control::Go);
    // Pinned for good, num_to_keep would never delete it.
    assert!(!h.runner.checkpoints.is_pinned(&donor), "the donor's checkpoint is still pinned");
    assert_eq!(h.status(&a), TrialStatus::Error);
}

#[tokio::test]
async fn a_panicking_restore_fails_its_trial_and_the_sweep_goes_on() {
    let mut h = harness(Options { trials: 2, max_concurrent: 1, ..Default::default() });
    // The first trial had a failed run: it is prepared off the loop, and that task panics.
    h.runner.trials.dirty.insert(trial_id(0));
    h.runner.restore_panics = true;
    assert!(!h.advance());
    assert_eq!(h.launched(), 0);
    assert_eq!(h.runner.restores.len(), 1);
    let done = h.runner.restores.tasks.join_next_with_id().await.unwrap();
    assert!(done.as_ref().is_err_and(|e| e.is_panic()));
    assert_eq!(h.runner.handle(LoopEvent::Restored(done)).unwrap(), Control::Go);
    assert_eq!(h.runner.restores.len(), 0, "nothing is left counted as restoring");
    assert!(!h.advance());
    // Its slot and resources are back: the next trial runs.
    assert_eq!(h.launched(), 1);
    assert_eq!(h.trial_of(0), trial_id(1));
    let failed = h.store.trial(&trial_id(0)).unwrap().unwrap();
    assert_eq!(failed.status, TrialStatus::Error);
    assert!(failed.error.as_deref().is_some_and(|e| e.contains("panicked")), "{:?}", failed.error);
}

#[tokio::test]
async fn a_stopper_that_stops_all_ends_the_sweep() {
    let mut h =
        harness(Options { trials: 10, max_concurrent: 2, stopper: Box::new(StopAllAfter { after: 1, seen: 0 }), ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    let mut rx = h.report(0, 1, 0.5, false);
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    assert_eq!(h.stop_level(1), StopLevel::Graceful, "the other running trial is stopped too");
    h.exit(0, ExitOutcome::Stopped);
    h.exit(1, ExitOutcome::Stopped);
    assert!(h.advance(), "no new trial starts: the sweep is over");
    assert_eq!(h.launched(), 2);
    assert_eq!(h.status(&h.trial_of(1)), TrialStatus::Terminated);
}

#[tokio::test]
async fn a_result_without_the_metric_fails_the_trial_naming_what_it_reported() {
    let mut h = harness(Options::default());
    assert!(!h.advance());
    let trial = h.trial_of(0);
    let (reply, mut rx) = Reply::channel();
    let report = Report {
        rank: 0,
        training_iteration: 1,
        metrics: [("acc".to_string(), 0.5)].into_iter().collect(),
        extra: None,
        checkpoint: None,
        rank_metrics: Vec::new(),
    };
    h.runner.handle(LoopEvent::Trials(vec![Event { trial_id: trial.clone(), kind: EventKind::Report { report, reply } }])).unwrap();
    assert!(!h.advance());
    assert_eq!(answer(&mut rx), Directive::Stop);
    h.exit(0, ExitOutcome::Stopped);
    assert!(h.advance());
    let rec = h.store.trial(&trial).unwrap().unwrap();
    assert_eq!(rec.status, TrialStatus::Error);
    let error = rec.error.unwrap();
    assert!(error.contains("no `loss`") && error.contains("acc"), "{error}");
}

#[tokio::test]
async fn a_failed_run_restarts_while_max_failures_allows() {
    let mut h = harness(Options { failure: FailureConfig { max_failures: 1, ..Default::default() }, ..Default::default() });
    assert!(!h.advance());
    h.exit(0, ExitOutcome::Failed("rank 0 died".into()));
    // A failed run may have left a checkpoint half written: cleaned off the loop first.
    assert!(!h.advance());
    assert_eq!(h.runner.restores.len(), 1);
    let trial = h.trial_of(0);
    assert_eq!(h.store.trial(&trial).unwrap().unwrap().failures, 1);
}

#[tokio::test]
async fn a_report_of_a_trial_not_running_is_told_to_stop() {
    let mut h = harness(Options::default());
    assert!(!h.advance());
    let (reply, mut rx, mut acks) = Reply::watched(1);
    let report =
        Report { rank: 0, training_iteration: 1, metrics: Default::default(), extra: None, checkpoint: None, rank_metrics: Vec::new() };
    h.runner.handle(LoopEvent::Trials(vec![Event { trial_id: "trial_99999".into(), kind: EventKind::Report { report, reply } }])).unwrap();
    assert_eq!(answer(&mut rx), Directive::Stop);
    assert!(acks.wait_for(1).await.is_err(), "not stored: never acknowledged");
    assert!(h.store.results("trial_99999").unwrap().is_empty());
}

#[tokio::test]
async fn the_first_interrupt_stops_gracefully_and_the_second_kills() {
    let mut h = harness(Options { trials: 3, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 3);
    assert_eq!(h.runner.handle(LoopEvent::Interrupt).unwrap(), Control::Go);
    assert!((0..3).all(|i| h.stop_level(i) == StopLevel::Graceful));
    h.exit(0, ExitOutcome::Stopped);
    assert!(!h.advance());
    assert_eq!(h.launched(), 3, "nothing new starts");
    assert_eq!(h.runner.handle(LoopEvent::Interrupt).unwrap(), Control::Kill);
    assert!((1..3).all(|i| h.stop_level(i) == StopLevel::Kill));
    h.runner.commit_now().unwrap();
    // Interrupted trials are PENDING again, to resume later.
    assert!((0..3).all(|i| h.status(&h.trial_of(i)) == TrialStatus::Pending));
}

#[tokio::test]
async fn a_run_the_infrastructure_ended_restarts_without_counting_against_max_failures() {
    // Defaults: max_failures 0, so a failure of the code would end the trial.
    let mut h = harness(Options { nodes: vec!["n1", "n2"], cpus: 1.0, ..Default::default() });
    assert!(!h.advance());
    let trial = h.trial_of(0);
    let first = h.backend.launched.lock().unwrap()[0].spec.workers[0].node.clone();
    h.node_lost(0, &first);
    h.exit(0, ExitOutcome::Infrastructure(format!("node {first} was lost under rank 0")));
    h.runner.commit_now().unwrap();
    let rec = h.record(&trial);
    assert_eq!((rec.status, rec.failures, rec.infrastructure_failures), (TrialStatus::Pending, 0, 1));
    assert!(rec.last_failure.unwrap().contains("was lost"));
    // It runs again, on the node left.
    h.launched_after_restores(2).await;
    let again = h.backend.launched.lock().unwrap()[1].spec.clone();
    assert_eq!(again.trial_id, trial);
    assert_ne!(again.workers[0].node, first, "placed on the node left");
}

#[tokio::test]
async fn what_a_stuck_run_held_is_not_given_back_and_its_restart_goes_elsewhere() {
    let failure = FailureConfig { max_failures: 3, ..Default::default() };
    let mut h = harness(Options { trials: 3, cpus: 1.0, nodes: vec!["n1", "n2", "n3"], failure, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 3, "a trial a node");
    let node_of = |h: &Harness, run: usize| h.backend.launched.lock().unwrap()[run].spec.workers[0].node.clone();
    let (trial, held) = (h.trial_of(0), node_of(&h, 0));
    // Its job step outlives it (a rank on a lost node): its CPU stays booked.
    let ev = Event { trial_id: trial.clone(), kind: EventKind::Stuck };
    assert_eq!(h.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
    h.exit(0, ExitOutcome::Infrastructure("node n9 was lost under rank 1".into()));
    for _ in 0..3 {
        assert!(!h.advance());
    }
    assert_eq!(h.launched(), 3, "no room for its restart while the others run: {held} is held");
    let freed = node_of(&h, 1);
    h.exit(1, ExitOutcome::Completed);
    h.launched_after_restores(4).await;
    let again = h.backend.launched.lock().unwrap()[3].spec.clone();
    assert_eq!((again.trial_id, again.workers[0].node.clone()), (trial, freed), "restarted where a run ended, not on {held}");
}

#[tokio::test]
async fn infrastructure_failures_past_their_limit_end_the_trial() {
    let failure = FailureConfig { max_infrastructure_failures: 0, ..Default::default() };
    let mut h = harness(Options { failure, ..Default::default() });
    assert!(!h.advance());
    let trial = h.trial_of(0);
    h.exit(0, ExitOutcome::Infrastructure("the cluster killed the job step".into()));
    h.runner.commit_now().unwrap();
    let rec = h.record(&trial);
    assert_eq!((rec.status, rec.infrastructure_failures), (TrialStatus::Error, 1));
    assert!(rec.error.unwrap().contains("killed the job step"));
}

#[tokio::test]
async fn a_run_that_fails_while_the_sweep_stops_is_left_to_resume_not_errored() {
    // Two nodes of one CPU, two trials; losing one node leaves room for a trial, losing both stops the sweep.
    let failure = FailureConfig { max_failures: 3, ..Default::default() };
    let mut h = harness(Options { trials: 2, cpus: 1.0, nodes: vec!["n1", "n2"], failure, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    let (t0, t1) = (h.trial_of(0), h.trial_of(1));
    // Run 0 hangs: killed, its failure still to come.
    h.runner.trials.running.get_mut(&t0).unwrap().ending = Some(Ending::Hung("hung: waiting on rank 0 (on n1)".into()));
    h.node_lost(1, "n1");
    assert!(!h.runner.phase.stopping, "a node is left");
    h.node_lost(1, "n2");
    assert!(h.runner.phase.stopping, "no node left: the sweep stops");
    assert_eq!(h.stop_level(1), StopLevel::Graceful);
    h.exit(0, ExitOutcome::Failed("rank 0 was killed by signal 9".into()));
    h.exit(1, ExitOutcome::Stopped);
    assert!(h.advance());
    h.runner.commit_now().unwrap();
    let (r0, r1) = (h.record(&t0), h.record(&t1));
    assert_eq!((r0.status, r0.failures), (TrialStatus::Pending, 1), "the hung run counts, and its trial resumes later");
    assert_eq!(r1.status, TrialStatus::Pending);
    assert_eq!(h.launched(), 2, "nothing restarted while stopping");
}

#[test]
fn a_hang_names_each_waited_for_rank_and_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec!["node1".to_string(), "node3".to_string()];
    let msg = trainer::hang_message(30.0, 4, &[1], &nodes, dir.path());
    assert!(msg.contains("after iteration 4; waiting on rank 1 (on node3)"), "{msg}");
    let local = trainer::hang_message(30.0, 4, &[0, 1], &[String::new(), String::new()], dir.path());
    assert!(local.contains("waiting on rank 0, 1"), "{local}");
}

#[tokio::test]
async fn a_run_that_fails_on_a_full_disk_stops_the_sweep_and_errors_no_trial() {
    let mut h = harness(Options { trials: 2, ..Default::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 2);
    let (t0, t1) = (h.trial_of(0), h.trial_of(1));
    h.exit(0, ExitOutcome::Failed("rank 0 exited with code 1; last log lines:\nError: No space left on device (os error 28)".into()));
    assert!(h.runner.phase.stopping && h.runner.phase.disk_full);
    assert_eq!(h.stop_level(1), StopLevel::Graceful, "the other trial stops too");
    h.exit(1, ExitOutcome::Stopped);
    assert!(h.advance());
    h.runner.commit_now().unwrap();
    let (r0, r1) = (h.record(&t0), h.record(&t1));
    assert_eq!((r0.status, r0.failures, r0.infrastructure_failures), (TrialStatus::Pending, 0, 1));
    assert_eq!(r1.status, TrialStatus::Pending);
    assert_eq!(h.launched(), 2, "nothing restarted on the full disk");
}

impl Harness {
    /// Run `run` books `workers` workers of one CPU for a trainer; returns where the grant arrives.
    fn book(&mut self, run: usize, workers: u32) -> oneshot::Receiver<Result<Vec<trainer::WorkerBundle>, String>> {
        let (reply, rx) = oneshot::channel();
        let request = Request::from_scaling(&ScalingConfig::workers(workers));
        let ev = Event { trial_id: self.trial_of(run), kind: EventKind::Book { request, reply } };
        assert_eq!(self.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
        rx
    }
}

#[tokio::test]
async fn a_trial_books_its_trainers_workers_in_place_of_its_own_and_waits_first_in_line() {
    let mut h = harness(Options { trials: 6, cpus: 4.0, ..Options::default() });
    assert!(!h.advance());
    assert_eq!(h.launched(), 4, "4 trials of one CPU");
    // Each gives its CPU back and waits, in order: a later, smaller booking does not overtake.
    let mut first = h.book(0, 3);
    let mut second = h.book(1, 2);
    h.advance();
    assert!(first.try_recv().is_err() && second.try_recv().is_err(), "2 CPUs are free: the first in line needs 3");
    h.exit(3, ExitOutcome::Completed);
    h.advance();
    let granted = first.try_recv().expect("granted once 3 CPUs are free").unwrap();
    assert_eq!(granted.len(), 3);
    assert_eq!(h.record(&h.trial_of(0)).resources.len(), 3, "the trial's resources are its trainer's");
    // A CPU and a slot are free, but no new trial starts while a running one waits.
    h.exit(2, ExitOutcome::Completed);
    h.advance();
    assert!(second.try_recv().is_err());
    assert_eq!(h.launched(), 4, "a new trial started while a running one waited for its trainer's resources");
    // The first trainer's workers go back: the second is granted, and new trials start on the rest.
    h.exit(0, ExitOutcome::Completed);
    h.advance();
    assert_eq!(second.try_recv().expect("granted").unwrap().len(), 2);
    assert_eq!(h.launched(), 6);
    // A trainer that can never fit is refused by name; the trial keeps its bundle.
    let refused = h.book(4, 5).try_recv().expect("answered at once").unwrap_err();
    assert!(refused.contains("ScalingConfig") && refused.contains("never start"), "{refused}");
    assert_eq!(h.record(&h.trial_of(4)).resources.len(), 1);
    // A trial that ends while it waits: its booking is dropped unanswered.
    let mut last = h.book(5, 4);
    h.advance();
    assert!(last.try_recv().is_err());
    h.exit(5, ExitOutcome::Completed);
    h.advance();
    assert!(matches!(last.try_recv(), Err(oneshot::error::TryRecvError::Closed)), "an ended trial's booking is dropped");
}

#[tokio::test]
async fn a_booking_in_a_cluster_allocation_is_refused_and_changes_nothing() {
    let mut h = harness(Options { trials: 1, cpus: 2.0, nodes: vec!["n1", "n2"], ..Options::default() });
    h.advance();
    let why = h.book(0, 2).try_recv().expect("answered at once").unwrap_err();
    assert!(why.contains("cluster allocation"), "{why}");
    assert_eq!(h.record(&h.trial_of(0)).resources.len(), 1);
}

impl Harness {
    /// Run `run` asks for the trainer it booked to run, in `dir`; returns its updates.
    fn run_trainer(&mut self, run: usize, dir: &std::path::Path) -> mpsc::UnboundedReceiver<trainer::inner::TrainerUpdate> {
        let doc = serde_json::json!({ "name": "train", "dir": dir, "trainer": { "command": ["sh", "-c", "true"] } });
        let prepared = futures_util::FutureExt::now_or_never(trainer::inner::prepare(serde_json::from_value(doc).unwrap()));
        let (updates, rx) = mpsc::unbounded_channel();
        let kind = EventKind::RunTrainer { run: Box::new(prepared.unwrap().unwrap()), updates };
        let ev = Event { trial_id: self.trial_of(run), kind };
        assert_eq!(self.runner.handle(LoopEvent::Trials(vec![ev])).unwrap(), Control::Go);
        rx
    }
}

#[tokio::test]
async fn a_trials_trainer_runs_in_the_loop_and_its_bundles_stay_held_until_its_ranks_are_gone() {
    use trainer::inner::TrainerUpdate;
    let mut h = harness(Options { trials: 3, cpus: 2.0, max_concurrent: 2, ..Options::default() });
    h.advance();
    assert_eq!(h.launched(), 2);
    let trial = h.trial_of(0);
    let mut granted = h.book(0, 2);
    h.exit(1, ExitOutcome::Completed);
    h.advance();
    assert_eq!(granted.try_recv().unwrap().unwrap().len(), 2);
    let dir = h.runner.settings.exp_dir.join("trials").join(&trial).join("train/train");
    let mut updates = h.run_trainer(0, &dir);
    assert_eq!(h.launched(), 3, "the trainer's ranks launched");
    {
        let launched = h.backend.launched.lock().unwrap();
        assert_eq!(launched[2].spec.trial_id, format!("{trial}.train.train"));
        assert_eq!(launched[2].spec.workers.len(), 2, "on the bundles its trial booked");
        assert_eq!(launched[2].spec.trial_dir, dir);
    }
    // A result: answered at once, streamed back once written, in the run's result.jsonl.
    let mut answer = h.report(2, 1, 0.5, false);
    assert_eq!(answer.try_recv().unwrap(), Directive::Continue);
    let got = tokio::time::timeout(Duration::from_secs(10), updates.recv()).await.unwrap().unwrap();
    assert!(matches!(got, TrainerUpdate::Result { training_iteration: 1, .. }), "{got:?}");
    assert_eq!(std::fs::read_to_string(dir.join("result.jsonl")).unwrap().lines().count(), 1);
    // The trial's process ends first: its trainer is stopped, and its bundles stay held while the ranks run.
    h.exit(0, ExitOutcome::Completed);
    h.advance();
    assert_eq!(h.stop_level(2), StopLevel::Graceful);
    assert_eq!(h.status(&trial), TrialStatus::Running);
    assert_eq!(h.launched(), 3, "a trial started on bundles the trainer's ranks still use");
    // A report now is told to stop.
    assert_eq!(h.report(2, 2, 0.4, false).try_recv().unwrap(), Directive::Stop);
    // Its ranks are gone: the trial ends, the bundles go back, the next trial starts.
    h.exit(2, ExitOutcome::Stopped);
    h.advance();
    h.runner.commit_now().unwrap();
    assert_eq!(h.status(&trial), TrialStatus::Terminated);
    assert_eq!(h.launched(), 4);
    let mut last = None;
    while let Ok(Some(u)) = tokio::time::timeout(Duration::from_secs(10), updates.recv()).await {
        last = Some(u);
    }
    assert!(matches!(&last, Some(TrainerUpdate::Ended { status, .. }) if status == "stopped"), "{last:?}");
}
