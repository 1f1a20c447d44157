//! The `[cluster]` section of an experiment file: where trials run — this
//! machine, or the nodes of the Slurm allocation nestor runs inside.

use serde::{Deserialize, Serialize};

use crate::slurm::{SlurmAllocation, SlurmError, SlurmJobsConfig};

/// Which engine runs the trials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterBackend {
    /// Slurm inside an allocation (`SLURM_JOB_ID` set), else this machine.
    #[default]
    Auto,
    /// This machine, even inside an allocation.
    Local,
    /// The Slurm allocation nestor runs inside (an error outside one).
    Slurm,
    /// Each trial run a Slurm job of its own, submitted from wherever the
    /// driver runs (a login node): `[cluster.jobs]` says how.
    #[serde(rename = "slurm_jobs")]
    SlurmJobs,
}

/// `[cluster]`: which engine runs the trials and where their workers report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `auto` (default), `local` or `slurm`.
    #[serde(default)]
    pub backend: ClusterBackend,
    /// The address the nodes reach the driver at (`host` or `host:port`);
    /// default: this machine's host name, on a free port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_address: Option<String>,
    /// `[cluster.jobs]`: how trial runs are submitted as jobs of their own
    /// (`backend = "slurm_jobs"`).
    #[serde(default, skip_serializing_if = "SlurmJobsConfig::is_default")]
    pub jobs: SlurmJobsConfig,
    /// Seconds a trial's job step may wait for its resources (nodes busy
    /// with steps the sweep does not know of) before the run counts as one
    /// the cluster would not start: placed again, or failed naming why
    /// (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_start_timeout_s: Option<f64>,
}

impl ClusterConfig {
    /// Whether it is all defaults (left out of a written file).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses a report address the nodes cannot reach: a loopback address
    /// (`127.0.0.1`, `::1`, `localhost`) names each node itself, not the
    /// driver. `nodes` says whose nodes, for the message ("the nodes of
    /// Slurm job 7", "the nodes of the trials' Slurm jobs").
    pub fn check_reachable(&self, bind: Option<std::net::SocketAddr>, nodes: &str) -> Result<(), SlurmError> {
        if let Some(t) = self.step_start_timeout_s.filter(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(SlurmError(format!("cluster.step_start_timeout_s: must be a number of seconds > 0, got {t}")));
        }
        if let Some(a) = &self.report_address {
            let ip = a.parse::<std::net::SocketAddr>().map(|s| s.ip()).or_else(|_| a.parse::<std::net::IpAddr>()).ok();
            let host = a.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(a.as_str(), |(h, _)| h);
            if ip.is_some_and(|ip| ip.is_loopback()) || (ip.is_none() && host.eq_ignore_ascii_case("localhost")) {
                return Err(SlurmError(format!(
                    "cluster.report_address = {a:?} is a loopback address: the nodes of {nodes} would reach themselves, \
                     not the driver; give an address of this machine they reach (or leave it out for its host name)"
                )));
            }
        }
        if let Some(b) = bind.filter(|b| b.ip().is_loopback()) {
            return Err(SlurmError(format!(
                "trainer.report_bind = \"{b}\" listens on loopback only: the nodes of {nodes} cannot reach it; \
                 leave it out (every interface) or bind an address they reach"
            )));
        }
        Ok(())
    }

    /// Where the report server listens when `[trainer] report_bind` leaves
    /// it out: the interface of the address the nodes are told to reach
    /// (`advertise`, `host` or `host:port`), on a free port; never every
    /// interface. Where that name is this machine's loopback here (an
    /// `/etc/hosts` line such as `127.0.1.1 host`: the nodes resolve it
    /// otherwise), the interface this machine reaches the nodes from
    /// (`toward`: their addresses; one on loopback means they run here). An
    /// address that is not this machine's is refused, naming the setting.
    pub fn report_bind_for(advertise: &str, toward: &[String]) -> Result<std::net::SocketAddr, SlurmError> {
        use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
        let host_of = |a: &str| -> String {
            let h = match a.rsplit_once(':') {
                Some((h, port)) if port.parse::<u16>().is_ok() && !h.ends_with(':') => h,
                _ => a,
            };
            h.trim_start_matches('[').trim_end_matches(']').to_string()
        };
        let resolve = |h: &str| -> std::io::Result<Vec<IpAddr>> { Ok((h, 0).to_socket_addrs()?.map(|s| s.ip()).collect()) };
        let bindable = |ip: IpAddr| std::net::TcpListener::bind((ip, 0)).is_ok();
        let host = host_of(advertise);
        let ips = resolve(&host).map_err(|e| SlurmError(format!("cluster.report_address: cannot resolve {host:?}: {e}")))?;
        if let Some(ip) = ips.iter().copied().find(|ip| !ip.is_loopback() && bindable(*ip)) {
            return Ok(SocketAddr::new(ip, 0));
        }
        if ips.iter().all(IpAddr::is_loopback) {
            for node in toward {
                for ip in resolve(&host_of(node)).unwrap_or_default() {
                    if ip.is_loopback() {
                        return Ok(SocketAddr::new(ip, 0));
                    }
                    // The source address of this machine's route to the node (a UDP connect sends nothing).
                    let any: IpAddr =
                        if ip.is_ipv4() { std::net::Ipv4Addr::UNSPECIFIED.into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
                    let local = std::net::UdpSocket::bind((any, 0)).and_then(|s| s.connect((ip, 9)).and_then(|()| s.local_addr()));
                    if let Some(local) = local.ok().map(|a| a.ip()).filter(|l| !l.is_unspecified() && bindable(*l)) {
                        return Ok(SocketAddr::new(local, 0));
                    }
                }
            }
        }
        let shown: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        Err(SlurmError(format!(
            "the nodes are told to reach the driver at {advertise} ({}), which is not an address of this machine they can reach; \
             set [cluster] report_address to one, or [trainer] report_bind to the local address they reach it through",
            shown.join(", ")
        )))
    }

    /// The allocation to run in: `None` for this machine.
    pub fn allocation(&self) -> Result<Option<SlurmAllocation>, SlurmError> {
        match self.backend {
            ClusterBackend::Local | ClusterBackend::SlurmJobs => Ok(None),
            ClusterBackend::Auto => SlurmAllocation::from_env(),
            ClusterBackend::Slurm => SlurmAllocation::from_env()?.map(Some).ok_or_else(|| {
                SlurmError(
                    "cluster.backend = \"slurm\" but nestor is not inside a Slurm allocation (no SLURM_JOB_ID): \
                     run it under salloc or sbatch, or use `nestor submit`"
                        .into(),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_server_listens_on_the_advertised_interface_only() {
        let here = ["127.0.0.1".to_string()];
        // A name that is loopback here, nodes on this machine: loopback.
        assert_eq!(ClusterConfig::report_bind_for("127.0.0.1", &here).unwrap(), "127.0.0.1:0".parse().unwrap());
        assert_eq!(ClusterConfig::report_bind_for("localhost:7000", &here).unwrap(), "127.0.0.1:0".parse().unwrap());
        // Loopback here and no node known: nothing to listen on that they reach.
        assert!(ClusterConfig::report_bind_for("127.0.0.1", &[]).is_err());
        // TEST-NET-3: no machine's own address.
        let e = ClusterConfig::report_bind_for("203.0.113.7", &here).unwrap_err().0;
        assert!(e.contains("not an address of this machine") && e.contains("report_bind"), "{e}");
        let unknown = ClusterConfig::report_bind_for("no-such-host.invalid", &here).unwrap_err().0;
        assert!(unknown.starts_with("cluster.report_address: cannot resolve"), "{unknown}");
        // A name that is loopback here, nodes elsewhere: the address this machine reaches them from.
        let route = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect("192.0.2.77:9").and_then(|()| s.local_addr()));
        if let Ok(local) = route {
            let bound = ClusterConfig::report_bind_for("localhost", &["192.0.2.77".to_string()]).unwrap();
            assert_eq!(bound.ip(), local.ip());
            assert!(!bound.ip().is_unspecified());
        }
    }

    #[test]
    fn a_loopback_report_address_or_bind_is_refused_naming_the_key() {
        let with = |a: &str| ClusterConfig { report_address: Some(a.into()), ..ClusterConfig::default() };
        for bad in ["127.0.0.1", "127.0.0.1:4000", "localhost", "LOCALHOST:9", "::1", "[::1]:80"] {
            let e = with(bad).check_reachable(None, "Slurm job 7").unwrap_err().0;
            assert!(e.starts_with("cluster.report_address = ") && e.contains("Slurm job 7"), "{bad}: {e}");
        }
        for good in ["10.0.0.1", "10.0.0.1:4000", "login1", "login1.cluster:7000", "[fe80::1]:80"] {
            with(good).check_reachable(None, "Slurm job 7").unwrap();
        }
        let bind = |b: &str| Some(b.parse::<std::net::SocketAddr>().unwrap());
        let e = ClusterConfig::default().check_reachable(bind("127.0.0.1:0"), "Slurm job 7").unwrap_err().0;
        assert!(e.starts_with("trainer.report_bind = \"127.0.0.1:0\""), "{e}");
        ClusterConfig::default().check_reachable(bind("0.0.0.0:0"), "Slurm job 7").unwrap();
        ClusterConfig::default().check_reachable(None, "Slurm job 7").unwrap();
    }

    #[test]
    fn slurm_jobs_settings_are_checked_naming_the_key() {
        let ok = SlurmJobsConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let bad = |c: SlurmJobsConfig| c.validate().unwrap_err();
        assert_eq!(bad(SlurmJobsConfig { max_jobs: 0, ..ok.clone() }).0, "cluster.jobs.max_jobs");
        assert_eq!(bad(SlurmJobsConfig { poll_s: 0.0, ..ok.clone() }).0, "cluster.jobs.poll_s");
        assert_eq!(bad(SlurmJobsConfig { partition: Some("a b".into()), ..ok.clone() }).0, "cluster.jobs.partition");
        for own in ["--ntasks=4", "-n4", "--output=x", "--signal=B:USR1@60", "--array=0-3"] {
            let (key, why) = bad(SlurmJobsConfig { sbatch: vec![own.into()], ..ok.clone() });
            assert_eq!(key, "cluster.jobs.sbatch");
            assert!(why.contains("nestor sets it"), "{own}: {why}");
        }
        let (_, why) = bad(SlurmJobsConfig { sbatch: vec!["--partition=x".into()], ..ok.clone() });
        assert!(why.contains("a key of its own"), "{why}");
        let (_, why) = bad(SlurmJobsConfig { sbatch: vec!["constraint=a100".into()], ..ok.clone() });
        assert!(why.contains("not an option"), "{why}");
        for fine in ["--constraint=a100", "--exclusive", "-C", "--nice=10", "--reservation=r"] {
            assert_eq!(SlurmJobsConfig { sbatch: vec![fine.into()], ..ok.clone() }.validate(), Ok(()), "{fine}");
        }
        // [cluster.jobs] as serde reads it, a misspelt key named.
        let parsed: ClusterConfig =
            serde_json::from_str(r#"{"backend": "slurm_jobs", "jobs": {"partition": "gpu", "max_jobs": 4}}"#).unwrap();
        assert_eq!((parsed.backend, parsed.jobs.partition.as_deref(), parsed.jobs.max_jobs), (ClusterBackend::SlurmJobs, Some("gpu"), 4));
        let err = serde_json::from_str::<ClusterConfig>(r#"{"jobs": {"partiton": "gpu"}}"#).unwrap_err().to_string();
        assert!(err.contains("partiton"), "{err}");
    }
}
