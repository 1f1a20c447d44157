//! nestor on a real Slurm cluster: a `slurmctld` and several `slurmd` on
//! loopback ports, started by each test (common/slurm.rs) and stopped after it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::slurm::SlurmCluster;
use trainer::SlurmAllocation;

/// Inside an allocation, the job is read per node, from `scontrol` and from
/// the job's environment alike.
#[test]
fn an_allocation_is_read_per_node_from_scontrol_and_from_the_environment() {
    let cluster = SlurmCluster::start(2, 4, 4000);
    let script = "scontrol show job -d $SLURM_JOB_ID; echo ===; env";
    let out = cluster.run("salloc", &["-N2", "--ntasks-per-node=2", "--mem=1000", "bash", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "salloc: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let (shown, env) = stdout.split_once("===").unwrap();
    let vars: BTreeMap<String, String> =
        env.lines().filter_map(|l| l.split_once('=')).filter(|(k, _)| k.starts_with("SLURM_")).map(|(k, v)| (k.into(), v.into())).collect();
    let job = &vars["SLURM_JOB_ID"];
    let from_scontrol = SlurmAllocation::from_scontrol(job, shown).unwrap();
    let from_env = SlurmAllocation::from_vars(&vars).unwrap();
    for a in [&from_scontrol, &from_env] {
        assert_eq!(&a.job_id, job);
        let nodes: Vec<(&str, u32, Option<f64>)> = a.nodes.iter().map(|n| (n.name.as_str(), n.cpus, n.memory_bytes)).collect();
        assert_eq!(nodes, [("node1", 2, Some(1000.0 * 1048576.0)), ("node2", 2, Some(1000.0 * 1048576.0))], "{shown}");
    }
    // Uneven (Slurm fills the first node): each node's own count, the same both ways.
    let out = cluster.run("salloc", &["-N2", "-n4", "bash", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (shown, env) = stdout.split_once("===").unwrap();
    let vars: BTreeMap<String, String> =
        env.lines().filter_map(|l| l.split_once('=')).filter(|(k, _)| k.starts_with("SLURM_")).map(|(k, v)| (k.into(), v.into())).collect();
    let from_scontrol = SlurmAllocation::from_scontrol(&vars["SLURM_JOB_ID"], shown).unwrap();
    let cpus: Vec<u32> = from_scontrol.nodes.iter().map(|n| n.cpus).collect();
    assert_eq!(cpus.iter().sum::<u32>(), 4, "{shown}");
    assert!(cpus.iter().all(|&c| c >= 1), "{shown}");
    assert_eq!(cpus, SlurmAllocation::from_vars(&vars).unwrap().nodes.iter().map(|n| n.cpus).collect::<Vec<_>>(), "{env}");
}
