//! When a report waits for the loop's answer. Where nothing but Continue
//! can be decided on a result (FIFO, no stopper), an in-process rank goes on
//! from its report once it is taken; with a stopper that may fire it waits
//! for the decision, as it does under any deciding scheduler. A stop still
//! reaches a rank that did not wait: its next report returns `Stopped`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use search::{BasicVariantGenerator, Domain, Mode, Searcher, Space, Suggestion, TrialResult};
use tuner::{ProgressMode, ReportError, RunConfig, Stop, Trainable, TuneConfig, Tuner};

/// Random search whose `on_trial_result` (called by the loop before it
/// answers the report) waits for the trial to say its report has returned.
struct Gate {
    inner: BasicVariantGenerator,
    returned: Receiver<u64>,
    wait: Duration,
    /// Per result: whether its report returned while the loop was still deciding on it.
    seen: Arc<Mutex<Vec<bool>>>,
}

impl Searcher for Gate {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        self.inner.suggest(trial_id)
    }
    fn on_trial_result(&mut self, _trial_id: &str, result: &TrialResult) {
        let returned = match self.returned.recv_timeout(self.wait) {
            Ok(step) => step == result.training_iteration,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        };
        self.seen.lock().unwrap().push(returned);
    }
    fn save(&self) -> serde_json::Value {
        self.inner.save()
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), search::SearchError> {
        self.inner.restore(state)
    }
}

fn sweep(steps: u64, stop: Stop, wait: Duration) -> Vec<bool> {
    let dir = tempfile::tempdir().unwrap();
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let (tx, rx): (Sender<u64>, Receiver<u64>) = channel();
    let tx = Mutex::new(tx);
    let trainable = Trainable::function(move |ctx| {
        for step in 1..=steps {
            ctx.report([("loss", step as f64)], None)?;
            tx.lock().unwrap().send(step)?;
        }
        Ok(())
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate { inner: BasicVariantGenerator::new(space.clone(), 1, 0), returned: rx, wait, seen: Arc::clone(&seen) };
    let grid = Tuner::new(trainable, space)
        .with_searcher(Box::new(gate))
        .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 1, ..Default::default() })
        .run_config(RunConfig { name: "a".into(), storage: dir.path().into(), stop, progress: ProgressMode::Quiet, ..Default::default() })
        .fit()
        .unwrap();
    assert_eq!(grid.get("trial_00000").unwrap().status.as_str(), "TERMINATED");
    assert_eq!(grid.get("trial_00000").unwrap().history.len() as u64, steps, "every result stored");
    let seen = seen.lock().unwrap().clone();
    seen
}

#[test]
fn a_report_nothing_can_be_decided_on_does_not_wait_for_the_loop() {
    // FIFO, no stopper: each report returned while the loop was deciding on it.
    assert_eq!(sweep(3, Stop::new(), Duration::from_secs(30)), [true, true, true]);
    // A stopper that may fire (this one never does): the report waits for the decision.
    assert_eq!(sweep(1, Stop::new().at_least("loss", 1e9), Duration::from_millis(500)), [false]);
}

#[test]
fn a_stop_reaches_a_rank_that_did_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let steps = Arc::new(Mutex::new(0u64));
    let seen = Arc::clone(&steps);
    // Its results lack the experiment's metric: the loop fails the trial, and the rank,
    // which did not wait for that answer, reads it as a stop at a later report.
    let trainable = Trainable::function(move |ctx| {
        for _ in 0..20_000 {
            *seen.lock().unwrap() += 1;
            match ctx.report([("other", 1.0)], None) {
                Ok(()) => std::thread::sleep(Duration::from_millis(1)),
                Err(ReportError::Stopped) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Err("never told to stop".into())
    });
    let grid = Tuner::new(trainable, space)
        .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 1, ..Default::default() })
        .run_config(RunConfig { name: "s".into(), storage: dir.path().into(), progress: ProgressMode::Quiet, ..Default::default() })
        .fit()
        .unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status.as_str(), "ERROR");
    assert!(t.error.as_deref().unwrap_or("").contains("loss"), "{:?}", t.error);
    let n = *steps.lock().unwrap();
    // Read at the report after the loop's answer (which the rank may, rarely, see at once).
    assert!((1..20_000).contains(&n), "told to stop: {n} reports");
}
