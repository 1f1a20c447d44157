//! nestor on a real Slurm cluster: a `slurmctld` and several `slurmd` on
//! loopback ports, started by each test (common/slurm.rs) and stopped after it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::slurm::{Options, SlurmCluster};
use trainer::SlurmAllocation;

/// Writes `dir/sweep.toml`: the fixture worker, each trial's 2 ranks one
/// per node (STRICT_SPREAD, a CPU each), with `extra` after `[trainer]`'s keys.
fn spanning_sweep(dir: &std::path::Path, name: &str, experiment: &str, space: &str, extra: &str) {
    let trainer = format!("num_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\nresources_per_worker = {{ CPU = 1 }}\n{extra}");
    common::write(dir, &common::sweep(name, experiment, space, &trainer));
}

/// `salloc -N2 --ntasks-per-node=2 --mem=1000 nestor run sweep.toml --storage runs --plain` in `dir`.
fn salloc_run(cluster: &SlurmCluster, dir: &std::path::Path) -> std::process::Command {
    let mut c = cluster.cmd("salloc");
    c.args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
        .arg(common::nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir);
    c
}

/// `salloc --no-kill -N3 --ntasks-per-node=2 --mem=1000 nestor run sweep.toml --storage runs --plain`
/// in `dir`, started with its output piped: an allocation that survives a node's loss.
fn salloc_no_kill_run(cluster: &SlurmCluster, dir: &std::path::Path) -> std::process::Child {
    cluster
        .cmd("salloc")
        .args(["--no-kill", "-N3", "--ntasks-per-node=2", "--mem=1000"])
        .arg(common::nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Inside an allocation, the job is read per node, from `scontrol` and from
/// the job's environment alike.
#[test]
fn an_allocation_is_read_per_node_from_scontrol_and_from_the_environment() {
    let cluster = SlurmCluster::start(2, 4, 4000);
    let script = "scontrol show job -d $SLURM_JOB_ID; echo ===; env";
    let out = cluster.run("salloc", &["-N2", "--ntasks-per-node=2", "--mem=1000", "bash", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "salloc: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let (shown, env) = stdout.split_once("===").unwrap();
    let vars: BTreeMap<String, String> =
        env.lines().filter_map(|l| l.split_once('=')).filter(|(k, _)| k.starts_with("SLURM_")).map(|(k, v)| (k.into(), v.into())).collect();
    let job = &vars["SLURM_JOB_ID"];
    let from_scontrol = SlurmAllocation::from_scontrol(job, shown).unwrap();
    let from_env = SlurmAllocation::from_vars(&vars).unwrap();
    for a in [&from_scontrol, &from_env] {
        assert_eq!(&a.job_id, job);
        let nodes: Vec<(&str, u32, Option<f64>)> = a.nodes.iter().map(|n| (n.name.as_str(), n.cpus, n.memory_bytes)).collect();
        assert_eq!(nodes, [("node1", 2, Some(1000.0 * 1048576.0)), ("node2", 2, Some(1000.0 * 1048576.0))], "{shown}");
    }
    // Uneven (Slurm fills the first node): each node's own count, the same both ways.
    let out = cluster.run("salloc", &["-N2", "-n4", "bash", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (shown, env) = stdout.split_once("===").unwrap();
    let vars: BTreeMap<String, String> =
        env.lines().filter_map(|l| l.split_once('=')).filter(|(k, _)| k.starts_with("SLURM_")).map(|(k, v)| (k.into(), v.into())).collect();
    let from_scontrol = SlurmAllocation::from_scontrol(&vars["SLURM_JOB_ID"], shown).unwrap();
    let cpus: Vec<u32> = from_scontrol.nodes.iter().map(|n| n.cpus).collect();
    assert_eq!(cpus.iter().sum::<u32>(), 4, "{shown}");
    assert!(cpus.iter().all(|&c| c >= 1), "{shown}");
    assert_eq!(cpus, SlurmAllocation::from_vars(&vars).unwrap().nodes.iter().map(|n| n.cpus).collect::<Vec<_>>(), "{env}");
}

/// `salloc -N2 nestor run sweep.toml`: each trial is a job step whose two
/// ranks (STRICT_SPREAD) run on different nodes, with their torchrun
/// variables, and report to the driver; the sweep ends as it would on one
/// machine. Each node has its own network namespace and address, so the
/// ranks report to the driver and meet each other across a network.
#[test]
fn inside_an_allocation_a_trials_ranks_run_as_one_step_across_the_nodes() {
    let cluster = SlurmCluster::start_with(2, 2, 2000, Options { networks: true, ..Options::default() });
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "spanning",
        "num_samples = 2\nmax_concurrent_trials = 2",
        "x = { grid = [0.2, 0.7] }\nsteps = 3\nsleep_ms = 50\ncheckpoint = true\ndump_env = true",
        "\n[checkpoint]\nfrequency = 1",
    );
    let out = salloc_run(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    assert!(stderr.contains("nestor: Slurm job ") && stderr.contains("2 node(s): node1 {CPU: 2"), "{stderr}");
    let exp = dir.path().join("runs/spanning");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let trials = store.trials().unwrap();
    assert_eq!(trials.len(), 4, "{stdout}");
    for t in &trials {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}: {:?}", t.id, t.error);
        let mut nodes = Vec::new();
        for rank in 0..2 {
            let (line, node) = rank_line(&exp, &t.id, rank, 2);
            assert!(line.contains(&format!("node rank {rank}, local rank 0")), "{line}");
            nodes.push(node);
        }
        assert_ne!(nodes[0], nodes[1], "{}: both ranks on {}", t.id, nodes[0]);
        // The record says where the ranks ran.
        let booked: Vec<&str> = t.resources.iter().map(|w| w.node.as_str()).collect();
        assert_eq!(booked, nodes.iter().map(String::as_str).collect::<Vec<_>>(), "{}", t.id);
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 3, "{}", t.id);
        // torchrun's variables with real values: rank 0's node's address, and the driver by its host name.
        for (dump, node) in rank_dumps(&exp, &t.id, 2) {
            assert_eq!(dump["SLURMD_NODENAME"].as_str(), Some(node.as_str()), "{}", t.id);
            assert_eq!(dump["MASTER_ADDR"].as_str().unwrap(), cluster.node_addr(&nodes[0]), "{}: {dump}", t.id);
            let report = dump["NESTOR_ADDR"].as_str().unwrap();
            assert!(!report.contains("127.0.0.1") && !report.contains("localhost"), "{}: {report}", t.id);
        }
    }
    if cluster.networked() {
        // The nodes' addresses are not loopback: the reports above crossed the bridge.
        assert!(!cluster.node_addr("node1").starts_with("127."));
        assert!(stderr.contains("nestor: Slurm job "), "{stderr}");
    }
    // `nestor status` says where each trial's ranks ran.
    drop(store);
    let status = common::ok(common::nestor(dir.path(), &["status", "runs/spanning"]));
    let nodes: Vec<&str> = status.lines().filter(|l| l.trim_start().starts_with("nodes: ")).collect();
    assert_eq!(nodes.len(), 4, "{status}");
    for l in nodes {
        assert!(l.contains("node1 (rank ") && l.contains("node2 (rank "), "{l}");
    }
}

/// The job's id from `salloc --no-shell`'s "Granted job allocation N".
fn granted(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("Granted job allocation")).unwrap_or_else(|| panic!("salloc: {stderr}"));
    line.rsplit(' ').next().unwrap().trim().to_string()
}

/// nestor's job steps of `job` still known to Slurm.
fn nestor_steps(cluster: &SlurmCluster, job: &str) -> Vec<String> {
    let out = cluster.run("squeue", &["-h", "-s", "-j", job, "-o", "%i %j"]);
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(" nestor-")).map(str::to_string).collect()
}

/// The driver killed with SIGKILL inside an allocation that goes on (as a
/// batch script's would): its trials' job steps end with it.
#[test]
fn a_driver_killed_with_sigkill_leaves_no_job_step_running() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let alloc = cluster.run("salloc", &["--no-shell", "-N2", "--ntasks-per-node=2", "--mem=1000"]);
    let job = granted(&alloc);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "killed",
        "num_samples = 1\nmax_concurrent_trials = 2",
        "x = { grid = [0.2, 0.7] }\nsteps = 1000\nsleep_ms = 100",
        "",
    );
    let mut driver = std::process::Command::new(common::nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .env("SLURM_CONF", cluster.conf())
        .env("SLURM_JOB_ID", &job)
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while nestor_steps(&cluster, &job).len() < 2 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the trials' steps never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    driver.kill().unwrap();
    driver.wait().unwrap();
    let killed = std::time::Instant::now();
    while !nestor_steps(&cluster, &job).is_empty() {
        assert!(killed.elapsed() < std::time::Duration::from_secs(20), "steps left: {:?}", nestor_steps(&cluster, &job));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The allocation itself is still there: the steps ended with the driver, not with the job. (A
    // controller busy with other tests' clusters may time a query out: asked again, not read as empty.)
    let asked = std::time::Instant::now();
    let jobs = loop {
        let out = cluster.run("squeue", &["-h", "-j", &job, "-o", "%T"]);
        if out.status.success() || asked.elapsed() > std::time::Duration::from_secs(20) {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(String::from_utf8_lossy(&jobs.stdout).trim(), "RUNNING", "{}", String::from_utf8_lossy(&jobs.stderr));
    let _ = cluster.run("scancel", &[&job]);
}

/// A rank killed on one node ends the whole step; the group restarts from
/// its latest checkpoint (a failure, counted) and ends where an
/// uninterrupted run ends, its state carried through.
#[test]
fn a_rank_killed_on_one_node_restarts_the_group_from_its_checkpoint() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "rankdies",
        "num_samples = 1",
        "x = 0.5\nsteps = 12\nsleep_ms = 100\ncheckpoint = true\ndump_env = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nmax_failures = 1",
    );
    let run = salloc_run(&cluster, dir.path()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let trial = dir.path().join("runs/rankdies/trials/trial_00000");
    // Once rank 1 is past step 3, kill it where it runs.
    let started = std::time::Instant::now();
    let pid = loop {
        let log = std::fs::read_to_string(trial.join("logs/rank-1.log")).unwrap_or_default();
        let dump = std::fs::read_to_string(trial.join("rank-1.json")).ok();
        if let (true, Some(dump)) = (log.contains("acked step 3"), dump) {
            let v: serde_json::Value = serde_json::from_str(&dump).unwrap();
            break v["pid"].as_u64().unwrap() as i32;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "rank 1 never got past step 3: {log}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("rank 1 (on node2) was killed (SIGKILL)"), "the failure names the rank and its node: {stderr}");
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/rankdies/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!((t.status, t.failures, t.restarts), (tuner::TrialStatus::Terminated, 1, 1), "{:?}", t.last_failure);
    let last = t.last_result.unwrap();
    assert_eq!(last.training_iteration, 12);
    // The same as a run never interrupted: the loss of step 12, and the sum of every step's (restored state).
    let loss = |k: u64| (0.5f64 - 0.3).powi(2) + 1.0 / k as f64;
    assert!((last.metrics["loss"] - loss(12)).abs() < 1e-9, "{:?}", last.metrics);
    let acc: f64 = (1..=12).map(loss).sum();
    assert!((last.metrics["acc"] - acc).abs() < 1e-9, "acc {} != {acc}", last.metrics["acc"]);
}

/// `nestor resume` inside the allocation after the driver was killed: a
/// step of the experiment still running in the job is cancelled first, and
/// the trial goes on from its checkpoint to its end.
#[test]
fn a_resume_in_the_job_cancels_the_experiments_leftover_steps_and_finishes_the_sweep() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let job = granted(&cluster.run("salloc", &["--no-shell", "-N2", "--ntasks-per-node=2", "--mem=1000"]));
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "resumed",
        "num_samples = 1",
        "x = 0.5\nsteps = 15\nsleep_ms = 100\ncheckpoint = true",
        "\n[checkpoint]\nfrequency = 1",
    );
    let nestor = |args: &[&str]| {
        let mut c = std::process::Command::new(common::nestor_bin());
        c.args(args).env("SLURM_CONF", cluster.conf()).env("SLURM_JOB_ID", &job).current_dir(dir.path());
        c
    };
    let mut driver = nestor(&["run", "sweep.toml", "--storage", "runs", "--plain"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let log = dir.path().join("runs/resumed/trials/trial_00000/logs/rank-0.log");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("acked step 4") {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the trial never got to step 4");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    driver.kill().unwrap();
    driver.wait().unwrap();
    // A step of this experiment that outlived its driver (as one whose srun was on another machine would),
    // holding every CPU of the allocation: the resume cancels it before it probes the nodes.
    let mut leftover = cluster
        .cmd("srun")
        .args([&format!("--jobid={job}"), "--job-name=nestor-resumed-trial_00000-0123abcd", "--exact", "-N2", "-n4", "--mem-per-cpu=100"])
        .args(["sleep", "300"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while nestor_steps(&cluster, &job).is_empty() {
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the leftover step never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = nestor(&["resume", "runs/resumed", "--plain"]).output().unwrap();
    let stdout = common::ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}");
    // The leftover was cancelled (its srun is gone), and nothing of nestor's runs in the job.
    let resumed = std::time::Instant::now();
    while leftover.try_wait().unwrap().is_none() {
        assert!(resumed.elapsed() < std::time::Duration::from_secs(10), "the leftover step still runs");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(nestor_steps(&cluster, &job).is_empty(), "{:?}", nestor_steps(&cluster, &job));
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/resumed/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!(t.status, tuner::TrialStatus::Terminated);
    let last = t.last_result.unwrap();
    assert_eq!(last.training_iteration, 15);
    let loss = |k: u64| (0.5f64 - 0.3).powi(2) + 1.0 / k as f64;
    let acc: f64 = (1..=15).map(loss).sum();
    assert!((last.metrics["acc"] - acc).abs() < 1e-9, "the state did not carry through the resume: {:?}", last.metrics);
    let _ = cluster.run("scancel", &[&job]);
}

/// A node that does not see the experiment's directory: the sweep is
/// refused before anything is written, naming the directory and the node.
#[test]
fn an_experiment_directory_a_node_cannot_see_is_refused_before_anything_runs() {
    let shared = tempfile::tempdir().unwrap();
    let cluster = SlurmCluster::start_with(2, 2, 2000, Options { hidden: vec![(1, shared.path().to_path_buf())], ..Options::default() });
    let dir = tempfile::tempdir().unwrap();
    common::write(
        dir.path(),
        &common::sweep("unseen", "num_samples = 1", "x = 0.5\nsteps = 2", "num_workers = 2\nresources_per_worker = { CPU = 1 }"),
    );
    let runs = shared.path().join("runs");
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
        .arg(common::nestor_bin())
        .args(["run", "sweep.toml", "--storage"])
        .arg(&runs)
        .arg("--plain")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{} is not visible on node2", runs.display()))
            && stderr.contains("a file system all nodes share")
            && stderr.contains("experiment.storage = \"s3://"),
        "{stderr}"
    );
    // Nothing of the experiment was written, and no probe file is left.
    let left: Vec<_> = std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A cluster whose nodes share no directory with the driver, checkpoints in
/// an object store: each rank ships its shard through the report channel
/// (the driver uploads it to the bucket), a rank killed on one node is
/// restarted, and both ranks fetch the shard they resume from through the
/// channel. The trial ends as an uninterrupted one; nothing of the shipping
/// is left on the driver.
#[test]
fn without_a_shared_directory_ranks_ship_their_checkpoints_through_the_driver() {
    let hidden = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s3 = common::S3Server::start(&dir.path().join("s3"));
    let options =
        Options { networks: true, hidden: vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())], ..Options::default() };
    let cluster = SlurmCluster::start_with(2, 2, 2000, options);
    let local = hidden.path().join("local");
    spanning_sweep(
        dir.path(),
        "shipped",
        &format!("num_samples = 1\nstorage = \"s3://bucket/runs\"\nlocal_dir = \"{}\"", local.display()),
        "x = 0.5\nsteps = 12\nsleep_ms = 100\ncheckpoint = true\ndump_env = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nmax_failures = 1",
    );
    let mut run = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
        .arg(common::nestor_bin())
        .args(["run", "sweep.toml", "--plain"])
        .envs(s3.env())
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let trial = local.join("shipped/trials/trial_00000");
    // Once rank 1 is past step 3, kill it where it runs (its environment names the trial's directory).
    let started = std::time::Instant::now();
    let victim = loop {
        let log = std::fs::read_to_string(trial.join("logs/rank-1.log")).unwrap_or_default();
        let pid = common::rank_pid(&trial, 1);
        if let (true, Some(pid)) = (log.contains("acked step 3"), pid) {
            break pid;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) || run.try_wait().unwrap().is_some() {
            let _ = run.kill();
            let out = run.wait_with_output().unwrap();
            panic!("rank 1 never got past step 3: {log}\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    common::signal(victim, libc::SIGKILL);
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("{} is not shared with node1, node2", local.join("shipped").display()))
            && stderr.contains("ranks ship checkpoints through the driver to s3://bucket/runs/shipped"),
        "{stderr}"
    );
    assert!(stderr.contains("rank 1 (on node2) was killed (SIGKILL)"), "{stderr}");
    let store = tuner::store::Store::open_existing(&local.join("shipped/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!((t.status, t.failures, t.restarts), (tuner::TrialStatus::Terminated, 1, 1), "{:?}", t.last_failure);
    let last = t.last_result.unwrap();
    assert_eq!(last.training_iteration, 12);
    // The state each rank resumed from came back whole: the same sum as a run never interrupted.
    let loss = |k: u64| (0.5f64 - 0.3).powi(2) + 1.0 / k as f64;
    let acc: f64 = (1..=12).map(loss).sum();
    assert!((last.metrics["acc"] - acc).abs() < 1e-9, "acc {} != {acc}", last.metrics["acc"]);
    // Both ranks resumed from a copy fetched to their node, not from a path of the driver's.
    for r in 0..2 {
        let log = std::fs::read_to_string(trial.join(format!("logs/rank-{r}.log"))).unwrap();
        let resumed = log.lines().find(|l| l.starts_with("resumed from ")).unwrap_or_else(|| panic!("rank {r} never resumed: {log}"));
        let from = resumed.trim_start_matches("resumed from ");
        assert!(from.contains(&format!("nestor-trial_00000-rank-{r}-")) && !from.starts_with(&local.display().to_string()), "{resumed}");
    }
    // Every committed checkpoint holds both ranks' shards, in the bucket.
    let latest = t.latest_checkpoint.unwrap();
    assert_eq!((latest.ranks.clone(), latest.iteration), (vec![0, 1], 12), "{latest:?}");
    let objects = s3.objects("runs/shipped/trials/trial_00000/checkpoint_000012");
    let names: Vec<&str> = objects.iter().map(|o| o.rsplit("checkpoint_000012/").next().unwrap()).collect();
    assert_eq!(names, vec![".committed", "rank-0/state.json", "rank-1/state.json"]);
    // The ranks wrote in their nodes' own directories: none of it is here, nor any staged upload.
    let here: Vec<String> = std::fs::read_dir(&trial).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!here.iter().any(|n| n.starts_with("rank-") || n.starts_with(".scratch") || n == ".incoming"), "{here:?}");
}

/// `nestor submit`: the batch script goes next to the experiment, sbatch
/// runs the sweep on whole nodes, and submitting again resumes it.
#[test]
fn submit_runs_the_sweep_as_a_batch_job_and_a_second_submit_resumes_it() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(dir.path(), "batch", "num_samples = 1", "x = { grid = [0.2, 0.7] }\nsteps = 4\nsleep_ms = 400", "");
    let submit = || {
        let mut seen_running = None;
        let out = std::process::Command::new(common::nestor_bin())
            .args(["submit", "sweep.toml", "--nodes", "2", "--storage", "runs", "--time", "10"])
            .env("SLURM_CONF", cluster.conf())
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stdout = common::ok(out);
        let job = stdout.strip_prefix("Submitted job ").and_then(|r| r.split(':').next()).unwrap_or_else(|| panic!("{stdout}")).to_string();
        assert!(stdout.contains(&format!("nestor status {}", dir.path().join("runs/batch").display())), "{stdout}");
        let started = std::time::Instant::now();
        loop {
            let q = cluster.run("squeue", &["-h", "-j", &job, "-o", "%T"]);
            if String::from_utf8_lossy(&q.stdout).trim().is_empty() {
                break;
            }
            // While the job runs, `nestor status` shows its running trials and their nodes.
            if seen_running.is_none() && dir.path().join("runs/batch/store").exists() {
                let out = common::nestor(dir.path(), &["status", "runs/batch"]);
                let status = String::from_utf8_lossy(&out.stdout).into_owned();
                if out.status.success() && status.contains("RUNNING") && status.contains("nodes: node1 (rank ") {
                    seen_running = Some(status);
                }
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "job {job} still queued or running");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        (std::fs::read_to_string(dir.path().join(format!("runs/batch-{job}.out"))).unwrap(), seen_running)
    };
    let (first, seen_running) = submit();
    assert!(first.contains("nestor: Slurm job ") && first.contains("2 trials (2 TERMINATED)"), "{first}");
    let running = seen_running.unwrap_or_else(|| panic!("`nestor status` never showed a running trial with its nodes:\n{first}"));
    assert!(running.contains("node2 (rank 1)"), "{running}");
    let script = std::fs::read_to_string(dir.path().join("runs/batch.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --nodes=2") && script.contains("# Submitted as: sbatch --job-name=nestor-batch"), "{script}");
    assert!(
        script.contains(" --time=10 ") && !script.contains("#SBATCH --time"),
        "options the user names are sbatch's arguments:\n{script}"
    );
    let status = common::ok(common::nestor(dir.path(), &["status", "runs/batch"]));
    assert_eq!(status.lines().filter(|l| l.contains("nodes: node1 (rank ") || l.contains("nodes: node2 (rank ")).count(), 2, "{status}");
    // Submitted again: the job resumes the finished experiment instead of refusing to overwrite it.
    let (second, _) = submit();
    assert!(second.contains("nestor: resuming ") && second.contains("2 trials (2 TERMINATED)"), "{second}");
}

/// `hang_timeout_s` across nodes: rank 1 (on node2) stops reporting and
/// ignores SIGTERM; the driver kills the whole step, names the rank it was
/// waiting on, and the group restarts from its checkpoint to the end.
#[test]
fn a_rank_hung_on_another_node_is_killed_with_its_step_and_the_trial_restarts() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "hung",
        "num_samples = 1",
        "x = 0.5\nsteps = 5\nsleep_ms = 50\ncheckpoint = true\nhang_at = 3\nfail_rank = 1\nignore_sigterm = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nmax_failures = 1\nhang_timeout_s = 1.0",
    );
    let out = salloc_run(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("trial_00000: hung: no report for 1 s (failure.hang_timeout_s) after iteration 2; waiting on rank 1"),
        "{stderr}"
    );
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/hung/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!((t.status, t.failures), (tuner::TrialStatus::Terminated, 1));
    assert!(t.last_failure.as_deref().unwrap_or_default().contains("hanging on purpose at step 3"), "{:?}", t.last_failure);
    assert_eq!(t.last_result.unwrap().training_iteration, 5);
    let jobs = cluster.run("squeue", &["-h", "-s", "-o", "%j"]);
    assert!(!String::from_utf8_lossy(&jobs.stdout).contains("nestor-"), "a step outlived the sweep");
}

/// A node goes down mid-trial (its slurmd, step daemons and tasks killed at
/// once) in an allocation that survives it (`salloc --no-kill`): the hung
/// step is killed, the node is set aside once Slurm cannot reach it, and
/// the trial finishes on the other nodes from its checkpoint. With the
/// default `[failure]` settings: a lost node is not the trial's failure.
#[test]
fn a_node_that_goes_down_is_set_aside_and_the_trial_finishes_on_the_others() {
    let mut cluster = SlurmCluster::start(3, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "nodedown",
        "num_samples = 1",
        "x = 0.5\nsteps = 15\nsleep_ms = 100\ncheckpoint = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nhang_timeout_s = 2.0",
    );
    let run = salloc_no_kill_run(&cluster, dir.path());
    let log = dir.path().join("runs/nodedown/trials/trial_00000/logs/rank-1.log");
    let started = std::time::Instant::now();
    let node = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("acked step 3") {
            let first = text.lines().next().unwrap();
            break first.split(" on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "rank 1 never got past step 3: {text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    cluster.kill_node(&node);
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains(&format!("node {node} is set aside for the rest of the sweep")), "{stderr}");
    assert!(stderr.contains(&format!("(on {node})")), "the hang names the lost node: {stderr}");
    assert!(stderr.contains("(infrastructure failure 1 of 5)"), "{stderr}");
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/nodedown/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!(t.status, tuner::TrialStatus::Terminated);
    assert_eq!((t.failures, t.infrastructure_failures), (0, 1), "{:?}", t.last_failure);
    assert!(t.last_failure.as_deref().unwrap_or_default().contains(&format!("node {node} was lost under rank")), "{:?}", t.last_failure);
    assert!(t.resources.iter().all(|w| w.node != node), "the last run used the lost node: {:?}", t.resources);
    let last = t.last_result.unwrap();
    assert_eq!(last.training_iteration, 15);
    let loss = |k: u64| (0.5f64 - 0.3).powi(2) + 1.0 / k as f64;
    let acc: f64 = (1..=15).map(loss).sum();
    assert!((last.metrics["acc"] - acc).abs() < 1e-9, "the state did not carry through: {:?}", last.metrics);
}

/// Each rank's `rank-<r>.json` (the fixture's `dump_env`) and the node its log says it ran on.
fn rank_dumps(exp: &std::path::Path, trial: &str, world: u32) -> Vec<(serde_json::Value, String)> {
    let dir = exp.join("trials").join(trial);
    (0..world)
        .map(|r| {
            let dump: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(format!("rank-{r}.json"))).unwrap()).unwrap();
            (dump, rank_line(exp, trial, r, world).1)
        })
        .collect()
}

/// Rank `r`'s first log line (`nestor: rank r of world on nodeX (...)`) and its node.
fn rank_line(exp: &std::path::Path, trial: &str, r: u32, world: u32) -> (String, String) {
    let log = std::fs::read_to_string(exp.join("trials").join(trial).join(format!("logs/rank-{r}.log"))).unwrap();
    let line = log.lines().find(|l| l.starts_with(&format!("nestor: rank {r} of {world} on "))).unwrap_or_else(|| panic!("{log}"));
    let node = line.split(" on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    (line.to_string(), node)
}

/// In an allocation with GPUs (GRES), a trial's step asks Slurm for its
/// ranks' GPUs: each rank gets its own, steps running side by side never
/// share one, and none waits for another's. A CPU-only trial's step asks for
/// none, so CPU trials run side by side too, seeing no GPU.
///
/// Each node's GPU sampler (`nestor gpu-sample`, started beside the node's
/// first rank) sends the run's share of the node's GPUs, and the trial's
/// results carry both nodes' as one. This cluster's GPUs are files, so the
/// samplers read their compute processes from files the ranks write
/// (`NESTOR_GPU_READS`), each naming its own pid: counting a node's own
/// step's processes, and no other's, is the sampler's.
#[test]
fn in_an_allocation_with_gpus_each_step_gets_its_ranks_gpus_from_slurm() {
    let cluster = SlurmCluster::start_with(2, 4, 4000, Options { gpus: 2, ..Options::default() });
    let alloc = cluster.run("salloc", &["--no-shell", "-N2", "--exclusive", "--gres=gpu:2", "--mem=0"]);
    let job = granted(&alloc);
    let dir = tempfile::tempdir().unwrap();
    let reads = dir.path().join("gpu-reads");
    std::fs::create_dir(&reads).unwrap();
    let run = |name: &str, gpu: u32| {
        let trainer = format!(
            "num_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\nuse_gpu = {}\nresources_per_worker = {{ CPU = 1, GPU = {gpu} }}",
            gpu > 0
        );
        let mut space = "x = { grid = [0.1, 0.2, 0.3, 0.4] }\nsteps = 4\nsleep_ms = 500\ndump_env = true".to_string();
        if gpu > 0 {
            space.push_str(&format!("\ngpu_reads = {:?}", reads.display().to_string()));
        }
        common::write(dir.path(), &common::sweep(name, "num_samples = 1\nmax_concurrent_trials = 4", &space, &trainer));
        let out = cluster
            .cmd(common::nestor_bin().to_str().unwrap())
            .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
            .env("SLURM_JOB_ID", &job)
            .env("NESTOR_GPU_READS", &reads)
            .env("NESTOR_GPU_PERIOD_MS", "150")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stdout = common::ok(out);
        assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
        let exp = dir.path().join("runs").join(name);
        let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
        let trials = store.trials().unwrap();
        for t in &trials {
            let m = &t.last_result.as_ref().unwrap().metrics;
            if gpu == 0 {
                assert!(!m.keys().any(|k| k.starts_with("gpu_")), "{}: GPU figures without a GPU: {m:?}", t.id);
                continue;
            }
            // Rank 0 (node 1): 1 GiB at 20%, rank 1 (node 2): 2 GiB at 60%, every read.
            let expected = [("gpu_util_mean_percent", 40.0), ("gpu_util_peak_percent", 40.0)];
            for (k, v) in expected
                .into_iter()
                .chain([("gpu_memory_mean_bytes", 3.0), ("gpu_memory_peak_bytes", 3.0)].map(|(k, g)| (k, g * f64::from(1u32 << 30))))
            {
                assert!(m.get(k).is_some_and(|got| (got - v).abs() <= 1e-9 * v), "{}'s {k}, not {v}: {m:?}", t.id);
            }
        }
        let ranks: Vec<(String, Vec<(serde_json::Value, String)>)> =
            trials.iter().map(|t| (t.id.clone(), rank_dumps(&exp, &t.id, 2))).collect();
        // The first wave starts into free resources side by side: none of its steps waits for another.
        // (A step started as soon as another ended may wait a moment while Slurm releases the ended one's.)
        let first_wave = if gpu > 0 { 2 } else { 4 };
        for t in &trials[..first_wave] {
            let log = std::fs::read_to_string(exp.join("trials").join(&t.id).join("logs/srun.log")).unwrap_or_default();
            assert!(!log.contains("step creation temporarily disabled"), "{}'s step waited for another's resources: {log}", t.id);
        }
        ranks
    };
    // Two trials at a time: each rank a GPU of its node, as Slurm picked it.
    let ranks = run("gpus", 1);
    let started = |d: &serde_json::Value| d["started_at"].as_f64().unwrap();
    let mut overlapped = 0;
    for (i, (a, ra)) in ranks.iter().enumerate() {
        let nodes: Vec<&str> = ra.iter().map(|(_, n)| n.as_str()).collect();
        assert!(nodes.contains(&"node1") && nodes.contains(&"node2"), "{a}: {nodes:?}");
        for (dump, node) in ra {
            let cvd = dump["CUDA_VISIBLE_DEVICES"].as_str().unwrap_or_else(|| panic!("{a} on {node}: {dump}"));
            assert!(cvd == "0" || cvd == "1", "{a} on {node}: CUDA_VISIBLE_DEVICES={cvd}");
        }
        // Runs of 4 x 500 ms that start less than 1.8 s apart ran side by side: their GPUs differ on each node.
        for (b, rb) in &ranks[i + 1..] {
            if (started(&ra[0].0) - started(&rb[0].0)).abs() < 1.8 {
                overlapped += 1;
                for (da, na) in ra {
                    for (db, nb) in rb {
                        if na == nb {
                            assert_ne!(da["CUDA_VISIBLE_DEVICES"], db["CUDA_VISIBLE_DEVICES"], "{a} and {b} share a GPU of {na}");
                        }
                    }
                }
            }
        }
    }
    assert!(overlapped >= 1, "the GPU trials ran one at a time: {ranks:?}");
    // CPU-only trials in the same allocation: no GPU, and four at a time.
    let ranks = run("cpus", 0);
    for (t, r) in &ranks {
        for (dump, node) in r {
            assert_eq!(dump["CUDA_VISIBLE_DEVICES"].as_str().unwrap_or(""), "", "{t} on {node}");
        }
    }
    let starts: Vec<f64> = ranks.iter().map(|(_, r)| started(&r[0].0)).collect();
    let spread = starts.iter().copied().fold(f64::MIN, f64::max) - starts.iter().copied().fold(f64::MAX, f64::min);
    assert!(spread < 1.8, "the CPU trials did not all run side by side: started {starts:?}");
    let _ = cluster.run("scancel", &[&job]);
}

/// Workers that cannot reach the driver say so, naming the address they
/// tried; a loopback report address, which would name each node itself, is
/// refused before anything runs.
#[test]
fn a_worker_that_cannot_reach_the_driver_names_the_address() {
    let cluster = SlurmCluster::start_with(2, 2, 2000, Options { networks: true, ..Options::default() });
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = 2";
    // Nothing listens on port 1 of the driver's machine.
    let host = String::from_utf8(std::process::Command::new("hostname").output().unwrap().stdout).unwrap().trim().to_string();
    spanning_sweep(dir.path(), "unreachable", "num_samples = 1", space, &format!("\n[cluster]\nreport_address = \"{host}:1\""));
    let out = salloc_run(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let exp = dir.path().join("runs/unreachable");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let trial = store.trials().unwrap().remove(0);
    assert_eq!(trial.status, tuner::TrialStatus::Error, "{stderr}");
    let error = trial.error.unwrap_or_default();
    assert!(error.contains("exited with code 1; last log lines ("), "{error}");
    let path = error.split_once("last log lines (").unwrap().1.split_once("):").unwrap().0;
    let log = std::fs::read_to_string(path).unwrap();
    assert!(log.contains(&format!("cannot reach the nestor driver at https://{host}:1: Connection refused")), "{log}");
    // 127.0.0.1 on a node is the node: refused, and nothing written.
    spanning_sweep(dir.path(), "loopback", "num_samples = 1", space, "\n[cluster]\nreport_address = \"127.0.0.1\"");
    let out = salloc_run(&cluster, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(stderr.contains("cluster.report_address = \"127.0.0.1\" is a loopback address"), "{stderr}");
    assert!(!dir.path().join("runs/loopback").exists(), "{stderr}");
}

/// A node dies mid-sweep in an allocation the trials fill, each trial's two
/// ranks on two nodes: Slurm holds the dead steps' CPUs on the nodes left
/// until it calls the node down. The restarts wait for them without that
/// counting as a hang, only the dead node is set aside, and every trial
/// ends TERMINATED with the default `[failure]` settings (a lost node is
/// not a trial's failure), on the two nodes left.
#[test]
fn a_node_lost_in_a_full_allocation_leaves_the_sweep_running_on_the_nodes_left() {
    let mut cluster = SlurmCluster::start(3, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "full",
        "",
        "x = { grid = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6] }\nsteps = 12\nsleep_ms = 100\ncheckpoint = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nhang_timeout_s = 3.0",
    );
    let started = std::time::Instant::now();
    let run = salloc_no_kill_run(&cluster, dir.path());
    // Three trials run, two ranks each: every CPU of the allocation is busy.
    let trials = dir.path().join("runs/full/trials");
    let busy = || {
        (0..3).all(|t| {
            std::fs::read_to_string(trials.join(format!("trial_{t:05}/logs/rank-1.log"))).unwrap_or_default().contains("acked step 3")
        })
    };
    while !busy() {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "the first three trials never got going");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cluster.kill_node("node2");
    let killed = std::time::Instant::now();
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = common::ok(out);
    eprintln!("the sweep ended {:.1} s after the node was killed\n{stderr}", killed.elapsed().as_secs_f64());
    assert!(stdout.contains("6 trials (6 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("node node2 is set aside for the rest of the sweep"), "{stderr}");
    for healthy in ["node1", "node3"] {
        assert!(!stderr.contains(&format!("node {healthy} is set aside")), "a healthy node was set aside: {stderr}");
    }
    assert!(!stderr.contains("stopping the sweep"), "{stderr}");
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/full/store")).unwrap();
    for t in store.trials().unwrap() {
        assert_eq!((t.status, t.failures), (tuner::TrialStatus::Terminated, 0), "{}: {:?}", t.id, t.last_failure);
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 12, "{}", t.id);
    }
    // Steps with a rank on the dead node stay listed until the job ends (Slurm's way); no other is left.
    let jobs = cluster.run("squeue", &["-h", "-s", "-o", "%j %N"]);
    let left: Vec<String> = String::from_utf8_lossy(&jobs.stdout)
        .lines()
        .filter(|l| {
            let (name, nodes) = l.split_once(' ').unwrap_or((l, ""));
            name.starts_with("nestor-") && !trainer::expand_hostlist(nodes.trim()).unwrap_or_default().contains(&"node2".to_string())
        })
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "steps outlived the sweep: {left:?}");
}

/// A job step the cluster refuses to create (here each rank asks for more
/// CPUs than the job holds on a node, as declared `[resources]` can make
/// it) is an infrastructure failure named with srun's words: not charged
/// to `max_failures`, each refused run's end paced so the restarts do not
/// go at once, and the trial ERROR once `max_infrastructure_failures` is spent.
#[test]
fn a_step_the_cluster_refuses_is_named_paced_and_not_the_trials_failure() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    let trainer =
        "num_workers = 2\nresources_per_worker = { CPU = 3 }\n\n[failure]\nmax_infrastructure_failures = 2\n\n[resources]\nCPU = 4";
    common::write(dir.path(), &common::sweep("refused", "num_samples = 1", "x = 0.5\nsteps = 3", trainer));
    let started = std::time::Instant::now();
    let out = salloc_run(&cluster, dir.path()).output().unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("1 trial (1 ERROR)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("the cluster would not start the job step on"), "{stderr}");
    assert!(stderr.contains("(infrastructure failure 2 of 2)"), "{stderr}");
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/refused/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!((t.failures, t.infrastructure_failures), (0, 3), "{:?}", t.error);
    let error = t.error.unwrap();
    assert!(error.contains("Unable to create step") && error.contains("no node of it is down"), "{error}");
    // Three refused runs, each one's end paced by 2 s.
    assert!(took >= std::time::Duration::from_secs(6), "the refused runs went at once: {took:?}");
}

/// A node dies in a full `--no-kill` allocation and the driver is killed
/// seconds later; `nestor resume` in the same job finishes the sweep on
/// the nodes left. The steps that had a rank on the dead node cannot end
/// (Slurm lists them until the job ends, holding their CPUs and memory on
/// the live nodes too): the resume leaves what they hold alone.
#[test]
fn a_resume_after_a_node_loss_and_a_driver_kill_finishes_in_the_same_allocation() {
    let mut cluster = SlurmCluster::start(3, 2, 2000);
    let job = granted(&cluster.run("salloc", &["--no-shell", "--no-kill", "-N3", "--ntasks-per-node=2", "--mem=1000"]));
    let dir = tempfile::tempdir().unwrap();
    spanning_sweep(
        dir.path(),
        "twice",
        "",
        "x = { grid = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6] }\nsteps = 12\nsleep_ms = 100\ncheckpoint = true",
        "\n[checkpoint]\nfrequency = 1\n\n[failure]\nhang_timeout_s = 3.0",
    );
    let conf = cluster.conf().to_path_buf();
    let nestor = |args: &[&str]| {
        let mut c = std::process::Command::new(common::nestor_bin());
        c.args(args).env("SLURM_CONF", &conf).env("SLURM_JOB_ID", &job).current_dir(dir.path());
        c
    };
    let mut driver = nestor(&["run", "sweep.toml", "--storage", "runs", "--plain"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let trials = dir.path().join("runs/twice/trials");
    let busy = || {
        (0..3).all(|t| {
            std::fs::read_to_string(trials.join(format!("trial_{t:05}/logs/rank-1.log"))).unwrap_or_default().contains("acked step 3")
        })
    };
    let started = std::time::Instant::now();
    while !busy() {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "the first three trials never got going");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cluster.kill_node("node2");
    std::thread::sleep(std::time::Duration::from_secs(2));
    driver.kill().unwrap();
    driver.wait().unwrap();
    let out = nestor(&["resume", "runs/twice", "--plain"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let listed = cluster.run("squeue", &["-h", "-s", "-j", &job, "-o", "%i %j %N"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("6 trials (6 TERMINATED)"),
        "{stdout}\n{stderr}\nsteps: {}",
        String::from_utf8_lossy(&listed.stdout)
    );
    assert!(stderr.contains("node node2 is set aside"), "{stderr}");
    for healthy in ["node1", "node3"] {
        assert!(!stderr.contains(&format!("node {healthy} is set aside")), "a healthy node was set aside: {stderr}");
    }
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/twice/store")).unwrap();
    for t in store.trials().unwrap() {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}: {:?}", t.id, t.last_failure);
        assert_eq!(t.last_result.as_ref().unwrap().training_iteration, 12, "{}", t.id);
        assert!(t.resources.iter().all(|w| w.node != "node2"), "{}'s last run used the lost node: {:?}", t.id, t.resources);
    }
    let _ = cluster.run("scancel", &[&job]);
}

/// The state reader for trials that run as Slurm jobs of their own: one
/// `squeue` call reads every job of an experiment (and no other's), each
/// ended job says how it ended, and readings sooner than the interval
/// reuse the last one.
#[test]
fn the_job_watch_reads_an_experiments_jobs_in_one_call_and_says_how_each_ended() {
    use trainer::{SlurmJobEnd, SlurmJobState, SlurmJobWatch};
    let cluster = SlurmCluster::start(1, 2, 2000);
    let submit = |name: &str, script: &str| {
        let out =
            cluster.run("sbatch", &["--parsable", &format!("--job-name={name}"), "--mem=100", "--output=/dev/null", "--wrap", script]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap().to_string()
    };
    let ok = submit("nestor-exp-trial_00000-aa", "true");
    let failed = submit("nestor-exp-trial_00001-bb", "exit 3");
    let running = submit("nestor-exp-trial_00002-cc", "sleep 60");
    let other = submit("nestor-other-trial_00000-dd", "sleep 60");
    // An experiment whose name extends this one's, and a driver's own job.
    let longer = submit("nestor-exp-x-trial_00000-ee", "sleep 60");
    let driver = submit("nestor-exp", "sleep 60");
    let conf = cluster.conf().display().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut watch = SlurmJobWatch::new("nestor-exp-", std::time::Duration::ZERO).env("SLURM_CONF", conf.clone());
    let started = std::time::Instant::now();
    let jobs = loop {
        let jobs = rt.block_on(watch.jobs()).unwrap().clone();
        let state = |id: &str| jobs.get(id).map(|j| j.state.clone());
        if state(&ok) == Some(SlurmJobState::Completed)
            && state(&failed) == Some(SlurmJobState::Failed)
            && state(&running) == Some(SlurmJobState::Running)
        {
            break jobs;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the jobs never got there: {jobs:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    for not_ours in [&other, &longer, &driver] {
        assert!(!jobs.contains_key(not_ours), "another experiment's job was read: {jobs:?}");
    }
    assert_eq!(jobs[&ok].state.end(), Some(SlurmJobEnd::Done));
    assert_eq!(jobs[&failed].state.end(), Some(SlurmJobEnd::Failed));
    assert_eq!(jobs[&running].state.end(), None, "a running job has not ended");
    assert_eq!(jobs[&running].nodes, "node1");
    cluster.run("scancel", &[&running]);
    let started = std::time::Instant::now();
    while rt.block_on(watch.jobs()).unwrap().get(&running).map(|j| j.state.clone()) != Some(SlurmJobState::Cancelled) {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "scancel was never seen");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Paced: within the interval, a reading is the last one, and squeue is not called.
    let mut paced = SlurmJobWatch::new("nestor-exp-", std::time::Duration::from_secs(3600)).env("SLURM_CONF", conf);
    let first = rt.block_on(paced.jobs()).unwrap().clone();
    for _ in 0..4 {
        assert_eq!(rt.block_on(paced.jobs()).unwrap(), &first);
    }
    assert_eq!(paced.calls(), 1);
    cluster.run("scancel", &[&other]);
}

/// A step whose nodes are busy with a step the sweep does not know of (a
/// stuck one, someone else's) waits a bounded time, then counts as a step
/// the cluster would not start: placed again, then failed naming why.
/// Never an endless wait.
#[test]
fn a_step_that_cannot_start_within_its_bound_is_a_placement_failure_not_an_endless_wait() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    let dir = tempfile::tempdir().unwrap();
    // Each rank asks for 900 MB of its node's 1000; half of the second node's is held by a step nestor does not know of.
    let trainer = "num_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\nresources_per_worker = { CPU = 1, memory = 900000000 }\n\n\
                   [failure]\nmax_infrastructure_failures = 1\n\n[cluster]\nstep_start_timeout_s = 3";
    common::write(dir.path(), &common::sweep("busy", "num_samples = 1", "x = 0.5\nsteps = 2", trainer));
    // Inside the allocation, a step of its own holds memory of the second node before nestor starts.
    let script = format!(
        "srun -w \"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | tail -1)\" -N1 -n1 -c1 --mem=500 --exact sleep 120 & sleep 2; \
         {} run sweep.toml --storage runs --plain; rc=$?; kill %1; exit $rc",
        common::nestor_bin().display()
    );
    let started = std::time::Instant::now();
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=1000", "bash", "-c", &script])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let store = tuner::store::Store::open_existing(&dir.path().join("runs/busy/store")).unwrap();
    let t = store.trial("trial_00000").unwrap().unwrap();
    assert_eq!(t.status, tuner::TrialStatus::Error, "{stderr}");
    let error = t.error.unwrap_or_default();
    assert!(error.contains("the cluster would not start the job step on"), "{error}");
    assert!(error.contains("srun had not started every rank after 3 s, waiting for the step's resources"), "{error}");
    assert_eq!(t.infrastructure_failures, 2, "placed again once, then failed");
    assert!(took < std::time::Duration::from_secs(60), "the sweep took {took:?}");
}

/// On nodes without GRES, GPUs declared in `[resources]` are the pool's:
/// ranks sharing them (`GPU = 0.5`) get the pool's indices, and each step's
/// GPU samplers count their own ranks' processes on a GPU that another
/// trial's ranks use at the same time, not that trial's. (The GPUs' compute
/// processes come from files the ranks write, `NESTOR_GPU_READS`.)
#[test]
fn trials_sharing_a_declared_gpu_each_get_their_own_ranks_figures() {
    let cluster = SlurmCluster::start(2, 4, 2000);
    let dir = tempfile::tempdir().unwrap();
    let reads = dir.path().join("gpu-reads");
    std::fs::create_dir(&reads).unwrap();
    let space =
        format!("x = {{ grid = [0.1, 0.2] }}\nsteps = 6\nsleep_ms = 400\ndump_env = true\ngpu_reads = {:?}", reads.display().to_string());
    let trainer = "num_workers = 2\nplacement_strategy = \"STRICT_SPREAD\"\nuse_gpu = true\nresources_per_worker = { CPU = 1, GPU = 0.5 }\n\n[resources]\nCPU = 4\nGPU = 1";
    common::write(dir.path(), &common::sweep("shared", "num_samples = 1\nmax_concurrent_trials = 2", &space, trainer));
    let out = salloc_run(&cluster, dir.path()).env("NESTOR_GPU_READS", &reads).env("NESTOR_GPU_PERIOD_MS", "150").output().unwrap();
    let stdout = common::ok(out);
    assert!(stdout.contains("2 trials (2 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/shared");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let trials = store.trials().unwrap();
    let dumps: Vec<_> = trials.iter().map(|t| rank_dumps(&exp, &t.id, 2)).collect();
    // Side by side, on GPU 0 of each node both.
    let started = |d: &Vec<(serde_json::Value, String)>| d[0].0["started_at"].as_f64().unwrap();
    assert!((started(&dumps[0]) - started(&dumps[1])).abs() < 1.5, "the two trials did not share the GPUs at once");
    for d in &dumps {
        for (dump, node) in d {
            assert_eq!(dump["CUDA_VISIBLE_DEVICES"].as_str(), Some("0"), "on {node}: {dump}");
        }
    }
    let gib = f64::from(1u32 << 30);
    for t in &trials {
        let m = &t.last_result.as_ref().unwrap().metrics;
        // Its rank 0: 1 GiB at 20%, its rank 1: 2 GiB at 60%; the other trial's on the same GPUs not counted.
        for (k, v) in [
            ("gpu_util_mean_percent", 40.0),
            ("gpu_util_peak_percent", 40.0),
            ("gpu_memory_mean_bytes", 3.0 * gib),
            ("gpu_memory_peak_bytes", 3.0 * gib),
        ] {
            assert!(m.get(k).is_some_and(|got| (got - v).abs() <= 1e-9 * v), "{}'s {k}, not {v}: {m:?}", t.id);
        }
    }
}
