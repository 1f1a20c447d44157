//! A real Slurm cluster on this machine for a test: one `slurmctld` and a
//! `slurmd` per node (`slurmd -N nodeX`), each on its own loopback port,
//! with its state, spool and logs in a temporary directory; stopped when
//! dropped. Debian's `slurm-wlm` provides the daemons (installed with apt
//! when missing and this is root, as CI is).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running cluster; [`SlurmCluster::cmd`] runs a Slurm client against it.
pub struct SlurmCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<Child>,
    /// The node names, in order.
    pub nodes: Vec<String>,
    network: Option<Network>,
}

/// Installs the daemons once, when they are missing.
fn ensure_installed() {
    super::apt_install("/usr/sbin/slurmctld", &["slurm-wlm"], "these tests run a Slurm cluster on loopback");
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
    /// `(node, dir)` pairs: that node's slurmd (and so every task it runs)
    /// sees an empty `dir`, a tmpfs of its own mounted over it in a mount
    /// namespace of its own, as a node without the file system this host has.
    pub hidden: Vec<(usize, PathBuf)>,
    /// Each node in a network namespace of its own, with its own address on
    /// a bridge (slurmctld and the driver on the bridge's address), its own
    /// host name and an `/etc/hosts` naming the nodes and this host: what
    /// crosses nodes crosses a real network, not loopback. Where namespaces
    /// cannot be made (no `CAP_NET_ADMIN`), the nodes stay on loopback and
    /// [`SlurmCluster::networked`] says so.
    pub networks: bool,
    /// More `slurm.conf` lines (`Key=value`); a key the base file has too
    /// takes this value instead (e.g. `MinJobAge=300`).
    pub conf: String,
    /// `PartitionName=` lines in place of the one default partition `test`
    /// (`{nodes}` stands for every node).
    pub partitions: String,
}

/// A bridge with a network namespace per node on it.
struct Network {
    bridge: String,
    /// The bridge's (this host's) address.
    host_addr: String,
    /// Each node's namespace and address.
    nodes: Vec<(String, String)>,
}

impl Network {
    /// A /24 of 10.213.0.0/16 no other test cluster of this machine uses; `None` where namespaces cannot be made.
    fn create(nodes: usize) -> Option<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let ip = |args: &[&str]| {
            Command::new("ip").args(args).output().map(|o| (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned()))
        };
        for _ in 0..16 {
            let net = (std::process::id() * 7 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) % 250 + 1;
            let bridge = format!("nestorbr{net}");
            if ip(&["link", "show", &bridge]).is_ok_and(|(ok, _)| ok) {
                continue;
            }
            let mut made = Self { bridge: bridge.clone(), host_addr: format!("10.213.{net}.1"), nodes: Vec::new() };
            let mut steps: Vec<Vec<String>> = vec![
                vec!["link".into(), "add".into(), bridge.clone(), "type".into(), "bridge".into()],
                vec!["addr".into(), "add".into(), format!("{}/24", made.host_addr), "dev".into(), bridge.clone()],
                vec!["link".into(), "set".into(), bridge.clone(), "up".into()],
            ];
            for i in 1..=nodes {
                let (ns, veth, addr) = (format!("nestor-{net}-{i}"), format!("nestorv{net}-{i}"), format!("10.213.{net}.{}", 10 + i));
                // Left by a test process that was killed: its bridge is gone, so no cluster uses it.
                let _ = ip(&["netns", "del", &ns]);
                steps.push(vec!["netns".into(), "add".into(), ns.clone()]);
                steps.push(["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns].map(String::from).to_vec());
                steps.push(["link", "set", &veth, "master", &bridge, "up"].map(String::from).to_vec());
                steps.push(["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"].map(String::from).to_vec());
                steps.push(["-n", &ns, "link", "set", "eth0", "up"].map(String::from).to_vec());
                steps.push(["-n", &ns, "link", "set", "lo", "up"].map(String::from).to_vec());
                made.nodes.push((ns, addr));
            }
            for step in steps {
                let args: Vec<&str> = step.iter().map(String::as_str).collect();
                match ip(&args) {
                    Ok((true, _)) => {}
                    Ok((false, why)) => {
                        eprintln!("test cluster: no network namespaces here (ip {}: {why}); the nodes share loopback", args.join(" "));
                        return None;
                    }
                    Err(e) => {
                        eprintln!("test cluster: no network namespaces here (ip: {e}); the nodes share loopback");
                        return None;
                    }
                }
            }
            return Some(made);
        }
        None
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for (ns, _) in &self.nodes {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
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
        let network = if options.networks { Network::create(nodes) } else { None };
        let ctld_addr = network.as_ref().map_or("127.0.0.1", |n| n.host_addr.as_str());
        let mut conf = format!(
            "ClusterName=nestor\nSlurmctldHost={host}({ctld_addr})\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
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
        if !options.conf.is_empty() {
            let key = |l: &str| l.split('=').next().unwrap_or_default().trim().to_string();
            let own: Vec<String> = options.conf.lines().map(key).filter(|k| !k.is_empty()).collect();
            conf = conf.lines().filter(|l| !own.contains(&key(l))).map(|l| format!("{l}\n")).collect();
            conf.push_str(options.conf.trim_end());
            conf.push('\n');
        }
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
        for (i, n) in names.iter().enumerate() {
            let (node_host, addr) = match &network {
                Some(net) => (n.as_str(), net.nodes[i].1.as_str()),
                None => (host.as_str(), "127.0.0.1"),
            };
            conf.push_str(&format!(
                "NodeName={n} NodeHostname={node_host} NodeAddr={addr} Port={} CPUs={cpus} RealMemory={memory_mb}{gres} State=UNKNOWN\n",
                free_port()
            ));
        }
        // What the nodes' own /etc/hosts says: the nodes, and this host at the bridge's address.
        let hosts = d.join("hosts");
        if let Some(net) = &network {
            let mut text = format!("127.0.0.1 localhost\n{} {host}\n", net.host_addr);
            for (n, (_, addr)) in names.iter().zip(&net.nodes) {
                text.push_str(&format!("{addr} {n}\n"));
            }
            std::fs::write(&hosts, text).unwrap();
        }
        if options.partitions.is_empty() {
            conf.push_str(&format!("PartitionName=test Nodes={} Default=YES MaxTime=INFINITE State=UP\n", names.join(",")));
        } else {
            conf.push_str(&options.partitions.replace("{nodes}", &names.join(",")));
            conf.push('\n');
        }
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
        let mut cluster =
            Self { conf: conf_path.clone(), daemons: vec![spawn("slurmctld", &["-i"])], nodes: names.clone(), dir, network: None };
        for (i, n) in names.iter().enumerate() {
            // A node of its own: its network, host name and hosts file, or its view of a hidden directory.
            let mut setup = Vec::new();
            if network.is_some() {
                setup.push(format!("hostname {n} && mount --bind '{}' /etc/hosts", hosts.display()));
            }
            for (_, path) in options.hidden.iter().filter(|(h, _)| *h == i) {
                setup.push(format!("mount -t tmpfs nestor-hidden '{}'", path.display()));
            }
            if setup.is_empty() {
                cluster.daemons.push(spawn("slurmd", &["-N", n]));
                continue;
            }
            let script = format!("{} && exec slurmd -D -f '{}' -N {n}", setup.join(" && "), conf_path.display());
            let mut c = match &network {
                Some(net) => {
                    let mut c = Command::new("nsenter");
                    c.arg(format!("--net=/run/netns/{}", net.nodes[i].0)).arg("unshare");
                    c
                }
                None => Command::new("unshare"),
            };
            c.args(["--uts", "--mount", "--propagation", "private", "sh", "-c", &script]).stdout(Stdio::null()).stderr(Stdio::null());
            cluster.daemons.push(c.spawn().expect("start slurmd in namespaces of its own"));
        }
        cluster.network = network;
        cluster.wait_idle(Duration::from_secs(30));
        cluster
    }

    /// Whether each node has a network (and address) of its own.
    pub fn networked(&self) -> bool {
        self.network.is_some()
    }

    /// Node `name`'s address (its `NodeAddr`).
    pub fn node_addr(&self, name: &str) -> String {
        let i = self.nodes.iter().position(|n| n == name).expect("a node of this cluster");
        self.network.as_ref().map_or_else(|| "127.0.0.1".to_string(), |net| net.nodes[i].1.clone())
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
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
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
            // A node of several partitions has a line in each.
            let idle = text.lines().filter(|l| l.ends_with(" idle")).collect::<std::collections::BTreeSet<_>>().len();
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
    /// (`SLURMD_NODENAME=<name>` with this cluster's `SLURM_CONF`: other
    /// test clusters of this machine name their nodes alike) are killed at once.
    pub fn kill_node(&mut self, name: &str) {
        let i = self.nodes.iter().position(|n| n == name).expect("a node of this cluster") + 1;
        let _ = self.daemons[i].kill();
        let _ = self.daemons[i].wait();
        let log = self.dir().join(format!("slurmd-{name}.log"));
        let env = format!("SLURMD_NODENAME={name}");
        let conf = format!("SLURM_CONF={}", self.conf.display());
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let holds_log = std::fs::read_dir(e.path().join("fd"))
                .map(|fds| fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == log)))
                .unwrap_or(false);
            let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
            let runs_there = vars.contains(&env.as_bytes()) && vars.contains(&conf.as_bytes());
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
