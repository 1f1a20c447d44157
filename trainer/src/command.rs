//! What a run's ranks execute when they are processes: the command, its
//! environment and working directory, the collectives, how it is stopped
//! and where it reports. The process and Slurm engines run it; a trainer
//! inside a trial brings its own.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::scaling::TorchConfig;

/// How to run a trial's worker process.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Extra environment variables (the driver's own environment is inherited).
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the driver's).
    pub working_dir: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL when stopping.
    pub grace_period: Duration,
    /// Whether workers get GPUs (sets the default collective backend).
    pub use_gpu: bool,
    /// Collective backend and timeout for PyTorch workers.
    pub torch: TorchConfig,
    /// Where the report server listens (default: loopback, a free port).
    pub report_bind: SocketAddr,
    /// How ranks start: a process each, or forked from a warm process.
    pub warm: Warm,
    /// Files ranks may fetch from the driver (`GetFile`).
    pub files: Vec<PathBuf>,
    /// TLS on the report channel, with a certificate made for this driver
    /// (ranks get its authority in their run's plan). The Slurm backends
    /// always encrypt, and so does this one when `report_bind` is not a
    /// loopback address; on loopback the channel is plaintext unless this
    /// is set.
    pub encrypt: bool,
}

impl ProcessConfig {
    /// A config running `command` with a 5-second grace period.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            env: BTreeMap::new(),
            working_dir: None,
            grace_period: Duration::from_secs(5),
            use_gpu: false,
            torch: TorchConfig::default(),
            report_bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            warm: Warm::Cold,
            files: Vec::new(),
            encrypt: false,
        }
    }
}

/// How a run's ranks start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Warm {
    /// A process per rank, from `command`.
    #[default]
    Cold,
    /// Forked from `command` started once as a warm process (with
    /// `NESTOR_ZYGOTE=1`): a command that speaks the protocol of
    /// `trainer/src/warm.rs` itself (the Python driver's worker).
    Command,
    /// Forked from nestor's own warm process around a command that runs a
    /// Python script or module (`python train.py`, `python -m pkg.train`):
    /// the script's imports loaded once, each rank running it as
    /// `python train.py` would (`python/nestor/_zygote.py`).
    Python,
}

impl Warm {
    /// How ranks of `command` start, given the section's `warm` key: off
    /// with `false`; unset, a Python script or module is warm and anything
    /// else cold; `true`, a command that is not a Python script speaks the
    /// protocol itself. The Python driver's worker (`python -m
    /// nestor._worker`) always speaks it.
    pub fn of(command: &[String], setting: Option<bool>) -> Self {
        if setting == Some(false) {
            return Self::Cold;
        }
        match PythonCommand::parse(command) {
            Some(p) if p.module && p.target == "nestor._worker" => Self::Command,
            Some(_) => Self::Python,
            None if setting == Some(true) => Self::Command,
            None => Self::Cold,
        }
    }
}

/// nestor's warm process for Python scripts, run with `python -c`.
const ZYGOTE: &str = include_str!("../../python/nestor/_zygote.py");

/// A command that runs Python code from a file or a module: the
/// interpreter (`python`, `python3`, `python3.11`, a path to one) and its
/// options, then `script [args]` or `-m module [args]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PythonCommand<'a> {
    /// The interpreter and its options.
    pub interpreter: &'a [String],
    /// Whether `target` is a module (`-m`) rather than a script's path.
    pub module: bool,
    pub target: &'a str,
    pub args: &'a [String],
}

impl<'a> PythonCommand<'a> {
    /// `command` read as a Python command; `None` for anything else (a
    /// program that is not an interpreter, `-c`, a script from stdin, an
    /// option this does not know).
    pub(crate) fn parse(command: &'a [String]) -> Option<Self> {
        let program = std::path::Path::new(command.first()?).file_name()?.to_str()?;
        let version = program.strip_prefix("python")?;
        if !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return None;
        }
        let mut i = 1;
        while let Some(arg) = command.get(i) {
            match arg.as_str() {
                "-m" => {
                    let target = command.get(i + 1)?;
                    return Some(Self { interpreter: &command[..i], module: true, target, args: &command[i + 2..] });
                }
                "-W" | "-X" => i += 2,
                a if (a.starts_with("-W") || a.starts_with("-X")) && a.len() > 2 => i += 1,
                a if a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| "uOBsSEIbqvdPR".contains(c)) => i += 1,
                a if a.starts_with('-') => return None,
                target => return Some(Self { interpreter: &command[..i], module: false, target, args: &command[i + 1..] }),
            }
        }
        None
    }

    /// The command of nestor's warm process around this one.
    pub(crate) fn zygote(&self) -> Vec<String> {
        let mut c = self.interpreter.to_vec();
        c.extend(["-c".to_string(), ZYGOTE.to_string(), if self.module { "module" } else { "script" }.to_string()]);
        c.push(self.target.to_string());
        c.extend(self.args.iter().cloned());
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn python_commands_are_read_with_their_options_and_anything_else_is_not() {
        let c = cmd("python3 -u -X dev train.py --lr 0.1");
        let p = PythonCommand::parse(&c).unwrap();
        assert_eq!((p.interpreter.len(), p.module, p.target, p.args.len()), (4, false, "train.py", 2));
        let c = cmd("/opt/venv/bin/python3.11 -OO -m pkg.train x");
        let p = PythonCommand::parse(&c).unwrap();
        assert_eq!((p.interpreter.len(), p.module, p.target, p.args), (2, true, "pkg.train", &c[4..]));
        let z = p.zygote();
        assert_eq!(
            (&z[..3], z[3].contains("def serve("), &z[4..]),
            (&[c[0].clone(), "-OO".into(), "-c".into()][..], true, &cmd("module pkg.train x")[..])
        );
        for other in [
            "python -c print(1)",
            "python - x",
            "python",
            "python -m",
            "pythonw train.py",
            "torchrun train.py",
            "sh -c x",
            "python --foo x.py",
        ] {
            assert_eq!(PythonCommand::parse(&cmd(other)), None, "{other}");
        }
    }

    #[test]
    fn the_warm_key_picks_how_ranks_start() {
        let script = cmd("python train.py");
        let driver = cmd("python -m nestor._worker /x/blob.pkl");
        let other = cmd("./worker --x");
        assert_eq!([None, Some(true), Some(false)].map(|s| Warm::of(&script, s)), [Warm::Python, Warm::Python, Warm::Cold]);
        assert_eq!([None, Some(true), Some(false)].map(|s| Warm::of(&driver, s)), [Warm::Command, Warm::Command, Warm::Cold]);
        assert_eq!([None, Some(true), Some(false)].map(|s| Warm::of(&other, s)), [Warm::Cold, Warm::Command, Warm::Cold]);
    }
}
