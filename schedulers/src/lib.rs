//! Trial schedulers and stoppers: pure decision logic over results.
//!
//! No I/O and no clock of their own: time reaches a scheduler only through
//! the results it is shown (its `time_attr`), which is what lets a scheduler
//! be tested exactly and replayed.
#![warn(missing_docs)]

mod asha;
mod config;
pub mod conformance;
pub mod curve_model;
mod fifo;
pub mod gp;
mod hyperband;
mod learning_curve;
mod median;
mod objective;
mod pbt;
mod pbt_config;
mod ranked;
mod resource_changing;
mod scheduler;
mod settings;
mod stopper;

pub use asha::{Asha, AshaConfig, AshaType};
pub use config::{ResourceChangingConfig, SchedulerConfig};
pub use fifo::Fifo;
pub use hyperband::{HyperBand, HyperBandConfig};
pub use learning_curve::{LearningCurve, LearningCurveConfig};
pub use median::{MedianStopping, MedianStoppingConfig};
pub use objective::{Objective, Score};
pub use pbt::{CustomExplore, Mutation, Pbt};
pub use pbt_config::{Pb2Config, PbtConfig};
pub use resource_changing::{ResourceChanging, WorkerAllocation};
pub use scheduler::{Capacity, Decision, Exploit, Paused, Scheduler, SchedulerError, TrialStatus, TrialView};
pub use settings::ConfigError;
pub use stopper::{CombinedStopper, FnStopper, MetricThresholds, Stopper};
