//! The chaos suite by hand: many short sweeps, each with one fault at a
//! random, seeded point, checked against a fault-free run (common/chaos.rs
//! says which faults and which invariants). Prints a line per run and a
//! table per fault kind.
//!
//! `cargo bench -p nestor-tests --bench chaos -- [--runs N] [--seed S] [--kinds rank-kill,driver-kill,...]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::chaos::{line, run_many, table, Fault};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let runs: usize = arg("--runs").map_or(20, |r| r.parse().expect("--runs N"));
    let seed: u64 = arg("--seed").map_or_else(
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000,
        |s| s.parse().expect("--seed S"),
    );
    let kinds: Vec<Fault> = arg("--kinds").map_or_else(
        || Fault::ALL.to_vec(),
        |k| k.split(',').map(|n| Fault::parse(n).unwrap_or_else(|| panic!("unknown fault {n:?}"))).collect(),
    );
    println!("chaos: {runs} runs, seed {seed}, faults {}", kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","));
    let started = std::time::Instant::now();
    let outcomes = run_many(runs, seed, &kinds, |o| println!("{}", line(o)));
    println!("\n{}", table(&outcomes));
    let broken = outcomes.iter().filter(|o| !o.held()).count();
    println!("{} runs in {:.0} s; {broken} broke an invariant", outcomes.len(), started.elapsed().as_secs_f64());
    if broken > 0 {
        std::process::exit(1);
    }
}
