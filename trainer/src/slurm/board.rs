//! The states of an experiment's Slurm jobs, read in one `squeue` call
//! every interval for all of them ([`Board`]), whatever their number, and
//! handed to every run that follows one of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::jobs::{JobRow, JobWatch};

/// The latest reading of the experiment's jobs, for every run to look up its own.
#[derive(Debug, Clone, Default)]
pub(super) struct Reading {
    /// The experiment's jobs by id.
    pub(super) jobs: Arc<BTreeMap<String, JobRow>>,
    /// Why the last call failed (the reading before it stands).
    pub(super) error: Option<String>,
}

/// Reads the states of the experiment's jobs in one `squeue` call every
/// interval while any run follows one, and hands each reading to all of
/// them; counts the calls nestor makes to the controller.
#[derive(Debug)]
pub(super) struct Board {
    pub(super) readings: watch::Sender<Reading>,
    /// Wakes the reader at once (a job was submitted, a stop was asked).
    pub(super) poke: Arc<tokio::sync::Notify>,
    /// Calls to `slurmctld`: `squeue`, `sbatch`, `scancel`.
    pub(super) calls: AtomicU64,
}

impl Board {
    pub(super) fn start(prefix: String, interval: Duration) -> Arc<Self> {
        let (readings, _) = watch::channel(Reading::default());
        let board = Arc::new(Self { readings, poke: Arc::default(), calls: AtomicU64::new(0) });
        let weak = Arc::downgrade(&board);
        tokio::spawn(async move {
            let mut watch = JobWatch::new(prefix, interval / 5);
            // squeue calls already in `calls`.
            let mut counted = 0;
            loop {
                let Some(board) = weak.upgrade() else { return };
                if board.readings.receiver_count() > 0 {
                    let reading = match watch.jobs().await {
                        Ok(jobs) => Reading { jobs: Arc::new(jobs.clone()), error: None },
                        Err(e) => Reading { jobs: Arc::clone(&board.readings.borrow().jobs), error: Some(e.0) },
                    };
                    board.calls.fetch_add(watch.calls() - counted, Ordering::Relaxed);
                    counted = watch.calls();
                    board.readings.send_replace(reading);
                }
                let poke = Arc::clone(&board.poke);
                drop(board);
                let poked = poke.notified();
                // The next reading: after the interval, or sooner when poked (a job submitted or
                // cancelled), but never two within a fifth of it (JobWatch answers from its last then).
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = poked => tokio::time::sleep(interval / 5).await,
                }
            }
        });
        board
    }

    pub(super) fn count_call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}
