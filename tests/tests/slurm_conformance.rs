//! The backend conformance suite (trainer::conformance) for Slurm job
//! steps: the fixture worker's ranks on two nodes of a test cluster's
//! allocation, each run one `srun`. The only test of its binary: it points
//! this process's Slurm clients at the test cluster (`SLURM_CONF`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::slurm::SlurmCluster;
use trainer::conformance::{check, Case, Subject};
use trainer::{Backend, LaunchSpec, ProcessConfig, SlurmAllocation, SlurmBackend, WorkerBundle};

struct Steps {
    backend: Arc<dyn Backend>,
    nodes: Vec<String>,
}

impl Subject for Steps {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::clone(&self.backend)
    }

    fn spec(&self, trial_id: &str, case: &Case, dir: &std::path::Path) -> LaunchSpec {
        let config = common::conformance_config(case);
        // <experiment>/trials/<id>, as the tuner lays it out.
        let mut spec = LaunchSpec::new(trial_id, config, dir.join("exp/trials").join(trial_id));
        // One rank per node.
        spec.workers = (0..case.world_size)
            .map(|r| WorkerBundle { node: self.nodes[r as usize % self.nodes.len()].clone(), ..WorkerBundle::cpus(1.0) })
            .collect();
        spec
    }
}

#[test]
fn slurm_job_steps_pass_the_backend_conformance_suite() {
    let cluster = SlurmCluster::start(2, 2, 2000);
    // This binary's only test: no other thread reads the environment meanwhile.
    std::env::set_var("SLURM_CONF", cluster.conf());
    let out = cluster.run("salloc", &["--no-shell", "-N2", "--ntasks-per-node=2", "--mem=1000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let job = stderr.lines().find_map(|l| l.strip_prefix("salloc: Granted job allocation ")).unwrap_or_else(|| panic!("salloc: {stderr}"));
    let shown = cluster.run("scontrol", &["show", "job", "-d", job]);
    let allocation = SlurmAllocation::from_scontrol(job, &String::from_utf8_lossy(&shown.stdout)).unwrap();
    let nodes: Vec<String> = allocation.nodes.iter().map(|n| n.name.clone()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let mut config = ProcessConfig::new(vec![common::worker().to_string()]);
        config.grace_period = std::time::Duration::from_secs(2);
        let backend = SlurmBackend::start(config, allocation, None).await.unwrap();
        check(&Steps { backend: Arc::new(backend), nodes }, dir.path()).await;
    });
    // Every run's step is gone.
    let steps = cluster.run("squeue", &["-h", "-s", "-j", job, "-o", "%j"]);
    assert!(!String::from_utf8_lossy(&steps.stdout).contains("nestor-"), "{}", String::from_utf8_lossy(&steps.stdout));
    let _ = cluster.run("scancel", &[job]);
}
