//! Trials as Slurm jobs of their own, on a real Slurm cluster on this
//! machine (a slurmctld and two slurmd, each in a network namespace of its
//! own where this machine allows it):
//!
//! - the overhead of a job: a 2-rank trial of one step, from its start
//!   (the driver places it) to its first stored result, as a job of its own
//!   (`sbatch`, Slurm schedules it, the job starts its step) against as a
//!   step inside an allocation (`srun`);
//! - a job put back in the queue (`scontrol requeue`, as preemption in
//!   requeue mode does): from the requeue to the trial's next stored result,
//!   in its new job;
//! - the load the driver puts on `slurmctld` while 100 jobs wait in the
//!   queue: the remote procedure calls `sdiag` counts for this user over a
//!   minute, with `[cluster.jobs] poll_s` at its default (10 s);
//! - the overhead of a job on nodes that do not see the experiment's
//!   directory (its output relayed to the driver, the checkpoint shipped
//!   through it), as in the first.
//!
//! `cargo bench -p nestor-tests --bench slurm_jobs [-- --reps N] [--only overhead]`
//!
//! (`--only overhead` measures the first part alone.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::slurm::{Options, SlurmCluster};

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join(name)
}

fn stats(label: &str, v: &[f64]) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    println!("{label}: median {:.3} s, min {:.3} s, max {:.3} s ({} runs)", s[s.len() / 2], s[0], s[s.len() - 1], s.len());
}

fn fixture_sweep(dir: &Path, name: &str, experiment: &str, space: &str, trainer: &str) {
    let text = format!(
        "[experiment]\nname = \"{name}\"\nmetric = \"loss\"\nmode = \"min\"\n{experiment}\n\n[space]\n{space}\n\n[trainer]\ncommand = [\"{}\"]\n\
         grace_period_s = 1.0\n{trainer}\n",
        bin("fixture-worker").display()
    );
    std::fs::write(dir.join("sweep.toml"), text).unwrap();
}

const JOBS: &str = "\n[cluster]\nbackend = \"slurm_jobs\"\n\n[cluster.jobs]\nsignal_s = 0\n";

fn nestor(cluster: &SlurmCluster, dir: &Path) -> Command {
    let mut c = cluster.cmd(bin("nestor"));
    c.args(["run", "sweep.toml", "--storage", "runs", "--plain"]).current_dir(dir);
    c
}

/// Trial 0's results as stored, each run's in turn (its `result.jsonl`): (timestamp, iteration).
fn results(exp: &Path) -> Vec<(f64, u64)> {
    let text = std::fs::read_to_string(exp.join("trials/trial_00000/result.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|r| (r["metrics"]["timestamp"].as_f64().unwrap(), r["training_iteration"].as_u64().unwrap()))
        .collect()
}

fn started_at(exp: &Path) -> f64 {
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    store.trial("trial_00000").unwrap().and_then(|t| t.started_at).unwrap()
}

/// `sdiag`'s remote procedure calls by this user: (calls, the busiest types).
fn rpcs(cluster: &SlurmCluster) -> (u64, Vec<(String, u64)>) {
    let out = cluster.run("sdiag", &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut by_type = Vec::new();
    let mut in_types = false;
    let mut total = 0;
    for line in text.lines() {
        if line.starts_with("Remote Procedure Call statistics by message type") {
            in_types = true;
            continue;
        }
        if line.starts_with("Remote Procedure Call statistics by user") {
            in_types = false;
            continue;
        }
        let Some((name, rest)) = line.trim().split_once('(') else { continue };
        let count = rest.split("count:").nth(1).and_then(|c| c.split_whitespace().next()).and_then(|c| c.parse::<u64>().ok());
        match (in_types, count) {
            (true, Some(c)) if !name.trim().starts_with("REQUEST_STATS_INFO") => by_type.push((name.trim().to_string(), c)),
            (false, Some(c)) if name.trim() == "root" => total = c,
            _ => {}
        }
    }
    (total, by_type)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.iter().position(|a| a == "--reps").and_then(|i| args.get(i + 1)).and_then(|r| r.parse().ok()).unwrap_or(3);
    let conf = "MinJobAge=300\nDefMemPerCPU=200\nJobRequeue=1".to_string();
    let cluster = SlurmCluster::start_with(2, 2, 2000, Options { networks: true, conf, ..Options::default() });
    let network = if cluster.networked() { "a network namespace and address each" } else { "loopback" };
    println!("2 nodes x 2 CPUs on this machine ({network}), {reps} runs each");

    // 1. A job's overhead against a step's.
    let trainer = "num_workers = 2\nresources_per_worker = { CPU = 1 }";
    let (mut step, mut job) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        for (inside, into) in [(true, &mut step), (false, &mut job)] {
            let dir = tempfile::tempdir().unwrap();
            let extra = if inside { String::new() } else { format!("{JOBS}poll_s = 1\n") };
            fixture_sweep(dir.path(), "one", "", "x = 0.5\nsteps = 1\nquiet = true", &format!("{trainer}\n{extra}"));
            let out = if inside {
                cluster
                    .cmd("salloc")
                    .args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
                    .arg(bin("nestor"))
                    .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
                    .current_dir(dir.path())
                    .output()
                    .unwrap()
            } else {
                nestor(&cluster, dir.path()).output().unwrap()
            };
            assert!(out.status.success(), "run {rep}: {}", String::from_utf8_lossy(&out.stderr));
            let exp = dir.path().join("runs/one");
            into.push(results(&exp)[0].0 - started_at(&exp));
        }
    }
    stats("2-rank trial as a step inside an allocation (trial started to its first stored result)", &step);
    stats("2-rank trial as a job of its own, poll_s = 1 (trial started to its first stored result)", &job);
    if args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).is_some_and(|p| p == "overhead") {
        return;
    }

    // 2. A job put back in the queue: requeue to the next stored result.
    let mut requeue = Vec::new();
    for rep in 0..reps {
        let dir = tempfile::tempdir().unwrap();
        fixture_sweep(
            dir.path(),
            "requeued",
            "",
            "x = 0.5\nsteps = 30\nsleep_ms = 200\ncheckpoint = true\nquiet = true",
            &format!("{trainer}\n\n[checkpoint]\nfrequency = 1\n{JOBS}poll_s = 1\n"),
        );
        let exp = dir.path().join("runs/requeued");
        let mut child =
            nestor(&cluster, dir.path()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let id = loop {
            assert!(Instant::now() < deadline, "run {rep}: no result");
            if results(&exp).len() >= 3 {
                let out = cluster.run("squeue", &["-h", "-t", "RUNNING", "-o", "%i"]);
                if let Some(id) = String::from_utf8_lossy(&out.stdout).lines().next() {
                    break id.trim().to_string();
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let t0 = now();
        assert!(cluster.run("scontrol", &["requeue", &id]).status.success());
        assert!(child.wait().unwrap().success(), "run {rep}");
        // The first result of the new job: a step the first job had reported already, run again from the checkpoint.
        let all = results(&exp);
        let last_before = all.iter().filter(|(t, _)| *t <= t0).map(|(_, i)| *i).max().unwrap_or(0);
        let next = all.iter().skip_while(|(t, _)| *t <= t0).find(|(_, i)| *i <= last_before).or_else(|| all.iter().find(|(t, _)| *t > t0));
        match next {
            Some((t, _)) => requeue.push(t - t0),
            None => println!("run {rep}: no result after the requeue: {all:?} (requeued at {t0})"),
        }
    }
    stats("job requeued by Slurm (scontrol requeue) to the trial's next stored result, poll_s = 1", &requeue);

    // 3. The driver's load on slurmctld with 100 jobs queued.
    let dir = tempfile::tempdir().unwrap();
    fixture_sweep(
        dir.path(),
        "queued",
        "num_samples = 100",
        "x = { uniform = [0.0, 1.0] }\nsteps = 100000\nsleep_ms = 1000\nquiet = true",
        &format!("num_workers = 1\nresources_per_worker = {{ CPU = 1 }}\n{JOBS}max_jobs = 100\n"),
    );
    let mut child = nestor(&cluster, dir.path()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = cluster.run("squeue", &["-h", "-t", "PENDING,RUNNING", "-o", "%i"]);
        if String::from_utf8_lossy(&out.stdout).lines().count() >= 100 {
            break;
        }
        assert!(Instant::now() < deadline, "100 jobs were never queued");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Settled: the submissions' pokes are over.
    std::thread::sleep(Duration::from_secs(15));
    let (before, types_before) = rpcs(&cluster);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(60));
    let (after, types_after) = rpcs(&cluster);
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let out = cluster.run("squeue", &["-h", "-t", "PENDING", "-o", "%i"]);
    let pending = String::from_utf8_lossy(&out.stdout).lines().count();
    // The driver's calls: the clients' message types (the nodes' slurmd talk to slurmctld as root too).
    let mut driver = 0;
    let mut lines = Vec::new();
    for (name, c) in &types_after {
        let was = types_before.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
        if c > &was {
            lines.push(format!("  {name}: {}", c - was));
            if !name.starts_with("MESSAGE_") && !name.starts_with("REQUEST_COMPLETE") {
                driver += c - was;
            }
        }
    }
    println!(
        "100 jobs queued ({pending} pending), poll_s = 10: {:.1} remote procedure calls a minute from the driver ({:.1} from this user, the nodes' included)",
        driver as f64 / minutes,
        (after - before).saturating_sub(1) as f64 / minutes
    );
    for l in lines {
        println!("{l}");
    }
    common::signal(child.id(), libc::SIGTERM);
    let _ = child.wait();
    cluster.run("scancel", &["--user", "root"]);
    drop(cluster);

    // 4. Nodes that do not see the experiment's directory: the job's output
    // and the ranks' checkpoints go through the driver.
    let hidden = tempfile::tempdir().unwrap();
    let conf = "MinJobAge=300\nDefMemPerCPU=200\nJobRequeue=1".to_string();
    let both = vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())];
    let cluster = SlurmCluster::start_with(2, 2, 2000, Options { networks: true, conf, hidden: both, ..Options::default() });
    let mut relayed = Vec::new();
    for rep in 0..reps {
        let dir = tempfile::tempdir_in(hidden.path()).unwrap();
        fixture_sweep(
            dir.path(),
            "one",
            "",
            "x = 0.5\nsteps = 1\nquiet = true\ncheckpoint = true",
            &format!("{trainer}\n{JOBS}poll_s = 1\n"),
        );
        let out = nestor(&cluster, dir.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.contains("is not visible on"), "run {rep}: {stderr}");
        let exp = dir.path().join("runs/one");
        relayed.push(results(&exp)[0].0 - started_at(&exp));
    }
    stats(
        "2-rank trial as a job of its own on nodes that do not see the experiment's directory (output and checkpoint through the driver), poll_s = 1",
        &relayed,
    );
}
