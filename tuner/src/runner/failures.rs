//! Failed runs: a restart from the latest committed checkpoint while
//! `max_failures` (the code's failures) or `max_infrastructure_failures`
//! (a node lost under it) allows, else ERROR; and hung runs, killed after
//! `hang_timeout_s`.

use schedulers::TrialStatus;
use trainer::StopLevel;

use super::{checkpoint_name, remove_uncommitted, view, Ending, Output, Runner};
use crate::callback::{Event, StopReason};
use crate::store::TrialRecord;
use crate::TuneError;

/// Why a run failed, which decides the limit its restart counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// The trial's own code: a rank died, exited non-zero or hung (`max_failures`).
    Code,
    /// The infrastructure: a node lost under it, a job step the cluster
    /// killed (`max_infrastructure_failures`).
    Infrastructure,
}

impl Runner {
    /// A run of `rec` failed: it restarts from its latest committed
    /// checkpoint while its cause's limit allows (and the sweep goes on),
    /// else it is ERROR. While the sweep is stopping, a run that would
    /// restart is left PENDING instead, for `nestor resume`: the sweep's own
    /// stop never puts a trial in ERROR.
    pub(super) fn failed_run(&mut self, mut rec: TrialRecord, msg: String, mut cause: Cause) -> Result<(), TuneError> {
        if cause == Cause::Code && disk_full(&self.settings.exp_dir, &msg) {
            // Not the trial's doing: no run can go on. The sweep stops, to be resumed once there is room.
            cause = Cause::Infrastructure;
            self.stop_for_full_disk();
        }
        let failure = &self.settings.failure;
        let (restartable, count) = match cause {
            Cause::Code => {
                let may = failure.may_restart(rec.failures);
                rec.failures += 1;
                (may, limit_count("failure", rec.failures, failure.max_failures))
            }
            Cause::Infrastructure => {
                let may = failure.may_restart_after_infrastructure(rec.infrastructure_failures);
                rec.infrastructure_failures += 1;
                (may, limit_count("infrastructure failure", rec.infrastructure_failures, failure.max_infrastructure_failures))
            }
        };
        // The failed run may have left a checkpoint half written.
        self.trials.dirty.insert(rec.id.clone());
        if !restartable {
            return self.give_up(rec, msg);
        }
        rec.status = TrialStatus::Pending;
        rec.last_failure = Some(msg.clone());
        self.store.put_trial(&rec)?;
        let from = rec.latest_checkpoint.as_ref().map_or_else(|| "the start".to_string(), |c| checkpoint_name(&c.uri).to_string());
        let on_resume = self.phase.stopping;
        self.reporter.report(Output::Event(Event::TrialRestarted { trial_id: rec.id.clone(), error: msg, from, count, on_resume }));
        if on_resume {
            self.commits.push_end(rec);
            return Ok(());
        }
        // Before anything new: its resources were just released.
        self.trials.pending.push_front(rec);
        Ok(())
    }

    /// The disk the experiment writes to is full: running trials stop and
    /// stay PENDING, and the sweep ends with the disk's error, to be resumed.
    fn stop_for_full_disk(&mut self) {
        if self.phase.disk_full {
            return;
        }
        self.phase.disk_full = true;
        let dir = self.settings.exp_dir.display().to_string();
        self.reporter.report(Output::Stopping(
            StopReason::DiskFull,
            format!("the disk holding {dir} is full: stopping the sweep; free some space, then continue it with `nestor resume {dir}`"),
        ));
        self.phase.stopping = true;
        for r in self.trials.running.values_mut() {
            r.ending.get_or_insert(Ending::Interrupted);
            r.handle.stop(StopLevel::Graceful);
        }
    }

    /// `rec` is ERROR for good.
    pub(super) fn give_up(&mut self, mut rec: TrialRecord, msg: String) -> Result<(), TuneError> {
        rec.status = TrialStatus::Error;
        rec.error = Some(msg.clone());
        rec.ended_at = Some(self.clock.unix_now());
        self.store.put_trial(&rec)?;
        if self.trials.dirty.remove(&rec.id) {
            // Nothing runs it again: what its last run left half written goes now.
            let (trial, keep) = self.checkpoints.cleanup(&self.store, &rec.id)?;
            self.checkpoints.spawn(&rec.id, async move {
                if let Err(e) = remove_uncommitted(&trial, &keep).await {
                    tracing::warn!(error = %e, "could not remove uncommitted checkpoints");
                }
            });
        }
        self.scheduler.on_trial_error(&view(&rec))?;
        self.searcher.on_trial_complete(&rec.id, rec.last_result.as_ref(), true);
        if self.phase.first_error.is_none() {
            self.phase.first_error = Some(format!("{}: {msg}", rec.id));
        }
        if self.settings.fail_fast && !self.phase.stopping {
            self.reporter.report(Output::Stopping(StopReason::FailFast, "fail_fast: a trial failed; stopping the sweep".into()));
            self.stop_all();
        }
        self.commits.push_end(rec);
        Ok(())
    }

    /// Kills the runs that have not completed a step within the hang
    /// timeout; each counts as a failure naming the ranks it waited for.
    pub(super) fn detect_hangs(&mut self) {
        self.phase.last_hang_check = Some(std::time::Instant::now());
        let Some(limit) = self.settings.failure.hang_timeout_s else { return };
        let now = self.clock.now();
        let trials_dir = self.settings.exp_dir.join("trials");
        for r in self.trials.running.values_mut() {
            if !r.handle.started() || self.trials.booking.waits(&r.record.id) {
                // Its ranks wait for the cluster to start them: the hang clock starts when they run.
                r.last_report = now;
                continue;
            }
            if r.ending.is_some() || now - r.last_report < limit {
                continue;
            }
            let after = r.record.last_result.as_ref().map_or(0, |l| l.training_iteration);
            let nodes: Vec<String> = r.allocation.workers.iter().map(|w| w.node.clone()).collect();
            let logs = trials_dir.join(&r.record.id).join("logs");
            let msg = trainer::hang_message(limit, after, &r.handle.lagging_ranks(), &nodes, &logs);
            tracing::warn!(trial = %r.record.id, "{}", msg.lines().next().unwrap_or_default());
            r.ending = Some(Ending::Hung(msg));
            // A hung rank has nothing left to save: kill the group now.
            r.handle.stop(StopLevel::Kill);
        }
    }
}

/// Whether a run's failure came of a full disk where the experiment
/// writes: its message says so, or less than a MiB is free there.
fn disk_full(dir: &std::path::Path, msg: &str) -> bool {
    msg.contains("No space left on device") || crate::store::free_bytes(dir).is_some_and(|free| free < 1 << 20)
}

/// `failure 2 of 3`, or `failure 2` with no limit.
fn limit_count(what: &str, n: u32, limit: i64) -> String {
    if limit < 0 {
        format!("{what} {n}")
    } else {
        format!("{what} {n} of {limit}")
    }
}
