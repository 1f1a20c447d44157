//! Acknowledgements: how far a run's results are durable in the driver's
//! result store.
//!
//! The driver answers each step with its decision as soon as the scheduler
//! has made it, so a worker never waits for a disk. The step's result is
//! stored by then and becomes durable with the driver's next group commit;
//! only then is it *acknowledged*. A worker learns how far it is
//! acknowledged from every later reply, and can wait for all of its steps
//! (`Context::sync`, or closing its report stream). Whatever was
//! acknowledged survives the driver's crash.

use std::sync::Arc;

use tokio::sync::watch;

/// How far one run's steps are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// Every step up to this iteration is durable.
    through: u64,
    /// A step was answered that will never be acknowledged (it was not
    /// stored, or the driver ended before it was durable).
    lost: Option<u64>,
}

/// A run's acknowledgement mark, shared by its steps' [`Ack`]s.
#[derive(Debug)]
pub(crate) struct Watermark(watch::Sender<Mark>);

impl Watermark {
    /// A run whose steps up to `start` (those of the checkpoint it resumed
    /// from) are durable already.
    pub(crate) fn new(start: u64) -> Arc<Self> {
        Arc::new(Self(watch::Sender::new(Mark { through: start, lost: None })))
    }

    /// Every step up to this iteration is durable.
    pub(crate) fn through(&self) -> u64 {
        self.0.borrow().through
    }

    /// Watches the mark.
    pub(crate) fn watch(&self) -> Acknowledged {
        Acknowledged(self.0.subscribe())
    }

    /// What step `iteration`'s ranks are owed.
    pub(crate) fn owe(self: &Arc<Self>, iteration: u64) -> Ack {
        Ack { mark: Some(Arc::clone(self)), iteration }
    }
}

/// Owed to the ranks of one step once its result is durable:
/// [`Ack::durable`] acknowledges it. Dropped unacknowledged, it tells
/// whoever waits for it that it never will be.
#[derive(Debug)]
pub struct Ack {
    mark: Option<Arc<Watermark>>,
    iteration: u64,
}

impl Ack {
    /// The step's result is durable: acknowledges it (and every step before it).
    pub fn durable(mut self) {
        if let Some(mark) = self.mark.take() {
            let iteration = self.iteration;
            mark.0.send_if_modified(|m| {
                let raise = iteration > m.through;
                if raise {
                    m.through = iteration;
                }
                raise
            });
        }
    }

    /// An acknowledgement nobody watches.
    pub(crate) fn unwatched() -> Self {
        Self { mark: None, iteration: 0 }
    }

    /// The iteration of the step it acknowledges.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if let Some(mark) = self.mark.take() {
            let iteration = self.iteration;
            mark.0.send_if_modified(|m| {
                let first = m.lost.is_none() && iteration > m.through;
                if first {
                    m.lost = Some(iteration);
                }
                first
            });
        }
    }
}

/// A step that was answered and will never be acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {iteration} was answered but is not durable: the driver did not store it, or ended before it could")]
pub struct NotAcknowledged {
    /// The first such step.
    pub iteration: u64,
}

/// Watches one run's acknowledgements.
#[derive(Debug, Clone)]
pub struct Acknowledged(watch::Receiver<Mark>);

impl Acknowledged {
    /// Every step up to this iteration is durable.
    pub fn through(&self) -> u64 {
        self.0.borrow().through
    }

    /// Waits until step `iteration` is durable; returns how far the run is
    /// acknowledged then.
    pub async fn wait_for(&mut self, iteration: u64) -> Result<u64, NotAcknowledged> {
        let seen = self.0.wait_for(|m| m.through >= iteration || m.lost.is_some_and(|l| l <= iteration)).await;
        match seen.map(|m| *m) {
            Ok(m) if m.through >= iteration => Ok(m.through),
            Ok(m) => Err(NotAcknowledged { iteration: m.lost.unwrap_or(iteration) }),
            // Every owed step is gone and the run with them: nothing more will come.
            Err(_) => {
                let m = *self.0.borrow();
                if m.through >= iteration {
                    Ok(m.through)
                } else {
                    Err(NotAcknowledged { iteration: m.through + 1 })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn acknowledgements_rise_in_order_and_a_lost_step_ends_the_wait() {
        let mark = Watermark::new(4);
        let mut seen = mark.watch();
        assert_eq!(seen.through(), 4, "the checkpoint's steps are durable already");
        assert_eq!(seen.wait_for(3).await, Ok(4));
        let (five, six) = (mark.owe(5), mark.owe(6));
        let waiter = tokio::spawn({
            let mut seen = seen.clone();
            async move { seen.wait_for(6).await }
        });
        five.durable();
        assert_eq!(seen.through(), 5);
        assert!(!waiter.is_finished());
        six.durable();
        assert_eq!(waiter.await.unwrap(), Ok(6));

        // A step answered and never stored: waiting for it, or beyond it, ends.
        drop(mark.owe(7));
        assert_eq!(seen.wait_for(8).await, Err(NotAcknowledged { iteration: 7 }));
        assert_eq!(seen.wait_for(6).await, Ok(6), "what was acknowledged stays so");

        // The run is gone with a step unacknowledged.
        let mark = Watermark::new(0);
        let mut seen = mark.watch();
        let one = mark.owe(1);
        drop(mark);
        one.durable();
        assert_eq!(seen.wait_for(1).await, Ok(1));
        assert_eq!(seen.wait_for(2).await, Err(NotAcknowledged { iteration: 2 }));
    }
}
