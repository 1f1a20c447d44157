//! A worker process for nestor's integration tests, driven by its config:
//!
//! - `x` (float): the loss is `(x - 0.3)^2 + 1 / iteration`, deterministic;
//! - `steps` (int, default 5): iterations to run;
//! - `sleep_ms` (int, default 0): time per iteration;
//! - `resumed_sleep_ms` (int): time per iteration in a run that resumed from a checkpoint;
//! - `checkpoint` (bool): save `{"step": n, "acc": a}` with every report and resume
//!   from it (`acc`, reported too, sums the losses so far: state that only a
//!   correct restore carries on);
//! - `no_checkpoint_trial` (string): the trial of this id saves no checkpoint;
//! - `rank0_checkpoint` (bool): only rank 0 saves a shard (every rank restores it);
//! - `report_world_size` (bool): report `world_size` (from the context) with every result;
//! - `ckpt_mb` (int): add a `blob.bin` of this many MiB to every checkpoint, and log
//!   `rank r: checkpointing step n` before reporting it;
//! - `hang_at` (int): rank `fail_rank` stops reporting at this iteration, in a run that
//!   did not start from a checkpoint;
//! - `fail_at` (int): exit with code 3 at this iteration, after printing to stderr
//!   (rank `fail_rank` only, default 0);
//! - `hog_mb` (int): at `fail_at`, rank `fail_rank` fills this many MiB of memory
//!   and waits instead of exiting (for the out-of-memory killer);
//! - `link_in_checkpoint` (string): put a symbolic link named `stolen` to this
//!   path in every checkpoint it reports (the driver must refuse it);
//! - `nan_at` (int): report NaN at this iteration;
//! - `omit_metric` (bool): report `other` instead of `loss`;
//! - `ignore_sigterm` (bool): ignore SIGTERM;
//! - `leak_child` (bool): start a `sleep 300` that outlives this process;
//! - `quiet` (bool): no log line per step (for benchmarks);
//! - `on_notice` (bool): save a checkpoint only with the first report after the
//!   cluster's notice that it will end the run (`Context::preemption_notice`),
//!   logging `rank r: preemption notice at step n`;
//! - `dump_env` (bool): write `rank-<r>.json` in the trial directory with this
//!   rank's torchrun and nestor variables, its pid, its leaked child's pid, its
//!   checkpoint and when it started.
//!
//! - `gpu_reads` (string): a directory where this rank writes itself as a
//!   compute process on its first GPU (`<trial>-<rank>.json`: `index`,
//!   `pid`, `memory_bytes` (rank + 1) GiB, `sm_percent` 20 + 40 x rank),
//!   for a node's GPU sampler told to read there (`NESTOR_GPU_READS`);
//!
//! - `dataset` (string): read that data set of `[datasets]` instead, one epoch a
//!   step (`steps` epochs, batches of `batch_size`, default 8), printing
//!   `RANK {"rank", "epoch", "ids", "count"}` with the `id` column's values in
//!   reading order (after a first `RANK {"rank", "pid", "start", "plan_seen"}`); with `checkpoint`, a checkpoint each epoch to resume from,
//!   and `fail_at` fails only a run that did not start from one.
//!
//! Ranks other than 0 report `loss + 100 * rank`, so a test can tell whose
//! metrics became the trial's.

use std::path::PathBuf;
use std::time::Duration;

use trainer::{Context, ReportError};

fn main() -> anyhow::Result<()> {
    let mut ctx = Context::from_env()?;
    if let Ok(name) = ctx.param::<String>("dataset") {
        return read_dataset(ctx, &name);
    }
    let x: f64 = ctx.param("x").unwrap_or(0.0);
    let steps: u64 = ctx.param("steps").unwrap_or(5);
    let sleep_ms: u64 = ctx.param("sleep_ms").unwrap_or(0);
    let no_checkpoint_trial: Option<String> = ctx.param("no_checkpoint_trial").ok();
    let rank0_only: bool = ctx.param("rank0_checkpoint").unwrap_or(false);
    let checkpoint: bool = ctx.param("checkpoint").unwrap_or(false)
        && no_checkpoint_trial.as_deref() != Some(ctx.trial_id())
        && (!rank0_only || ctx.world_rank() == 0);
    let report_world_size: bool = ctx.param("report_world_size").unwrap_or(false);
    let extra_metrics: std::collections::BTreeMap<String, f64> = ctx.param("extra_metrics").unwrap_or_default();
    let fail_at: Option<u64> = ctx.param("fail_at").ok();
    let nan_at: Option<u64> = ctx.param("nan_at").ok();
    let omit: bool = ctx.param("omit_metric").unwrap_or(false);
    let quiet: bool = ctx.param("quiet").unwrap_or(false);
    let rank = ctx.world_rank();
    let fail_rank: u32 = ctx.param("fail_rank").unwrap_or(0);
    let fail_at = fail_at.filter(|_| rank == fail_rank);
    let hang_at: Option<u64> = ctx.param("hang_at").ok().filter(|_| rank == fail_rank && ctx.checkpoint().is_none());
    let ckpt_mb: usize = ctx.param("ckpt_mb").unwrap_or(0);
    let started_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    if ctx.param::<bool>("ignore_sigterm").unwrap_or(false) {
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    let mut leaked = None;
    if ctx.param::<bool>("leak_child").unwrap_or(false) {
        // Deliberately never waited for: nestor must clean it up.
        let child = std::process::Command::new("sleep").arg("300").spawn()?;
        leaked = Some(child.id());
        std::mem::forget(child);
    }
    if ctx.param::<bool>("dump_env").unwrap_or(false) {
        let var = |k: &str| std::env::var(k).ok();
        // What the run's plan says, by the names of the variables it replaced.
        let plan: serde_json::Value = var("NESTOR_RUN").and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default();
        let meet = &plan["routes"]["meet"];
        let dump = serde_json::json!({
            "RANK": var("RANK"), "WORLD_SIZE": var("WORLD_SIZE"), "LOCAL_RANK": var("LOCAL_RANK"),
            "LOCAL_WORLD_SIZE": var("LOCAL_WORLD_SIZE"), "NODE_RANK": var("NODE_RANK"),
            "MASTER_ADDR": var("MASTER_ADDR"), "MASTER_PORT": var("MASTER_PORT"),
            "CUDA_VISIBLE_DEVICES": var("CUDA_VISIBLE_DEVICES"), "OMP_NUM_THREADS": var("OMP_NUM_THREADS"),
            "NESTOR_TORCH_BACKEND": plan["world"]["torch_backend"], "NESTOR_RENDEZVOUS_FILE": meet["path"], "NESTOR_TRIAL_ID": plan["trial"]["id"],
            "NESTOR_ADDR": plan["channel"]["addr"], "SLURMD_NODENAME": var("SLURMD_NODENAME"), "SLURM_JOB_ID": var("SLURM_JOB_ID"),
            "pid": std::process::id(), "child": leaked, "local_rank": ctx.local_rank(), "world_size": ctx.world_size(),
            "NESTOR_CHECKPOINT": ctx.checkpoint().map(|c| c.display().to_string()), "plan": plan, "started_at": started_at,
        });
        let path = ctx.trial_dir().join(format!("rank-{rank}.json"));
        std::fs::write(&path, dump.to_string())?;
    }
    if let Ok(dir) = ctx.param::<String>("gpu_reads") {
        let cvd = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
        let index: u32 = cvd.split(',').next().and_then(|i| i.parse().ok()).unwrap_or_else(|| panic!("rank {rank}: no GPU ({cvd:?})"));
        let me = serde_json::json!({
            "index": index, "pid": std::process::id(),
            "memory_bytes": (u64::from(rank) + 1) << 30, "sm_percent": 20.0 + 40.0 * f64::from(rank),
        });
        std::fs::write(PathBuf::from(dir).join(format!("{}-{rank}.json", ctx.trial_id())), me.to_string())?;
    }
    let mut start = 0u64;
    let mut acc = 0.0f64;
    if let Some(dir) = ctx.checkpoint() {
        let state: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("state.json"))?)?;
        start = state["step"].as_u64().unwrap_or(0);
        acc = state["acc"].as_f64().unwrap_or(0.0);
        if ckpt_mb > 0 {
            let blob = std::fs::metadata(dir.join("blob.bin"))?.len();
            anyhow::ensure!(blob == (ckpt_mb as u64) << 20, "checkpoint blob has {blob} bytes");
        }
        eprintln!("resumed from {} at step {start}", dir.display());
    }
    let sleep_ms: u64 = if ctx.checkpoint().is_some() { ctx.param("resumed_sleep_ms").unwrap_or(sleep_ms) } else { sleep_ms };
    // Below the trial directory, so a worker killed mid-run leaves nothing
    // behind once its experiment is removed.
    let scratch = ctx.trial_dir().join(format!(".scratch-rank-{rank}-{}", std::process::id()));
    let offset = 100.0 * f64::from(rank);
    let mut acked = start;
    let on_notice: bool = ctx.param("on_notice").unwrap_or(false);
    let mut noticed = false;
    for step in start + 1..=steps {
        std::thread::sleep(Duration::from_millis(sleep_ms));
        if fail_at == Some(step) {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            if let Ok(mb) = ctx.param::<usize>("hog_mb") {
                eprintln!("fixture: filling {mb} MiB at step {step}");
                // Touched page by page, so the memory is really in use.
                let hog: Vec<u8> = vec![1u8; mb << 20];
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                    std::hint::black_box(&hog);
                }
            }
            eprintln!("fixture: failing on purpose at step {step} (t={t:.6})");
            std::process::exit(3);
        }
        if hang_at == Some(step) {
            eprintln!("fixture: hanging on purpose at step {step}");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        let loss = if nan_at == Some(step) { f64::NAN } else { (x - 0.3).powi(2) + 1.0 / step as f64 + offset };
        acc += loss;
        let name = if omit { "other" } else { "loss" };
        let notice = on_notice && !noticed && ctx.preemption_notice().is_some();
        if notice {
            noticed = true;
            eprintln!("rank {rank}: preemption notice at step {step}");
        }
        let ckpt: Option<PathBuf> = if checkpoint || notice {
            std::fs::create_dir_all(&scratch)?;
            std::fs::write(scratch.join("state.json"), serde_json::json!({ "step": step, "acc": acc }).to_string())?;
            if let Ok(target) = ctx.param::<String>("link_in_checkpoint") {
                let link = scratch.join("stolen");
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(target, link)?;
            }
            if ckpt_mb > 0 {
                std::fs::write(scratch.join("blob.bin"), vec![step as u8; ckpt_mb << 20])?;
                eprintln!("rank {rank}: checkpointing step {step}");
            }
            Some(scratch.clone())
        } else {
            None
        };
        let mut metrics: Vec<(String, f64)> = vec![(name.into(), loss), ("step".into(), step as f64), ("acc".into(), acc)];
        if report_world_size {
            metrics.push(("world_size".into(), f64::from(ctx.world_size())));
        }
        // `extra_metrics = { name = value, ... }`: reported beside the others at every step.
        metrics.extend(extra_metrics.iter().map(|(k, v)| (k.clone(), *v)));
        let reported = ctx.report(metrics, ckpt.as_deref());
        if !quiet {
            // Acknowledgements trail the decisions by a group commit.
            for s in acked + 1..=ctx.acknowledged_iteration() {
                eprintln!("rank {rank}: acked step {s}");
            }
            acked = acked.max(ctx.acknowledged_iteration());
        }
        match reported {
            Ok(()) => {}
            Err(ReportError::Stopped) => break,
            Err(e) => return Err(e.into()),
        }
    }
    if !quiet {
        for s in acked + 1..=ctx.sync()? {
            eprintln!("rank {rank}: acked step {s}");
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// The `dataset` mode: one epoch of the data set a step.
fn read_dataset(mut ctx: Context, name: &str) -> anyhow::Result<()> {
    use data::arrow_array::{cast::AsArray, types::Int64Type};
    use data::DatasetShards as _;
    let steps: u64 = ctx.param("steps").unwrap_or(3);
    let batch_size: usize = ctx.param("batch_size").unwrap_or(8);
    let checkpoint: bool = ctx.param("checkpoint").unwrap_or(false);
    let sleep_ms: u64 = ctx.param("sleep_ms").unwrap_or(0);
    let rank = ctx.world_rank();
    let fail_at: Option<u64> =
        ctx.param("fail_at").ok().filter(|_| rank == ctx.param("fail_rank").unwrap_or(0) && ctx.checkpoint().is_none());
    let start = ctx.start_iteration();
    let mut shard = ctx.dataset_shard(name)?;
    // Whether this rank's node sees the plan's file (else it was fetched from the driver).
    let plan: serde_json::Value = std::env::var("NESTOR_RUN").ok().and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default();
    let plan_seen = plan["datasets"].as_str().is_some_and(|p| std::path::Path::new(p).exists());
    println!("RANK {}", serde_json::json!({ "rank": rank, "pid": std::process::id(), "start": start, "plan_seen": plan_seen }));
    let scratch = ctx.trial_dir().join(format!(".scratch-rank-{rank}-{}", std::process::id()));
    for epoch in start..steps {
        let mut ids = Vec::new();
        for batch in shard.iter_batches(batch_size) {
            let batch = batch?;
            anyhow::ensure!(batch.num_rows() <= batch_size, "a batch of {} rows", batch.num_rows());
            let column = batch.column_by_name("id").ok_or_else(|| anyhow::anyhow!("no id column"))?;
            let column = column.as_primitive_opt::<Int64Type>().ok_or_else(|| anyhow::anyhow!("id is {}", column.data_type()))?;
            ids.extend(column.values().iter().copied());
            std::thread::sleep(Duration::from_millis(sleep_ms));
        }
        println!("RANK {}", serde_json::json!({ "rank": rank, "epoch": epoch, "ids": ids, "count": shard.count() }));
        if fail_at == Some(epoch + 1) {
            eprintln!("fixture: failing on purpose in epoch {epoch}");
            std::process::exit(3);
        }
        let ckpt = if checkpoint {
            std::fs::create_dir_all(&scratch)?;
            std::fs::write(scratch.join("epoch"), (epoch + 1).to_string())?;
            Some(scratch.clone())
        } else {
            None
        };
        match ctx.report([("epoch", (epoch + 1) as f64), ("rows", ids.len() as f64)], ckpt.as_deref()) {
            Ok(()) => {}
            Err(ReportError::Stopped) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
