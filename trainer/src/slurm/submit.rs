//! `nestor submit`: a sweep as a Slurm batch job. The script asks for whole
//! nodes (the sweep places its trials' ranks on them itself), survives a
//! node going down (`--no-kill`: the node is set aside and the sweep goes
//! on), gets SIGTERM two minutes before its time limit (nestor then stops
//! its trials so they resume later), and runs `nestor resume` when the
//! experiment has a store already, else `nestor run`: submitting again
//! continues the sweep.

use std::path::{Path, PathBuf};

use super::SlurmError;

/// A sweep to submit as a batch job.
#[derive(Debug, Clone)]
pub struct BatchJob {
    /// The experiment's name (the job's is `nestor-<name>`).
    pub name: String,
    /// The experiment's directory (absolute): resumed when it has a store.
    pub exp_dir: PathBuf,
    /// The experiment file to run (absolute), and its `--set`s.
    pub file: PathBuf,
    /// `--set KEY=VALUE` overrides for `nestor run`.
    pub sets: Vec<String>,
    /// Whole nodes to ask for.
    pub nodes: u32,
    /// GPUs per node to ask for.
    pub gpus_per_node: Option<u32>,
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

impl BatchJob {
    /// The batch script.
    pub fn script(&self) -> String {
        let mut lines = vec![
            "#!/bin/bash".to_string(),
            format!("#SBATCH --job-name={}", sh_quote(&format!("nestor-{}", self.name))),
            format!("#SBATCH --nodes={}", self.nodes),
            // Whole nodes: the sweep places its trials' ranks on them itself.
            "#SBATCH --exclusive".to_string(),
            "#SBATCH --mem=0".to_string(),
            // A node that goes down is set aside and the sweep goes on with the others.
            "#SBATCH --no-kill".to_string(),
            format!("#SBATCH --output={}", self.output_dir.join(format!("{}-%j.out", self.name)).display()),
            // Time limit: SIGTERM two minutes before, and nestor stops its trials so they resume later.
            "#SBATCH --signal=B:TERM@120".to_string(),
        ];
        if let Some(g) = self.gpus_per_node {
            lines.push(format!("#SBATCH --gpus-per-node={g}"));
        }
        if let Some(p) = &self.partition {
            lines.push(format!("#SBATCH --partition={}", sh_quote(p)));
        }
        if let Some(t) = &self.time {
            lines.push(format!("#SBATCH --time={}", sh_quote(t)));
        }
        for a in &self.sbatch_args {
            lines.push(format!("#SBATCH {}", sh_quote(a)));
        }
        let sets: String = self.sets.iter().map(|s| format!(" --set {}", sh_quote(s))).collect();
        let nestor = quoted(&self.nestor);
        lines.push(String::new());
        lines.push(format!("cd {}", quoted(&self.cwd)));
        lines.push(format!("if [ -d {}/store ]; then", quoted(&self.exp_dir)));
        lines.push(format!("    exec {nestor} resume {} --plain", quoted(&self.exp_dir)));
        lines.push("else".into());
        lines.push(format!("    exec {nestor} run {}{sets} --plain", quoted(&self.file)));
        lines.push("fi".into());
        lines.join("\n") + "\n"
    }

    /// Writes the script to `<output_dir>/<name>.sbatch` and submits it;
    /// returns the job's id and the script's path.
    pub fn submit(&self) -> Result<(String, PathBuf), SlurmError> {
        std::fs::create_dir_all(&self.output_dir).map_err(|e| SlurmError(format!("{}: {e}", self.output_dir.display())))?;
        let path = self.output_dir.join(format!("{}.sbatch", self.name));
        std::fs::write(&path, self.script()).map_err(|e| SlurmError(format!("{}: {e}", path.display())))?;
        let out = std::process::Command::new("sbatch")
            .arg("--parsable")
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
            file: "/home/u/sweep.toml".into(),
            sets: vec!["experiment.num_samples=8".into(), "trainer.command=['python', 'x.py']".into()],
            nodes: 2,
            gpus_per_node: Some(4),
            partition: Some("gpu".into()),
            time: Some("1:00:00".into()),
            sbatch_args: vec!["--account=ml".into()],
            output_dir: "/runs".into(),
            cwd: "/home/u".into(),
            nestor: "/opt/nestor".into(),
        };
        let s = job.script();
        for line in [
            "#SBATCH --job-name='nestor-my sweep'",
            "#SBATCH --nodes=2",
            "#SBATCH --no-kill",
            "#SBATCH --gpus-per-node=4",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=1:00:00",
            "#SBATCH --account=ml",
            "if [ -d '/runs/my sweep'/store ]; then",
            "    exec /opt/nestor resume '/runs/my sweep' --plain",
            "    exec /opt/nestor run /home/u/sweep.toml --set experiment.num_samples=8 --set 'trainer.command=['\\''python'\\'', '\\''x.py'\\'']' --plain",
        ] {
            assert!(s.lines().any(|l| l == line), "no line {line:?} in:\n{s}");
        }
    }
}
