//! In-process trainables: a Rust function run on its own thread per trial.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::aggregate::Aggregator;
use crate::backend::{Backend, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, StepProgress, TrialHandle};
use crate::collective::Collective;
use crate::context::{Context, Group, ReportError};
use crate::intake::Intake;

/// What a training function returns: `Ok`, or any error (which fails the
/// trial, except [`ReportError::Stopped`], which ends it normally).
pub type TrainResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A training function: called once per trial run with the trial's context.
pub type TrainFn = dyn Fn(&mut Context) -> TrainResult + Send + Sync;

/// Runs a Rust function per rank of each trial, each rank on its own thread
/// (`ctx.world_rank()`, `ctx.world_size()`, and in-process collectives for
/// data parallelism). Threads are kept and reused for later trials, so a
/// short trial does not pay for a thread's creation. A panic becomes the
/// trial's error.
#[derive(Clone)]
pub struct FunctionBackend {
    func: Arc<TrainFn>,
    pool: Arc<Pool>,
}

type Job = Box<dyn FnOnce() + Send>;

/// Idle trial threads, each waiting on its own job channel.
#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<std::sync::mpsc::Sender<Job>>>,
    spawned: AtomicUsize,
}

impl Pool {
    fn run(self: &Arc<Self>, job: Job) -> std::io::Result<()> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let job = match idle {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                Err(e) => e.0,
            },
            None => job,
        };
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let pool = Arc::downgrade(self);
        let n = self.spawned.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new().name(format!("nestor-trial-{n}")).spawn(move || {
            let mut job = Some(job);
            while let Some(j) = job.take() {
                j();
                // Back to the idle list, unless the backend is gone.
                let Some(pool) = pool.upgrade() else { return };
                match pool.idle.lock() {
                    Ok(mut idle) => idle.push(tx.clone()),
                    Err(_) => return,
                }
                drop(pool);
                job = rx.recv().ok();
            }
        })?;
        Ok(())
    }
}

impl FunctionBackend {
    /// Wraps a training function.
    pub fn new<F>(func: F) -> Self
    where
        F: Fn(&mut Context) -> TrainResult + Send + Sync + 'static,
    {
        Self { func: Arc::new(func), pool: Arc::new(Pool::default()) }
    }
}

impl std::fmt::Debug for FunctionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FunctionBackend")
    }
}

impl Backend for FunctionBackend {
    /// Starts one thread per rank; they share a step aggregator and a
    /// collective group. The run's exit is sent once every rank has returned;
    /// the first rank to fail makes the others stop (their collectives abort
    /// and their next report returns `Stopped`) and names the run's error.
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let world_size = spec.world_size();
        let aggregator = Arc::new(Aggregator::new(&spec.trial_id, world_size, spec.start_iteration, events.clone()));
        let (handle, stop) = TrialHandle::new(Vec::new(), Some(Arc::clone(&aggregator) as Arc<dyn StepProgress>));
        let group = Arc::new(Group {
            intake: Intake::in_process(&spec, aggregator),
            runtime: tokio::runtime::Handle::try_current().ok(),
            collective: Collective::new(world_size, stop.clone()),
            failed: AtomicBool::new(false),
            stop: stop.clone(),
            await_decisions: spec.await_decisions,
        });
        let exit = Arc::new(GroupExit { remaining: AtomicUsize::new(world_size as usize), failure: Mutex::new(None) });
        for rank in 0..world_size {
            let func = Arc::clone(&self.func);
            let trial_id = spec.trial_id.clone();
            let mut ctx = Context::in_process(&spec, rank, Arc::clone(&group));
            let (group, exit, events, stop) = (Arc::clone(&group), Arc::clone(&exit), events.clone(), stop.clone());
            let job: Job = Box::new(move || {
                let failure = match catch_unwind(AssertUnwindSafe(|| func(&mut ctx))) {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => match e.downcast_ref::<ReportError>() {
                        Some(ReportError::Stopped) => None,
                        _ => Some(error_chain(&*e)),
                    },
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Some(format!("the training function panicked: {msg}"))
                    }
                };
                drop(ctx);
                let prefix = if world_size > 1 { format!("rank {rank}: ") } else { String::new() };
                match &failure {
                    Some(msg) => {
                        // The first failure is the run's; it stops the others.
                        if let Ok(mut f) = exit.failure.lock() {
                            f.get_or_insert_with(|| format!("{prefix}{msg}"));
                        }
                        group.failed.store(true, Ordering::Release);
                        group.collective.abort(format!("rank {rank} failed: {msg}"));
                        group.intake.aggregator().fail();
                    }
                    None => {
                        group.collective.abort(format!("rank {rank} has returned"));
                        group.intake.aggregator().rank_finished(rank);
                    }
                }
                if exit.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let failure = exit.failure.lock().ok().and_then(|mut f| f.take());
                    let outcome = match failure {
                        Some(msg) => ExitOutcome::Failed(msg),
                        None if *stop.borrow() > crate::StopLevel::Run => ExitOutcome::Stopped,
                        None => ExitOutcome::Completed,
                    };
                    // The driver may already be gone (second Ctrl-C); nothing to tell then.
                    let _ = events.send(Event { trial_id, kind: EventKind::Exited(outcome) });
                }
            });
            self.pool.run(job).map_err(|source| LaunchError::Spawn { program: "trial thread".into(), source })?;
        }
        Ok(handle)
    }

    /// A rank's next report reads a graceful stop as `Stopped`.
    fn goes_on_unanswered(&self) -> bool {
        true
    }
}

/// How a run's ranks end together.
struct GroupExit {
    remaining: AtomicUsize,
    failure: Mutex<Option<String>>,
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod conformance_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::conformance::{check, Behaviour, Case, Subject};

    /// In-process ranks: rank 0 reports `loss`; the last rank fails with an
    /// error, or hangs in a barrier no other rank enters (a kill aborts it).
    struct Functions(Arc<dyn Backend>);

    impl Subject for Functions {
        fn backend(&self) -> Arc<dyn Backend> {
            Arc::clone(&self.0)
        }

        fn spec(&self, trial_id: &str, case: &Case, dir: &std::path::Path) -> LaunchSpec {
            let (fail_at, hang_at) = match case.behaviour {
                Behaviour::Complete => (0, 0),
                Behaviour::FailAt(s) => (s, 0),
                Behaviour::HangAt(s) => (0, s),
            };
            let config = serde_json::json!({ "steps": case.steps, "step_ms": case.step_ms, "fail_at": fail_at, "hang_at": hang_at });
            let mut spec = LaunchSpec::new(trial_id, config, dir.join(trial_id));
            spec.workers = vec![crate::WorkerBundle::cpus(1.0); case.world_size as usize];
            spec
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_function_backend_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let backend = FunctionBackend::new(|ctx| {
            let steps: u64 = ctx.param("steps")?;
            let step_ms: u64 = ctx.param("step_ms")?;
            let (fail_at, hang_at): (u64, u64) = (ctx.param("fail_at")?, ctx.param("hang_at")?);
            let last = ctx.world_rank() + 1 == ctx.world_size();
            for step in 1..=steps {
                std::thread::sleep(std::time::Duration::from_millis(step_ms));
                if last && step == fail_at {
                    return Err(anyhow_like(format!("failing on purpose at step {step}")));
                }
                if last && step == hang_at {
                    ctx.barrier()?;
                }
                match ctx.report([("loss", 1.0 / step as f64)], None) {
                    Err(ReportError::Stopped) => return Ok(()),
                    other => other?,
                }
            }
            Ok(())
        });
        check(&Functions(Arc::new(backend)), dir.path()).await;
    }

    fn anyhow_like(msg: String) -> Box<dyn std::error::Error + Send + Sync> {
        msg.into()
    }
}
