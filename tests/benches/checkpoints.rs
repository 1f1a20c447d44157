//! Checkpoints and failover, measured:
//!
//! 1. upload: 4 ranks each persisting a 256 MiB shard at once, through
//!    nestor's storage layer, to local storage (copied, fsynced, renamed) and
//!    to an S3-compatible server on loopback (s3s-fs, multipart, parallel);
//!    against a plain `cp -r` of the same bytes (and `cp` + `sync`);
//! 2. ranks: a real sweep (the `nestor` binary, 4 fixture ranks) whose
//!    ranks each checkpoint `--mib` MiB to the S3 server at each of 2
//!    steps: the ranks uploading their shards themselves, against every
//!    byte through the driver (`NESTOR_RANKS_UPLOAD=0`);
//! 3. restore: a 2-rank trial resumed from a checkpoint of `--mib` MiB a
//!    rank in the S3 server, from its launch to its first result: each rank
//!    downloading its own shard from the bucket (the plan's `store` route),
//!    against the driver downloading the checkpoint first and the ranks
//!    reading its copy (`local`), interleaved;
//! 4. failover: a rank of a running N-rank trial killed with SIGKILL, to
//!    every rank of the restarted group running again (each rank writes its
//!    start time as soon as it runs), through the real `nestor` binary.
//!
//! ```text
//! cargo bench -p nestor-tests --bench checkpoints [-- --reps R --mib M --only upload|ranks|restore|failover]
//! ```

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trainer::Storage;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn num(name: &str, default: u64) -> u64 {
    arg(name).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

const RANKS: usize = 4;

/// Four shard directories of `mib` MiB each (incompressible bytes).
fn make_shards(root: &Path, mib: usize) -> std::io::Result<Vec<PathBuf>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..RANKS)
        .map(|r| {
            let dir = root.join(format!("shard-{r}"));
            std::fs::create_dir_all(&dir)?;
            let mut bytes = vec![0u8; mib << 20];
            for chunk in bytes.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
            }
            std::fs::write(dir.join("model.bin"), &bytes)?;
            Ok(dir)
        })
        .collect()
}

async fn upload_all(storage: &Storage, shards: &[PathBuf], iteration: u64) -> Result<(), trainer::CheckpointError> {
    let uploads = shards.iter().enumerate().map(|(r, s)| storage.upload_shard(s, iteration, r as u32));
    for r in futures_util::future::join_all(uploads).await {
        r?;
    }
    Ok(())
}

struct S3 {
    child: std::process::Child,
    port: u16,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's credentials and endpoint for the S3 server `s3`.
fn use_s3(s3: &S3) {
    // SAFETY: set before any thread of this process reads the environment for S3.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "nestor");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "nestor-secret");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", s3.port));
        std::env::set_var("AWS_ALLOW_HTTP", "true");
    }
}

fn start_s3(root: &Path) -> std::io::Result<S3> {
    std::fs::create_dir_all(root.join("bucket"))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_s3-server")).arg(root).stdout(Stdio::piped()).spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out).read_line(&mut line)?;
    }
    let port = line.trim().strip_prefix("listening on ").and_then(|p| p.parse().ok()).unwrap_or(0);
    Ok(S3 { child, port })
}

async fn upload(reps: u64, mib: usize) -> Result<(), Box<dyn std::error::Error>> {
    let work = tempfile::tempdir_in(std::env::var("NESTOR_BENCH_DIR").unwrap_or_else(|_| ".".into()))?;
    let shards = make_shards(&work.path().join("src"), mib)?;
    let total_mib = (RANKS * mib) as f64;
    let report = |name: &str, times: &mut Vec<f64>| {
        let t = median(times);
        println!("  {name:<34} {:>7.0} ms  {:>6.0} MiB/s   (median of {})", t * 1e3, total_mib / t, times.len());
    };
    println!("upload: {RANKS} ranks x {mib} MiB = {total_mib:.0} MiB, all ranks at once");

    let (mut cp, mut cp_sync) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let dst = work.path().join(format!("cp-{rep}"));
        std::fs::create_dir_all(&dst)?;
        let t0 = Instant::now();
        let status = Command::new("cp").arg("-r").args(&shards).arg(&dst).status()?;
        cp.push(t0.elapsed().as_secs_f64());
        Command::new("sync").status()?;
        cp_sync.push(t0.elapsed().as_secs_f64());
        assert!(status.success(), "cp failed");
        std::fs::remove_dir_all(&dst)?;
    }
    report("cp -r", &mut cp);
    report("cp -r, then sync", &mut cp_sync);

    let mut local = Vec::new();
    for rep in 0..reps {
        let storage = Storage::local(work.path().join(format!("local-{rep}")));
        let t0 = Instant::now();
        upload_all(&storage, &shards, 1).await?;
        local.push(t0.elapsed().as_secs_f64());
        std::fs::remove_dir_all(work.path().join(format!("local-{rep}")))?;
    }
    report("nestor, local (fsynced)", &mut local);

    let s3 = start_s3(&work.path().join("s3"))?;
    use_s3(&s3);
    let mut remote = Vec::new();
    for rep in 0..reps {
        let storage = Storage::parse("s3://bucket/bench")?.join(&format!("rep-{rep}"));
        let t0 = Instant::now();
        upload_all(&storage, &shards, 1).await?;
        remote.push(t0.elapsed().as_secs_f64());
        storage.delete_checkpoint(&storage.uri("checkpoint_000001")).await?;
    }
    report("nestor, S3 on loopback (s3s-fs)", &mut remote);
    Ok(())
}

fn nestor_bin() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fixture-worker")).with_file_name("nestor")
}

fn rank_started(trial: &Path, rank: usize) -> Option<(f64, u32)> {
    let text = std::fs::read_to_string(trial.join(format!("rank-{rank}.json"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some((v["started_at"].as_f64()?, v["pid"].as_u64()? as u32))
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// Kills rank 1 of a running `n`-rank trial `reps` times; the seconds from
/// each kill to every rank of the new group running.
fn failover(n: usize, reps: u64) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let sweep = format!(
        "[experiment]\nname = \"failover\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\nx = 0.5\nsteps = 1000000\nsleep_ms = 20\n\
         checkpoint = true\ndump_env = true\nquiet = true\n\n[trainer]\ncommand = [\"{}\"]\nnum_workers = {n}\n\n[failure]\nmax_failures = {}\n",
        env!("CARGO_BIN_EXE_fixture-worker"),
        reps + 1
    );
    std::fs::write(dir.path().join("sweep.toml"), sweep)?;
    let mut nestor = Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain", "--set", &format!("resources.CPU={}", n.max(2))])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let trial = dir.path().join("runs/failover/trials/trial_00000");
    let mut times = Vec::new();
    let mut since = 0.0;
    for _ in 0..reps {
        let up = wait_until(Duration::from_secs(30), || (0..n).all(|r| rank_started(&trial, r).is_some_and(|(t, _)| t > since)));
        if !up {
            return Err("the group did not come up".into());
        }
        // Let it run and checkpoint a little first.
        std::thread::sleep(Duration::from_millis(300));
        let Some((_, victim)) = rank_started(&trial, 1) else { return Err("no rank 1".into()) };
        since = now();
        // SAFETY: signalling a worker process of this benchmark's own sweep.
        unsafe {
            libc::kill(victim as i32, libc::SIGKILL);
        }
        let back = wait_until(Duration::from_secs(30), || (0..n).all(|r| rank_started(&trial, r).is_some_and(|(t, _)| t > since)));
        if !back {
            return Err("the group did not come back".into());
        }
        let latest = (0..n).filter_map(|r| rank_started(&trial, r)).map(|(t, _)| t).fold(0.0, f64::max);
        times.push(latest - since);
    }
    // SAFETY: interrupting our own child.
    unsafe {
        libc::kill(nestor.id() as i32, libc::SIGINT);
    }
    let _ = nestor.wait();
    Ok(times)
}

/// Wall time of `nestor run` of a 4-rank trial checkpointing `mib` MiB per
/// rank at each of 2 steps to the S3 server, with `extra` in the driver's
/// environment.
fn ranks_run(work: &Path, s3: &S3, mib: usize, rep: u64, extra: &[(&str, &str)]) -> Result<f64, Box<dyn std::error::Error>> {
    let dir = work.join(format!("run-{rep}-{}", extra.len()));
    std::fs::create_dir_all(&dir)?;
    let sweep = format!(
        "[experiment]\nname = \"ckpt\"\nstorage = \"s3://bucket/ranks-{rep}-{n}\"\nlocal_dir = \"local\"\ntrial_files = false\n\n\
         [space]\nx = 0.5\nsteps = 2\ncheckpoint = true\nckpt_mb = {mib}\n\n[trainer]\ncommand = [\"{}\"]\nnum_workers = {RANKS}\n\
         resources_per_worker = {{ CPU = 0.5 }}\n",
        env!("CARGO_BIN_EXE_fixture-worker"),
        n = extra.len(),
    );
    std::fs::write(dir.join("sweep.toml"), sweep)?;
    let t0 = Instant::now();
    let out = Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--plain"])
        .current_dir(&dir)
        .envs([
            ("AWS_ACCESS_KEY_ID", "nestor".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "nestor-secret".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", s3.port)),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ])
        .envs(extra.iter().map(|(k, v)| (*k, *v)))
        .output()?;
    let took = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("1 TERMINATED") {
        return Err(format!("the sweep failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(took)
}

fn ranks(reps: u64, mib: usize) -> Result<(), Box<dyn std::error::Error>> {
    let work = tempfile::tempdir_in(std::env::var("NESTOR_BENCH_DIR").unwrap_or_else(|_| ".".into()))?;
    let s3 = start_s3(&work.path().join("s3"))?;
    let total = (RANKS * mib * 2) as f64;
    println!("ranks: a {RANKS}-rank trial, {mib} MiB per rank at each of 2 steps to S3 on loopback ({total:.0} MiB), whole `nestor run`");
    let (mut direct, mut driver) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        direct.push(ranks_run(work.path(), &s3, mib, rep, &[])?);
        driver.push(ranks_run(work.path(), &s3, mib, rep, &[("NESTOR_RANKS_UPLOAD", "0")])?);
    }
    let (d, v) = (median(&mut direct), median(&mut driver));
    println!("  each rank uploads its own shard      {:>7.0} ms  (median of {reps})", d * 1e3);
    println!("  every byte through the driver        {:>7.0} ms  (median of {reps})", v * 1e3);
    Ok(())
}

/// A resumed 2-rank run, from its launch to its first result.
async fn resume_once(
    backend: &trainer::ProcessBackend,
    storage: &Storage,
    trial: &Path,
    back: Result<String, PathBuf>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let config = serde_json::json!({ "x": 0.5, "steps": 3, "checkpoint": false });
    let mut spec = trainer::LaunchSpec::new("restore", config, trial.to_path_buf());
    spec.workers = vec![trainer::WorkerBundle::cpus(1.0); 2];
    spec.storage = storage.clone();
    spec.start_iteration = 2;
    let t0 = Instant::now();
    match back {
        Ok(uri) => spec.checkpoint_uri = Some(uri),
        // Through the driver: it downloads the checkpoint, then the ranks read its copy.
        Err(scratch) => spec.checkpoint = Some(storage.fetch_checkpoint(&storage.uri("checkpoint_000002"), &scratch).await?),
    }
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let _handle = trainer::Backend::launch(backend, spec, tx)?;
    let mut first = None;
    while let Some(ev) = events.recv().await {
        match ev.kind {
            trainer::EventKind::Report { report, reply } => {
                first.get_or_insert(t0.elapsed().as_secs_f64());
                assert_eq!(report.training_iteration, 3, "the run goes on from the checkpoint");
                reply.send(trainer::Directive::Continue).durable();
            }
            trainer::EventKind::Exited(outcome) => {
                assert_eq!(outcome, trainer::ExitOutcome::Completed, "the resumed run");
                break;
            }
            _ => {}
        }
    }
    Ok(first.ok_or("no result")?)
}

async fn restore(reps: u64, mib: usize) -> Result<(), Box<dyn std::error::Error>> {
    let work = tempfile::tempdir_in(std::env::var("NESTOR_BENCH_DIR").unwrap_or_else(|_| ".".into()))?;
    let s3 = start_s3(&work.path().join("s3"))?;
    use_s3(&s3);
    let shards = make_shards(&work.path().join("src"), mib)?;
    for s in &shards {
        std::fs::write(s.join("state.json"), br#"{"step": 2, "acc": 0.0}"#)?;
    }
    let storage = Storage::parse("s3://bucket/restore")?;
    upload_all(&storage, &shards[..2], 2).await?;
    let backend =
        trainer::ProcessBackend::start(trainer::ProcessConfig::new(vec![env!("CARGO_BIN_EXE_fixture-worker").to_string()])).await?;
    let trial = work.path().join("trial");
    println!("restore: a 2-rank trial resumed from {mib} MiB a rank in S3 on loopback, launch to first result");
    let (mut direct, mut driver) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        direct.push(resume_once(&backend, &storage, &trial, Ok(storage.uri("checkpoint_000002"))).await?);
        driver.push(resume_once(&backend, &storage, &trial, Err(work.path().join(format!("scratch-{rep}")))).await?);
        let _ = std::fs::remove_dir_all(work.path().join(format!("scratch-{rep}")));
    }
    let (d, v) = (median(&mut direct), median(&mut driver));
    println!("  each rank downloads its own shard    {:>7.0} ms  (median of {reps})", d * 1e3);
    println!("  the driver downloads, ranks read it  {:>7.0} ms  (median of {reps})", v * 1e3);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let only = arg("--only");
    let reps = num("--reps", 5);
    if only.as_deref().is_none_or(|o| o == "upload") {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(upload(reps.min(5), num("--mib", 256) as usize))?;
    }
    if only.as_deref().is_none_or(|o| o == "ranks") {
        ranks(reps.min(5), num("--mib", 256) as usize)?;
    }
    if only.as_deref().is_none_or(|o| o == "restore") {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(restore(reps.min(5), num("--mib", 256) as usize))?;
    }
    if only.as_deref().is_none_or(|o| o == "failover") {
        println!("failover: rank 1 killed (SIGKILL) -> every rank of the restarted group running");
        for n in [2, 4] {
            let mut t = failover(n, reps * 2)?;
            let med = median(&mut t) * 1e3;
            let max = t.iter().copied().fold(0.0, f64::max) * 1e3;
            println!("  {n} ranks: median {med:.0} ms, max {max:.0} ms  ({} kills)", t.len());
        }
    }
    Ok(())
}
