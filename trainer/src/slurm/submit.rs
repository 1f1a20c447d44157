//! `nestor submit`: a sweep as a Slurm batch job, in one of two shapes.
//!
//! - The sweep inside the job ([`Shape::Nodes`]): the script asks for whole
//!   nodes (the sweep places its trials' ranks on them itself), survives a
//!   node going down (`--no-kill`: the node is set aside and the sweep goes
//!   on), gets SIGTERM two minutes before its time limit (nestor then stops
//!   its trials so they resume later); submitting again continues the sweep.
//! - The driver alone ([`Shape::Driver`], for `[cluster] backend =
//!   "slurm_jobs"`: the trials are jobs of their own): one task, asked back
//!   into the queue by Slurm after a node failure or preemption
//!   (`--requeue`), and, warned before its time limit (`B:USR1`), it stops
//!   the sweep (the trials' jobs are cancelled, their trials go on from
//!   their checkpoints) and submits its own successor, which starts once it
//!   has ended (`--dependency=singleton`, the same name) and resumes: the
//!   sweep outlives any one job's limit.
//!
//! Either script runs `nestor resume` when the experiment has a store
//! already, else `nestor run`.

use std::path::{Path, PathBuf};

use super::SlurmError;

/// A sweep to submit as a batch job.
#[derive(Debug, Clone)]
pub struct BatchJob {
    /// The experiment's name (the job's is `nestor-<name>`).
    pub name: String,
    /// The experiment's directory (absolute): resumed when it has a store.
    pub exp_dir: PathBuf,
    /// The experiment's URL when its storage is an object store
    /// (`s3://bucket/prefix/<name>`): a driver's job resumes from it when
    /// the bucket holds it (it may start on a node that has no copy).
    pub url: Option<String>,
    /// The experiment file to run (absolute), and its `--set`s.
    pub file: PathBuf,
    /// `--set KEY=VALUE` overrides for `nestor run`.
    pub sets: Vec<String>,
    /// What the job holds.
    pub shape: Shape,
    /// Seconds before its time limit the job is told (the sweep stops, or
    /// a driver's job hands it on).
    pub notice_s: u32,
    /// The partition.
    pub partition: Option<String>,
    /// The time limit, in Slurm's form.
    pub time: Option<String>,
    /// More `#SBATCH` options, as given.
    pub sbatch_args: Vec<String>,
    /// Where the job's output file goes (`<name>-<job id>.out`).
    pub output_dir: PathBuf,
    /// The directory the job starts in.
    pub cwd: PathBuf,
    /// The `nestor` binary the job runs.
    pub nestor: PathBuf,
}

/// What a submitted job holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// Whole nodes, the sweep's trials run on them.
    Nodes {
        /// Nodes to ask for.
        nodes: u32,
        /// GPUs per node to ask for.
        gpus_per_node: Option<u32>,
    },
    /// The driver alone, one task; its trials are Slurm jobs of their own.
    Driver {
        /// CPUs for the driver.
        cpus: u32,
    },
}

/// A word as the shell reads it back unchanged.
pub(super) fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn quoted(p: &Path) -> String {
    sh_quote(&p.display().to_string())
}

/// Refuses a control character (a newline above all: it would end an
/// option or a command) in `value`, naming `what` it is.
pub fn refuse_control(what: &str, value: &str) -> Result<(), SlurmError> {
    match value.chars().find(|c| c.is_control()) {
        Some(c) => Err(SlurmError(format!("{what}: control characters ({:?}) are not allowed in {value:?}", c.to_string()))),
        None => Ok(()),
    }
}

impl BatchJob {
    /// Refuses, by name, what would change the meaning of the script or of
    /// sbatch's arguments: a control character in a name, path or option.
    pub fn check(&self) -> Result<(), SlurmError> {
        refuse_control("experiment.name", &self.name)?;
        for (what, p) in [
            ("the experiment's directory", &self.exp_dir),
            ("the experiment file", &self.file),
            ("the output directory", &self.output_dir),
            ("the working directory", &self.cwd),
            ("the nestor binary", &self.nestor),
        ] {
            let text = p.to_str().ok_or_else(|| SlurmError(format!("{what}: {} is not UTF-8", p.display())))?;
            refuse_control(what, text)?;
        }
        if let Some(url) = &self.url {
            refuse_control("the experiment's URL", url)?;
        }
        for s in &self.sets {
            refuse_control("--set", s)?;
        }
        if let Some(p) = &self.partition {
            refuse_control("--partition", p)?;
        }
        if let Some(t) = &self.time {
            refuse_control("--time", t)?;
        }
        for a in &self.sbatch_args {
            refuse_control("--sbatch", a)?;
        }
        Ok(())
    }

    /// The options given to `sbatch` as its arguments (never written into
    /// the script's `#SBATCH` lines, where a shell would read them): the
    /// job's name, output file, partition, time limit and the user's own.
    pub fn sbatch_options(&self) -> Vec<String> {
        let output = self.output_dir.join(format!("{}-%j.out", self.name));
        let mut options = vec![format!("--job-name=nestor-{}", self.name), format!("--output={}", output.display())];
        options.extend(self.partition.iter().map(|p| format!("--partition={p}")));
        options.extend(self.time.iter().map(|t| format!("--time={t}")));
        options.extend(self.sbatch_args.iter().cloned());
        options
    }

    /// The batch script. Its `#SBATCH` lines are nestor's own, of numbers
    /// only; what a user named comes as [`BatchJob::sbatch_options`].
    pub fn script(&self) -> String {
        let options: Vec<String> = self.sbatch_options().iter().map(|o| sh_quote(o)).collect();
        let mut lines = vec!["#!/bin/bash".to_string(), format!("# Submitted as: sbatch {} <this script>", options.join(" "))];
        match &self.shape {
            Shape::Nodes { nodes, gpus_per_node } => {
                lines.extend([
                    format!("#SBATCH --nodes={nodes}"),
                    // Whole nodes: the sweep places its trials' ranks on them itself.
                    "#SBATCH --exclusive".to_string(),
                    "#SBATCH --mem=0".to_string(),
                    // A node that goes down is set aside and the sweep goes on with the others.
                    "#SBATCH --no-kill".to_string(),
                    // Time limit: SIGTERM before it, and nestor stops its trials so they resume later.
                    format!("#SBATCH --signal=B:TERM@{}", self.notice_s),
                ]);
                if let Some(g) = gpus_per_node {
                    lines.push(format!("#SBATCH --gpus-per-node={g}"));
                }
            }
            Shape::Driver { cpus } => lines.extend([
                "#SBATCH --nodes=1".to_string(),
                "#SBATCH --ntasks=1".to_string(),
                format!("#SBATCH --cpus-per-task={cpus}"),
                // Requeued after a node failure or preemption, it resumes.
                "#SBATCH --requeue".to_string(),
                "#SBATCH --open-mode=append".to_string(),
                // Before its time limit, the script (not the driver) is told, and hands the sweep on.
                format!("#SBATCH --signal=B:USR1@{}", self.notice_s),
            ]),
        }
        let sets: String = self.sets.iter().map(|s| format!(" --set {}", sh_quote(s))).collect();
        let nestor = quoted(&self.nestor);
        let exp = quoted(&self.exp_dir);
        let (started, resume) = match (&self.shape, &self.url) {
            (Shape::Driver { .. }, Some(url)) => {
                (format!("{nestor} status {} >/dev/null 2>&1", sh_quote(url)), format!("{nestor} resume {} --plain", sh_quote(url)))
            }
            _ => (format!("[ -d {exp}/store ]"), format!("{nestor} resume {exp} --plain")),
        };
        let run = format!("{nestor} run {}{sets} --plain", quoted(&self.file));
        lines.push(String::new());
        lines.push(format!("cd {}", quoted(&self.cwd)));
        match &self.shape {
            Shape::Nodes { .. } => lines.extend([
                format!("if {started}; then"),
                format!("    exec {resume}"),
                "else".into(),
                format!("    exec {run}"),
                "fi".into(),
            ]),
            Shape::Driver { .. } => {
                let script = quoted(&self.output_dir.join(format!("{}.sbatch", self.name)));
                lines.extend([
                    "# Near the time limit: the driver stops the sweep (its trials go on from their checkpoints),".to_string(),
                    "# and a new job of the same name, started once this one has ended, resumes it.".to_string(),
                    "hand_on() {".to_string(),
                    "    echo \"nestor: job $SLURM_JOB_ID nears its time limit; the sweep goes on in a new job\"".to_string(),
                    "    kill -TERM \"$driver\"".to_string(),
                    "    wait \"$driver\"".to_string(),
                    "    rc=$?".to_string(),
                    // 130: it stopped the sweep; 143: the TERM came before it could (it was starting).
                    "    if [ \"$rc\" = 130 ] || [ \"$rc\" = 143 ]; then".to_string(),
                    format!("        next=$(sbatch --parsable --dependency=singleton {} {script}) || exit 1", options.join(" ")),
                    "        echo \"nestor: the sweep goes on in job ${next%%;*}\"".to_string(),
                    "        exit 0".to_string(),
                    "    fi".to_string(),
                    "    exit \"$rc\"".to_string(),
                    "}".to_string(),
                    "trap hand_on USR1".to_string(),
                    format!("if {started}; then"),
                    format!("    {resume} &"),
                    "else".into(),
                    format!("    {run} &"),
                    "fi".into(),
                    "driver=$!".into(),
                    // `wait` returns early when the notice comes; the trap then ends the script.
                    "wait \"$driver\"".into(),
                    "exit $?".into(),
                ]);
            }
        }
        lines.join("\n") + "\n"
    }

    /// Writes the script to `<output_dir>/<name>.sbatch` and submits it;
    /// returns the job's id and the script's path.
    pub fn submit(&self) -> Result<(String, PathBuf), SlurmError> {
        self.check()?;
        std::fs::create_dir_all(&self.output_dir).map_err(|e| SlurmError(format!("{}: {e}", self.output_dir.display())))?;
        let path = self.output_dir.join(format!("{}.sbatch", self.name));
        std::fs::write(&path, self.script()).map_err(|e| SlurmError(format!("{}: {e}", path.display())))?;
        let out = std::process::Command::new("sbatch")
            .arg("--parsable")
            .args(self.sbatch_options())
            .arg(&path)
            .output()
            .map_err(|e| SlurmError(format!("cannot run sbatch (is this a Slurm cluster's login node?): {e}")))?;
        if !out.status.success() {
            return Err(SlurmError(format!("sbatch {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim())));
        }
        let id = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or_default().to_string();
        Ok((id, path))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_script_resumes_an_experiment_with_a_store_and_quotes_what_the_shell_would_split() {
        let job = BatchJob {
            name: "my sweep".into(),
            exp_dir: "/runs/my sweep".into(),
            url: None,
            file: "/home/u/sweep.toml".into(),
            sets: vec!["experiment.num_samples=8".into(), "trainer.command=['python', 'x.py']".into()],
            shape: Shape::Nodes { nodes: 2, gpus_per_node: Some(4) },
            notice_s: 120,
            partition: Some("gpu".into()),
            time: Some("1:00:00".into()),
            sbatch_args: vec!["--account=ml".into()],
            output_dir: "/runs".into(),
            cwd: "/home/u".into(),
            nestor: "/opt/nestor".into(),
        };
        let s = job.script();
        assert_eq!(
            job.sbatch_options(),
            ["--job-name=nestor-my sweep", "--output=/runs/my sweep-%j.out", "--partition=gpu", "--time=1:00:00", "--account=ml"]
        );
        assert!(s.lines().all(|l| !l.starts_with("#SBATCH") || l.chars().all(|c| c.is_ascii_alphanumeric() || "#-=:@ ".contains(c))));
        for line in [
            "# Submitted as: sbatch '--job-name=nestor-my sweep' '--output=/runs/my sweep-%j.out' --partition=gpu --time=1:00:00 --account=ml <this script>",
            "#SBATCH --nodes=2",
            "#SBATCH --no-kill",
            "#SBATCH --gpus-per-node=4",
            "if [ -d '/runs/my sweep'/store ]; then",
            "    exec /opt/nestor resume '/runs/my sweep' --plain",
            "    exec /opt/nestor run /home/u/sweep.toml --set experiment.num_samples=8 --set 'trainer.command=['\\''python'\\'', '\\''x.py'\\'']' --plain",
        ] {
            assert!(s.lines().any(|l| l == line), "no line {line:?} in:\n{s}");
        }
    }

    #[test]
    fn a_drivers_job_hands_the_sweep_on_near_its_limit_and_resumes_from_the_bucket() {
        let job = BatchJob {
            name: "x".into(),
            exp_dir: "/runs/x".into(),
            url: Some("s3://b/runs/x".into()),
            file: "/home/u/sweep.toml".into(),
            sets: Vec::new(),
            shape: Shape::Driver { cpus: 1 },
            notice_s: 60,
            partition: None,
            time: Some("1-00:00:00".into()),
            sbatch_args: Vec::new(),
            output_dir: "/runs".into(),
            cwd: "/home/u".into(),
            nestor: "/opt/nestor".into(),
        };
        let s = job.script();
        for line in [
            "#SBATCH --ntasks=1",
            "#SBATCH --requeue",
            "#SBATCH --signal=B:USR1@60",
            "trap hand_on USR1",
            "if /opt/nestor status s3://b/runs/x >/dev/null 2>&1; then",
            "    /opt/nestor resume s3://b/runs/x --plain &",
            "    /opt/nestor run /home/u/sweep.toml --plain &",
            "    if [ \"$rc\" = 130 ] || [ \"$rc\" = 143 ]; then",
            "        next=$(sbatch --parsable --dependency=singleton --job-name=nestor-x --output=/runs/x-%j.out --time=1-00:00:00 /runs/x.sbatch) || exit 1",
        ] {
            assert!(s.lines().any(|l| l == line), "no line {line:?} in:\n{s}");
        }
        assert!(!s.contains("--exclusive") && !s.contains("--nodes=2"), "a driver holds no whole nodes:\n{s}");
        // The trap is set before the driver starts, and the driver is waited for.
        let (trap, start) = (s.find("trap hand_on USR1").unwrap(), s.find("resume s3://b/runs/x --plain &").unwrap());
        assert!(trap < start && s.trim_end().ends_with("wait \"$driver\"\nexit $?"), "{s}");
    }

    #[test]
    fn a_control_character_in_a_name_path_or_option_is_refused_by_name() {
        let base = BatchJob {
            name: "x".into(),
            exp_dir: "/runs/x".into(),
            url: None,
            file: "/home/u/sweep.toml".into(),
            sets: Vec::new(),
            shape: Shape::Driver { cpus: 1 },
            notice_s: 60,
            partition: None,
            time: None,
            sbatch_args: Vec::new(),
            output_dir: "/runs".into(),
            cwd: "/home/u".into(),
            nestor: "/opt/nestor".into(),
        };
        assert!(base.check().is_ok());
        let cases = [
            ("experiment.name", BatchJob { name: "x\ntouch /tmp/owned".into(), ..base.clone() }),
            ("--partition", BatchJob { partition: Some("gpu\ntouch /tmp/owned".into()), ..base.clone() }),
            ("--time", BatchJob { time: Some("10\r".into()), ..base.clone() }),
            ("--sbatch", BatchJob { sbatch_args: vec!["--account=ml\nrm -rf ~".into()], ..base.clone() }),
            ("--set", BatchJob { sets: vec!["a=1\n".into()], ..base.clone() }),
            ("the output directory", BatchJob { output_dir: "/runs/a\nb".into(), ..base.clone() }),
        ];
        for (what, job) in cases {
            let e = job.check().unwrap_err().0;
            assert!(e.starts_with(&format!("{what}: control characters")), "{e}");
            assert!(job.submit().is_err(), "checked before anything is written");
        }
    }
}
