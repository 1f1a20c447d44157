//! Helpers for whole-binary tests: the `nestor` binary, the fixture worker,
//! experiment files in temporary directories.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod chaos;
pub mod data;
pub mod python;
pub mod slurm;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fixture worker built from this package.
pub fn worker() -> &'static str {
    env!("CARGO_BIN_EXE_fixture-worker")
}

/// The `nestor` binary, built beside the fixture worker.
pub fn nestor_bin() -> PathBuf {
    let p = Path::new(worker()).with_file_name("nestor");
    assert!(p.exists(), "{} is missing: build the workspace (cargo test --workspace builds it)", p.display());
    p
}

/// The fixture worker's config for a backend conformance case: the last
/// rank fails or hangs (ignoring SIGTERM) as the case says.
pub fn conformance_config(case: &trainer::conformance::Case) -> serde_json::Value {
    use trainer::conformance::Behaviour;
    let last = case.world_size - 1;
    let mut config = serde_json::json!({ "x": 0.5, "steps": case.steps, "sleep_ms": case.step_ms, "fail_rank": last });
    match case.behaviour {
        Behaviour::Complete => {}
        Behaviour::FailAt(s) => config["fail_at"] = s.into(),
        Behaviour::HangAt(s) => {
            config["hang_at"] = s.into();
            config["ignore_sigterm"] = true.into();
        }
    }
    config
}

/// Installs Debian's `packages` once (as root, with apt-get), unless `file` exists already.
pub fn apt_install(file: &str, packages: &[&str], why: &str) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if Path::new(file).exists() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "{why}: install {} (apt-get install {})", packages.join(", "), packages.join(" "));
    let apt = |args: &[&str]| {
        let out = Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").output().expect("run apt-get");
        assert!(out.status.success(), "apt-get {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    apt(&["update", "-q"]);
    let mut install = vec!["install", "-y", "-q"];
    install.extend_from_slice(packages);
    apt(&install);
}

/// Runs nestor in `dir`.
pub fn nestor(dir: &Path, args: &[&str]) -> Output {
    Command::new(nestor_bin()).args(args).current_dir(dir).output().expect("run nestor")
}

/// Starts `nestor run sweep.toml --storage runs --plain` in `dir`, output captured.
pub fn spawn_run(dir: &Path) -> std::process::Child {
    Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nestor")
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: sending a signal to a child process of this test.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Asserts success and returns stdout.
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "nestor failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An experiment file running the fixture worker with `space` lines.
pub fn sweep(name: &str, extra_experiment: &str, space: &str, extra: &str) -> String {
    format!(
        r#"[experiment]
name = "{name}"
metric = "loss"
mode = "min"
{extra_experiment}

[space]
{space}

[trainer]
command = ["{}"]
grace_period_s = 1.0
{extra}
"#,
        worker()
    )
}

/// Writes `text` to `dir/sweep.toml`.
pub fn write(dir: &Path, text: &str) {
    std::fs::write(dir.join("sweep.toml"), text).unwrap();
}

/// `nestor export DIR --format json`, parsed.
pub fn export(dir: &Path, exp: &str) -> Vec<serde_json::Value> {
    ok(nestor(dir, &["export", exp, "--format", "json"])).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Processes whose environment names `needle` (e.g. a temp dir), or whose
/// stdout or stderr is a file whose path does (a rank's log: a rank forked
/// from a warm process has the warm process's environment in `/proc`, its
/// own only in its memory), other than us.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == std::process::id() {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        let logs_there = [1, 2].iter().any(|fd| output_of(pid, *fd).is_some_and(|p| p.contains(needle)));
        if !zombie && (String::from_utf8_lossy(&environ).contains(needle) || logs_there) {
            out.push(pid);
        }
    }
    out
}

/// Where a process's file descriptor `fd` points (a path, `pipe:[..]`, ...).
fn output_of(pid: u32, fd: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok().map(|p| p.display().to_string())
}

/// A process's parent.
fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok())
}

/// Runs nestor in `dir` with extra environment variables.
pub fn nestor_env(dir: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    Command::new(nestor_bin()).args(args).envs(env.iter().cloned()).current_dir(dir).output().expect("run nestor")
}

/// Starts nestor in `dir` with `args` and extra environment variables, output captured.
pub fn spawn_nestor(dir: &Path, args: &[&str], env: &[(String, String)]) -> std::process::Child {
    Command::new(nestor_bin())
        .args(args)
        .envs(env.iter().cloned())
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nestor")
}

/// Polls `cond` every 5 ms until it holds; panics with `what` after `secs`.
pub fn wait_for(what: &str, secs: f64, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// As [`wait_for`], while `run` (a driver started with its output piped)
/// works: if it exits first, panics at once with its status and output, so a
/// failed sweep says why instead of timing out.
pub fn wait_for_run(what: &str, secs: f64, run: &mut std::process::Child, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    while !cond() {
        if let Ok(Some(status)) = run.try_wait() {
            let (mut out, mut err) = (String::new(), String::new());
            if let Some(mut o) = run.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut o, &mut out);
            }
            if let Some(mut e) = run.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the run ended ({status}) before {what}\n--- stdout\n{out}\n--- stderr\n{err}");
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// A file's text, empty when it does not exist (yet).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// An S3-compatible server (the `s3-server` binary of this package) on a
/// loopback port, serving `root` (bucket `bucket`); stopped on drop.
pub struct S3Server {
    child: Option<std::process::Child>,
    /// Its port.
    pub port: u16,
    /// The directory it serves; `root/bucket` is the bucket.
    pub root: PathBuf,
}

impl S3Server {
    /// Starts a server on a free port.
    pub fn start(root: &Path) -> Self {
        Self::start_on(root, 0)
    }

    /// Starts a server on `port` (0: a free one).
    pub fn start_on(root: &Path, port: u16) -> Self {
        use std::io::BufRead;
        std::fs::create_dir_all(root.join("bucket")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_s3-server"))
            .arg(root)
            .arg(port.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start s3-server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening on ").and_then(|p| p.parse().ok()).expect("s3-server prints its port");
        Self { child: Some(child), port, root: root.to_path_buf() }
    }

    /// The environment that points object_store's S3 client at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "nestor".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "nestor-secret".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The files (objects) under `prefix` of the bucket, relative to it, sorted.
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let base = self.root.join("bucket");
        let mut out = Vec::new();
        let mut stack = vec![base.join(prefix)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.push(e.path().strip_prefix(&base).unwrap().display().to_string());
                }
            }
        }
        out.sort();
        out
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment of process `pid` (empty when it is gone or not readable).
pub fn environ_of(pid: u32) -> std::collections::BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    String::from_utf8_lossy(&raw).split('\0').filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect()
}

/// The run's plan a rank process was started with (`NESTOR_RUN`), or null.
pub fn plan_of(env: &std::collections::BTreeMap<String, String>) -> serde_json::Value {
    env.get("NESTOR_RUN").and_then(|p| serde_json::from_str(p).ok()).unwrap_or_default()
}

/// The pid of the worker process of `rank` whose run's plan names
/// `trial_dir` (started with it), or whose stdout is its log there (forked
/// from a warm process): the rank itself, not a process it started.
pub fn rank_pid(trial_dir: &Path, rank: u32) -> Option<u32> {
    let dir = trial_dir.display().to_string();
    let log = trial_dir.join(format!("logs/rank-{rank}.log")).display().to_string();
    let found: Vec<u32> = processes_mentioning(&dir)
        .into_iter()
        .filter(|&pid| {
            let env = environ_of(pid);
            let started = plan_of(&env)["trial"]["dir"] == dir.as_str() && env.get("RANK") == Some(&rank.to_string());
            started || output_of(pid, 1).is_some_and(|p| p == log)
        })
        .collect();
    found.iter().copied().find(|pid| parent_of(*pid).is_none_or(|p| !found.contains(&p)))
}

/// Per trial: status, iterations of its effective history, its last loss.
pub type Outcome = std::collections::BTreeMap<String, (String, Vec<u64>, String)>;

/// What a sweep decided, trial by trial: compared between runs of the same sweep.
pub fn outcome(exp: &Path) -> Outcome {
    let grid = tuner::ResultGrid::load(exp).unwrap();
    grid.iter()
        .map(|t| {
            let its = t.history.iter().map(|r| r.training_iteration).collect();
            let loss = t.metrics.as_ref().map(|m| format!("{:.12}", m["loss"])).unwrap_or_default();
            (t.trial_id.clone(), (t.status.as_str().to_string(), its, loss))
        })
        .collect()
}
