//! Scheduling overhead: 1,000 trials of a function that sleeps 20 ms and
//! reports once, 16 at a time. The ideal is as many 20 ms rounds as it
//! takes to run them 16 at a time (63 for 1,000 trials: 1.26 s); the
//! benchmark prints the measured time, the overhead against the ideal, and
//! the driver's peak RSS.
//!
//! ```text
//! cargo bench -p nestor-tuner --bench overhead [-- --trials N --sleep-ms MS --concurrency C --no-trial-files --asha --learning-curve --tensorboard]
//! ```
//!
//! `--asha` schedules with ASHA (stopping, `max_t` 4): a scheduler whose
//! state grows with every trial, where FIFO (the default) keeps none.
//! `--learning-curve` with the learning-curve scheduler (`max_t` 4): a
//! curve model fitted at its checks.

mod support;
use support::{arg, peak_rss_mb};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tuner::{
    AshaConfig, Domain, Mode, NodeResources, ProgressMode, ReportError, RunConfig, SchedulerConfig, Space, Trainable, TuneConfig, Tuner,
};

// The allocator of the `nestor` binary, so the driver here is the one users run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

static REPORT_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How much longer than asked the trials' sleeps took, in all: the
/// operating system's share of the overhead, not nestor's.
static OVERSLEPT_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The highest resident set sampled while trials run (KiB): the loop's own
/// memory, before the sweep's result grid is loaded at its end.
static SWEEP_RSS_KB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the `nestor` binary does.
    tuner::return_freed_memory_at_once();
    let trials = arg("--trials", 1000);
    let sleep_ms = arg("--sleep-ms", 20);
    let concurrency = arg("--concurrency", 16) as usize;
    let asha = std::env::args().any(|a| a == "--asha");
    let learning_curve = std::env::args().any(|a| a == "--learning-curve");
    let dir = tempfile::tempdir()?;
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build()?;
    let starts = Arc::new(Mutex::new(Vec::with_capacity(trials as usize)));
    let ends = Arc::new(Mutex::new(Vec::with_capacity(trials as usize)));
    let (s2, e2) = (Arc::clone(&starts), Arc::clone(&ends));
    let trainable = Trainable::function(move |ctx| {
        s2.lock().map_err(|_| "poisoned")?.push(Instant::now());
        if STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed).is_multiple_of(50) {
            SWEEP_RSS_KB.fetch_max(support::status_kb("VmRSS"), std::sync::atomic::Ordering::Relaxed);
        }
        let slept = Instant::now();
        std::thread::sleep(Duration::from_millis(sleep_ms));
        let over = slept.elapsed().saturating_sub(Duration::from_millis(sleep_ms));
        OVERSLEPT_NS.fetch_add(over.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        let x: f64 = ctx.param("x")?;
        let t = Instant::now();
        let reported = ctx.report([("loss", x)], None);
        REPORT_NS.fetch_add(t.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        e2.lock().map_err(|_| "poisoned")?.push(Instant::now());
        // A trial ASHA stops is answered like one it lets go on: it ends here either way.
        match reported {
            Ok(()) | Err(ReportError::Stopped) => Ok(()),
            Err(e) => Err(e.into()),
        }
    });
    // Each trial is one single-CPU worker; declare enough CPUs for `concurrency` of them.
    let tuner = Tuner::new(trainable, space)
        .resources(NodeResources::declared(concurrency as f64))
        .tune_config(TuneConfig {
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            num_samples: trials,
            max_concurrent_trials: Some(concurrency),
            seed: Some(0),
            scheduler: if asha {
                SchedulerConfig::Asha(AshaConfig { max_t: 4.0, ..Default::default() })
            } else if learning_curve {
                SchedulerConfig::LearningCurve(schedulers::LearningCurveConfig { max_t: 4.0, ..Default::default() })
            } else {
                SchedulerConfig::Fifo
            },
            ..Default::default()
        })
        .run_config(RunConfig {
            name: "overhead".into(),
            storage: dir.path().to_path_buf(),
            progress: ProgressMode::Quiet,
            trial_files: !std::env::args().any(|a| a == "--no-trial-files"),
            ..Default::default()
        });
    // `--tensorboard`: the TensorBoard logger writes every result as well.
    let tensorboard = std::env::args().any(|a| a == "--tensorboard");
    let tuner = if tensorboard {
        let exp = dir.path().join("overhead");
        tuner.callback(tuner::callback::tensorboard::TensorBoardLogger::new(exp, Default::default()))
    } else {
        tuner
    };
    let start = Instant::now();
    let grid = tuner.fit()?;
    let end = Instant::now();
    let elapsed = end.duration_since(start).as_secs_f64();
    assert_eq!(grid.num_terminated() as u64, trials, "every trial must finish");
    // Rounds of `concurrency` trials each; the last may be part full.
    let ideal = trials.div_ceil(concurrency as u64) as f64 * sleep_ms as f64 / 1000.0;
    let mut files = if std::env::args().any(|a| a == "--no-trial-files") { "no trial files" } else { "trial files written" }.to_string();
    if tensorboard {
        files.push_str(", TensorBoard logger on");
    }
    let scheduler = if asha {
        "ASHA"
    } else if learning_curve {
        "learning curve"
    } else {
        "FIFO"
    };
    println!("trials={trials} sleep={sleep_ms}ms concurrency={concurrency} scheduler={scheduler} ({files})");
    println!("total {elapsed:.3}s, ideal {ideal:.3}s, overhead {:.1}%", (elapsed / ideal - 1.0) * 100.0);
    println!("mean report round trip {:.0} us", REPORT_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 / trials as f64 / 1000.0);
    let oversleep = OVERSLEPT_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 / trials as f64 / 1e9;
    println!("mean oversleep (a trial's 20 ms sleep beyond 20 ms: the OS's timers, not nestor) {:.0} us", oversleep * 1e6);
    // Each slot runs its trials one after another: their oversleeps add up along it.
    let os_share = trials.div_ceil(concurrency as u64) as f64 * oversleep;
    println!(
        "of the overhead, the sleeps' own overshoot {:.1}% and the rest (nestor, and the threads' wake-ups) {:.1}%",
        os_share / ideal * 100.0,
        (elapsed - ideal - os_share) / ideal * 100.0
    );
    // A slot freed by the k-th trial to end is taken by the (k + concurrency)-th to start.
    let mut starts = starts.lock().map_err(|_| "poisoned")?.clone();
    let mut ends = ends.lock().map_err(|_| "poisoned")?.clone();
    starts.sort();
    ends.sort();
    let gaps: Vec<f64> =
        ends.iter().zip(starts.iter().skip(concurrency)).map(|(e, s)| s.saturating_duration_since(*e).as_secs_f64() * 1e6).collect();
    if let (Some(first), Some(last)) = (starts.first(), ends.last()) {
        println!(
            "startup (fit -> first trial) {:.1} ms, shutdown (last trial -> fit returns) {:.1} ms",
            first.duration_since(start).as_secs_f64() * 1e3,
            end.duration_since(*last).as_secs_f64() * 1e3
        );
    }
    println!("mean slot gap (trial end -> next start) {:.0} us", gaps.iter().sum::<f64>() / gaps.len().max(1) as f64);
    println!(
        "driver RSS during the sweep (sampled every 50 trials) {:.1} MB; peak RSS with the result grid loaded {:.1} MB",
        SWEEP_RSS_KB.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0,
        peak_rss_mb()
    );
    Ok(())
}
