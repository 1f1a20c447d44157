//! Nothing to use: this crate exists for its `Cargo.toml`, which gives the
//! crates the examples' build and the `nestor` binary's build share one set
//! of features (see there).
