//! Faults at random points: short sweeps of the deterministic fixture
//! worker, each with one fault injected at a seeded, logged point of its
//! progress (after a random number of stored results), then checked against
//! a fault-free run of the same sweep.
//!
//! Faults: SIGKILL of a rank, SIGSTOP of a rank (a hang), SIGKILL of the
//! driver (then `nestor resume`), the experiment's disk filling up (then
//! freed), the object store the checkpoints go to stopped mid-sweep and
//! started again on the same port, and a whole Slurm node killed (its
//! slurmd, step daemons and tasks) in a `--no-kill` allocation the
//! trials fill, on a 3-node test cluster; and that node's death followed a
//! moment later by the driver's SIGKILL, then `nestor resume` in the same
//! allocation, beside the job steps Slurm cannot end. With every trial a
//! Slurm job of its own (`slurm_jobs`, the driver outside any allocation,
//! on the same 3-node cluster): a running trial's job requeued by the
//! cluster (`scontrol requeue`, what preemption does), cancelled from
//! outside (`scancel`), its node killed, and the driver killed (then
//! `nestor resume`).
//!
//! Invariants, after each run (and at most one `nestor resume`):
//! - `finished`: the sweep ends with exit 0;
//! - `equal`: every trial's final state (status, iteration, loss, and the
//!   sum the checkpoints carry) equals the fault-free run's;
//! - `acked`: every result acknowledged to a rank before the fault is in the
//!   store as it was first stored (not redone after the fault);
//! - `clean`: no process of the experiment is left, and no job step of it
//!   (but those with a rank on a dead node, which Slurm lists until the job
//!   ends); with jobs of their own, no job of the sweep left in the queue;
//! - `named`: a failure the fault caused names the rank it hit (a sweep a
//!   full disk stopped says so, and how to go on).
//!
//! Used by `tests/chaos.rs` (a few runs, a new seed each time) and
//! `benches/chaos.rs` (`--runs N --seed S`, a table).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::slurm::{Options, SlurmCluster};
use super::{nestor_bin, now, processes_mentioning, signal, sweep, S3Server};

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL to one rank of a running trial.
    RankKill,
    /// SIGSTOP to one rank: it hangs until the hang timeout kills its group.
    RankStop,
    /// SIGKILL to the driver; then `nestor resume`.
    DriverKill,
    /// The experiment's disk fills up for a while; then `nestor resume` if the driver stopped.
    DiskFull,
    /// The object store goes away for a while and comes back on the same port.
    StoreRestart,
    /// A Slurm node dies with everything on it, mid-sweep, in a full allocation.
    NodeKill,
    /// A Slurm node dies, the driver is killed with SIGKILL a moment later,
    /// and `nestor resume` runs in the same allocation (as a batch script's
    /// next line would), beside the steps Slurm cannot end.
    NodeThenDriver,
    /// Trials as jobs of their own: a running one's job requeued by the cluster.
    JobRequeue,
    /// Trials as jobs of their own: a running one's job cancelled from outside.
    JobCancel,
    /// Trials as jobs of their own: a node under a running job dies.
    JobNodeKill,
    /// Trials as jobs of their own: the driver is killed; then `nestor resume`.
    JobDriverKill,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::RankKill,
        Fault::RankStop,
        Fault::DriverKill,
        Fault::DiskFull,
        Fault::StoreRestart,
        Fault::NodeKill,
        Fault::NodeThenDriver,
        Fault::JobRequeue,
        Fault::JobCancel,
        Fault::JobNodeKill,
        Fault::JobDriverKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::RankKill => "rank-kill",
            Fault::RankStop => "rank-stop",
            Fault::DriverKill => "driver-kill",
            Fault::DiskFull => "disk-full",
            Fault::StoreRestart => "store-restart",
            Fault::NodeKill => "node-kill",
            Fault::NodeThenDriver => "node-then-driver",
            Fault::JobRequeue => "job-requeue",
            Fault::JobCancel => "job-scancel",
            Fault::JobNodeKill => "job-node-kill",
            Fault::JobDriverKill => "job-driver-kill",
        }
    }

    /// Whether its sweep runs each trial as a Slurm job of its own.
    pub fn jobs(self) -> bool {
        matches!(self, Fault::JobRequeue | Fault::JobCancel | Fault::JobNodeKill | Fault::JobDriverKill)
    }

    pub fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// The invariants, in table order.
pub const INVARIANTS: [&str; 5] = ["finished", "equal", "acked", "clean", "named"];

/// What one run did and found.
#[derive(Debug)]
pub struct Outcome {
    pub run: usize,
    pub fault: Fault,
    /// Where it struck: after how many stored results, and at what.
    pub point: String,
    /// Per invariant: `None` held (or does not apply), `Some(why)` broken.
    pub broken: BTreeMap<&'static str, String>,
    /// Seconds from the fault to the next result stored after it.
    pub recovery_s: Option<f64>,
    /// Whether the run needed `nestor resume`.
    pub resumed: bool,
    /// Whether the fault came after the sweep's end (nothing was hit).
    pub missed: bool,
}

impl Outcome {
    pub fn held(&self) -> bool {
        self.broken.is_empty()
    }
}

/// Steps per trial and trials per sweep: short sweeps, many of them.
const STEPS: u64 = 8;
const TRIALS: usize = 4;

/// The sweep every run makes: 4 trials of 2 ranks, 8 steps each, a
/// checkpoint per step, FIFO (so its end does not depend on timing). On
/// the test cluster, each trial's ranks on two of the three nodes, three
/// trials at a time: the allocation is full.
fn sweep_text(name: &str, storage: &str, slurm: bool, jobs: bool) -> String {
    // A job of its own takes a while to start: its trial runs long enough to be hit while it runs.
    let sleep_ms = if jobs { 150 } else { 40 };
    let space = format!("x = {{ grid = [0.1, 0.35, 0.6, 0.85] }}\nsteps = {STEPS}\nsleep_ms = {sleep_ms}\ncheckpoint = true");
    let placement = if slurm {
        "resources_per_worker = { CPU = 1 }\nplacement_strategy = \"STRICT_SPREAD\""
    } else {
        "resources_per_worker = { CPU = 0.5 }"
    };
    // A job Slurm requeues shows as completing for seconds before it is back in the queue: a hang
    // timeout under that would call the requeue a hang.
    let hang_s = if jobs { 10.0 } else { 2.0 };
    let mut trainer =
        format!("num_workers = 2\n{placement}\n\n[checkpoint]\nfrequency = 1\n\n[failure]\nmax_failures = 3\nhang_timeout_s = {hang_s:.1}");
    if jobs {
        trainer.push_str("\n\n[cluster]\nbackend = \"slurm_jobs\"\n\n[cluster.jobs]\npoll_s = 0.5\nsignal_s = 0\n");
    }
    let at_once = if slurm { 3 } else { 2 };
    sweep(name, &format!("max_concurrent_trials = {at_once}\n{storage}"), &space, &trainer)
}

/// A trial's final state, as compared across runs.
#[derive(Debug, Clone, PartialEq)]
struct Final {
    status: String,
    iteration: u64,
    loss: f64,
    acc: f64,
}

fn finals(trials: &[serde_json::Value]) -> BTreeMap<String, Final> {
    trials
        .iter()
        .map(|t| {
            let m = &t["metrics"];
            let f = Final {
                status: t["status"].as_str().unwrap_or_default().to_string(),
                iteration: m["training_iteration"].as_u64().unwrap_or(0),
                loss: m["loss"].as_f64().unwrap_or(f64::NAN),
                acc: m["acc"].as_f64().unwrap_or(f64::NAN),
            };
            (t["trial_id"].as_str().unwrap_or_default().to_string(), f)
        })
        .collect()
}

/// `nestor export <exp> --format trials`, one JSON value per trial.
fn export(at: &Path, exp: &Path, env: &[(String, String)]) -> Result<Vec<serde_json::Value>, String> {
    let out = Command::new(nestor_bin())
        .args(["export", &exp.display().to_string(), "--format", "trials"])
        .envs(env.iter().cloned())
        .current_dir(at)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).map_err(|e| e.to_string())).collect()
}

/// Where a sweep's files go for a kind of fault, and what it needs running.
struct Place {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    s3: Option<S3Server>,
    disk: Option<PathBuf>,
    /// The test cluster the driver runs in (an allocation of all its nodes).
    cluster: Option<SlurmCluster>,
    /// Its nodes still up (a resume asks for an allocation of these).
    alive: usize,
    /// The one allocation the driver and its resume both run in (else each gets its own).
    job: Option<String>,
    /// Each trial a Slurm job of its own.
    jobs: bool,
}

impl Place {
    fn new(fault: Fault, name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (mut env, mut s3, mut disk) = (Vec::new(), None, None);
        let cluster = if fault.jobs() {
            // Ended jobs stay listed to be read; a job holds its CPUs' share of memory, not the node's.
            let conf = "MinJobAge=300\nDefMemPerCPU=200\nJobRequeue=1\nSlurmdTimeout=5".to_string();
            Some(SlurmCluster::start_with(3, 2, 2000, Options { networks: true, conf, ..Options::default() }))
        } else {
            matches!(fault, Fault::NodeKill | Fault::NodeThenDriver).then(|| SlurmCluster::start(3, 2, 2000))
        };
        let job = match (&cluster, fault) {
            (Some(c), Fault::NodeThenDriver) => {
                let out = c.run("salloc", &["--no-shell", "--no-kill", "-N3", "--ntasks-per-node=2", "--mem=1000"]);
                let said = String::from_utf8_lossy(&out.stderr).into_owned();
                let line = said.lines().find(|l| l.contains("Granted job allocation")).unwrap_or_else(|| panic!("salloc: {said}"));
                Some(line.rsplit(' ').next().unwrap_or_default().trim().to_string())
            }
            _ => None,
        };
        let storage = match fault {
            Fault::StoreRestart => {
                let server = S3Server::start(&dir.path().join("s3"));
                env = server.env();
                s3 = Some(server);
                "storage = \"s3://bucket/runs\"\nlocal_dir = \"local\"".to_string()
            }
            Fault::DiskFull => {
                let d = dir.path().join("disk");
                std::fs::create_dir_all(&d).unwrap();
                let out = Command::new("mount").args(["-t", "tmpfs", "-o", "size=24m", "nestor-chaos"]).arg(&d).output().unwrap();
                assert!(out.status.success(), "the disk-full fault mounts a tmpfs (run as root): {}", String::from_utf8_lossy(&out.stderr));
                let storage = format!("storage = \"{}\"", d.display());
                disk = Some(d);
                storage
            }
            _ => format!("storage = \"{}\"", dir.path().join("runs").display()),
        };
        super::write(dir.path(), &sweep_text(name, &storage, cluster.is_some(), fault.jobs()));
        Self { dir, env, s3, disk, cluster, alive: 3, job, jobs: fault.jobs() }
    }

    /// The experiment directory: where its store and logs are.
    fn exp(&self, name: &str) -> PathBuf {
        if self.s3.is_some() {
            self.dir.path().join("local").join(name)
        } else if let Some(d) = &self.disk {
            d.join(name)
        } else {
            self.dir.path().join("runs").join(name)
        }
    }

    /// Where trial logs are (local even when checkpoints go to the object store).
    fn trials(&self, name: &str) -> PathBuf {
        self.exp(name).join("trials")
    }

    fn spawn(&self, args: &[&str]) -> Child {
        let mut cmd = match &self.cluster {
            // Trials as jobs of their own: the driver outside any allocation, as on a login node.
            Some(c) if self.jobs => c.cmd(nestor_bin()),
            Some(c) if self.job.is_some() => {
                let mut cmd = c.cmd(nestor_bin());
                cmd.env("SLURM_JOB_ID", self.job.as_deref().unwrap_or_default());
                cmd
            }
            Some(c) => {
                let mut cmd = c.cmd("salloc");
                // Never waiting for nodes that are gone: an allocation now, or an error.
                cmd.args(["--no-kill", "--immediate=60", &format!("-N{}", self.alive), "--ntasks-per-node=2", "--mem=1000"])
                    .arg(nestor_bin());
                cmd
            }
            None => Command::new(nestor_bin()),
        };
        cmd.args(args)
            .envs(self.env.iter().cloned())
            .current_dir(self.dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(d) = &self.disk {
            let _ = Command::new("umount").arg("-l").arg(d).status();
        }
    }
}

/// Steps acknowledged so far, as the ranks 0 print them (at once, unlike
/// the files for people, which a writer thread appends a little later).
fn progress(trials: &Path) -> usize {
    acked(trials).len()
}

/// (trial, step) pairs rank 0 has been told are durable.
fn acked(trials: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(trials) else { return out };
    for e in entries.flatten() {
        let trial = e.file_name().to_string_lossy().into_owned();
        let log = std::fs::read_to_string(e.path().join("logs/rank-0.log")).unwrap_or_default();
        for step in log.lines().filter_map(|l| l.strip_prefix("rank 0: acked step ")).filter_map(|s| s.trim().parse().ok()) {
            out.push((trial.clone(), step));
        }
    }
    out
}

/// The ranks of the experiment now: (pid, rank, trial, Slurm node or "").
fn ranks(exp: &Path) -> Vec<(u32, u32, String, String)> {
    let needle = exp.display().to_string();
    let mut out: Vec<(u32, u32, String, String)> = processes_mentioning(&needle)
        .into_iter()
        .filter_map(|pid| {
            let env = super::environ_of(pid);
            let trial = super::plan_of(&env)["trial"]["id"].as_str()?.to_string();
            Some((pid, env.get("RANK")?.parse().ok()?, trial, env.get("SLURMD_NODENAME").cloned().unwrap_or_default()))
        })
        .collect();
    out.sort();
    out
}

/// The sweep's jobs Slurm lists as running: their ids.
fn running_jobs(cluster: &SlurmCluster) -> Vec<String> {
    listed_jobs(cluster).into_iter().filter(|(_, state)| state == "RUNNING").map(|(id, _)| id).collect()
}

/// The sweep's jobs still in the queue (anything but ended): `id state`.
fn queued_jobs(cluster: &SlurmCluster) -> Vec<String> {
    let ended = ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"];
    listed_jobs(cluster).into_iter().filter(|(_, state)| !ended.contains(&state.as_str())).map(|(id, s)| format!("{id} {s}")).collect()
}

/// The nestor jobs Slurm lists (ended ones too): (id, state).
fn listed_jobs(cluster: &SlurmCluster) -> Vec<(String, String)> {
    let out = cluster.run("squeue", &["--noheader", "--states=all", "--format=%i|%j|%T"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            let (id, name, state) = (f.next()?, f.next()?, f.next()?);
            name.starts_with("nestor-").then(|| (id.to_string(), state.to_string()))
        })
        .collect()
}

/// The trial whose ranks run in Slurm job `id`.
fn trial_of_job(exp: &Path, id: &str) -> Option<String> {
    processes_mentioning(&exp.display().to_string()).into_iter().find_map(|pid| {
        let env = super::environ_of(pid);
        (env.get("SLURM_JOB_ID")? == id).then(|| super::plan_of(&env)["trial"]["id"].as_str().map(str::to_string)).flatten()
    })
}

fn wait_output(child: Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// The fault-free run every run is compared with.
pub struct Reference {
    finals: BTreeMap<String, Final>,
}

impl Reference {
    pub fn take() -> Self {
        let place = Place::new(Fault::RankKill, "reference");
        let (ok, said) = wait_output(place.spawn(&["run", "sweep.toml", "--plain"]));
        assert!(ok, "the fault-free run failed: {said}");
        let trials = export(place.dir.path(), &place.exp("reference"), &place.env).unwrap();
        let finals = finals(&trials);
        assert_eq!(finals.len(), TRIALS);
        assert!(finals.values().all(|f| f.status == "TERMINATED" && f.iteration == STEPS), "{finals:?}");
        Self { finals }
    }
}

/// Runs one sweep with `fault` at a point drawn from `rng`.
pub fn run_one(n: usize, fault: Fault, reference: &Reference, rng: &mut impl Rng) -> Outcome {
    let name = format!("chaos-{n}");
    let mut place = Place::new(fault, &name);
    let exp = place.exp(&name);
    let trials_dir = place.trials(&name);
    let total = TRIALS * STEPS as usize;
    // After this many acknowledged steps, plus a little: mid-sweep, anywhere.
    let after = rng.random_range(1..total * 3 / 4);
    let jitter_ms = rng.random_range(0..40u64);
    let hold_ms = rng.random_range(200..1200u64);
    let victim_draw: u32 = rng.random();
    let mut broken = BTreeMap::new();
    let mut driver = place.spawn(&["run", "sweep.toml", "--plain"]);
    let started = Instant::now();
    while progress(&trials_dir) < after {
        if driver.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(60) {
            let (_, said) = wait_output(driver);
            broken.insert("finished", format!("the sweep ended before the fault point ({after} results): {said}"));
            return Outcome {
                run: n,
                fault,
                point: format!("after {after} steps"),
                broken,
                recovery_s: None,
                resumed: false,
                missed: true,
            };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if matches!(fault, Fault::JobRequeue | Fault::JobCancel | Fault::JobNodeKill) {
        // Jobs start and end between results: the fault waits for one running (the sweep's next, if none is).
        let cluster = place.cluster.as_ref().unwrap();
        let waited = Instant::now();
        while running_jobs(cluster).is_empty() && driver.try_wait().unwrap().is_none() && waited.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(jitter_ms));
    let acked_before = acked(&trials_dir);
    let ranks_before = ranks(&exp);
    let mut point = format!("after {after} steps +{jitter_ms} ms");
    let mut victim: Option<(u32, String)> = None;
    let mut dead_node: Option<String> = None;
    // The job a requeue or a scancel hit, and its trial.
    let mut hit_job: Option<(String, Option<String>)> = None;
    let fault_at = now();
    match fault {
        Fault::RankKill | Fault::RankStop => {
            let ranks = ranks(&exp);
            if let Some((pid, rank, trial, _)) = ranks.get(victim_draw as usize % ranks.len().max(1)) {
                signal(*pid, if fault == Fault::RankKill { libc::SIGKILL } else { libc::SIGSTOP });
                point.push_str(&format!(", {trial} rank {rank}"));
                victim = Some((*rank, trial.clone()));
            } else {
                point.push_str(", no rank running");
            }
        }
        Fault::DriverKill | Fault::JobDriverKill => signal(driver.id(), libc::SIGKILL),
        Fault::JobRequeue | Fault::JobCancel => {
            let running = place.cluster.as_ref().map(running_jobs).unwrap_or_default();
            match running.get(victim_draw as usize % running.len().max(1)) {
                Some(id) => {
                    let cluster = place.cluster.as_ref().unwrap();
                    let trial = trial_of_job(&exp, id);
                    let out =
                        if fault == Fault::JobRequeue { cluster.run("scontrol", &["requeue", id]) } else { cluster.run("scancel", &[id]) };
                    // A job whose ranks had all but ended (its last step acknowledged) was not hit running.
                    let at_end = trial.as_ref().is_some_and(|t| acked(&trials_dir).contains(&(t.clone(), STEPS)));
                    if out.status.success() && !at_end {
                        point.push_str(&format!(", job {id} ({})", trial.as_deref().unwrap_or("?")));
                        hit_job = Some((id.clone(), trial));
                    } else {
                        point.push_str(", no rank running");
                    }
                }
                None => point.push_str(", no rank running"),
            }
        }
        Fault::DiskFull => {
            let disk = place.disk.clone().unwrap_or_default();
            let filler = disk.join("filler");
            let _ =
                Command::new("dd").args(["if=/dev/zero", "bs=64k"]).arg(format!("of={}", filler.display())).stderr(Stdio::null()).status();
            std::thread::sleep(Duration::from_millis(hold_ms));
            let _ = std::fs::remove_file(&filler);
            point.push_str(&format!(", full for {hold_ms} ms"));
        }
        Fault::NodeKill | Fault::NodeThenDriver | Fault::JobNodeKill => {
            let mut nodes: Vec<String> = ranks(&exp).into_iter().map(|r| r.3).filter(|n| !n.is_empty()).collect();
            nodes.dedup();
            if let (Some(node), Some(cluster)) = (nodes.get(victim_draw as usize % nodes.len().max(1)), place.cluster.as_mut()) {
                cluster.kill_node(node);
                place.alive -= 1;
                point.push_str(&format!(", {node}"));
                dead_node = Some(node.clone());
                if fault == Fault::NodeThenDriver {
                    std::thread::sleep(Duration::from_millis(hold_ms * 2));
                    signal(driver.id(), libc::SIGKILL);
                    point.push_str(&format!(", the driver {} ms later", hold_ms * 2));
                }
            } else {
                point.push_str(", no rank running");
            }
        }
        Fault::StoreRestart => {
            if let Some(s3) = place.s3.as_mut() {
                let port = s3.port;
                s3.kill();
                std::thread::sleep(Duration::from_millis(hold_ms));
                *s3 = S3Server::start_on(&place.dir.path().join("s3"), port);
            }
            point.push_str(&format!(", gone for {hold_ms} ms"));
        }
    }
    // The trials the fault hit (a rank's; those with a rank on the dead node), and when one of them runs again.
    let hit: Vec<String> = match (&victim, &dead_node) {
        (Some((_, trial)), _) => vec![trial.clone()],
        _ if hit_job.is_some() => hit_job.iter().filter_map(|(_, t)| t.clone()).collect(),
        (_, Some(node)) => ranks_before.iter().filter(|r| &r.3 == node).map(|r| r.2.clone()).collect(),
        _ => Vec::new(),
    };
    let mut restarted_at = None;
    while driver.try_wait().unwrap().is_none() {
        if restarted_at.is_none() && ranks(&exp).iter().any(|r| hit.contains(&r.2) && !ranks_before.iter().any(|b| b.0 == r.0)) {
            restarted_at = Some(now());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (ok, mut said) = wait_output(driver);
    let missed =
        (matches!(fault, Fault::DriverKill | Fault::NodeThenDriver | Fault::JobDriverKill) && ok) || point.ends_with("no rank running");
    if missed {
        point.push_str(" (missed: the sweep had ended)");
    }
    let mut resumed = false;
    if !ok {
        // At most one resume, at once. Jobs of their own outlive their driver (the resume cancels them).
        if !place.jobs {
            if let Err(left) = wait_clean(&exp) {
                broken.insert("clean", format!("after the driver ended: {left}"));
            }
        }
        resumed = true;
        let (ok, again) = wait_output(place.spawn(&["resume", &exp.display().to_string(), "--plain"]));
        said.push_str("\n--- nestor resume\n");
        said.push_str(&again);
        if !ok {
            broken.insert("finished", format!("the resumed sweep failed: {}", tail(&again)));
        }
    }
    if let Err(left) = wait_clean(&exp) {
        broken.entry("clean").or_insert(left);
    }
    if let (Some(cluster), true) = (&place.cluster, place.jobs) {
        // No job of the sweep's left to start or run later (a requeued one above all).
        let deadline = Instant::now() + Duration::from_secs(10);
        let left = loop {
            let left = queued_jobs(cluster);
            if left.is_empty() || Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if !left.is_empty() {
            broken.entry("clean").or_insert(format!("jobs left in the queue: {left:?}"));
        }
    }
    if let Some((id, _)) = &hit_job {
        let named = if fault == Fault::JobRequeue {
            format!("Slurm put job {id} back in its queue")
        } else {
            format!("job {id} was cancelled outside nestor")
        };
        if !said.contains(&named) {
            let about: Vec<&str> = said.lines().filter(|l| l.contains(&format!("job {id}")) || l.contains("WARN")).collect();
            broken.insert("named", format!("no `{named}` in the output; it says: {}", about.join("\n")));
        }
    }
    if let (Some(node), true) = (&dead_node, place.jobs) {
        if !said.contains(node.as_str()) {
            broken.insert("named", format!("the lost node {node} is not named: {}", tail(&said)));
        }
    }
    if let (Some(cluster), false) = (&place.cluster, place.jobs) {
        // Steps with a rank on the dead node stay listed until the job ends (Slurm's way).
        let listed = cluster.run("squeue", &["-h", "-s", "-o", "%j %N"]);
        let left: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter(|l| {
                let (name, nodes) = l.split_once(' ').unwrap_or((l, ""));
                let on_dead = dead_node.as_ref().is_some_and(|d| trainer::expand_hostlist(nodes.trim()).unwrap_or_default().contains(d));
                name.starts_with("nestor-") && !on_dead
            })
            .map(str::to_string)
            .collect();
        if !left.is_empty() {
            broken.entry("clean").or_insert(format!("job steps left: {left:?}"));
        }
    }
    if let (Some(node), false) = (&dead_node, place.jobs) {
        if !said.contains(&format!("node {node} is set aside")) {
            broken.insert("named", format!("no `node {node} is set aside` in the output: {}", tail(&said)));
        }
        let others: Vec<&str> = said.lines().filter(|l| l.contains(" is set aside") && !l.contains(&format!("node {node} "))).collect();
        if !others.is_empty() {
            broken.insert("named", format!("a healthy node was set aside: {others:?}"));
        }
    }
    let trials = match export(place.dir.path(), &exp, &place.env) {
        Ok(t) => t,
        Err(e) => {
            broken.insert("equal", format!("export failed: {e}"));
            Vec::new()
        }
    };
    let got = finals(&trials);
    if !trials.is_empty() && got != reference.finals {
        let diff: Vec<String> = reference
            .finals
            .iter()
            .filter(|(id, f)| got.get(*id) != Some(f))
            .map(|(id, f)| format!("{id}: {:?} != {f:?}", got.get(id)))
            .collect();
        broken.insert("equal", diff.join("; "));
    }
    // Every result acknowledged before the fault is the one first stored.
    let stamp = |trial: &str, step: u64| -> Option<f64> {
        let t = trials.iter().find(|t| t["trial_id"] == trial)?;
        t["history"].as_array()?.iter().find(|h| h["training_iteration"] == step)?["timestamp"].as_f64()
    };
    let lost: Vec<String> = acked_before
        .iter()
        .filter(|(trial, step)| stamp(trial, *step).is_none_or(|t| t > fault_at))
        .map(|(trial, step)| format!("{trial} step {step}"))
        .collect();
    if !lost.is_empty() && !trials.is_empty() {
        broken.insert("acked", format!("acknowledged before the fault, then lost or redone: {}", lost.join(", ")));
    }
    if let Some((rank, trial)) = &victim {
        let named = match fault {
            Fault::RankKill => format!("{trial}: rank {rank} was killed by signal 9"),
            _ => format!("{trial}: hung: no report for 2 s"),
        };
        let named_rank = format!("waiting on rank {rank}");
        if fault == Fault::RankStop && said.contains(&named) && !said.contains(&named_rank) {
            broken.insert("named", format!("the hang does not name rank {rank}: {}", tail(&said)));
        }
        if !said.contains(&named) {
            broken.insert("named", format!("no `{named}` in the output: {}", tail(&said)));
        }
    }
    // A sweep the full disk stopped says so, and how to go on.
    if fault == Fault::DiskFull && resumed && !(said.contains("is full: the sweep stopped") && said.contains("nestor resume")) {
        broken.insert("named", format!("the stopped sweep does not say the disk is full: {}", tail(&said)));
    }
    // From the fault to the first result of a hit trial's new run (a rank's or a node's fault), or
    // to the sweep's first result after it (the driver, the disk, the store).
    let since = restarted_at.unwrap_or(fault_at);
    let recovery_s = trials
        .iter()
        .filter(|t| hit.is_empty() || hit.iter().any(|h| t["trial_id"] == h.as_str()))
        .filter_map(|t| t["history"].as_array())
        .flatten()
        .filter_map(|h| h["timestamp"].as_f64())
        .filter(|&t| t > since)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))))
        .map(|t| t - fault_at);
    Outcome { run: n, fault, point, broken, recovery_s, resumed, missed }
}

/// Waits (up to 5 s) until no process of the experiment is left.
fn wait_clean(exp: &Path) -> Result<(), String> {
    let needle = exp.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_mentioning(&needle);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let what: Vec<String> = left
                .iter()
                .map(|p| format!("{p} {}", std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default().replace('\0', " ")))
                .collect();
            for p in &left {
                signal(*p, libc::SIGKILL);
            }
            return Err(format!("processes left: {}", what.join("; ")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// Runs `runs` sweeps, the faults taken in turn from `kinds`, drawn from `seed`.
pub fn run_many(runs: usize, seed: u64, kinds: &[Fault], mut each: impl FnMut(&Outcome)) -> Vec<Outcome> {
    let reference = Reference::take();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..runs)
        .map(|n| {
            let o = run_one(n, kinds[n % kinds.len()], &reference, &mut rng);
            each(&o);
            o
        })
        .collect()
}

/// One line per run.
pub fn line(o: &Outcome) -> String {
    let verdicts: Vec<String> =
        INVARIANTS.iter().map(|i| if o.broken.contains_key(i) { format!("{i}:BROKEN") } else { format!("{i}:ok") }).collect();
    let rec = o.recovery_s.map_or("-".to_string(), |r| format!("{r:.2} s"));
    let mut s = format!(
        "run {:>3} {:<13} {:<55} {} recovery {rec}{}",
        o.run,
        o.fault.name(),
        o.point,
        verdicts.join(" "),
        if o.resumed { " (resumed)" } else { "" }
    );
    for (i, why) in &o.broken {
        s.push_str(&format!("\n    {i}: {why}"));
    }
    s
}

/// The summary table (Markdown): per fault kind, runs, invariants held, recovery.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::from("| fault | runs | missed | resumed | ");
    s.push_str(&INVARIANTS.join(" | "));
    s.push_str(" | recovery median | recovery max |\n|---|---|---|---|");
    s.push_str(&"---|".repeat(INVARIANTS.len()));
    s.push_str("---|---|\n");
    for kind in Fault::ALL {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.fault == kind).collect();
        if of.is_empty() {
            continue;
        }
        let held = |i: &str| format!("{}/{}", of.iter().filter(|o| !o.broken.contains_key(i)).count(), of.len());
        let mut rec: Vec<f64> = of.iter().filter_map(|o| o.recovery_s).collect();
        rec.sort_by(f64::total_cmp);
        let med = rec.get(rec.len() / 2).map_or("-".into(), |r| format!("{r:.2} s"));
        let max = rec.last().map_or("-".into(), |r| format!("{r:.2} s"));
        let count = |f: &dyn Fn(&Outcome) -> bool| of.iter().filter(|o| f(o)).count();
        s.push_str(&format!("| {} | {} | {} | {} | ", kind.name(), of.len(), count(&|o| o.missed), count(&|o| o.resumed)));
        s.push_str(&INVARIANTS.iter().map(|i| held(i)).collect::<Vec<_>>().join(" | "));
        s.push_str(&format!(" | {med} | {max} |\n"));
    }
    s
}
