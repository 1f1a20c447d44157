//! External-process trainables: a command per trial, in its own process
//! group, reporting over gRPC; SIGTERM then SIGKILL to stop it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::{Backend, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, StopLevel, TrialHandle};
use crate::service::ReportServer;

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
}

impl ProcessConfig {
    /// A config running `command` with a 5-second grace period.
    pub fn new(command: Vec<String>) -> Self {
        Self { command, env: BTreeMap::new(), working_dir: None, grace_period: Duration::from_secs(5) }
    }
}

/// Launches each trial as a process (rank 0 of a one-worker group).
#[derive(Debug, Clone)]
pub struct ProcessBackend {
    config: Arc<ProcessConfig>,
    server: Arc<ReportServer>,
}

impl ProcessBackend {
    /// Starts the report server on loopback. Must be called inside a tokio runtime.
    pub async fn start(config: ProcessConfig) -> std::io::Result<Self> {
        let server = ReportServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await?;
        Ok(Self { config: Arc::new(config), server: Arc::new(server) })
    }

    /// The report server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.server.addr()
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).is_ok();
    if !ok {
        // Fall back to time and pid: still unguessable enough for loopback, never constant.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        bytes.copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29500)
}

/// The last `n` lines of a log file.
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

impl Backend for ProcessBackend {
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let cfg = &self.config;
        let program = cfg.command.first().cloned().unwrap_or_default();
        let logs = spec.trial_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| LaunchError::Io { path: logs.clone(), source })?;
        let log_path = logs.join("rank-0.log");
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|source| LaunchError::Io { path: log_path.clone(), source })
        };
        let (stdout, stderr) = (open_log()?, open_log()?);
        let token = random_token();
        let config_json = spec.config.to_string();
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&cfg.command[1..])
            .envs(&cfg.env)
            .env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env("LOCAL_RANK", "0")
            .env("LOCAL_WORLD_SIZE", "1")
            .env("NODE_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", free_port().to_string())
            .env("NESTOR_ADDR", self.server.url())
            .env("NESTOR_TOKEN", &token)
            .env("NESTOR_TRIAL_ID", &spec.trial_id)
            .env("NESTOR_TRIAL_DIR", &spec.trial_dir)
            .env("NESTOR_CONFIG", &config_json)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        match &spec.checkpoint {
            Some(c) => cmd.env("NESTOR_CHECKPOINT", c.join("rank-0")),
            None => cmd.env_remove("NESTOR_CHECKPOINT"),
        };
        if let Some(dir) = &cfg.working_dir {
            cmd.current_dir(dir);
        }
        let parent = std::process::id() as i32;
        // SAFETY: the closure runs in the forked child before exec and calls
        // only async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        self.server.register(&spec.trial_id, token, 1, spec.trial_dir.clone(), spec.start_iteration, events.clone());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                self.server.unregister(&spec.trial_id);
                return Err(LaunchError::Spawn { program, source });
            }
        };
        let pgid = child.id().map_or(0, |p| p as i32);
        let (handle, mut stop) = TrialHandle::new(if pgid > 0 { vec![pgid] } else { Vec::new() });
        let server = Arc::clone(&self.server);
        let grace = cfg.grace_period;
        let trial_id = spec.trial_id;
        tokio::spawn(async move {
            let mut requested = StopLevel::Run;
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    changed = stop.changed() => {
                        let level = if changed.is_ok() { *stop.borrow_and_update() } else { StopLevel::Kill };
                        if level == StopLevel::Run || level <= requested { continue; }
                        requested = level;
                        if level == StopLevel::Kill {
                            signal_group(pgid, libc::SIGKILL);
                            break child.wait().await;
                        }
                        signal_group(pgid, libc::SIGTERM);
                        match tokio::time::timeout(grace, child.wait()).await {
                            Ok(status) => break status,
                            Err(_) => {
                                tracing::warn!(trial = %trial_id, "worker ignored SIGTERM for {grace:?}; killing it");
                                signal_group(pgid, libc::SIGKILL);
                                break child.wait().await;
                            }
                        }
                    }
                }
            };
            // Whatever the leader did, no process of the group outlives the trial.
            signal_group(pgid, libc::SIGKILL);
            server.unregister(&trial_id);
            let outcome = match status {
                Ok(s) if s.success() => ExitOutcome::Completed,
                Ok(_) if requested > StopLevel::Run => ExitOutcome::Stopped,
                Ok(s) => {
                    let how = match (s.code(), s.signal()) {
                        (Some(code), _) => format!("exited with code {code}"),
                        (None, Some(sig)) => format!("was killed by signal {sig}"),
                        _ => "ended".to_string(),
                    };
                    let tail = log_tail(&log_path, 20);
                    let tail = if tail.is_empty() { String::new() } else { format!("; last log lines ({}):\n{tail}", log_path.display()) };
                    ExitOutcome::Failed(format!("rank 0 {how}{tail}"))
                }
                Err(e) => ExitOutcome::Failed(format!("failed to wait for rank 0: {e}")),
            };
            let _ = events.send(Event { trial_id, kind: EventKind::Exited(outcome) });
        });
        Ok(handle)
    }
}
