//! nestor's data sets on Arrow's readers: the driver's plan of an
//! experiment's `[datasets]` and each rank's share of them (Ray Train's
//! `get_dataset_shard`).
//!
//! The section's types and the plan file are nestor-trainer's
//! ([`trainer::data`]); this crate plans (Parquet footers, CSV and JSON
//! files read through once) and reads. A program that tunes with
//! `[datasets]` calls [`install`] once before it does (the `nestor` binary
//! does); a Rust trainable reads its share with
//! [`DatasetShards::dataset_shard`]:
//!
//! ```no_run
//! use data::DatasetShards;
//!
//! fn train(ctx: &mut trainer::Context) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut shard = ctx.dataset_shard("train")?;
//!     for epoch in 0..3u64 {
//!         let rows: usize = shard.iter_batches(256).map(|b| b.map(|b| b.num_rows())).sum::<Result<_, _>>()?;
//!         ctx.report([("epoch", epoch as f64), ("rows", rows as f64)], None)?;
//!     }
//!     Ok(())
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

mod plan;
mod read;

pub use plan::plan_all;
pub use read::{BatchOptions, Batches, DataShard};
pub use trainer::data::{read_plans, Block, DataError, DataPlan, DataPlans, DatasetSpec, DatasetTable, Format, Paths};
pub use {arrow_array, arrow_schema};

/// The planner on Arrow's readers, for [`trainer::data::install_planner`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrowPlanner;

impl trainer::data::Planner for ArrowPlanner {
    fn plan<'a>(&'a self, specs: &'a BTreeMap<String, DatasetSpec>, seed: u64) -> trainer::data::Planning<'a> {
        Box::pin(plan_all(specs, seed))
    }
}

/// Installs this crate's planner for the process, so that a sweep with
/// `[datasets]` can be planned. Calling it again does nothing.
pub fn install() {
    trainer::data::install_planner(Box::new(ArrowPlanner));
}

/// A rank's data sets: `ctx.dataset_shard(name)` on a
/// [`trainer::Context`].
pub trait DatasetShards {
    /// This rank's share of the data set `name` of the experiment's
    /// `[datasets]` (Ray Train's `get_dataset_shard`): each
    /// `iter_batches` reads the next epoch as Arrow record batches, every
    /// rank as many rows, no row on two ranks. Epochs count from the
    /// iterations already done, so a restarted run reads its checkpoint's
    /// epoch in that epoch's order (one report an epoch). A rank whose node
    /// does not see the plan file fetches it from the driver.
    fn dataset_shard(&mut self, name: &str) -> Result<DataShard, DataError>;
}

impl DatasetShards for trainer::Context {
    fn dataset_shard(&mut self, name: &str) -> Result<DataShard, DataError> {
        let plan = self.dataset_plan(name)?;
        Ok(DataShard::new(name, Arc::new(plan), self.world_rank(), self.world_size(), self.start_iteration()))
    }
}
