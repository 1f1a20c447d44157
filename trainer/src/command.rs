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
    /// Fork each rank from a warm process started once from `command`
    /// (with `NESTOR_ZYGOTE=1`) instead of starting `command` per rank.
    pub warm: bool,
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
            warm: false,
            files: Vec::new(),
            encrypt: false,
        }
    }
}
