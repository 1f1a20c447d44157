//! A trial that runs a trainer of its own (Ray Train V2's Tune pattern: a
//! function that builds a trainer and calls `fit()`) books that trainer's
//! resources: its own bundle goes back to the pool and the trainer's
//! bundles are its resources from then on. A booking that cannot be granted
//! at once waits, first come first served, and no new trial starts while
//! one waits: the trials already running need those resources to finish.

use std::collections::VecDeque;

use tokio::sync::oneshot;
use trainer::{Allocation, Request, WorkerBundle};

use super::reporter::Output;
use super::Runner;
use crate::TuneError;

/// Where a booking's answer goes.
pub(super) type BookReply = oneshot::Sender<Result<Vec<WorkerBundle>, String>>;

/// A running trial waiting for its trainer's resources.
pub(super) struct Booking {
    trial: String,
    request: Request,
    reply: BookReply,
}

/// The bookings waiting, first come first served.
#[derive(Default)]
pub(super) struct Bookings(VecDeque<Booking>);

impl Bookings {
    /// Whether `trial` waits for its trainer's resources.
    pub(super) fn waits(&self, trial: &str) -> bool {
        self.0.iter().any(|b| b.trial == trial)
    }

    /// Whether any trial waits: no new trial starts meanwhile.
    pub(super) fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// `trial` has ended: its booking (if any) is dropped unanswered.
    pub(super) fn forget(&mut self, trial: &str) {
        self.0.retain(|b| b.trial != trial);
    }
}

impl Runner {
    /// Running trial `trial` books `request` for a trainer it starts.
    pub(super) fn on_book(&mut self, trial: &str, request: Request, reply: BookReply) -> Result<(), TuneError> {
        let Some(r) = self.trials.running.get_mut(trial) else { return Ok(()) };
        if r.ending.is_some() {
            return Ok(()); // it is ending: the booking goes unanswered
        }
        let refused = if self.pool.is_cluster() {
            Some(
                "a trainer started inside a trial cannot book its resources in a cluster allocation; give the trial \
                 its trainer's resources with tune.with_resources (or run the trainer as the trainable)"
                    .to_string(),
            )
        } else if r.allocation.workers.len() > 1 {
            Some(format!(
                "a trial of {} workers started a trainer; only a trial of one worker may (its trainer's workers become the trial's)",
                r.allocation.workers.len()
            ))
        } else {
            self.pool.check(&request).err().map(|e| format!("its trainer's ScalingConfig: {e}"))
        };
        if let Some(why) = refused {
            let _ = reply.send(Err(why));
            return Ok(());
        }
        // Its own bundle goes back first: the trainer's workers are the trial's now.
        self.pool.release(&std::mem::replace(&mut r.allocation, Allocation::empty()));
        r.record.resources.clear();
        self.trials.booking.0.push_back(Booking { trial: trial.to_string(), request, reply });
        self.grant_bookings()
    }

    /// Grants the waiting bookings the pool holds, in order; the first that
    /// does not fit waits (and those behind it).
    pub(super) fn grant_bookings(&mut self) -> Result<(), TuneError> {
        while let Some(first) = self.trials.booking.0.front() {
            if first.reply.is_closed() || !self.trials.running.contains_key(&first.trial) {
                self.trials.booking.0.pop_front();
                continue;
            }
            let Some(allocation) = self.pool.try_allocate(&first.request) else { break };
            let Some(Booking { trial, reply, .. }) = self.trials.booking.0.pop_front() else { break };
            let now = self.clock.now();
            let Some(r) = self.trials.running.get_mut(&trial) else { continue };
            r.record.resources = allocation.workers.clone();
            // Waiting for the resources was no hang.
            r.last_report = now;
            let workers = allocation.workers.clone();
            r.allocation = allocation;
            self.store.put_trial(&r.record)?;
            let what = describe(&workers);
            if reply.send(Ok(workers)).is_err() {
                continue; // gone meanwhile: its exit gives the allocation back
            }
            // After the ends not yet shown: the trainer whose workers these were is shown ending first.
            let after_ends = self.commits.ends_pending();
            self.reporter.report(Output::Note { message: format!("{trial} runs its trainer on {what}"), after_ends });
        }
        Ok(())
    }
}

/// `2 workers x {CPU: 1}`, or each bundle when they differ.
fn describe(workers: &[WorkerBundle]) -> String {
    let one = |w: &WorkerBundle| {
        let mut parts = vec![format!("CPU: {}", w.cpus)];
        if !w.gpus.is_empty() {
            parts.push(format!("GPU: {:?}", w.gpus));
        }
        parts.extend(w.custom.iter().map(|(k, v)| format!("{k}: {v}")));
        format!("{{{}}}", parts.join(", "))
    };
    match workers.first() {
        Some(w) if workers.iter().all(|x| x.cpus == w.cpus && x.gpus.is_empty() && x.custom == w.custom) => {
            let n = workers.len();
            format!("{n} worker{} x {}", if n == 1 { "" } else { "s" }, one(w))
        }
        _ => workers.iter().map(one).collect::<Vec<_>>().join(" + "),
    }
}
