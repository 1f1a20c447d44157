//! The `nestor` command line: parses arguments and calls the library.
//!
//! Exit codes: 0 success; 1 the sweep or a query failed; 2 bad input
//! (experiment file, flags, missing experiment); 130 interrupted.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

use search::{BasicVariantGenerator, Metrics, Mode, Searcher, Suggestion};

use crate::callback::Status;
use crate::experiment::ExperimentFile;
use crate::files::csv_field;
use crate::result_grid::{QueryError, ResultGrid, Scope, TrialOutcome};
use crate::text::headline;
use crate::text::{config_summary, fmt_num};
use crate::{ProgressMode, TuneError, Tuner};

/// nestor: hyperparameter tuning where every trial is a training run.
#[derive(Debug, Parser)]
#[command(name = "nestor", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// One row per result.
    Csv,
    /// One JSON object per result.
    Json,
    /// One JSON object per trial: status, config, error, last metrics,
    /// history, committed checkpoints (what the Python driver reads).
    Trials,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sweep an experiment file describes, then print the best result.
    Run {
        /// The experiment file (TOML).
        file: PathBuf,
        /// Override a key of the file, e.g. --set experiment.num_samples=8
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Where experiments go (overrides experiment.storage).
        #[arg(long)]
        storage: Option<PathBuf>,
        /// Print plain progress lines even on a terminal.
        #[arg(long)]
        plain: bool,
        /// Serve the dashboard while the sweep runs, on loopback at this
        /// port (8265 if no port is given).
        #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "8265")]
        dashboard: Option<u16>,
    },
    /// Serve a web dashboard of one or more experiments: the trial table,
    /// learning curves, config against metric, each trial's detail. It
    /// follows running sweeps live. Ctrl-C stops it.
    Dashboard {
        /// Experiment directories (<storage>/<name>).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// The port (0: any free one).
        #[arg(long, default_value_t = 8265)]
        port: u16,
        /// The address to listen on. Every request needs the token (made
        /// up and printed unless --token gives one), loopback too: other
        /// users of the machine reach loopback.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// The token every request must carry: ?token= on the first load
        /// (kept in an HttpOnly cookie after it), or Authorization: Bearer.
        /// At least 16 characters.
        #[arg(long)]
        token: Option<String>,
    },
    /// Run an experiment file's sweep on recorded learning curves under a
    /// virtual clock (its real scheduler and searcher, no training), leaving
    /// a normal experiment directory behind.
    Simulate {
        /// The experiment file (its [trainer] is not used).
        file: PathBuf,
        /// JSON lines: {"config": {...}, "metrics": [...], "seconds_per_iteration": s}.
        #[arg(long)]
        curves: PathBuf,
        /// Worker slots (default: experiment.max_concurrent_trials, else 4).
        #[arg(long)]
        workers: Option<usize>,
        /// Override a key of the file.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Where experiments go (overrides experiment.storage).
        #[arg(long)]
        storage: Option<PathBuf>,
        /// Print a line per trial start and end.
        #[arg(long)]
        plain: bool,
        /// Count compute in this column of the curves (a cumulative cost
        /// such as samples_seen; default: the curves' only column, else
        /// iterations).
        #[arg(long, value_name = "ATTR")]
        cost: Option<String>,
        /// Run the same curves through each of these schedulers (and FIFO)
        /// and print compute and regret: fifo,asha,asha:asha_type=promotion,hyperband,...
        #[arg(long, value_name = "SCHEDULERS")]
        compare: Option<String>,
        /// With --compare: how many seeds (orders of the configs).
        #[arg(long, default_value_t = 5, requires = "compare")]
        seeds: u64,
        /// Keep only the best N finished trials in the store (the others are
        /// summed up as they end, then deleted): memory stays that of N
        /// trials however many run. Such a sweep cannot be resumed.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "compare")]
        keep: Option<u64>,
    },
    /// Submit the sweep as a Slurm batch job: writes the batch script next
    /// to the experiment (`<storage>/<name>.sbatch`) and prints the job's id
    /// and the experiment directory. The job runs `nestor run`, or `nestor
    /// resume` when the experiment exists already, so submitting again
    /// continues it. The sweep runs on the job's `--nodes` nodes; or, with
    /// `[cluster] backend = "slurm_jobs"`, the job holds the driver alone
    /// (one task: the trials are jobs of their own) and, near its time
    /// limit, stops the sweep and submits a new job of its own that
    /// resumes it.
    Submit {
        /// The experiment file (TOML).
        file: PathBuf,
        /// Nodes of the job (not with backend = "slurm_jobs").
        #[arg(long)]
        nodes: Option<u32>,
        /// GPUs per node (not with backend = "slurm_jobs").
        #[arg(long)]
        gpus_per_node: Option<u32>,
        /// The partition.
        #[arg(long)]
        partition: Option<String>,
        /// The job's time limit (Slurm's forms: minutes, HH:MM:SS, D-HH:MM).
        #[arg(long)]
        time: Option<String>,
        /// How long before its time limit the job is told: the sweep then
        /// stops its trials so they resume later (a driver's job hands the
        /// sweep on to a new job of its own).
        #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..))]
        notice: u32,
        /// Override a key of the file.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Where experiments go (overrides experiment.storage).
        #[arg(long)]
        storage: Option<PathBuf>,
        /// Print the script instead of submitting it.
        #[arg(long)]
        dry_run: bool,
        /// More sbatch options, after `--`.
        #[arg(last = true)]
        sbatch_args: Vec<String>,
    },
    /// Continue an interrupted or crashed experiment.
    Resume {
        /// The experiment directory (<storage>/<name>), or its URL when its
        /// storage is an object store (s3://bucket/prefix/<name>): it goes on
        /// from the bucket alone.
        dir: PathBuf,
        /// Print plain progress lines even on a terminal.
        #[arg(long)]
        plain: bool,
        /// Serve the dashboard while the sweep runs, on loopback at this
        /// port (8265 if no port is given).
        #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "8265")]
        dashboard: Option<u16>,
        /// Run the trials in ERROR on from their latest checkpoint.
        #[arg(long, conflicts_with = "restart_errored")]
        resume_errored: bool,
        /// Run the trials in ERROR again from the start (their results and checkpoints deleted).
        #[arg(long)]
        restart_errored: bool,
        /// Override a `trainer.` key of the stored experiment, what differs on
        /// this machine (e.g. --set trainer.working_dir="/home/me/project").
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Show every trial: state, iteration, restarts, latest metrics.
    Status {
        /// The experiment directory, or its URL (s3://bucket/prefix/<name>).
        dir: PathBuf,
    },
    /// Bring an experiment whose storage is an object store back into its
    /// local directory (its files and its result store); prints the directory.
    Pull {
        /// The experiment's URL (s3://bucket/prefix/<name>, gs://, az://).
        url: PathBuf,
    },
    /// List the exploits of a population-based sweep: who took whose
    /// checkpoint, at which iteration, and how the config changed.
    Exploits {
        /// The experiment directory.
        dir: PathBuf,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Print the best trial: config, metrics, checkpoint.
    Best {
        /// The experiment directory.
        dir: PathBuf,
        /// Metric to rank by (default: the experiment's).
        #[arg(long)]
        metric: Option<String>,
        /// min or max (default: the experiment's).
        #[arg(long)]
        mode: Option<Mode>,
        /// last, avg, all, or last-N-avg (e.g. last-5-avg).
        #[arg(long, default_value = "last")]
        scope: Scope,
        /// One JSON object: trial_id, config, metrics, checkpoint.
        #[arg(long)]
        json: bool,
    },
    /// Print every result, one row per result (or every trial, one line each).
    Export {
        /// The experiment directory.
        dir: PathBuf,
        /// csv, json (JSON lines, a result each) or trials (JSON lines, a trial each).
        #[arg(long, value_enum)]
        format: Format,
    },
    /// Upload a rank's checkpoint shard to the object store its trial's
    /// checkpoints go to (what Python ranks run when their run's plan sends
    /// checkpoints to an object store); prints the checkpoint's URI.
    PutShard {
        /// The rank's checkpoint directory.
        dir: PathBuf,
        /// The trial's storage (`s3://bucket/prefix/<experiment>/trials/<trial>`).
        store: String,
        /// The iteration the checkpoint is reported with.
        #[arg(long)]
        iteration: u64,
        /// The rank.
        #[arg(long)]
        rank: u32,
    },
    /// Download a rank's shard of a checkpoint in an object store into a
    /// local directory (what Python ranks run when their run's plan resumes
    /// from the store): its own, or rank 0's where it saved none; prints
    /// `fetched`, or `none` when the checkpoint holds neither.
    GetShard {
        /// The checkpoint's URI (`s3://bucket/prefix/.../checkpoint_000004`).
        uri: String,
        /// The directory to download into.
        dest: PathBuf,
        /// The rank.
        #[arg(long)]
        rank: u32,
    },
    /// Send standard input to the driver as a trial's job output (what a
    /// trial's Slurm job runs when its node does not see the experiment's
    /// directory; the run is named by its plan, `NESTOR_RUN`, and
    /// `NESTOR_TOKEN`). Never blocks the writer: output the driver cannot
    /// take in time is dropped, and said.
    RelayOutput,
    /// Read a node's GPUs of a trial's run and send the run's share to the
    /// driver once a period (what the Slurm prologue starts beside a node's
    /// first rank when the run holds GPUs there; the run is named by its
    /// plan, `NESTOR_RUN`, and `NESTOR_TOKEN`, the sender by `RANK` and
    /// `NODE_RANK`). Ends with the rank that started it.
    GpuSample {
        /// The node's GPUs of the run: NVML indices, `0,1` or `0-3`.
        #[arg(long)]
        gpus: String,
        /// Other runs share these GPUs (fractional GPUs).
        #[arg(long)]
        shared: bool,
        /// How often to read, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
    },
    /// Copy a committed checkpoint (a directory or an object store URL, as
    /// `nestor best` prints it) into a local directory: one `rank-<r>/` per
    /// rank that saved a shard.
    Fetch {
        /// The checkpoint's location.
        uri: String,
        /// The directory to fill (created; must be empty if it exists).
        dest: PathBuf,
    },
    /// Show the configs a file would run first, running nothing.
    Sample {
        /// The experiment file.
        file: PathBuf,
        /// How many.
        #[arg(short = 'n', default_value_t = 5)]
        n: u64,
        /// Override a key of the file.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
}

/// A failure with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl From<TuneError> for Failure {
    fn from(e: TuneError) -> Self {
        let code = match &e {
            TuneError::Experiment(_)
            | TuneError::Search(_)
            | TuneError::Scaling(_)
            | TuneError::Resources(_)
            | TuneError::Exists(_)
            | TuneError::Storage(_)
            | TuneError::NoTrainer => 2,
            TuneError::Store(crate::store::StoreError::Missing(_)) => 2,
            TuneError::Interrupted(_) => 130,
            // Its own code: a front end (the Python driver) tells a sweep that
            // stopped on its first error, its results stored, from one that broke.
            TuneError::FailFast(_) => 3,
            _ => 1,
        };
        Failure { code, message: e.to_string() }
    }
}

impl From<QueryError> for Failure {
    fn from(e: QueryError) -> Self {
        let code = match &e {
            QueryError::Store(crate::store::StoreError::Missing(_)) | QueryError::Missing(_) => 2,
            _ => 1,
        };
        Failure { code, message: e.to_string() }
    }
}

/// A sweep that stopped on a full disk says so, and how to go on: what it
/// acknowledged is stored, and `nestor resume` continues once there is room.
fn on_full_disk(mut f: Failure, dir: &Path) -> Failure {
    if f.message.contains("No space left on device") || f.message.contains("os error 28") {
        f.message.push_str(&format!(
            "\nthe disk holding {} is full: the sweep stopped; every acknowledged result is kept (`nestor status` reads them). \
             Free some space, then continue it with `nestor resume {}`",
            dir.display(),
            dir.display()
        ));
    }
    f
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    if !dies_with_parent() {
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours for a terminal only: not in logs, files or pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            // sled's own logs repeat an error the store returns, and nestor's message names it once.
            tracing_subscriber::EnvFilter::try_from_env("NESTOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sled=off")),
        )
        .try_init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// `--storage PATH` as an `experiment.storage` override; a path that is
/// not UTF-8 is refused (written back as text it would name another directory).
fn storage_set(path: &Path) -> Result<String, Failure> {
    let text = path.to_str().ok_or_else(|| Failure {
        code: 2,
        message: format!("--storage: {} is not UTF-8; give a path whose name is text", path.display()),
    })?;
    Ok(format!("experiment.storage={}", toml::Value::String(text.to_string())))
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Run { file, sets, storage, plain, dashboard } => {
            let mut sets = sets;
            if let Some(s) = storage {
                sets.push(storage_set(&s)?);
            }
            let experiment = ExperimentFile::read(&file, &sets).map_err(TuneError::from)?;
            let tuner = Tuner::from_file(experiment, file.display().to_string(), None).progress(progress(plain));
            let dir = tuner.experiment_dir();
            if let Some(port) = dashboard {
                serve_beside(&dir, port)?;
            }
            let grid = tuner.fit().map_err(|e| on_full_disk(e.into(), &dir))?;
            print_summary(&grid, &dir)
        }
        Command::Simulate { file, curves, workers, sets, storage, plain, cost, compare, seeds, keep } => {
            let mut sets = sets;
            if let Some(s) = storage {
                sets.push(storage_set(&s)?);
            }
            if let Some(w) = workers {
                sets.push(format!("experiment.max_concurrent_trials={w}"));
            }
            let experiment = ExperimentFile::read(&file, &sets).map_err(TuneError::from)?;
            let Some(metric) = experiment.experiment.metric.clone() else {
                return Err(Failure {
                    code: 2,
                    message: format!("{}: experiment.metric: required to simulate (the curves' values are that metric)", file.display()),
                });
            };
            let bad = |message: String| Failure { code: 2, message };
            let curves = crate::simulate::Curves::from_jsonl(&curves, metric).map_err(|e| bad(e.to_string()))?;
            let columns = curves.attrs();
            let cost = cost.or_else(|| (columns.len() == 1).then(|| columns[0].clone()));
            let curves = match cost {
                Some(c) => curves.cost(c).map_err(|e| bad(e.to_string()))?,
                None => curves,
            };
            let origin = file.display().to_string();
            if let Some(list) = compare {
                let base = ExperimentFile::raw_table(&file, &sets).map_err(TuneError::from)?;
                let entries = crate::simulate::compare::entries(&list, &base, &origin, &curves).map_err(bad)?;
                let storage = experiment.experiment.storage.clone().unwrap_or_else(|| "runs".into());
                // The sweeps are scratch: a directory of their own, removed after.
                let dir = std::path::Path::new(&storage).join(format!(".{}-compare-{}", experiment.experiment.name, std::process::id()));
                let started = std::time::Instant::now();
                let rows = crate::simulate::compare::run(&entries, &curves, seeds, &dir, |label, seed, o| {
                    if plain {
                        println!("{label} seed {seed}: compute {:.4e}, chosen {:.4}, best {:.4}", o.spent, o.chosen, o.best);
                    }
                });
                let _ = std::fs::remove_dir_all(&dir);
                let rows = rows?;
                print!("{}", crate::simulate::compare::table(&rows, curves.cost_attr(), seeds));
                println!("{} simulated sweeps in {:.1} s", rows.len() as u64 * seeds, started.elapsed().as_secs_f64());
                return Ok(());
            }
            if let Some(note) = max_t_note(&ExperimentFile::raw_table(&file, &sets).map_err(TuneError::from)?, &experiment, &curves) {
                eprintln!("{note}");
            }
            let started = std::time::Instant::now();
            let mode = experiment.experiment.mode.unwrap_or(search::Mode::Min);
            let tuner = Tuner::from_file(experiment, origin, Some(crate::Trainable::simulated(curves.clone()))).progress(if plain {
                ProgressMode::Plain
            } else {
                ProgressMode::Quiet
            });
            // Summed up trial by trial: a million trials' results need not
            // fit in memory; with --keep, those let go of as they end.
            let dir = tuner.experiment_dir();
            let keep_n = keep.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let (store, summary) = crate::simulate::summary::run(tuner, &curves, mode, keep_n)?;
            print_simulated(&summary, &store, &dir, mode)?;
            if let Some(n) = keep {
                let finished = summary.counts.iter().filter(|(s, _)| s.is_finished()).map(|(_, n)| n).sum::<u64>();
                println!("The store keeps the best {} of the {finished} finished trials (--keep)", n.min(finished));
            }
            println!(
                "Simulated {} trials, {} iterations, in {:.2} s",
                summary.trials(),
                summary.iterations,
                started.elapsed().as_secs_f64()
            );
            let scored = &summary.outcome;
            if let Some(attr) = curves.cost_attr() {
                println!(
                    "Compute: {} {attr}; the chosen config's final {} is {}, the best tried {}",
                    crate::text::fmt_num(scored.spent),
                    curves.metric(),
                    crate::text::fmt_num(scored.chosen),
                    crate::text::fmt_num(scored.best)
                );
            }
            Ok(())
        }
        Command::Submit { file, nodes, gpus_per_node, partition, time, notice, sets, storage, dry_run, sbatch_args } => {
            let mut sets = sets;
            if let Some(s) = storage {
                sets.push(storage_set(&s)?);
            }
            let job = SubmitJob { file: &file, nodes, gpus_per_node, partition, time, notice, sets: &sets, sbatch_args: &sbatch_args };
            submit(&job, dry_run)
        }
        Command::Resume { dir, plain, dashboard, resume_errored, restart_errored, sets } => {
            // An experiment in an object store (`s3://bucket/prefix/<name>`): resumed from the bucket alone,
            // in the local directory its file names.
            let dir = match remote_experiment(&dir)? {
                Some(remote) => remote.into_local()?,
                None => dir,
            };
            if let Some(port) = dashboard {
                serve_beside(&dir, port)?;
            }
            let errored = match (resume_errored, restart_errored) {
                (true, _) => crate::Errored::Resume,
                (_, true) => crate::Errored::Restart,
                _ => crate::Errored::Keep,
            };
            let tuner = Tuner::restore_with(&dir, None, &sets)?.progress(progress(plain)).errored(errored);
            let grid = tuner.fit().map_err(|e| on_full_disk(e.into(), &dir))?;
            print_summary(&grid, &dir)
        }
        Command::Pull { url } => match remote_experiment(&url)? {
            Some(remote) => {
                let dir = remote.into_local()?;
                println!("{}", dir.display());
                Ok(())
            }
            None => Err(Failure { code: 2, message: format!("{}: give the experiment's URL (s3://bucket/prefix/<name>)", url.display()) }),
        },
        Command::Status { dir } => reading(&dir, status),
        Command::Dashboard { dirs, port, host, token } => dashboard(dirs, port, host, token),
        Command::Exploits { dir, json } => reading(&dir, |d| exploits(d, json)),
        Command::Best { dir, metric, mode, scope, json } => reading(&dir, |d| best(d, metric.as_deref(), mode, scope, json)),
        Command::Export { dir, format } => reading(&dir, |d| export(d, format)),
        Command::Fetch { uri, dest } => fetch(&uri, &dest),
        Command::PutShard { dir, store, iteration, rank } => put_shard(&dir, &store, iteration, rank),
        Command::GetShard { uri, dest, rank } => get_shard(&uri, &dest, rank),
        Command::RelayOutput => relay_output(),
        Command::GpuSample { gpus, shared, period_ms } => gpu_sample(&gpus, shared, period_ms),
        Command::Sample { file, n, sets } => sample(&file, n, &sets),
    }
}

/// An experiment whose result store is mirrored in an object store: its
/// URL (`s3://bucket/prefix/<name>`), and its store and file read back
/// into a directory of this machine.
struct RemoteExperiment {
    url: String,
    /// A private directory holding `store/` and `experiment.toml`, removed on drop.
    scratch: PathBuf,
    file: ExperimentFile,
}

impl Drop for RemoteExperiment {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// `dir` read back from its object store when it is a URL; `None` for a local directory.
fn remote_experiment(dir: &Path) -> Result<Option<RemoteExperiment>, Failure> {
    let url = dir.to_string_lossy().trim_end_matches('/').to_string();
    if !url.contains("://") || url.starts_with("file://") {
        return Ok(None);
    }
    let failed = |message: String| Failure { code: 2, message };
    let storage = trainer::Storage::parse(&url).map_err(|e| failed(e.to_string()))?;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let scratch = std::env::temp_dir().join(format!(
        "nestor-remote-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let runtime = trainer::driver_runtime().map_err(|e| failed(format!("{url}: {e}")))?;
    let text = runtime.block_on(async {
        let text = storage.get_bytes("experiment.toml").await.map_err(|e| failed(e.to_string()))?;
        let text = text.ok_or_else(|| failed(format!("no nestor experiment at {url} (no experiment.toml there)")))?;
        crate::store::Store::materialize(&storage.join("store"), &scratch.join("store")).await.map_err(|e| failed(e.to_string()))?;
        Ok::<_, Failure>(String::from_utf8_lossy(&text).into_owned())
    })?;
    std::fs::write(scratch.join("experiment.toml"), &text).map_err(|e| failed(format!("{}: {e}", scratch.display())))?;
    let file = ExperimentFile::from_toml(&text, &url, &[]).map_err(TuneError::from)?;
    Ok(Some(RemoteExperiment { url, scratch, file }))
}

impl RemoteExperiment {
    /// The experiment brought back from its object store (its files and
    /// its store) into its local directory (its file's `local_dir`, else
    /// `nestor-runs`, and its name): where a resume goes on.
    fn into_local(self) -> Result<PathBuf, Failure> {
        let dir = Path::new(&self.file.experiment.local_root()).join(&self.file.experiment.name);
        let failed = |message: String| Failure { code: 1, message };
        let storage = trainer::Storage::parse(&self.url).map_err(|e| failed(e.to_string()))?;
        let runtime = trainer::driver_runtime().map_err(|e| failed(format!("{}: {e}", self.url)))?;
        runtime.block_on(crate::remote::pull(&storage, &dir)).map_err(|e| failed(e.to_string()))?;
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        eprintln!("nestor: {} read back from {} into {}", self.file.experiment.name, self.url, dir.display());
        Ok(dir)
    }
}

/// Runs `read` on the experiment `dir`, or on the copy read back from its object store when it is a URL.
fn reading(dir: &Path, read: impl FnOnce(&Path) -> Result<(), Failure>) -> Result<(), Failure> {
    match remote_experiment(dir)? {
        Some(remote) => {
            SHOWN_AS.with(|s| *s.borrow_mut() = Some((remote.scratch.clone(), remote.url.clone())));
            let done = read(&remote.scratch);
            SHOWN_AS.with(|s| *s.borrow_mut() = None);
            done
        }
        None => read(dir),
    }
}

/// `nestor dashboard`: serves until Ctrl-C.
fn dashboard(dirs: Vec<PathBuf>, port: u16, host: std::net::IpAddr, token: Option<String>) -> Result<(), Failure> {
    crate::dashboard::check_dirs(&dirs).map_err(|message| Failure { code: 2, message })?;
    if token.as_deref().is_some_and(|t| t.len() < 16 || !t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c))) {
        return Err(Failure {
            code: 2,
            message: "--token: at least 16 characters, letters, digits and -_.~ only (leave it out for a random one)".into(),
        });
    }
    let token = token.unwrap_or_else(crate::dashboard::new_token);
    let options = crate::dashboard::DashboardOptions { addr: std::net::SocketAddr::new(host, port), token: token.clone() };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure { code: 1, message: format!("dashboard: {e}") })?;
    runtime
        .block_on(async {
            let served = crate::dashboard::serve(dirs, options, |addr| println!("nestor dashboard: {}", dashboard_url(addr, &token)));
            tokio::select! {
                r = served => r,
                _ = tokio::signal::ctrl_c() => Ok(()),
            }
        })
        .map_err(|e| Failure { code: 1, message: format!("dashboard on {host}:{port}: {e}") })
}

fn dashboard_url(addr: std::net::SocketAddr, token: &str) -> String {
    let host = if addr.ip().is_unspecified() { "localhost".to_string() } else { addr.ip().to_string() };
    format!("http://{host}:{}/?token={token}", addr.port())
}

/// The dashboard of the sweep about to run in `dir`, on loopback, served
/// from a thread of its own; its address is printed once it listens.
fn serve_beside(dir: &Path, port: u16) -> Result<(), Failure> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // Loopback is shared by every user of the machine: a token there too.
    let token = crate::dashboard::new_token();
    let shown = token.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("nestor-dashboard-server".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return drop(tx.send(Err(e.to_string()))),
            };
            let options = crate::dashboard::DashboardOptions { addr, token: token.clone() };
            let bound = tx.clone();
            let served = runtime.block_on(crate::dashboard::serve(vec![dir], options, move |a| drop(bound.send(Ok(a)))));
            if let Err(e) = served {
                let _ = tx.send(Err(e.to_string()));
            }
        })
        .map_err(out_err)?;
    match rx.recv() {
        Ok(Ok(a)) => {
            eprintln!("nestor: dashboard at {}", dashboard_url(a, &shown));
            Ok(())
        }
        Ok(Err(e)) => Err(Failure { code: 1, message: format!("--dashboard: cannot listen on {addr}: {e}") }),
        Err(_) => Err(Failure { code: 1, message: "--dashboard: the server did not start".into() }),
    }
}

fn progress(plain: bool) -> ProgressMode {
    if plain {
        ProgressMode::Plain
    } else {
        ProgressMode::Auto
    }
}

fn out_err(e: std::io::Error) -> Failure {
    Failure { code: 1, message: format!("cannot write output: {e}") }
}

/// Metrics as JSON; non-finite values as the strings "NaN", "Infinity", "-Infinity".
pub fn metrics_json(m: &Metrics) -> Value {
    search::metrics_serde::to_json(m)
}

/// `2`, or `2 gpu:0,1` when its ranks hold GPUs (`-` before its first start).
fn workers_summary(bundles: &[trainer::WorkerBundle]) -> String {
    if bundles.is_empty() {
        return "-".into();
    }
    let gpus: Vec<String> = bundles.iter().filter(|b| !b.gpus.is_empty()).map(|b| b.cuda_visible_devices()).collect();
    if gpus.is_empty() {
        bundles.len().to_string()
    } else {
        format!("{} gpu:{}", bundles.len(), gpus.join(","))
    }
}

/// A program that starts this binary and names itself in
/// `NESTOR_PARENT_PID` (the Python driver does) has it stop gracefully
/// (SIGTERM) when it dies: set here, not between its fork and exec, where
/// a multi-threaded Python may not run code. False when that parent is
/// gone already. Call it first, while this process has one thread.
fn dies_with_parent() -> bool {
    let Some(parent) = std::env::var("NESTOR_PARENT_PID").ok().and_then(|p| p.parse::<i32>().ok()) else { return true };
    // Not handed down: a program the workers start is not this one's parent's child.
    std::env::remove_var("NESTOR_PARENT_PID");
    // SAFETY: prctl and getppid only set and read this process's attributes.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        libc::getppid() == parent
    }
}

/// `node1 (ranks 0-1), node2 (rank 2)`: where a trial's ranks run (`None` on one machine).
fn nodes_summary(bundles: &[trainer::WorkerBundle]) -> Option<String> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (rank, b) in bundles.iter().enumerate().filter(|(_, b)| !b.node.is_empty()) {
        match groups.iter_mut().find(|(n, _)| *n == b.node) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((&b.node, vec![rank])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let ranks = |r: &[usize]| match r {
        [one] => format!("rank {one}"),
        [first, .., last] if last - first + 1 == r.len() => format!("ranks {first}-{last}"),
        _ => format!("ranks {}", r.iter().map(usize::to_string).collect::<Vec<_>>().join(",")),
    };
    Some(groups.iter().map(|(n, r)| format!("{n} ({})", ranks(r))).collect::<Vec<_>>().join(", "))
}

fn abs(p: &Path) -> String {
    // An experiment read back from its object store is shown by its URL.
    if let Some(url) = SHOWN_AS.with(|s| s.borrow().as_ref().filter(|(dir, _)| dir == p).map(|(_, url)| url.clone())) {
        return url;
    }
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()
}

thread_local! {
    /// The directory an experiment was read back into, and its URL.
    static SHOWN_AS: std::cell::RefCell<Option<(PathBuf, String)>> = const { std::cell::RefCell::new(None) };
}

/// A checkpoint's location as people use it: URLs as they are, paths absolute.
fn location(uri: &str) -> String {
    if uri.contains("://") {
        uri.to_string()
    } else {
        abs(Path::new(uri))
    }
}

fn print_summary(grid: &ResultGrid, dir: &Path) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    let counts: Vec<String> = grid.counts().iter().map(|(s, n)| format!("{n} {s}")).collect();
    writeln!(out, "Experiment {}: {} ({})", abs(dir), crate::text::trials(grid.len() as u64), counts.join(", ")).map_err(out_err)?;
    if grid.metric.is_some() {
        match grid.best_result(None, None, Scope::Last) {
            Ok(best) => {
                let metric = grid.metric.clone().unwrap_or_default();
                let value = best.metrics.as_ref().and_then(|m| m.get(&metric)).copied().unwrap_or(f64::NAN);
                let iter = best.history.last().map_or(0, |r| r.training_iteration);
                writeln!(out, "Best trial {}: {metric}={} at iteration {iter}", best.trial_id, fmt_num(value)).map_err(out_err)?;
                writeln!(out, "  config: {}", config_summary(&best.config)).map_err(out_err)?;
                let best_ck = best.best_checkpoint(&metric, grid.mode.unwrap_or_default()).map(|c| c.uri.as_str());
                let ck = best_ck.or(best.checkpoint()).map_or_else(|| "none".to_string(), location);
                writeln!(out, "  checkpoint: {ck}").map_err(out_err)?;
            }
            Err(e) => writeln!(out, "No best trial: {e}").map_err(out_err)?,
        }
    }
    for t in grid.errors() {
        writeln!(out, "  {} ERROR: {}", t.trial_id, headline(t.error.as_deref().unwrap_or(""))).map_err(out_err)?;
    }
    Ok(())
}

/// A note when the file leaves the scheduler's `max_t` at its default and
/// the curves go on past it in its `time_attr` (a cost such as
/// `samples_seen` runs to thousands, where the default is 100): every
/// trial would stop before its curve ends.
fn max_t_note(raw: &toml::Table, experiment: &ExperimentFile, curves: &crate::simulate::Curves) -> Option<String> {
    let given = raw.get("scheduler").and_then(toml::Value::as_table).is_some_and(|t| t.contains_key("max_t"));
    let settings = serde_json::to_value(&experiment.scheduler).ok()?;
    let max_t = settings["max_t"].as_f64().filter(|_| !given)?;
    let attr = settings["time_attr"].as_str().unwrap_or("training_iteration");
    let end = curves.end(attr)?;
    (end > max_t).then(|| {
        format!(
            "note: scheduler.max_t is not set, so it is {} {attr} (the default), while the curves end at {}; \
             set scheduler.max_t = {} to train the best configs to the end (--compare does)",
            fmt_num(max_t),
            fmt_num(end),
            fmt_num(end)
        )
    })
}

/// [`print_summary`]'s lines for a simulation, from its [`Summary`](crate::simulate::summary::Summary).
fn print_simulated(
    summary: &crate::simulate::summary::Summary,
    store: &crate::store::Store,
    dir: &Path,
    mode: Mode,
) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    let counts: Vec<String> = summary.counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    writeln!(out, "Experiment {}: {} ({})", abs(dir), crate::text::trials(summary.trials()), counts.join(", ")).map_err(out_err)?;
    match &summary.best {
        Some((best, value)) => {
            let metric = &summary.metric;
            let iter = best.last_result.as_ref().map_or(0, |r| r.training_iteration);
            writeln!(out, "Best trial {}: {metric}={} at iteration {iter}", best.id, fmt_num(*value)).map_err(out_err)?;
            writeln!(out, "  config: {}", config_summary(&best.config)).map_err(out_err)?;
            let best = crate::result_grid::TrialOutcome::from_record(
                dir,
                best.clone(),
                store.results(&best.id).map_err(QueryError::from)?,
                store.checkpoints(&best.id).map_err(QueryError::from)?,
            );
            let ck = best
                .best_checkpoint(metric, mode)
                .map(|c| c.uri.as_str())
                .or(best.checkpoint())
                .map_or_else(|| "none".to_string(), location);
            writeln!(out, "  checkpoint: {ck}").map_err(out_err)?;
        }
        None => writeln!(out, "No best trial: no trial reported a finite value").map_err(out_err)?,
    }
    for (_, id, error) in &summary.errors {
        writeln!(out, "  {id} ERROR: {}", headline(error)).map_err(out_err)?;
    }
    Ok(())
}

fn status(dir: &Path) -> Result<(), Failure> {
    let grid = match ResultGrid::load(dir) {
        Err(QueryError::Store(crate::store::StoreError::Locked(_))) => return live_status(dir),
        other => other?,
    };
    let mut out = std::io::stdout().lock();
    let counts: Vec<String> = grid.counts().iter().map(|(s, n)| format!("{n} {s}")).collect();
    writeln!(out, "Experiment {}: {} ({})", abs(dir), crate::text::trials(grid.len() as u64), counts.join(", ")).map_err(out_err)?;
    if grid.let_go > 0 {
        writeln!(out, "  and {} finished trials the simulation summed up and let go of (--keep)", grid.let_go).map_err(out_err)?;
    }
    let metric = grid.metric.clone();
    writeln!(
        out,
        "{:<12} {:<10} {:>5} {:>7} {:>8} {:>8} {:<10} {:<14} config",
        "trial",
        "status",
        "iter",
        "resumes",
        "restarts",
        "failures",
        "workers",
        metric.as_deref().unwrap_or("metrics")
    )
    .map_err(out_err)?;
    for t in grid.iter() {
        let iter = t.history.last().map_or(0, |r| r.training_iteration);
        let m = match (&metric, &t.metrics) {
            (Some(name), Some(ms)) => ms.get(name).map(|v| fmt_num(*v)).unwrap_or_default(),
            (None, Some(ms)) => {
                ms.iter().filter(|(k, _)| !is_auto(k)).map(|(k, v)| format!("{k}={}", fmt_num(*v))).collect::<Vec<_>>().join(" ")
            }
            _ => String::new(),
        };
        writeln!(
            out,
            "{:<12} {:<10} {:>5} {:>7} {:>8} {:>8} {:<10} {:<14} {}",
            t.trial_id,
            t.status.as_str(),
            iter,
            t.resumes,
            t.restarts,
            t.failures,
            workers_summary(&t.resources),
            m,
            config_summary(&t.config)
        )
        .map_err(out_err)?;
        if let Some(e) = &t.error {
            writeln!(out, "    error: {}", headline(e)).map_err(out_err)?;
        } else if let Some(f) = &t.last_failure {
            writeln!(out, "    last failure: {}", headline(f)).map_err(out_err)?;
        }
        if let Some(nodes) = nodes_summary(&t.resources) {
            writeln!(out, "    nodes: {nodes}").map_err(out_err)?;
        }
        if let Some(gpu) = t.metrics.as_ref().and_then(trainer::gpu_usage::summary) {
            writeln!(out, "    GPU: {gpu}").map_err(out_err)?;
        }
        if t.exploits > 0 {
            writeln!(out, "    exploits: {}", t.exploits).map_err(out_err)?;
        }
        if t.resizes > 0 {
            writeln!(out, "    workers changed {} time(s), now {}", t.resizes, t.resources.len()).map_err(out_err)?;
        }
    }
    if !grid.exploits.is_empty() {
        const SHOWN: usize = 10;
        let n = grid.exploits.len();
        let more = if n > SHOWN { format!(", the latest {SHOWN} shown (all: nestor exploits)") } else { String::new() };
        writeln!(out, "Exploits: {n}{more}").map_err(out_err)?;
        for e in &grid.exploits[n.saturating_sub(SHOWN)..] {
            writeln!(out, "  {}", exploit_line(e)).map_err(out_err)?;
        }
    }
    Ok(())
}

/// `trial_00003 at iter 8 <- trial_00001 checkpoint_000008: lr=0.012 (was 0.05)`.
fn exploit_line(e: &crate::store::ExploitRecord) -> String {
    format!(
        "{} at iter {} <- {} {}: {}",
        e.trial_id,
        e.iteration,
        e.donor,
        crate::text::checkpoint_name(&e.donor_checkpoint),
        crate::text::config_change(&e.old_config, &e.new_config)
    )
}

fn exploits(dir: &Path, json: bool) -> Result<(), Failure> {
    let grid = ResultGrid::load(dir)?;
    let mut out = std::io::stdout().lock();
    if json {
        for e in &grid.exploits {
            writeln!(out, "{}", serde_json::to_string(e).unwrap_or_default()).map_err(out_err)?;
        }
        return Ok(());
    }
    if grid.exploits.is_empty() {
        writeln!(out, "No exploits in {} (only a pbt scheduler makes them)", abs(dir)).map_err(out_err)?;
    }
    for e in &grid.exploits {
        writeln!(out, "{}", exploit_line(e)).map_err(out_err)?;
    }
    Ok(())
}

/// Status of a sweep that is running in another process, from the
/// `status.json` it writes every half second.
fn live_status(dir: &Path) -> Result<(), Failure> {
    let unwritten =
        || Failure { code: 1, message: format!("the sweep at {} is running but has written no status yet; try again", dir.display()) };
    let snap = Status::read(dir).map_err(|message| Failure { code: 1, message })?.ok_or_else(unwritten)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Experiment {} is running (pid {}): {} of {} trials so far ({} RUNNING, {} TERMINATED, {} ERROR, {} PAUSED, {} to run)",
        abs(dir),
        snap.pid,
        snap.trials,
        snap.planned,
        snap.running.len(),
        snap.terminated,
        snap.error,
        snap.paused,
        snap.pending,
    )
    .map_err(out_err)?;
    let mut timing = format!("  running for {}", crate::progress::duration(snap.elapsed_s));
    if let Some(eta) = snap.eta_s {
        timing.push_str(&format!(", about {} to go", crate::progress::duration(eta)));
    }
    if let (Some(b), Some(m)) = (&snap.best, &snap.metric) {
        timing.push_str(&format!("; best {m}={} ({} at iteration {})", fmt_num(b.value), b.trial_id, b.iteration));
    }
    writeln!(out, "{timing}").map_err(out_err)?;
    let metric = snap.metric.clone();
    writeln!(out, "{:<12} {:<10} {:>5} {:<14} config", "trial", "status", "iter", metric.as_deref().unwrap_or("")).map_err(out_err)?;
    for r in &snap.running {
        let m = metric.as_ref().and_then(|m| r.metrics.as_ref()?.get(m)?.as_f64()).map(fmt_num).unwrap_or_default();
        writeln!(out, "{:<12} {:<10} {:>5} {m:<14} {}", r.trial_id, "RUNNING", r.iteration, config_summary(&r.config)).map_err(out_err)?;
        if let Some(nodes) = nodes_summary(&r.resources) {
            writeln!(out, "    nodes: {nodes}").map_err(out_err)?;
        }
    }
    Ok(())
}

fn is_auto(k: &str) -> bool {
    matches!(k, "training_iteration" | "time_this_iter_s" | "time_total_s" | "timestamp") || trainer::gpu_usage::METRICS.contains(&k)
}

fn best(dir: &Path, metric: Option<&str>, mode: Option<Mode>, scope: Scope, as_json: bool) -> Result<(), Failure> {
    let grid = ResultGrid::load(dir)?;
    let best: &TrialOutcome = grid.best_result(metric, mode, scope)?;
    let metric = metric.map(String::from).or(grid.metric.clone()).unwrap_or_default();
    let metrics = best.metrics.as_ref().map(metrics_json).unwrap_or(Value::Null);
    let ranked = best.best_checkpoints(&metric, mode.or(grid.mode).unwrap_or_default());
    let checkpoint = ranked.first().map(|c| location(&c.uri));
    let mut out = std::io::stdout().lock();
    if as_json {
        let checkpoints: Vec<Value> = ranked
            .iter()
            .map(|c| json!({ "uri": location(&c.uri), "training_iteration": c.iteration, "metrics": metrics_json(&c.metrics) }))
            .collect();
        let v = json!({
            "trial_id": best.trial_id,
            "config": best.config,
            "metrics": metrics,
            "checkpoint": checkpoint,
            "checkpoints": checkpoints,
        });
        writeln!(out, "{v}").map_err(out_err)?;
    } else {
        let mode = mode.or(grid.mode).unwrap_or_default();
        let value = best.value(&metric, mode, scope).unwrap_or(f64::NAN);
        writeln!(out, "Best trial {}: {metric}={}", best.trial_id, fmt_num(value)).map_err(out_err)?;
        writeln!(out, "  config: {}", config_summary(&best.config)).map_err(out_err)?;
        writeln!(out, "  checkpoint: {}", checkpoint.unwrap_or_else(|| "none".into())).map_err(out_err)?;
    }
    Ok(())
}

fn flatten(prefix: &str, v: &Value, out: &mut Map<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                flatten(&format!("{prefix}{k}."), v, out);
            }
        }
        other => {
            out.insert(prefix.trim_end_matches('.').to_string(), other.clone());
        }
    }
}

fn csv_cell(v: &Value) -> String {
    match v {
        Value::String(s) => csv_field(s),
        Value::Null => String::new(),
        other => csv_field(&other.to_string()),
    }
}

fn export(dir: &Path, format: Format) -> Result<(), Failure> {
    let grid = ResultGrid::load(dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match format {
        Format::Json => {
            for t in grid.iter() {
                for r in &t.history {
                    let mut row = Map::new();
                    row.insert("trial_id".into(), json!(t.trial_id));
                    if let Value::Object(m) = metrics_json(&r.metrics) {
                        row.extend(m);
                    }
                    if let Some(Value::Object(e)) = &r.extra {
                        row.extend(e.clone());
                    }
                    row.insert("training_iteration".into(), json!(r.training_iteration));
                    row.insert("config".into(), t.config.clone());
                    writeln!(out, "{}", Value::Object(row)).map_err(out_err)?;
                }
            }
        }
        Format::Trials => {
            for t in grid.iter() {
                writeln!(out, "{}", trial_json(t)).map_err(out_err)?;
            }
        }
        Format::Csv => {
            let mut metric_cols = BTreeSet::new();
            let mut config_cols = BTreeSet::new();
            for t in grid.iter() {
                let mut flat = Map::new();
                flatten("", &t.config, &mut flat);
                config_cols.extend(flat.keys().cloned());
                for r in &t.history {
                    metric_cols.extend(r.metrics.keys().filter(|k| *k != "training_iteration").cloned());
                }
            }
            let mut header = vec!["trial_id".to_string(), "training_iteration".to_string()];
            header.extend(metric_cols.iter().cloned());
            header.extend(config_cols.iter().map(|c| format!("config/{c}")));
            writeln!(out, "{}", header.iter().map(|h| csv_field(h)).collect::<Vec<_>>().join(",")).map_err(out_err)?;
            for t in grid.iter() {
                let mut flat = Map::new();
                flatten("", &t.config, &mut flat);
                for r in &t.history {
                    let mut row = vec![csv_field(&t.trial_id), r.training_iteration.to_string()];
                    row.extend(metric_cols.iter().map(|c| r.metrics.get(c).map(|v| v.to_string()).unwrap_or_default()));
                    row.extend(config_cols.iter().map(|c| flat.get(c).map(csv_cell).unwrap_or_default()));
                    writeln!(out, "{}", row.join(",")).map_err(out_err)?;
                }
            }
        }
    }
    out.flush().map_err(out_err)
}

/// One trial as JSON: everything a `Result` holds.
fn trial_json(t: &TrialOutcome) -> Value {
    let history: Vec<Value> = t
        .history
        .iter()
        .map(|r| {
            let mut m = match metrics_json(&r.metrics) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            if let Some(Value::Object(e)) = &r.extra {
                m.extend(e.clone());
            }
            m.insert("training_iteration".into(), json!(r.training_iteration));
            Value::Object(m)
        })
        .collect();
    let checkpoints: Vec<Value> = t
        .checkpoints
        .iter()
        .map(|c| json!({ "uri": location(&c.uri), "training_iteration": c.iteration, "metrics": metrics_json(&c.metrics), "ranks": c.ranks }))
        .collect();
    let nodes: BTreeSet<&str> = t.resources.iter().map(|b| b.node.as_str()).filter(|n| !n.is_empty()).collect();
    json!({
        "trial_id": t.trial_id,
        "status": t.status.as_str(),
        "config": t.config,
        "error": t.error,
        "last_failure": t.last_failure,
        "restarts": t.restarts,
        "failures": t.failures,
        "infrastructure_failures": t.infrastructure_failures,
        "resumes": t.resumes,
        "exploits": t.exploits,
        "metrics": history.last().cloned(),
        "history": history,
        "checkpoints": checkpoints,
        "path": abs(&t.path),
        "nodes": nodes,
    })
}

fn fetch(uri: &str, dest: &Path) -> Result<(), Failure> {
    let fail = |code: u8, message: String| Failure { code, message };
    if dest.exists() && std::fs::read_dir(dest).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(fail(2, format!("{}: not an empty directory", dest.display())));
    }
    let root = match uri.split_once("://") {
        Some((scheme, rest)) if scheme != "file" => format!("{scheme}://{}", rest.split('/').next().unwrap_or("")),
        _ => String::new(),
    };
    if root.is_empty() {
        let src = Path::new(uri.strip_prefix("file://").unwrap_or(uri));
        if !src.is_dir() {
            return Err(fail(2, format!("{uri}: no such checkpoint directory")));
        }
        return copy_tree(src, dest).map_err(|e| fail(1, format!("cannot copy {uri} to {}: {e}", dest.display())));
    }
    let storage = trainer::Storage::parse(&root).map_err(|e| fail(2, e.to_string()))?;
    let scratch = dest.join(".nestor-fetch");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(1, e.to_string()))?;
    let got = rt.block_on(storage.fetch_checkpoint(uri, &scratch)).map_err(|e| fail(1, e.to_string()))?;
    let moved = (|| -> std::io::Result<()> {
        for entry in std::fs::read_dir(&got)? {
            let entry = entry?;
            std::fs::rename(entry.path(), dest.join(entry.file_name()))?;
        }
        std::fs::remove_dir_all(&scratch)
    })();
    moved.map_err(|e| fail(1, format!("cannot fill {}: {e}", dest.display())))
}

fn put_shard(dir: &Path, store: &str, iteration: u64, rank: u32) -> Result<(), Failure> {
    let fail = |code: u8, message: String| Failure { code, message };
    if !dir.is_dir() {
        return Err(fail(2, format!("{}: not a directory", dir.display())));
    }
    let storage = trainer::Storage::parse(store).map_err(|e| fail(2, e.to_string()))?;
    if storage.is_local() {
        return Err(fail(2, format!("{store}: not an object store URL")));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(1, e.to_string()))?;
    let uri = rt.block_on(storage.upload_shard(dir, iteration, rank)).map_err(|e| fail(1, e.to_string()))?;
    writeln!(std::io::stdout(), "{uri}").map_err(out_err)
}

fn get_shard(uri: &str, dest: &Path, rank: u32) -> Result<(), Failure> {
    let fail = |code: u8, message: String| Failure { code, message };
    let location = uri.trim_end_matches('/').rsplit_once('/').map_or(uri, |(parent, _)| parent);
    let storage = trainer::Storage::parse(location).map_err(|e| fail(2, e.to_string()))?;
    if storage.is_local() {
        return Err(fail(2, format!("{uri}: not an object store URL")));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(1, e.to_string()))?;
    let fetched = rt.block_on(storage.fetch_shard(uri.trim_end_matches('/'), rank, dest)).map_err(|e| fail(1, e.to_string()))?;
    writeln!(std::io::stdout(), "{}", if fetched { "fetched" } else { "none" }).map_err(out_err)
}

fn relay_output() -> Result<(), Failure> {
    let fail = |code: u8, message: String| Failure { code, message };
    let target = trainer::RelayTarget::from_env().map_err(|e| fail(2, e))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(1, e.to_string()))?;
    rt.block_on(trainer::relay_output(target, tokio::io::stdin())).map(|_| ()).map_err(|e| fail(1, e))
}

fn gpu_sample(gpus: &str, shared: bool, period_ms: u64) -> Result<(), Failure> {
    let fail = |code: u8, message: String| Failure { code, message };
    let gpus = trainer::gpu_sampler::parse_gpus(gpus).map_err(|e| fail(2, e))?;
    if period_ms == 0 {
        return Err(fail(2, "--period-ms 0: give a period of at least 1 ms".into()));
    }
    // NESTOR_GPU_PERIOD_MS (the driver's environment, which the ranks inherit) sets the period on every node.
    let period_ms =
        std::env::var("NESTOR_GPU_PERIOD_MS").ok().and_then(|v| v.parse::<u64>().ok()).filter(|&ms| ms > 0).unwrap_or(period_ms);
    let args = trainer::gpu_sampler::SamplerArgs { gpus, shared, period: std::time::Duration::from_millis(period_ms) };
    trainer::gpu_sampler::run(&args).map_err(|e| fail(1, e))
}

fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dest)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let to = dest.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to)?;
        } else {
            std::fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

/// What `nestor submit` was asked for.
struct SubmitJob<'a> {
    file: &'a Path,
    nodes: Option<u32>,
    gpus_per_node: Option<u32>,
    partition: Option<String>,
    time: Option<String>,
    notice: u32,
    sets: &'a [String],
    sbatch_args: &'a [String],
}

/// Checks the experiment of `job`, then writes its batch script next to
/// the experiment and submits it with sbatch (prints it, with `dry_run`).
fn submit(job: &SubmitJob<'_>, dry_run: bool) -> Result<(), Failure> {
    let fail = |message: String| Failure { code: 2, message };
    // Checked now, so a bad file fails here and not in the queue.
    let experiment = ExperimentFile::read(job.file, job.sets).map_err(TuneError::from)?;
    experiment.clone().resolve(&job.file.display().to_string()).map_err(TuneError::from)?;
    let shape = if experiment.cluster.backend == trainer::ClusterBackend::SlurmJobs {
        if job.nodes.is_some() || job.gpus_per_node.is_some() {
            return Err(fail(
                "--nodes/--gpus-per-node: with [cluster] backend = \"slurm_jobs\" the trials are Slurm jobs of their own, \
                 each asking for its own resources; the submitted job holds the driver alone"
                    .into(),
            ));
        }
        trainer::SubmitShape::Driver { cpus: 1 }
    } else {
        match job.nodes {
            Some(0) => return Err(fail("--nodes must be at least 1".into())),
            Some(nodes) => trainer::SubmitShape::Nodes { nodes, gpus_per_node: job.gpus_per_node },
            None => return Err(fail("--nodes is required: the sweep's trials run on the job's nodes".into())),
        }
    };
    let abs = |p: &Path| std::path::absolute(p).map_err(|e| fail(format!("{}: {e}", p.display())));
    let root = abs(Path::new(&experiment.experiment.local_root()))?;
    let name = experiment.experiment.name.clone();
    let batch = trainer::BatchJob {
        exp_dir: root.join(&name),
        url: experiment.experiment.storage_url().map(|u| format!("{}/{name}", u.trim_end_matches('/'))),
        name,
        file: abs(job.file)?,
        sets: job.sets.to_vec(),
        shape,
        notice_s: job.notice,
        partition: job.partition.clone(),
        time: job.time.clone(),
        sbatch_args: job.sbatch_args.to_vec(),
        output_dir: root,
        cwd: std::env::current_dir().map_err(|e| fail(format!("the working directory: {e}")))?,
        nestor: std::env::current_exe().map_err(|e| fail(format!("cannot find the nestor binary: {e}")))?,
    };
    batch.check().map_err(|e| fail(e.0))?;
    if dry_run {
        print!("{}", batch.script());
        return Ok(());
    }
    let (id, path) = batch.submit().map_err(|e| fail(e.0))?;
    println!("Submitted job {id}: {} ({})", batch.exp_dir.display(), path.display());
    println!("  nestor status {}", batch.url.as_deref().map_or_else(|| batch.exp_dir.display().to_string(), str::to_string));
    Ok(())
}

fn sample(file: &Path, n: u64, sets: &[String]) -> Result<(), Failure> {
    let resolved = ExperimentFile::load(file, sets).map_err(TuneError::from)?;
    let seed = match resolved.file.experiment.seed {
        Some(s) => s,
        None => {
            eprintln!("note: the file sets no experiment.seed; showing seed 0 (a run picks and records a random seed)");
            0
        }
    };
    let mut g = BasicVariantGenerator::new(resolved.space, resolved.file.experiment.num_samples, seed)
        .with_points(resolved.points)
        .map_err(TuneError::from)?;
    let mut out = std::io::stdout().lock();
    for i in 0..n {
        match g.suggest(&crate::runner::trial_id(i)) {
            Suggestion::Config(c) => writeln!(out, "{c}").map_err(out_err)?,
            _ => break,
        }
    }
    Ok(())
}
