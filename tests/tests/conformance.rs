//! The backend conformance suite (trainer::conformance) for worker
//! processes: the fixture worker, one process per rank. (In-process
//! functions pass it in the trainer crate, the simulator in the tuner crate.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use trainer::conformance::{check, Case, Subject};
use trainer::{Backend, LaunchSpec, ProcessBackend, ProcessConfig, WorkerBundle};

struct Processes(Arc<dyn Backend>);

impl Subject for Processes {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::clone(&self.0)
    }

    fn spec(&self, trial_id: &str, case: &Case, dir: &std::path::Path) -> LaunchSpec {
        let config = common::conformance_config(case);
        let mut spec = LaunchSpec::new(trial_id, config, dir.join(trial_id));
        spec.workers = vec![WorkerBundle::cpus(1.0); case.world_size as usize];
        spec
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_pass_the_backend_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ProcessConfig::new(vec![common::worker().to_string()]);
    config.grace_period = std::time::Duration::from_secs(2);
    check(&Processes(Arc::new(ProcessBackend::start(config).await.unwrap())), dir.path()).await;
}
