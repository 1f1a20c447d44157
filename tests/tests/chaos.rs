//! The chaos suite, CI-sized: one run of each local fault kind at a random
//! point, a new seed every time (printed, to replay it with
//! `cargo bench -p nestor-tests --bench chaos -- --seed S`). Every
//! invariant must hold in every run. See common/chaos.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::chaos::{line, run_many, table, Fault};

#[test]
fn every_invariant_holds_after_a_fault_at_a_random_point() {
    let seed = std::env::var("NESTOR_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000);
    eprintln!("chaos seed {seed} (NESTOR_CHAOS_SEED={seed} replays it)");
    let outcomes = run_many(Fault::ALL.len(), seed, &Fault::ALL, |o| eprintln!("{}", line(o)));
    eprintln!("{}", table(&outcomes));
    let broken: Vec<String> = outcomes.iter().filter(|o| !o.held()).map(line).collect();
    assert!(broken.is_empty(), "seed {seed}: invariants broken:\n{}", broken.join("\n"));
}
