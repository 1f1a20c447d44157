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

/// The experiment's jobs `squeue` lists now, oldest first: (id, name, state).
fn listed(cluster: &SlurmCluster, prefix: &str) -> Vec<(String, String, String)> {
    let out = cluster.run("squeue", &["--noheader", "--states=all", "--format=%i|%j|%T"]);
    let mut jobs: Vec<(String, String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            Some((f.next()?.to_string(), f.next()?.to_string(), f.next()?.to_string()))
        })
        .filter(|(_, name, _)| name.starts_with(prefix))
        .collect();
    jobs.sort_by_key(|(id, _, _)| id.parse::<u64>().unwrap_or(u64::MAX));
    jobs
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

/// Waits up to `secs` for `cond`, failing with `what` and the driver's state when it never holds.
fn wait_until(what: &str, secs: u64, run: &mut std::process::Child, mut cond: impl FnMut() -> bool) {
    wait_for_run(what, secs as f64, run, &mut cond);
}

/// The driver, started outside any allocation with its output piped.
fn spawn_driver(cluster: &SlurmCluster, dir: &Path, args: &[&str]) -> std::process::Child {
    cluster
        .cmd(nestor_bin())
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The trial's record, once the sweep has ended.
fn trials(exp: &Path) -> Vec<tuner::store::TrialRecord> {
    tuner::store::Store::open_existing(&exp.join("store")).unwrap().trials().unwrap()
}

/// The iterations of each trial's effective history: 1..=n with none twice.
fn assert_histories_whole(exp: &Path) {
    let grid = tuner::ResultGrid::load(exp).unwrap();
    for t in grid.iter() {
        let its: Vec<u64> = t.history.iter().map(|r| r.training_iteration).collect();
        assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{}: a step lost or run twice", t.trial_id);
    }
}

/// The sweep of one trial, once its first job was ended by the cluster:
/// the trial finished all `steps` in a new job resumed from a checkpoint,
/// charged once to `max_infrastructure_failures` and never to
/// `max_failures`, each step once in its history. The driver's stderr.
fn went_on_in_a_new_job(out: std::process::Output, exp: &Path, steps: u64) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stdout.contains("(1 TERMINATED)"), "{stdout}\n{stderr}");
    let t = &trials(exp)[0];
    assert_eq!((t.failures, t.infrastructure_failures), (0, 1), "{stderr}");
    assert_eq!(t.last_result.as_ref().unwrap().training_iteration, steps);
    assert!(rank0_says(exp, "resumed from"), "the new job did not resume from a checkpoint");
    assert_histories_whole(exp);
    stderr
}

/// The trainer of 2 ranks of one CPU that checkpoint every step, no
/// failure allowed, as jobs of their own (`jobs` in `[cluster.jobs]`).
fn two_ranks_checkpointing(jobs: &str) -> String {
    format!(
        "num_workers = 2\nresources_per_worker = {{ CPU = 1 }}\n\n[failure]\nmax_failures = 0\n\n[checkpoint]\nfrequency = 1\n{}",
        jobs_section(jobs)
    )
}

/// One trial of 2 ranks that checkpoints every step, slow enough to be caught mid-run.
fn one_trial(dir: &Path, name: &str, space_extra: &str, jobs: &str) {
    let text = sweep(
        name,
        "num_samples = 1",
        &format!("x = 0.5\nsteps = 12\nsleep_ms = 400\ncheckpoint = true\n{space_extra}"),
        &two_ranks_checkpointing(jobs),
    );
    write(dir, &text);
}

/// Rank 0's log of `trial` holds `needle`.
fn rank0_says(exp: &Path, needle: &str) -> bool {
    std::fs::read_dir(exp.join("trials"))
        .map(|d| d.flatten().any(|t| std::fs::read_to_string(t.path().join("logs/rank-0.log")).is_ok_and(|l| l.contains(needle))))
        .unwrap_or(false)
}

/// A rank whose code fails ends its job FAILED, and the trial with rank 1
/// named and its log's last lines, charged to `max_failures`.
#[test]
fn a_rank_that_fails_in_its_job_fails_the_trial_naming_the_rank() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    one_trial(dir.path(), "fails", "fail_at = 3\nfail_rank = 1", "");
    let out = run_cmd(&cluster, dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("1 trials (1 ERROR)") || stdout.contains("1 trial (1 ERROR)"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = &trials(&dir.path().join("runs/fails"))[0];
    let error = t.error.clone().unwrap_or_default();
    assert!(error.contains("rank 1") && error.contains("exited with code 3"), "{error}");
    assert!(error.contains("failing on purpose at step 3"), "the rank's log tail: {error}");
    assert_eq!((t.failures, t.infrastructure_failures), (1, 0));
    let jobs = listed(&cluster, "nestor-fails-");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].2, "FAILED");
}

/// A partition Slurm does not have is refused once, naming it, before the
/// experiment exists: no trial ran and nothing was written.
#[test]
fn a_job_the_cluster_refuses_is_refused_once_before_anything_is_written() {
    let cluster = cluster(1, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    one_trial(dir.path(), "refused", "", "partition = \"nope\"");
    let out = run_cmd(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(stderr.contains("Slurm would not take a trial's job") && stderr.contains("--partition=nope"), "{stderr}");
    assert!(stderr.to_lowercase().contains("invalid partition"), "{stderr}");
    assert_eq!(stderr.matches("Slurm would not take").count(), 1, "{stderr}");
    assert!(!dir.path().join("runs/refused/store").exists(), "the store was written");
    assert!(listed(&cluster, "nestor-refused-").is_empty());
    // A key nestor sets itself is refused by name too.
    one_trial(dir.path(), "refused", "", "sbatch = [\"--ntasks=8\"]");
    let out = run_cmd(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.contains("cluster.jobs.sbatch") && stderr.contains("--ntasks=8"), "{stderr}");
}

/// `scontrol requeue` puts a running trial's job back in Slurm's queue:
/// nestor cancels it and the trial goes on from its latest checkpoint in a
/// new job, not charged to `max_failures` (which is 0), nothing lost or run twice.
#[test]
fn a_job_requeued_by_slurm_goes_on_from_its_checkpoint_in_a_new_job() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    one_trial(dir.path(), "requeued", "", "");
    let exp = dir.path().join("runs/requeued");
    let mut child = spawn_driver(&cluster, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    wait_until("step 3 acknowledged", 60, &mut child, || rank0_says(&exp, "acked step 3"));
    let job = listed(&cluster, "nestor-requeued-").into_iter().find(|(_, _, s)| s == "RUNNING").expect("a running job").0;
    let out = cluster.run("scontrol", &["requeue", &job]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = went_on_in_a_new_job(child.wait_with_output().unwrap(), &exp, 12);
    assert!(stderr.contains(&format!("Slurm put job {job} back in its queue")), "{stderr}");
    let jobs = listed(&cluster, "nestor-requeued-");
    assert_eq!(jobs.len(), 2, "a new job for the rest: {jobs:?}");
    // Nothing of the sweep's is left to start later.
    let queued = ["PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "SUSPENDED", "COMPLETING"];
    assert!(jobs.iter().all(|(_, _, s)| !queued.contains(&s.as_str())), "a job of the sweep is left in the queue: {jobs:?}");
}

/// A job that reaches its time limit: Slurm gives its ranks SIGUSR1
/// `signal_s` before it, the trial saves a checkpoint on that notice (it
/// saves none otherwise), the job ends TIMEOUT, and the trial goes on from
/// that checkpoint in a new job, not charged to `max_failures`.
#[test]
fn a_job_at_its_time_limit_checkpoints_on_the_notice_and_goes_on_in_a_new_job() {
    let cluster = cluster(1, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(
        "limit",
        "num_samples = 1",
        "x = 0.5\nsteps = 60\nsleep_ms = 2000\nresumed_sleep_ms = 50\non_notice = true",
        "num_workers = 2\nresources_per_worker = { CPU = 1 }\n\n[failure]\nmax_failures = 0\n\n[cluster]\nbackend = \"slurm_jobs\"\n\n\
         [cluster.jobs]\npoll_s = 0.5\ntime = \"1\"\nsignal_s = 45\n",
    );
    write(dir.path(), &text);
    let exp = dir.path().join("runs/limit");
    let started = Instant::now();
    let out = run_cmd(&cluster, dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let logs = |t: &str| {
        ["job.log", "rank-0.log", "rank-1.log"].map(|f| format!("{f}:\n{}", read(&exp.join(format!("trials/{t}/logs/{f}"))))).join("\n")
    };
    assert!(stdout.contains("(1 TERMINATED)"), "{stdout}\n{stderr}\n{}", logs("trial_00000"));
    let t = &trials(&exp)[0];
    assert_eq!((t.failures, t.infrastructure_failures), (0, 1), "{stderr}");
    assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 60);
    assert!(stderr.contains("time limit ran out"), "{stderr}");
    let jobs = listed(&cluster, "nestor-limit-");
    let states: Vec<&str> = jobs.iter().map(|(_, _, s)| s.as_str()).collect();
    assert_eq!(states, ["TIMEOUT", "COMPLETED"], "{jobs:?}");
    // The notice came about 15 s into the first job (45 s before its 1-minute limit); its step's checkpoint
    // is the one the second job resumed from.
    let log = read(&exp.join(format!("trials/{}/logs/rank-0.log", t.id)));
    let noticed: u64 = log.lines().find_map(|l| l.strip_prefix("rank 0: preemption notice at step ")).expect(&log).trim().parse().unwrap();
    assert!((4..=14).contains(&noticed), "notice at step {noticed} (2 s a step): {log}");
    assert!(log.contains(&format!("checkpoint_{noticed:06}/rank-0 at step {noticed}")), "{log}");
    assert!(started.elapsed() > Duration::from_secs(55), "the first job ended before its limit");
    assert_histories_whole(&exp);
}

/// A higher-priority partition's job takes the nodes of a preemptible
/// partition's: Slurm preempts (requeues) the trial's job, nestor cancels
/// it and queues a new one from the latest checkpoint, which runs once the
/// other job is done; nothing is lost or charged to `max_failures`.
#[test]
fn a_job_preempted_by_a_higher_priority_partition_goes_on_from_its_checkpoint() {
    let options = Options {
        conf: "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE".into(),
        partitions: "PartitionName=low Nodes={nodes} Default=YES PriorityTier=1 PreemptMode=REQUEUE MaxTime=INFINITE State=UP\n\
                     PartitionName=high Nodes={nodes} PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP"
            .into(),
        ..Options::default()
    };
    let cluster = cluster(1, 2, options);
    let dir = tempfile::tempdir().unwrap();
    one_trial(dir.path(), "preempted", "", "partition = \"low\"");
    let exp = dir.path().join("runs/preempted");
    let mut child = spawn_driver(&cluster, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    wait_until("step 3 acknowledged", 60, &mut child, || rank0_says(&exp, "acked step 3"));
    let first = listed(&cluster, "nestor-preempted-").into_iter().find(|(_, _, s)| s == "RUNNING").expect("a running job").0;
    let out = cluster.run("sbatch", &["--parsable", "-p", "high", "-n2", "--mem=100", "--output=/dev/null", "--wrap", "sleep 4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = went_on_in_a_new_job(child.wait_with_output().unwrap(), &exp, 12);
    assert!(stderr.contains(&format!("job {first}")), "{stderr}");
    assert_eq!(listed(&cluster, "nestor-preempted-").len(), 2);
}

/// The driver is SIGKILLed while its trials' jobs run and wait: the jobs
/// outlive it (they are Slurm's), and `nestor resume` cancels them, says
/// so, and finishes the sweep from the trials' checkpoints, each step once.
#[test]
fn a_resume_after_the_driver_is_killed_cancels_its_jobs_and_finishes_the_sweep() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(
        "orphans",
        "num_samples = 1",
        "x = { grid = [0.1, 0.2, 0.3, 0.4] }\nsteps = 10\nsleep_ms = 400\ncheckpoint = true",
        &format!("num_workers = 2\nresources_per_worker = {{ CPU = 1 }}\n\n[checkpoint]\nfrequency = 1\n{}", jobs_section("max_jobs = 4")),
    );
    write(dir.path(), &text);
    let exp = dir.path().join("runs/orphans");
    let mut child = spawn_driver(&cluster, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    wait_until("a step acknowledged and a job queued", 60, &mut child, || {
        rank0_says(&exp, "acked step 2") && listed(&cluster, "nestor-orphans-").iter().any(|(_, _, s)| s == "PENDING")
    });
    signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    let left: Vec<String> =
        listed(&cluster, "nestor-orphans-").into_iter().filter(|(_, _, s)| s == "RUNNING" || s == "PENDING").map(|(id, _, _)| id).collect();
    assert!(!left.is_empty(), "the jobs died with the driver");
    let out = cluster.cmd(nestor_bin()).args(["resume", &exp.display().to_string(), "--plain"]).current_dir(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains(&format!("cancelled {} job(s) an earlier driver of this experiment left", left.len())), "{stderr}");
    for id in &left {
        assert!(stderr.contains(id.as_str()), "job {id} not named: {stderr}");
    }
    assert_histories_whole(&exp);
    for t in trials(&exp) {
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 10, "{}", t.id);
    }
}

/// The Ray Train + Tune example (a TorchTrainer of 2 DDP ranks in a Tuner
/// with ASHA) from a Python driver outside any allocation, with
/// `nestor.init(cluster=nestor.SlurmJobs(...))`: each trial run is a job of
/// its own, its ranks meet in it, and the best checkpoint comes back.
#[test]
fn the_python_driver_runs_each_trial_as_a_slurm_job_with_slurm_jobs_in_init() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let mut c = common::python::torch_python_cmd(
        dir.path(),
        "examples/python/tune_torch.py",
        &[],
        &[("EXAMPLE_SLURM_JOBS", "0.5".into()), ("EXAMPLE_SAMPLES", "3".into()), ("EXAMPLE_STORAGE", storage.display().to_string())],
    );
    c.env("SLURM_CONF", cluster.conf());
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("a Slurm job per trial run (at most 4 at once"), "{stderr}");
    assert!(stdout.contains("best checkpoint:"), "{stdout}");
    let exp = storage.join("tune-torch");
    let jobs = listed(&cluster, "nestor-tune-torch-");
    assert!(jobs.len() >= 3, "a job per trial run: {jobs:?}");
    for t in trials(&exp) {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}: {:?}", t.id, t.error);
        assert!(jobs.iter().any(|(_, name, state)| name.starts_with(&format!("nestor-tune-torch-{}-", t.id)) && state == "COMPLETED"));
        let log = read(&exp.join(format!("trials/{}/logs/rank-1.log", t.id)));
        assert!(log.contains("nestor: rank 1 of 2 on node"), "{log}");
    }
}

/// The same example with nothing shared between the driver and the nodes
/// (its directory hidden on both) and `storage_path="s3://..."`: the
/// pickled training function comes to the ranks from the driver, the two
/// DDP ranks of each job meet through it, their output and checkpoints go
/// through it, the best checkpoint is in the bucket, and `nestor status`
/// reads the sweep from the bucket in another directory.
#[test]
fn the_python_driver_runs_jobs_on_nodes_that_share_no_directory_with_it() {
    let hidden = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&elsewhere.path().join("s3"));
    let both = vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())];
    let cluster = cluster(2, 2, Options { hidden: both, ..Options::default() });
    let mut c = common::python::torch_python_cmd(
        hidden.path(),
        "examples/python/tune_torch.py",
        &[],
        &[
            ("EXAMPLE_SLURM_JOBS", "0.5".into()),
            ("EXAMPLE_SAMPLES", "2".into()),
            ("EXAMPLE_NAME", "unshared-torch".into()),
            ("EXAMPLE_STORAGE", "s3://bucket/runs".into()),
        ],
    );
    c.env("SLURM_CONF", cluster.conf()).envs(s3.env());
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("is not visible on node") && stderr.contains("ship checkpoints through it"), "{stderr}");
    assert!(stdout.contains("best checkpoint: s3://bucket/runs/unshared-torch/trials/"), "{stdout}");
    let jobs = listed(&cluster, "nestor-unshared-torch-");
    assert!(jobs.len() >= 2 && jobs.iter().all(|(_, _, s)| s == "COMPLETED"), "{jobs:?}");
    let status = ok(nestor_env(elsewhere.path(), &["status", "s3://bucket/runs/unshared-torch"], &s3.env()));
    assert_eq!(status.lines().filter(|l| l.starts_with("trial_") && l.contains(" TERMINATED ")).count(), 2, "{status}");
    // Each rank's lines came to the driver's logs; a 2-rank DDP run formed its group.
    let logs: Vec<std::path::PathBuf> = walk(hidden.path()).into_iter().filter(|p| p.ends_with("logs/rank-1.log")).collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    for log in logs {
        let text = read(&log);
        assert!(text.contains("nestor: rank 1 of 2 on node"), "{text}");
    }
    let results = ok(nestor_env(elsewhere.path(), &["export", "s3://bucket/runs/unshared-torch", "--format", "json"], &s3.env()));
    for line in results.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["workers"].as_f64(), Some(2.0), "not a DDP group of 2: {line}");
    }
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Promotion ASHA pauses trials at their rungs and promotes them later: a
/// paused trial holds no job, its promotion is a new job that resumes from
/// the rung's checkpoint, and the sweep decides exactly what the same sweep
/// decides inside one allocation.
#[test]
fn promotion_asha_across_jobs_decides_as_inside_one_allocation() {
    let cluster = cluster(2, 2, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let promotion =
        "\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"asha\"\nasha_type = \"promotion\"\nmax_t = 9\nreduction_factor = 3\n";
    let text = |name: &str, cluster: &str| {
        sweep(
            name,
            "num_samples = 6\nmax_concurrent_trials = 1\nseed = 4",
            "x = { uniform = [0.0, 1.0] }\nsteps = 9\nsleep_ms = 25\ncheckpoint = true",
            &format!("num_workers = 2\nresources_per_worker = {{ CPU = 1 }}\n{promotion}{cluster}"),
        )
    };
    write(dir.path(), &text("inside", ""));
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
        .arg(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    ok(out);
    let reference = outcome(&dir.path().join("runs/inside"));
    write(dir.path(), &text("jobs", &jobs_section("")));
    let out = run_cmd(&cluster, dir.path()).output().unwrap();
    let stdout = ok(out);
    assert!(stdout.contains("6 trials (6 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/jobs");
    assert_eq!(outcome(&exp), reference, "across jobs the sweep decided otherwise");
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let jobs = listed(&cluster, "nestor-jobs-");
    let mut promoted = 0;
    for t in grid.iter() {
        // A job per run: the first, and one per promotion after a pause.
        let mine = jobs.iter().filter(|(_, n, _)| n.starts_with(&format!("nestor-jobs-{}-", t.trial_id))).count();
        assert_eq!(mine as u32, 1 + t.resumes, "{}: {jobs:?}", t.trial_id);
        promoted += t.resumes;
    }
    assert!(promoted > 0, "no trial was paused and promoted");
    assert_histories_whole(&exp);
}

/// A node dies under a running trial's job: Slurm ends the job (its step
/// fails on the lost node, or the job ends NODE_FAIL), the run ends as the
/// cluster's doing, and the trial finishes in a new job on the node left,
/// from its checkpoint.
#[test]
fn a_node_failing_under_a_job_sends_the_trial_to_a_new_job_from_its_checkpoint() {
    let mut cluster = cluster(2, 2, Options { conf: "SlurmdTimeout=5".into(), ..Options::default() });
    let dir = tempfile::tempdir().unwrap();
    let text = sweep("nodefail", "num_samples = 1", "x = 0.5\nsteps = 16\nsleep_ms = 400\ncheckpoint = true", &two_ranks_checkpointing(""));
    write(dir.path(), &text);
    let exp = dir.path().join("runs/nodefail");
    let mut child = spawn_driver(&cluster, dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    wait_until("step 3 acknowledged", 60, &mut child, || rank0_says(&exp, "acked step 3"));
    let log = read(&exp.join("trials/trial_00000/logs/rank-0.log"));
    let node = log.lines().find_map(|l| l.strip_prefix("nestor: rank 0 of 2 on ")).unwrap().split(' ').next().unwrap().to_string();
    cluster.kill_node(&node);
    let stderr = went_on_in_a_new_job(child.wait_with_output().unwrap(), &exp, 16);
    assert!(stderr.contains(&node), "the lost node is not named: {stderr}");
}

/// Nodes that share no directory with the driver (its working and
/// experiment directories hidden on both), the experiment in an object
/// store: each job's output comes to the driver over the report channel
/// and its ranks ship their checkpoints through it. A job requeued by
/// Slurm goes on in a new job from the checkpoint its ranks fetch back
/// through the driver, and `nestor status s3://...` reads the sweep from
/// another directory.
#[test]
fn jobs_on_nodes_that_share_no_directory_send_output_and_checkpoints_through_the_driver() {
    let hidden = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&elsewhere.path().join("s3"));
    let both = vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())];
    let cluster = cluster(2, 2, Options { hidden: both, ..Options::default() });
    let work = hidden.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let local = hidden.path().join("local");
    let text = sweep(
        "unshared",
        &format!("num_samples = 1\nstorage = \"s3://bucket/runs\"\nlocal_dir = \"{}\"", local.display()),
        "x = 0.5\nsteps = 12\nsleep_ms = 400\ncheckpoint = true\ndump_env = true",
        &two_ranks_checkpointing(""),
    );
    write(&work, &text);
    let exp = local.join("unshared");
    let mut child = cluster
        .cmd(nestor_bin())
        .args(["run", "sweep.toml", "--plain"])
        .envs(s3.env())
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The ranks' lines reach the driver's logs while the job runs.
    wait_until("step 3 acknowledged", 90, &mut child, || rank0_says(&exp, "acked step 3"));
    let job = listed(&cluster, "nestor-unshared-").into_iter().find(|(_, _, s)| s == "RUNNING").expect("a running job").0;
    let out = cluster.run("scontrol", &["requeue", &job]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = went_on_in_a_new_job(child.wait_with_output().unwrap(), &exp, 12);
    assert!(
        stderr.contains(&format!("{} is not visible on node", exp.display())) && stderr.contains("ship checkpoints through it"),
        "{stderr}"
    );
    assert_eq!(listed(&cluster, "nestor-unshared-").len(), 2, "a new job for the rest");
    let logs = exp.join("trials/trial_00000/logs");
    let job_log = read(&logs.join("job.log"));
    assert_eq!(job_log.matches("the experiment's directory is not visible on node").count(), 2, "{job_log}");
    assert!(job_log.contains("nestor: the ranks' job step exited with code 0"), "the second job's last line: {job_log}");
    for r in 0..2 {
        let log = read(&logs.join(format!("rank-{r}.log")));
        assert_eq!(log.matches(&format!("nestor: rank {r} of 2 on node")).count(), 2, "rank {r} in both jobs: {log}");
        // It resumed from a copy fetched to its node, not from a path of the driver's.
        let resumed = log.lines().find(|l| l.starts_with("resumed from ")).unwrap_or_else(|| panic!("rank {r} never resumed: {log}"));
        assert!(!resumed.contains(&local.display().to_string()), "{resumed}");
    }
    // What the ranks wrote themselves stayed on their nodes.
    let trial = exp.join("trials/trial_00000");
    let here: Vec<String> = std::fs::read_dir(&trial).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!here.iter().any(|n| n.starts_with("rank-")), "{here:?}");
    // The latest checkpoint holds both ranks' shards, in the bucket; the sweep reads back from there alone.
    let latest = trials(&exp)[0].latest_checkpoint.clone().unwrap();
    assert_eq!((latest.ranks.clone(), latest.iteration), (vec![0, 1], 12), "{latest:?}");
    let status = ok(nestor_env(elsewhere.path(), &["status", "s3://bucket/runs/unshared"], &s3.env()));
    assert!(status.contains("trial_00000") && status.contains("TERMINATED"), "{status}");
}

/// `nestor submit` of a jobs-per-trial sweep: the job holds the driver
/// alone (one task) and, told before its time limit, stops the sweep (its
/// trials' jobs cancelled, their checkpoints kept) and submits a new job
/// of its own, which starts once it has ended and resumes the sweep: the
/// sweep outlives its first driver's time limit and ends whole.
#[test]
fn a_submitted_driver_hands_the_sweep_on_to_a_new_job_before_its_time_limit() {
    let cluster = cluster(2, 3, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(
        "handon",
        "num_samples = 1",
        // A minute of steps: more than the first driver's job holds.
        "x = { grid = [0.2, 0.7] }\nsteps = 150\nsleep_ms = 400\ncheckpoint = true",
        &two_ranks_checkpointing(""),
    );
    write(dir.path(), &text);
    let out = cluster
        .cmd(nestor_bin())
        .args(["submit", "sweep.toml", "--storage", "runs", "--time", "1", "--notice", "40"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = ok(out);
    let first = stdout.strip_prefix("Submitted job ").and_then(|r| r.split(':').next()).unwrap_or_else(|| panic!("{stdout}")).to_string();
    let exp = dir.path().join("runs/handon");
    // The sweep goes on through driver jobs until one of them ends it.
    let started = Instant::now();
    let drivers = loop {
        let drivers: Vec<(String, String, String)> =
            listed(&cluster, "nestor-handon").into_iter().filter(|(_, name, _)| name == "nestor-handon").collect();
        if drivers.len() > 1 && drivers.iter().all(|(_, _, s)| s != "PENDING" && s != "RUNNING" && s != "COMPLETING") {
            break drivers;
        }
        let done = drivers.len() == 1 && drivers[0].2 == "COMPLETED";
        assert!(!done && started.elapsed() < Duration::from_secs(480), "the sweep was not handed on: {drivers:?}\n{}", outputs(dir.path()));
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(drivers[0].0, first);
    assert!(drivers.iter().all(|(_, _, s)| s == "COMPLETED"), "{drivers:?}\n{}", outputs(dir.path()));
    let said = read(&dir.path().join(format!("runs/handon-{first}.out")));
    assert!(said.contains(&format!("nestor: job {first} nears its time limit; the sweep goes on in a new job")), "{said}");
    assert!(said.contains(&format!("nestor: the sweep goes on in job {}", drivers[1].0)), "{said}");
    // Every trial finished all its steps once, at least one of them resumed from a checkpoint in a later driver's job.
    let ts = trials(&exp);
    assert_eq!(ts.len(), 2);
    for t in &ts {
        assert_eq!((t.status, t.failures), (tuner::TrialStatus::Terminated, 0), "{}: {:?}", t.id, t.error);
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 150, "{}", t.id);
    }
    assert!(rank0_says(&exp, "resumed from"), "no trial went on from a checkpoint:\n{}", outputs(dir.path()));
    assert_histories_whole(&exp);
    let last = read(&dir.path().join(format!("runs/handon-{}.out", drivers.last().unwrap().0)));
    assert!(last.contains("2 trials (2 TERMINATED)"), "{last}");
}

/// The driver jobs' output files, for a failure's message.
fn outputs(dir: &Path) -> String {
    std::fs::read_dir(dir.join("runs"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
                .map(|e| format!("{}:\n{}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// A trial whose ranks hold GPUs, as a job of its own across two nodes:
/// each node's GPU sampler (started beside the node's first rank) sends the
/// run's share of the GPUs Slurm gave the job there, and the trial's
/// results carry both nodes' as one. This cluster's GPUs are files, so the
/// samplers read their compute processes from files the ranks write
/// (`NESTOR_GPU_READS`), each naming its own pid.
#[test]
fn a_jobs_gpu_figures_come_from_a_sampler_on_each_of_its_nodes() {
    let cluster = cluster(2, 2, Options { gpus: 1, ..Options::default() });
    let dir = tempfile::tempdir().unwrap();
    let reads = dir.path().join("gpu-reads");
    std::fs::create_dir(&reads).unwrap();
    let text = sweep(
        "gpus",
        "num_samples = 1",
        &format!("x = 0.5\nsteps = 6\nsleep_ms = 400\ndump_env = true\ngpu_reads = {:?}", reads.display().to_string()),
        &format!(
            "num_workers = 2\nuse_gpu = true\nplacement_strategy = \"STRICT_SPREAD\"\nresources_per_worker = {{ CPU = 1, GPU = 1 }}\n{}",
            jobs_section("")
        ),
    );
    write(dir.path(), &text);
    let out = run_cmd(&cluster, dir.path()).env("NESTOR_GPU_READS", &reads).env("NESTOR_GPU_PERIOD_MS", "150").output().unwrap();
    let stdout = ok(out);
    assert!(stdout.contains("1 TERMINATED"), "{stdout}");
    let exp = dir.path().join("runs/gpus");
    let t = &trials(&exp)[0];
    let m = &t.last_result.as_ref().unwrap().metrics;
    // Rank 0: 1 GiB at 20%, rank 1: 2 GiB at 60%, on a node each.
    let gib = f64::from(1u32 << 30);
    for (k, v) in [
        ("gpu_util_mean_percent", 40.0),
        ("gpu_util_peak_percent", 40.0),
        ("gpu_memory_mean_bytes", 3.0 * gib),
        ("gpu_memory_peak_bytes", 3.0 * gib),
    ] {
        assert!(m.get(k).is_some_and(|got| (got - v).abs() <= 1e-9 * v), "{k}, not {v}: {m:?}");
    }
    // The figures read as one line for people.
    let status = ok(cluster.cmd(nestor_bin()).args(["status"]).arg(&exp).output().unwrap());
    assert!(status.contains("utilisation mean 40% (peak 40%), memory mean 3.0 GiB (peak 3.0 GiB)"), "{status}");
}
