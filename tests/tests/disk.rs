//! Reading an experiment where nothing can be written: `nestor status`,
//! `best` and `export` on a disk that is full, and on a read-only mount of
//! the experiment, give what they give on a healthy disk and change no
//! byte; once space is back, `nestor resume` finishes the sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A tmpfs of `mib` MiB mounted on `dir`, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, mib: u32) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "nestor-test"]).arg(dir).output().unwrap();
        assert!(out.status.success(), "these tests mount a tmpfs (run them as root): {}", String::from_utf8_lossy(&out.stderr));
        Self(dir.to_path_buf())
    }

    /// `from` again at `dir`, read-only.
    fn read_only(from: &Path, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("mount").args(args).output().unwrap();
            assert!(out.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["--bind", from.to_str().unwrap(), dir.to_str().unwrap()]);
        let m = Self(dir.to_path_buf());
        run(&["-o", "remount,ro,bind", dir.to_str().unwrap()]);
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every file below `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// What the reading commands print of the experiment at `exp`.
fn readings(at: &Path, exp: &str) -> Vec<String> {
    [vec!["status", exp], vec!["best", exp, "--json"], vec!["export", exp, "--format", "csv"], vec!["export", exp, "--format", "trials"]]
        .iter()
        .map(|args| {
            let out = nestor(at, args);
            assert!(out.status.success(), "nestor {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
            // Paths name the experiment where it was asked about, or where it ran (checkpoints).
            let root = std::fs::canonicalize(at).unwrap().display().to_string();
            String::from_utf8_lossy(&out.stdout).replace(&format!("{root}/disk/full"), "EXP").replace(&format!("{root}/ro/full"), "EXP")
        })
        .collect()
}

#[test]
fn reading_commands_work_on_a_full_disk_and_a_read_only_copy_and_resume_finishes_once_space_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Mount::tmpfs(&dir.path().join("disk"), 16);
    let space = "x = { uniform = [0.0, 1.0] }\nsteps = 4\nsleep_ms = 100\ncheckpoint = true";
    write(dir.path(), &sweep("full", "num_samples = 12\nseed = 3", space, ""));
    let mut run = spawn_nestor(dir.path(), &["run", "sweep.toml", "--storage", "disk", "--plain"], &[]);
    let exp = "disk/full";
    let trials = disk.0.join("full/trials");
    wait_for_run("three trials started", 60.0, &mut run, || trials.join("trial_00002/result.jsonl").exists());
    // Fill the disk to the last byte while the sweep runs.
    let filler = disk.0.join("filler");
    let fill = Command::new("dd").args(["if=/dev/zero", "bs=64k"]).arg(format!("of={}", filler.display())).output().unwrap();
    assert!(!fill.status.success(), "the disk did not fill");
    let out = run.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the sweep finished on a full disk: {said}");
    assert!(said.contains("No space left on device"), "{said}");
    assert!(said.contains("is full: the sweep stopped") && said.contains("nestor resume"), "{said}");
    eprintln!("the sweep on a full disk said:\n{said}");

    let before = contents(&disk.0.join("full"));
    let full = readings(dir.path(), exp);
    assert!(full[0].contains("TERMINATED"), "{}", full[0]);
    assert_eq!(contents(&disk.0.join("full")), before, "a reading command wrote into the experiment");

    // The same experiment mounted read-only reads the same.
    let ro = Mount::read_only(&disk.0.join("full"), &dir.path().join("ro/full"));
    assert_eq!(readings(dir.path(), "ro/full"), full, "read from a read-only mount");
    drop(ro);

    // With the space back: the same readings, and resume finishes the sweep.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(readings(dir.path(), exp), full, "read once space is back");
    ok(nestor(dir.path(), &["resume", exp, "--plain"]));
    // Every trial ran to its end; a trial whose worker could not write its checkpoint is ERROR.
    let after = readings(dir.path(), exp);
    let trials: Vec<serde_json::Value> = after[3].lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(trials.len(), 12, "{}", after[0]);
    for t in &trials {
        let status = t["status"].as_str().unwrap();
        assert!(status == "TERMINATED" || (status == "ERROR" && t["error"].as_str().unwrap().contains("exited")), "{t}");
        if status == "TERMINATED" {
            assert_eq!(t["history"].as_array().unwrap().len(), 4, "{t}");
        }
    }
}

#[test]
fn a_reading_command_on_a_running_sweep_neither_waits_for_nor_breaks_its_store() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("live", "num_samples = 4", "x = { uniform = [0.0, 1.0] }\nsteps = 6\nsleep_ms = 150", ""));
    let mut run = spawn_run(dir.path());
    let exp = dir.path().join("runs/live");
    wait_for_run("the first result", 30.0, &mut run, || exp.join("trials/trial_00000/result.jsonl").exists());
    // A running sweep holds the store: status shows its live progress, best says it is in use.
    let status = ok(nestor(dir.path(), &["status", "runs/live"]));
    assert!(status.contains("is running"), "{status}");
    let best = nestor(dir.path(), &["best", "runs/live"]);
    assert!(!best.status.success());
    assert!(String::from_utf8_lossy(&best.stderr).contains("in use by a running sweep"), "{}", String::from_utf8_lossy(&best.stderr));
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ok(nestor(dir.path(), &["status", "runs/live"])).contains("4 TERMINATED"));
}
