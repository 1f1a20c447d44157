//! Trials as Slurm jobs of their own (`[cluster] backend = "slurm_jobs"`),
//! on a real Slurm cluster started by each test (common/slurm.rs): the
//! driver runs outside any allocation, as on a login node, and submits
//! each trial run with `sbatch`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::slurm::{Options, SlurmCluster};
use common::*;

/// What these tests' clusters add to the base configuration: jobs that
/// ended stay listed long enough to be read, and a default memory per CPU
/// (else a job holds its node's whole memory).
const JOBS_CONF: &str = "MinJobAge=300\nDefMemPerCPU=200\nJobRequeue=1";

fn cluster(nodes: usize, cpus: u32, options: Options) -> SlurmCluster {
    let conf = if options.conf.is_empty() { JOBS_CONF.to_string() } else { format!("{JOBS_CONF}\n{}", options.conf) };
    SlurmCluster::start_with(nodes, cpus, 2000, Options { networks: true, conf, ..options })
}

/// `[cluster]` for jobs of their own, with `jobs` in `[cluster.jobs]`.
fn jobs_section(jobs: &str) -> String {
    format!("\n[cluster]\nbackend = \"slurm_jobs\"\n\n[cluster.jobs]\npoll_s = 0.5\nsignal_s = 0\n{jobs}\n")
}

/// `nestor run sweep.toml --storage runs --plain` in `dir`, against `cluster`, outside any allocation.
fn run_cmd(cluster: &SlurmCluster, dir: &Path) -> std::process::Command {
    let mut c = cluster.cmd(nestor_bin());
    c.args(["run", "sweep.toml", "--storage", "runs", "--plain"]).current_dir(dir);
    c
}

/// The experiment's jobs `squeue` lists now: (id, name, state).
fn listed(cluster: &SlurmCluster, prefix: &str) -> Vec<(String, String, String)> {
    let out = cluster.run("squeue", &["--noheader", "--states=all", "--format=%i|%j|%T"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            Some((f.next()?.to_string(), f.next()?.to_string(), f.next()?.to_string()))
        })
        .filter(|(_, name, _)| name.starts_with(prefix))
        .collect()
}

/// A sweep of more trials than the cluster holds at once, each a job of its
/// own whose two ranks Slurm places: every trial ends as it would on one
/// machine, its ranks ran in its job, and at some point jobs waited in
/// Slurm's queue behind the others.
#[test]
fn a_sweep_runs_each_trial_as_a_job_of_its_own_queued_beyond_the_clusters_size() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(
        "jobs",
        "num_samples = 1",
        "x = { grid = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6] }\nsteps = 4\nsleep_ms = 300\ncheckpoint = true\ndump_env = true",
        &format!("num_workers = 2\nresources_per_worker = {{ CPU = 1 }}\n\n[checkpoint]\nfrequency = 1\n{}", jobs_section("max_jobs = 4")),
    );
    write(dir.path(), &text);
    let mut child =
        run_cmd(&cluster, dir.path()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Watch the queue while it runs: jobs wait (PENDING) behind the running ones.
    let started = Instant::now();
    let mut most = 0;
    let mut waited = false;
    while child.try_wait().unwrap().is_none() {
        let jobs = listed(&cluster, "nestor-jobs-");
        let live: Vec<_> = jobs.iter().filter(|(_, _, s)| s == "PENDING" || s == "RUNNING").collect();
        most = most.max(live.len());
        waited |= jobs.iter().any(|(_, _, s)| s == "PENDING");
        assert!(started.elapsed() < Duration::from_secs(240), "the sweep did not end: {jobs:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("6 trials (6 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("a Slurm job per trial run (at most 4 at once"), "{stderr}");
    assert!(most <= 4, "more jobs than max_jobs at once: {most}");
    assert!(waited, "no job ever waited in the queue (the cluster holds 2 trials at once, max_jobs is 4)");
    let exp = dir.path().join("runs/jobs");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let trials = store.trials().unwrap();
    assert_eq!(trials.len(), 6);
    let ended = listed(&cluster, "nestor-jobs-");
    for t in &trials {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}: {:?}", t.id, t.error);
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 4, "{}", t.id);
        // One job, which completed, and whose ranks wrote the trial's logs.
        let mine: Vec<_> = ended.iter().filter(|(_, n, _)| n.starts_with(&format!("nestor-jobs-{}-", t.id))).collect();
        assert_eq!(mine.len(), 1, "{}: {ended:?}", t.id);
        assert_eq!(mine[0].2, "COMPLETED", "{}", t.id);
        for rank in 0..2u32 {
            let dump: serde_json::Value =
                serde_json::from_slice(&std::fs::read(exp.join(format!("trials/{}/rank-{rank}.json", t.id))).unwrap()).unwrap();
            assert_eq!(dump["SLURM_JOB_ID"].as_str(), Some(mine[0].0.as_str()), "{}: rank {rank} ran in another job: {dump}", t.id);
            assert_eq!(dump["RANK"].as_str(), Some(rank.to_string().as_str()));
            assert_eq!(dump["WORLD_SIZE"].as_str(), Some("2"));
            let log = read(&exp.join(format!("trials/{}/logs/rank-{rank}.log", t.id)));
            assert!(log.contains(&format!("nestor: rank {rank} of 2 on node")), "{log}");
        }
    }
}
