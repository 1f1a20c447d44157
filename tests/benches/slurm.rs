//! Start and restart times of trials on a real Slurm cluster on this
//! machine (a slurmctld and two slurmd, 8 CPUs each, each slurmd in a
//! network namespace of its own on a bridge where this machine allows it,
//! else on loopback):
//!
//! - a 16-rank job step across the 2 nodes: `srun` by hand (spawn to every
//!   rank's first line) against `nestor run` (spawn to the trial's first
//!   stored result, and the trial's own start to it);
//! - a 2-rank PyTorch DDP trial across the 2 nodes (when the example's
//!   Python environment is there): the same script by hand under `srun` with
//!   torchrun's variables (spawn to both ranks' first epoch line) against
//!   `nestor run` (spawn to the first stored result);
//! - a rank killed on one node: from the kill to the restarted group's first
//!   stored result;
//! - a 2-rank trial across the 2 nodes checkpointing a 64 MiB shard per rank
//!   every step, to an S3-compatible server on loopback: the time per step
//!   when the driver reads the shards from a directory the nodes share,
//!   against ranks shipping them through the report channel (nodes that
//!   share no directory with the driver).
//!
//! `cargo bench -p nestor-tests --bench slurm [-- --reps N]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::slurm::{Options, SlurmCluster};
use common::S3Server;

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn bin(name: &str) -> PathBuf {
    // target/release/deps/slurm-<hash> -> target/release/<name>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join(name)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn stats(label: &str, v: &[f64]) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    println!(
        "{label}: median {:.3} s, mean {mean:.3} s, min {:.3} s, max {:.3} s ({} runs)",
        s[s.len() / 2],
        s[0],
        s[s.len() - 1],
        s.len()
    );
}

/// Seconds from spawning `cmd` until `lines` lines matching `is_mark` were printed (stdout or stderr).
fn until_lines(mut cmd: Command, lines: usize, is_mark: impl Fn(&str) -> bool + Send + Copy + 'static) -> f64 {
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for stream in [Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>, Box::new(child.stderr.take().unwrap())] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if is_mark(&line) {
                    let _ = tx.send(started.elapsed().as_secs_f64());
                }
            }
        });
    }
    drop(tx);
    let mut last = f64::NAN;
    for _ in 0..lines {
        last = rx.recv_timeout(Duration::from_secs(120)).expect("the marks never came");
    }
    child.wait().unwrap();
    last
}

/// Writes `dir/sweep.toml` for the fixture worker.
fn fixture_sweep(dir: &Path, name: &str, space: &str, trainer: &str) {
    let text = format!(
        "[experiment]\nname = \"{name}\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\n{space}\n\n[trainer]\ncommand = [\"{}\"]\n{trainer}\n",
        bin("fixture-worker").display()
    );
    std::fs::write(dir.join("sweep.toml"), text).unwrap();
}

/// `nestor ARGS` in `dir` inside `job`.
fn nestor(cluster: &SlurmCluster, job: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin("nestor"));
    c.args(args).env("SLURM_CONF", cluster.conf()).env("SLURM_JOB_ID", job).current_dir(dir);
    c
}

/// The stored results of `exp`'s trial 0: (timestamp, iteration).
fn results(exp: &Path) -> Vec<(f64, u64)> {
    let out = Command::new(bin("nestor")).args(["export"]).arg(exp).args(["--format", "json"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| (r["timestamp"].as_f64().unwrap(), r["training_iteration"].as_u64().unwrap()))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.iter().position(|a| a == "--reps").and_then(|i| args.get(i + 1)).and_then(|r| r.parse().ok()).unwrap_or(3);
    // The nodes see an empty directory of their own at `hidden` (as nodes with no shared file system would).
    let hidden = tempfile::tempdir().unwrap();
    let on_both = vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())];
    let cluster = SlurmCluster::start_with(2, 8, 8000, Options { networks: true, hidden: on_both, ..Options::default() });
    let granted = cluster.run("salloc", &["--no-shell", "--no-kill", "-N2", "--ntasks-per-node=8", "--mem=6000"]);
    let stderr = String::from_utf8_lossy(&granted.stderr).into_owned();
    let job = stderr.lines().find_map(|l| l.strip_prefix("salloc: Granted job allocation ")).expect(&stderr).trim().to_string();
    let network = if cluster.networked() { "a network namespace and address each" } else { "loopback" };
    println!("Slurm job {job}: 2 nodes x 8 CPUs on this machine ({network}), {reps} runs each");
    let master = cluster.node_addr("node1");

    // 1. A 16-rank step across the 2 nodes.
    let mut by_hand = Vec::new();
    for _ in 0..reps {
        let mut c = cluster.cmd("srun");
        c.args([&format!("--jobid={job}"), "--exact", "-N2", "-n16", "--mem-per-cpu=100", "--label", "sh", "-c", "echo ready"]);
        by_hand.push(until_lines(c, 16, |l| l.ends_with("ready")));
    }
    stats("16-rank step by hand (srun, spawn to every rank's first line)", &by_hand);
    let (mut to_first, mut in_trial) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let dir = tempfile::tempdir().unwrap();
        fixture_sweep(dir.path(), "wide", "x = 0.5\nsteps = 1\nquiet = true", "num_workers = 16\nplacement_strategy = \"SPREAD\"");
        let t0 = now();
        let out = nestor(&cluster, &job, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]).output().unwrap();
        assert!(out.status.success(), "run {rep}: {}", String::from_utf8_lossy(&out.stderr));
        let exp = dir.path().join("runs/wide");
        let first = results(&exp)[0].0;
        to_first.push(first - t0);
        let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
        if let Some(started) = store.trial("trial_00000").unwrap().and_then(|t| t.started_at) {
            in_trial.push(first - started);
        }
    }
    stats("16-rank trial with nestor (nestor run spawned to the first stored result)", &to_first);
    if !in_trial.is_empty() {
        stats("16-rank trial with nestor (trial started to its first stored result)", &in_trial);
    }

    // 2. PyTorch DDP, 2 ranks on the 2 nodes, when the example's environment exists.
    let venv = Command::new("bash").arg(repo().join("examples/torch_ddp/venv.sh")).env("NESTOR_VENV_EXISTING", "1").output().ok();
    let venv = venv.filter(|o| o.status.success()).map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match venv.filter(|v| v.join("bin/python").exists()) {
        None => println!("PyTorch DDP: skipped (run examples/torch_ddp/venv.sh first)"),
        Some(venv) => {
            let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
            let mut by_hand = Vec::new();
            for rep in 0..reps {
                let script = format!(
                    "export RANK=$SLURM_PROCID LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR={master} MASTER_PORT={}; \
                     exec python examples/torch_ddp/train.py",
                    29600 + rep
                );
                let mut c = cluster.cmd("srun");
                c.args([&format!("--jobid={job}"), "--exact", "-N2", "-n2", "--distribution=arbitrary", "--nodelist=node1,node2"])
                    .args(["--mem-per-cpu=2000", "sh", "-c", &script])
                    .current_dir(repo())
                    .env("PATH", &path);
                by_hand.push(until_lines(c, 2, |l| l.starts_with("epoch 1 ")));
            }
            stats("2-node DDP by hand (srun + torchrun variables, spawn to both ranks' first epoch)", &by_hand);
            let mut with_nestor = Vec::new();
            for rep in 0..reps {
                let dir = tempfile::tempdir().unwrap();
                let t0 = now();
                let out = nestor(&cluster, &job, &repo(), &["run", "examples/torch_ddp/sweep.toml", "--plain", "--storage"])
                    .arg(dir.path())
                    .args(["--set", "experiment.num_samples=1", "--set", "trainer.placement_strategy=\"STRICT_SPREAD\""])
                    .env("PATH", &path)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "run {rep}: {}", String::from_utf8_lossy(&out.stderr));
                with_nestor.push(results(&dir.path().join("torch-ddp"))[0].0 - t0);
            }
            stats("2-node DDP with nestor (nestor run spawned to the first stored result)", &with_nestor);
            let ratio = with_nestor.iter().sum::<f64>() / by_hand.iter().sum::<f64>();
            println!("2-node DDP: nestor / by hand = {ratio:.3}");
        }
    }

    // 3. A rank killed on one node: kill to the restarted group's first stored result.
    let mut restart = Vec::new();
    for rep in 0..reps {
        let dir = tempfile::tempdir().unwrap();
        fixture_sweep(
            dir.path(),
            "restart",
            "x = 0.5\nsteps = 40\nsleep_ms = 50\ncheckpoint = true\ndump_env = true\nquiet = true",
            "num_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\n\n[checkpoint]\nfrequency = 1\n\n[failure]\nmax_failures = 1",
        );
        let mut run = nestor(&cluster, &job, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let exp = dir.path().join("runs/restart");
        let dump = exp.join("trials/trial_00000/rank-1.json");
        let started = Instant::now();
        let pid = loop {
            if let Some(v) = std::fs::read_to_string(&dump).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()) {
                if started.elapsed() > Duration::from_millis(600) {
                    break v["pid"].as_u64().unwrap() as i32;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(30), "run {rep}: rank 1 never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        let killed = now();
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        assert!(run.wait().unwrap().success(), "run {rep} failed");
        let after = results(&exp).into_iter().filter(|(t, _)| *t > killed).map(|(t, _)| t).fold(f64::INFINITY, f64::min);
        restart.push(after - killed);
    }
    stats("rank killed on node2 to the restarted group's first stored result", &restart);

    // 4. Checkpoints to S3: read from a shared directory, or shipped through the report channel.
    let s3_root = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(s3_root.path());
    let mib = 64;
    for (label, shared) in [("from a directory the nodes share", true), ("shipped through the report channel", false)] {
        let mut per_step = Vec::new();
        for rep in 0..reps {
            let dir = tempfile::tempdir_in(if shared { std::env::temp_dir() } else { hidden.path().to_path_buf() }).unwrap();
            let text = format!(
                "[experiment]\nname = \"ckpt\"\nmetric = \"loss\"\nmode = \"min\"\nstorage = \"s3://bucket/bench-{shared}-{rep}\"\n\
                 local_dir = \"{}\"\n\n[space]\nx = 0.5\nsteps = 6\ncheckpoint = true\nckpt_mb = {mib}\nquiet = true\n\n\
                 [trainer]\ncommand = [\"{}\"]\nnum_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\n\n[checkpoint]\nfrequency = 1\n",
                dir.path().join("runs").display(),
                bin("fixture-worker").display()
            );
            std::fs::write(dir.path().join("sweep.toml"), text).unwrap();
            let out = nestor(&cluster, &job, dir.path(), &["run", "sweep.toml", "--plain"]).envs(s3.env()).output().unwrap();
            assert!(out.status.success(), "run {rep}: {}", String::from_utf8_lossy(&out.stderr));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(stderr.contains("ranks ship checkpoints through the driver"), !shared, "{stderr}");
            let mut times: Vec<f64> = results(&dir.path().join("runs/ckpt")).into_iter().map(|(t, _)| t).collect();
            times.sort_by(f64::total_cmp);
            per_step.extend(times.windows(2).map(|w| w[1] - w[0]));
        }
        stats(&format!("step with 2 x {mib} MiB checkpointed to S3, {label}"), &per_step);
    }
    let _ = cluster.run("scancel", &[&job]);
}
