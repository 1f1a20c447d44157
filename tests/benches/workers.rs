//! Worker groups, measured:
//!
//! 1. start: the time from a trial's launch to all N worker processes
//!    running (spawned and exec'd: `launch` returns) with a trivial program
//!    (`sleep`), and to the first report of all N ranks having arrived over
//!    gRPC (the aggregated step) with the fixture worker (one report, exit),
//!    for N = 1, 4, 16;
//! 2. throughput: 16 single-worker trials reporting as fast as they can
//!    through the whole Tuner (every result stored in sled and decided on
//!    before its worker's report returns, and flushed in group commits off
//!    the loop); and one 16-rank trial doing the same (a result per step
//!    of all 16 ranks).
//!
//! With `--tls`, the report channel is TLS, as it is in the Slurm modes
//! (a certificate made for the driver, the ranks checking it).
//!
//! ```text
//! cargo bench -p nestor-tests --bench workers [-- --reps R --steps S --tls]
//! ```

use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;

// The allocator of the `nestor` binary, so the driver here is the one users run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use tokio::sync::mpsc;
use trainer::{Backend, Directive, EventKind, LaunchSpec, ProcessBackend, ProcessConfig, WorkerBundle};
use tuner::{Mode, NodeResources, ProgressMode, RunConfig, Space, Trainable, TuneConfig, Tuner};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// `--tls`: the report channel encrypted.
fn tls() -> bool {
    std::env::args().any(|a| a == "--tls")
}

/// The process config of a run of `command`, its report channel TLS with `--tls`.
fn process_config(command: &[&str]) -> ProcessConfig {
    ProcessConfig { encrypt: tls(), ..ProcessConfig::new(command.iter().map(|s| s.to_string()).collect()) }
}

fn worker() -> &'static str {
    env!("CARGO_BIN_EXE_fixture-worker")
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Launches a trial of `n` workers `reps` times: the times (ms) until `launch`
/// returned (every process spawned and exec'd) and until the first step of
/// all ranks arrived (only for a program that reports).
async fn start_times(n: u32, reps: u64, command: &[&str], reports: bool) -> Result<(Vec<f64>, Vec<f64>), Box<dyn std::error::Error>> {
    let backend = ProcessBackend::start(process_config(command)).await?;
    let dir = tempfile::tempdir()?;
    let (mut spawned, mut reported) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut spec = LaunchSpec::new(format!("t{rep}"), serde_json::json!({ "x": 0.5, "steps": 1 }), dir.path().join(format!("t{rep}")));
        spec.workers = vec![WorkerBundle::cpus(1.0); n as usize];
        let t0 = Instant::now();
        let handle = backend.launch(spec, tx)?;
        spawned.push(t0.elapsed().as_secs_f64() * 1e3);
        if !reports {
            handle.stop(trainer::StopLevel::Kill);
        }
        while let Some(kind) = rx.recv().await.map(|e| e.kind) {
            match kind {
                EventKind::Report { reply, .. } => {
                    reported.push(t0.elapsed().as_secs_f64() * 1e3);
                    reply.send(Directive::Stop).durable();
                }
                EventKind::NodeLost { .. } | EventKind::Book { .. } | EventKind::RunTrainer { .. } | EventKind::Stuck => {}
                EventKind::Exited(_) => break,
            }
        }
    }
    Ok((spawned, reported))
}

fn throughput(trials: u64, workers: u32, steps: u64, in_process: bool) -> Result<(f64, u64), Box<dyn std::error::Error>> {
    throughput_to(trials, workers, steps, in_process, None)
}

/// [`throughput`], the experiment's storage at `url` (its store mirrored there at every flush).
fn throughput_to(
    trials: u64,
    workers: u32,
    steps: u64,
    in_process: bool,
    url: Option<&str>,
) -> Result<(f64, u64), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let space = Space::builder().constant("x", 0.5).constant("steps", steps).constant("quiet", true).build()?;
    let trainable = if in_process {
        Trainable::function(|ctx| {
            let steps: u64 = ctx.param("steps")?;
            for step in 1..=steps {
                ctx.report([("loss", 1.0 / step as f64)], None)?;
            }
            Ok(())
        })
    } else {
        Trainable::process(process_config(&[worker()]))
    }
    .scaling(tuner::ScalingConfig::workers(workers));
    let grid = Tuner::new(trainable, space)
        .resources(NodeResources::declared(16.0))
        .tune_config(TuneConfig {
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            num_samples: trials,
            seed: Some(0),
            ..Default::default()
        })
        .run_config(RunConfig {
            name: "throughput".into(),
            storage: dir.path().into(),
            storage_url: url.map(String::from),
            progress: ProgressMode::Quiet,
            ..Default::default()
        })
        .fit()?;
    // From the first stored result to the last, by their timestamps.
    let mut stamps: Vec<f64> = grid.iter().flat_map(|t| t.history.iter().map(|r| r.metrics["timestamp"])).collect();
    stamps.sort_by(f64::total_cmp);
    let n = stamps.len() as u64;
    let span = stamps.last().copied().unwrap_or(0.0) - stamps.first().copied().unwrap_or(0.0);
    Ok((n as f64 / span.max(1e-9), n))
}

/// From a rank's failure (its exit) to the run reported failed with every
/// process of its group gone, for a group of `n` whose other ranks handle
/// SIGTERM (or ignore it, and so are killed after the one-second cap).
fn failure_time(n: u32, ignore_sigterm: bool) -> Result<f64, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let err = trainer::Trainer::command([worker()])
        .scaling(tuner::ScalingConfig::workers(n))
        .resources(NodeResources::declared(f64::from(n)))
        .config(
            serde_json::json!({ "x": 0.5, "steps": 1000, "sleep_ms": 20, "fail_at": 10, "fail_rank": 1, "ignore_sigterm": ignore_sigterm }),
        )
        .storage(dir.path())
        .name("fails")
        .fit()
        .err()
        .ok_or("the run did not fail")?;
    let done = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
    let log = std::fs::read_to_string(dir.path().join("fails/logs/rank-1.log"))?;
    let failed: f64 = log.split("(t=").nth(1).and_then(|s| s.split(')').next()).ok_or("no failure time")?.parse()?;
    assert!(err.to_string().contains("rank 1 exited with code 3"), "{err}");
    Ok((done - failed) * 1e3)
}

/// `--only start|driver|processes|ranks|failure` runs one part.
fn part(name: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).is_none_or(|p| p == name)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the `nestor` binary does.
    tuner::return_freed_memory_at_once();
    let reps = arg("--reps", 30);
    let steps = arg("--steps", 2000);
    if part("start") {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let channel = if tls() { "TLS" } else { "plaintext" };
        println!("start of a trial's worker group ({reps} launches each; median / p90 in ms; report channel {channel})");
        println!("{:>8} {:>26} {:>34}", "workers", "all running (`sleep 5`)", "all N first reports (fixture)");
        for n in [1u32, 2, 4, 16] {
            let (mut s, _) = rt.block_on(start_times(n, reps, &["sleep", "5"], false))?;
            let (_, mut r) = rt.block_on(start_times(n, reps, &[worker()], true))?;
            println!(
                "{n:>8} {:>12.2} / {:<12.2} {:>16.2} / {:<12.2}",
                percentile(&mut s, 0.5),
                percentile(&mut s, 0.9),
                percentile(&mut r, 0.5),
                percentile(&mut r, 0.9)
            );
        }
    }
    if part("failure") {
        for (n, ignore) in [(2u32, false), (16, false), (2, true)] {
            let mut t: Vec<f64> = (0..5).map(|_| failure_time(n, ignore)).collect::<Result<_, _>>()?;
            let how = if ignore { "ignore SIGTERM" } else { "exit on SIGTERM" };
            println!(
                "a rank fails in a group of {n} (the others {how}): run failed, group gone after {:.1} ms (median of 5)",
                percentile(&mut t, 0.5)
            );
        }
    }
    if part("driver") {
        let t = Instant::now();
        let (rate, n) = throughput(16, 1, steps, true)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "(the driver alone: 16 in-process trials x {steps} steps: {n} results persisted, {rate:.0} results/s, {secs:.1} s in all)"
        );
    }
    if part("driver-s3") {
        // The same, with the experiment's storage in a bucket of an S3 server on loopback: each flush
        // uploads its batch of results before they are acknowledged.
        let dir = tempfile::tempdir()?;
        let s3 = common::S3Server::start(&dir.path().join("s3"));
        for (k, v) in s3.env() {
            std::env::set_var(k, v);
        }
        let t = Instant::now();
        let (rate, n) = throughput_to(16, 1, steps, true, Some("s3://bucket/runs"))?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "(the driver alone, its store mirrored to S3 on loopback: 16 in-process trials x {steps} steps: {n} results persisted, {rate:.0} results/s, {secs:.1} s in all)"
        );
    }
    if part("processes") {
        let t = Instant::now();
        let (rate, n) = throughput(16, 1, steps, false)?;
        let secs = t.elapsed().as_secs_f64();
        let channel = if tls() { "TLS" } else { "plaintext" };
        println!(
            "16 single-worker trials x {steps} steps, report channel {channel}: {n} results persisted, {rate:.0} results/s ({secs:.1} s in all)"
        );
    }
    if part("ranks") {
        let t = Instant::now();
        let (rate, n) = throughput(1, 16, steps, false)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "1 trial x 16 ranks x {steps} steps: {n} results persisted ({} reports), {rate:.0} results/s, {:.0} reports/s ({secs:.1} s in all)",
            n * 16,
            rate * 16.0
        );
    }
    Ok(())
}
