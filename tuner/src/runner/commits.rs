//! Group commit: results (decided on already) and trial ends wait here
//! until one flush makes a whole burst of them durable; only then are they
//! acknowledged to their workers, their checkpoints committed and their
//! ends shown. One flush runs at a time, on a blocking thread, so the loop
//! never waits for the disk; what arrives meanwhile forms the next batch.

use std::sync::Arc;

use tokio::sync::mpsc;

use search::TrialResult;
use trainer::Ack;

use crate::store::{Store, StoreError, TrialRecord};

/// When stored results are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Every batch is flushed before its results are acknowledged and
    /// acted on beyond the decision (a real sweep: a result acknowledged to
    /// a worker survives a crash).
    EveryBatch,
    /// Only at the end (a replay of recorded curves: its results can be
    /// computed again, and nobody waits on an acknowledgement).
    AtEnd,
}

/// A result stored and decided on, and what its workers are owed once it is durable.
pub(crate) struct Stored {
    pub result: Arc<TrialResult>,
    pub ack: Ack,
}

/// What one flush made durable.
pub(crate) struct Batch {
    pub reports: Vec<Stored>,
    pub ended: Vec<TrialRecord>,
}

/// A flush off the loop is over: its batch number and how it went.
pub(crate) type FlushDone = (u64, Result<(), StoreError>);

/// A batch once its flush is over, and how the flush went.
pub(crate) type Flushed = (Batch, Result<(), StoreError>);

pub(crate) struct Commits {
    store: Store,
    durability: Durability,
    /// Stored since the last flush started.
    reports: Vec<Stored>,
    /// Trials that ended since the last flush started: shown as ended once durable.
    ended: Vec<TrialRecord>,
    /// The batch being flushed off the loop, and its number.
    inflight: Option<(u64, Batch)>,
    next_batch: u64,
    done_tx: mpsc::UnboundedSender<FlushDone>,
    /// The store holds writes of the sweep's opening that no flush has
    /// made durable yet: the first flush starts at the loop's first turn,
    /// whether or not anything is stored by then.
    opening: bool,
}

impl Commits {
    /// Commits over `store`; background flushes report on the receiver.
    /// `unflushed`: the store holds the sweep's opening, not yet durable.
    pub(crate) fn new(store: Store, durability: Durability, unflushed: bool) -> (Self, mpsc::UnboundedReceiver<FlushDone>) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let opening = unflushed && durability == Durability::EveryBatch;
        let c = Self { store, durability, reports: Vec::new(), ended: Vec::new(), inflight: None, next_batch: 0, done_tx, opening };
        (c, done_rx)
    }

    /// A result stored and decided on (not yet durable).
    pub(crate) fn push_report(&mut self, stored: Stored) {
        self.reports.push(stored);
    }

    /// A trial's end stored (not yet durable).
    pub(crate) fn push_end(&mut self, record: TrialRecord) {
        self.ended.push(record);
    }

    /// Whether `trial`'s results are stored but not yet durable.
    pub(crate) fn holds(&self, trial: &str) -> bool {
        self.reports.iter().chain(self.inflight.iter().flat_map(|(_, b)| &b.reports)).any(|p| p.result.trial_id == trial)
    }

    /// Whether some trial's end is stored and not yet shown.
    pub(crate) fn ends_pending(&self) -> bool {
        !self.ended.is_empty() || self.inflight.as_ref().is_some_and(|(_, b)| !b.ended.is_empty())
    }

    /// Whether ends wait for a flush that has not started.
    pub(crate) fn ends_waiting(&self) -> bool {
        !self.ended.is_empty()
    }

    /// Whether a flush runs off the loop now.
    pub(crate) fn in_flight(&self) -> bool {
        self.inflight.is_some()
    }

    /// Nothing stored waits to be acted on.
    pub(crate) fn is_idle(&self) -> bool {
        self.inflight.is_none() && self.reports.is_empty() && self.ended.is_empty() && !self.opening
    }

    /// Starts flushing what is stored so far on a blocking thread (it comes
    /// back through [`Commits::finished`]), unless a flush is under way;
    /// trial ends ride along, and `force` flushes for ends alone. A replay
    /// (durable only at the end) gets its batch back at once.
    pub(crate) fn start(&mut self, force: bool) -> Option<Flushed> {
        let at_end = self.durability == Durability::AtEnd;
        let ends_only = (force || at_end) && !self.ended.is_empty();
        if self.inflight.is_some() || (self.reports.is_empty() && !ends_only && !self.opening) {
            return None;
        }
        self.opening = false;
        let batch = Batch { reports: std::mem::take(&mut self.reports), ended: std::mem::take(&mut self.ended) };
        if at_end {
            return Some((batch, Ok(())));
        }
        let id = self.next_batch;
        self.next_batch += 1;
        self.inflight = Some((id, batch));
        let (store, done) = (self.store.clone(), self.done_tx.clone());
        tokio::task::spawn_blocking(move || {
            let _ = done.send((id, store.flush()));
        });
        None
    }

    /// Flush `id` (off the loop) is over: the batch it made durable, unless
    /// [`Commits::now`] took that batch already.
    pub(crate) fn finished(&mut self, id: u64, result: Result<(), StoreError>) -> Option<Flushed> {
        match self.inflight.take() {
            Some((current, batch)) if current == id => Some((batch, result)),
            other => {
                self.inflight = other;
                None
            }
        }
    }

    /// Everything stored so far, made durable now with one flush on the loop
    /// (a flush under way is covered by it too): the batches it covered. On
    /// this machine's disk only: a mirrored store's upload waits for the
    /// next flush off the loop.
    pub(crate) fn now(&mut self) -> Result<Vec<Batch>, StoreError> {
        let mut batches: Vec<Batch> = self.inflight.take().map(|(_, b)| b).into_iter().collect();
        if !self.reports.is_empty() || !self.ended.is_empty() {
            batches.push(Batch { reports: std::mem::take(&mut self.reports), ended: std::mem::take(&mut self.ended) });
        }
        if (!batches.is_empty() || self.opening) && self.durability == Durability::EveryBatch {
            self.store.flush_local()?;
            self.opening = false;
        }
        Ok(batches)
    }
}
