//! The vocabulary of configurations: domains, search spaces (Rust builder and
//! TOML), seeded sampling, and the searchers that suggest trial configs.
//!
//! Also home to the small types every other nestor crate shares: [`Mode`],
//! [`Metrics`] and [`TrialResult`].
#![warn(missing_docs)]

mod basic;
pub mod benchmarks;
mod bohb;
mod config;
pub mod conformance;
mod domain;
mod error;
mod limiter;
mod repeater;
mod searcher;
mod space;
mod tpe;
mod types;

pub use basic::BasicVariantGenerator;
pub use bohb::{Bohb, BohbOptions};
pub use config::{Algorithm, SearchConfig, SettingError};
pub use domain::Domain;
pub use error::{SearchError, SpaceError};
pub use limiter::ConcurrencyLimiter;
pub use repeater::{Repeater, TRIAL_INDEX};
pub use searcher::{Searcher, Suggestion};
pub use space::{json_to_toml, toml_to_json, Node, Space, SpaceBuilder, DOMAIN_KINDS};
pub use tpe::{Tpe, TpeOptions};
pub use types::{metrics_serde, Config, Metrics, Mode, TrialResult};
