//! A real Slurm cluster on this machine for a test: one `slurmctld` and a
//! `slurmd` per node (`slurmd -N nodeX`), each on its own loopback port,
//! with its state, spool and logs in a temporary directory; stopped when
//! dropped. Debian's `slurm-wlm` provides the daemons (installed with apt
//! when missing and this is root, as CI is).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A running cluster; [`SlurmCluster::cmd`] runs a Slurm client against it.
pub struct SlurmCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<Child>,
    /// The node names, in order.
    pub nodes: Vec<String>,
}

/// Installs the daemons once, when they are missing.
fn ensure_installed() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done || Path::new("/usr/sbin/slurmctld").exists() {
        *done = true;
        return;
    }
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "these tests run a Slurm cluster on loopback: install slurm-wlm (apt-get install slurm-wlm)");
    let apt = |args: &[&str]| {
        let out = Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").output().expect("run apt-get");
        assert!(out.status.success(), "apt-get {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    apt(&["update", "-q"]);
    apt(&["install", "-y", "-q", "slurm-wlm"]);
    *done = true;
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn hostname() -> String {
    let out = Command::new("hostname").output().expect("run hostname");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// What a test cluster has beyond its nodes' CPUs and memory.
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// GPUs per node, as GRES (`gpu:N`): character devices made for the
    /// test (`/dev/null`'s numbers), so Slurm books and binds them as it
    /// would real ones.
    pub gpus: u32,
    /// `(node, dir)`: that node's slurmd (and so every task it runs) sees an
    /// empty `dir`, a tmpfs mounted over it in a mount namespace of its own,
    /// as a node without the file system the others share.
    pub hidden: Option<(usize, PathBuf)>,
}

impl SlurmCluster {
    /// `nodes` nodes of `cpus` CPUs and `memory_mb` MB each, all idle when this returns.
    pub fn start(nodes: usize, cpus: u32, memory_mb: u64) -> Self {
        Self::start_with(nodes, cpus, memory_mb, Options::default())
    }

    /// [`SlurmCluster::start`], with `options`.
    pub fn start_with(nodes: usize, cpus: u32, memory_mb: u64, options: Options) -> Self {
        ensure_installed();
        let dir = tempfile::Builder::new().prefix("slurm").tempdir().unwrap();
        let d = dir.path();
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let host = hostname();
        let names: Vec<String> = (1..=nodes).map(|i| format!("node{i}")).collect();
        let mut conf = format!(
            "ClusterName=nestor\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
             AuthType=auth/none\nCredType=cred/none\nSlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd-%n.pid\nSlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core_Memory\nMpiDefault=none\nReturnToService=2\nSlurmdParameters=config_overrides\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\nInactiveLimit=0\n\
             KillWait=2\nMinJobAge=5\nSlurmdTimeout=10\nSlurmctldTimeout=10\nMessageTimeout=3\n",
            ctld = free_port(),
            slurmd = free_port(),
            d = d.display(),
        );
        let mut gres = String::new();
        if options.gpus > 0 {
            conf.push_str("GresTypes=gpu\n");
            gres = format!(" Gres=gpu:{}", options.gpus);
            // slurmd wants devices, not plain files.
            for i in 0..options.gpus {
                let path = std::ffi::CString::new(d.join(format!("gpu{i}")).into_os_string().into_encoded_bytes()).unwrap();
                let made = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
                assert_eq!(made, 0, "mknod a test GPU: {}", std::io::Error::last_os_error());
            }
            let files = format!("{}/gpu[0-{}]", d.display(), options.gpus - 1);
            std::fs::write(d.join("gres.conf"), format!("NodeName={} Name=gpu File={files}\n", names.join(","))).unwrap();
        }
        for n in &names {
            conf.push_str(&format!(
                "NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={} CPUs={cpus} RealMemory={memory_mb}{gres} State=UNKNOWN\n",
                free_port()
            ));
        }
        conf.push_str(&format!("PartitionName=test Nodes={} Default=YES MaxTime=INFINITE State=UP\n", names.join(",")));
        let conf_path = d.join("slurm.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let spawn = |program: &str, args: &[&str]| {
            Command::new(program)
                .arg("-D")
                .arg("-f")
                .arg(&conf_path)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("start {program}: {e}"))
        };
        let mut cluster = Self { conf: conf_path.clone(), daemons: vec![spawn("slurmctld", &["-i"])], nodes: names.clone(), dir };
        for (i, n) in names.iter().enumerate() {
            match &options.hidden {
                Some((h, path)) if *h == i => {
                    let script =
                        format!("mount -t tmpfs nestor-hidden '{}' && exec slurmd -D -f '{}' -N {n}", path.display(), conf_path.display());
                    let child = Command::new("unshare")
                        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start slurmd in a mount namespace");
                    cluster.daemons.push(child);
                }
                _ => cluster.daemons.push(spawn("slurmd", &["-N", n])),
            }
        }
        cluster.wait_idle(Duration::from_secs(30));
        cluster
    }

    /// The configuration file (`SLURM_CONF` for clients).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The cluster's directory (logs, state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A Slurm client command (`srun`, `salloc`, `squeue`, ...) against this cluster.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        // A test may itself run inside an allocation: its job is not this cluster's.
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLURM_") && k != "SLURM_CONF") {
            c.env_remove(k);
        }
        c
    }

    /// Runs `program args` against this cluster.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.cmd(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"))
    }

    fn wait_idle(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            let out = self.run("sinfo", &["-h", "-N", "-o", "%N %T"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let idle = text.lines().filter(|l| l.ends_with(" idle")).count();
            if idle == self.nodes.len() {
                return;
            }
            if start.elapsed() > limit {
                let log = std::fs::read_to_string(self.dir().join("slurmctld.log")).unwrap_or_default();
                panic!("the test cluster's nodes are not idle after {limit:?}: {text}\nslurmctld.log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Node `name` goes down as a machine that loses power: its slurmd,
    /// its step daemons (they hold its log open) and every task it runs
    /// (`SLURMD_NODENAME=<name>`) are killed at once.
    pub fn kill_node(&mut self, name: &str) {
        let i = self.nodes.iter().position(|n| n == name).expect("a node of this cluster") + 1;
        let _ = self.daemons[i].kill();
        let _ = self.daemons[i].wait();
        let log = self.dir().join(format!("slurmd-{name}.log"));
        let env = format!("SLURMD_NODENAME={name}");
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let holds_log = std::fs::read_dir(e.path().join("fd"))
                .map(|fds| fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == log)))
                .unwrap_or(false);
            let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
            let runs_there = environ.split(|&b| b == 0).any(|kv| kv == env.as_bytes());
            if pid != std::process::id() as i32 && (holds_log || runs_there) {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first, so no task outlives the cluster.
        let _ = self.run("scancel", &["--full", "--user", "root"]);
        for d in self.daemons.iter_mut().rev() {
            unsafe {
                libc::kill(d.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in &mut self.daemons {
            while d.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}
