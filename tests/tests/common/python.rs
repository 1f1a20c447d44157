//! Python for the tests: the checkout, the cached environment with torch
//! (examples/torch_ddp/venv.sh: torch, grpcio, cloudpickle, pandas, and this
//! checkout's `nestor` package), scripts run in it with the cargo-built
//! binary, and what they print.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use super::{nestor, nestor_bin, ok, processes_mentioning, read, signal, wait_for, wait_for_run};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The cached environment with torch, whose `nestor` package is this
/// checkout's python/ (created on first use; several GB the first time).
pub fn torch_venv() -> &'static Path {
    // Once per test binary: the tests that use it run at once.
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let out = Command::new("bash").arg(repo().join("examples/torch_ddp/venv.sh")).output().expect("run venv.sh");
        assert!(out.status.success(), "examples/torch_ddp/venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `python SCRIPT ARGS` (a path in the repository) in the torch
/// environment, from `cwd`, with the cargo-built binary.
pub fn torch_python_cmd(cwd: &Path, script: &str, args: &[&str], env: &[(&str, String)]) -> Command {
    let mut c = Command::new(torch_venv().join("bin/python"));
    c.arg(repo().join(script))
        .args(args)
        .current_dir(cwd)
        .env("NESTOR_BIN", nestor_bin())
        .env("PYTHONPATH", repo().join("tests/py"))
        .envs(env.iter().map(|(k, v)| (*k, v)));
    c
}

/// [`torch_python_cmd`], run to its end.
pub fn torch_python(cwd: &Path, script: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    torch_python_cmd(cwd, script, args, env).output().expect("run the script")
}

/// `tests/py/<script> DIR ARGS` in a 2-node allocation of a Slurm cluster on
/// loopback (each node its own network), its trial's ranks spread one a
/// node (`PLACEMENT=STRICT_SPREAD`); its stdout, once it passed and said
/// it ran as a Slurm job.
pub fn on_two_slurm_nodes(script: &str, dir: &Path, args: &[&str]) -> String {
    let options = super::slurm::Options { networks: true, ..Default::default() };
    let cluster = super::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=3000"])
        .arg(torch_venv().join("bin/python"))
        .arg(repo().join("tests/py").join(script))
        .arg(dir)
        .args(args)
        .current_dir(dir)
        .env("NESTOR_BIN", nestor_bin())
        .env("PYTHONPATH", repo().join("tests/py"))
        .env("PLACEMENT", "STRICT_SPREAD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    assert!(stderr.contains("nestor: Slurm job "), "{stderr}");
    stdout
}

/// The script's stdout, after checking it succeeded.
pub fn passed(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the script failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The rest of the line of `out` that starts with `key`.
pub fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} line in:\n{out}")).trim()
}

/// `nestor export EXP --format trials`: a JSON object per trial.
pub fn trials(cwd: &Path, exp: &Path) -> Vec<serde_json::Value> {
    ok(nestor(cwd, &["export", exp.to_str().unwrap(), "--format", "trials"])).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The pid of the `nestor` binary a script's driver process started (its child).
pub fn nestor_child(driver: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{driver}/task/{driver}/children")).unwrap_or_default();
    children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|p| {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).split('\0').next().is_some_and(|a| a.ends_with("/nestor"))
    })
}

/// Starts a driver script (`cmd`), waits until its ranks have written `n`
/// lines to `acks` (one per acknowledged report), then SIGKILLs the driver
/// and its `nestor` binary at once and waits for every process mentioning
/// `dir` (the sweep's workers) to go. Returns the lines written by then.
pub fn kill_driver_midway(mut cmd: Command, acks: &Path, n: usize, dir: &Path) -> Vec<String> {
    let mut driver = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("start the script");
    wait_for_run(&format!("{n} acknowledged reports"), 90.0, &mut driver, || read(acks).lines().count() >= n);
    let binary = nestor_child(driver.id()).expect("the driver's nestor process");
    signal(driver.id(), libc::SIGKILL);
    signal(binary, libc::SIGKILL);
    let _ = driver.wait();
    wait_for("the killed sweep's workers to go", 10.0, || processes_mentioning(dir.to_str().unwrap()).is_empty());
    read(acks).lines().map(str::to_string).collect()
}

/// `trial iteration` lines, as a set.
pub fn trial_iterations(lines: &[String]) -> std::collections::BTreeSet<(String, u64)> {
    lines
        .iter()
        .map(|l| {
            let (t, i) = l.split_once(' ').unwrap();
            (t.to_string(), i.parse().unwrap())
        })
        .collect()
}
