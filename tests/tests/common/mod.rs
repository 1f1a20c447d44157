//! Helpers for whole-binary tests: the `nestor` binary, the fixture worker,
//! experiment files in temporary directories.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// Processes whose environment names `needle` (e.g. a temp dir), other than us.
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
        if !zombie && String::from_utf8_lossy(&environ).contains(needle) {
            out.push(pid);
        }
    }
    out
}
