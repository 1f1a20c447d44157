//! Simulated sweeps: the real Tuner loop on recorded or made-up learning
//! curves under a virtual clock (the engine is `crate::curves`):
//! `nestor simulate`'s summary of a sweep at scale, `--compare`'s table of
//! schedulers on the same curves, and the benchmark of made-up curves the
//! scheduler benches score sweeps on.

pub mod benchmark;
pub mod compare;
pub mod summary;

pub use crate::curves::{Curve, Curves, CurvesError, SimBackend};
