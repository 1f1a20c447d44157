//! This machine: its detected (or declared) resources, worker processes
//! started here.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use trainer::{NodeResources, ProcessBackend, ProcessConfig, ResourcePool};

use super::{Launcher, Nodes, Placement, Startup};
use crate::config::Kind;
use crate::experiment::ExperimentFile;
use crate::TuneError;

pub(super) struct LocalPlacement {
    node: NodeResources,
}

impl LocalPlacement {
    /// `node` when given; a simulation's `max_concurrent_trials` virtual
    /// slots; the file's `[resources]`; else what this machine has.
    pub(super) fn new(file: &ExperimentFile, kind: &Kind, node: Option<NodeResources>) -> Result<Self, TuneError> {
        let node = match (node, file.resources.is_empty(), kind) {
            (Some(node), _, _) => node,
            (None, _, Kind::Simulated(_)) => {
                let slots = file.experiment.max_concurrent_trials.unwrap_or(4) as f64;
                NodeResources::from_declared(&[("CPU".to_string(), slots)].into_iter().collect())?
            }
            (None, false, _) => NodeResources::from_declared(&file.resources)?,
            (None, true, _) => NodeResources::detect(),
        };
        Ok(Self { node })
    }
}

impl Placement for LocalPlacement {
    fn check<'a>(&'a mut self, _: &'a Startup<'a>) -> BoxFuture<'a, Result<(), TuneError>> {
        async { Ok(()) }.boxed()
    }

    fn nodes(&self) -> Nodes {
        Nodes {
            pool: ResourcePool::new(self.node.clone()),
            description: format!("node {}, {}", self.node.describe(), self.node.gpu_note),
            notes: Vec::new(),
        }
    }

    fn backend<'a>(self: Box<Self>, config: ProcessConfig, _: &'a Startup<'a>) -> BoxFuture<'a, Result<Launcher, TuneError>> {
        async move {
            let backend = ProcessBackend::start(config).await.map_err(|source| TuneError::Io { path: "<report server>".into(), source })?;
            Ok(Launcher { backend: Arc::new(backend), notes: Vec::new() })
        }
        .boxed()
    }
}
