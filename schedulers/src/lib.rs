//! Trial schedulers and stoppers: pure decision logic over results.
//!
//! No I/O and no clock of their own: time reaches a scheduler only through
//! the results it is shown, which is what lets a scheduler be tested exactly
//! and replayed.
#![warn(missing_docs)]

pub mod conformance;
mod fifo;
mod scheduler;
mod stopper;

pub use fifo::Fifo;
pub use scheduler::{Decision, Scheduler, SchedulerError, TrialStatus, TrialView};
pub use stopper::{CombinedStopper, FnStopper, MetricThresholds, Stopper};
