//! In-process trainables: a Rust function run on its own thread per trial.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::backend::{Backend, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, TrialHandle};
use crate::context::{Context, ReportError};

/// What a training function returns: `Ok`, or any error (which fails the
/// trial, except [`ReportError::Stopped`], which ends it normally).
pub type TrainResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A training function: called once per trial run with the trial's context.
pub type TrainFn = dyn Fn(&mut Context) -> TrainResult + Send + Sync;

/// Runs a Rust function per trial, each on its own thread. A panic becomes
/// the trial's error.
#[derive(Clone)]
pub struct FunctionBackend {
    func: Arc<TrainFn>,
}

impl FunctionBackend {
    /// Wraps a training function.
    pub fn new<F>(func: F) -> Self
    where
        F: Fn(&mut Context) -> TrainResult + Send + Sync + 'static,
    {
        Self { func: Arc::new(func) }
    }
}

impl std::fmt::Debug for FunctionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FunctionBackend")
    }
}

impl Backend for FunctionBackend {
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let (handle, stop) = TrialHandle::new();
        let func = Arc::clone(&self.func);
        let trial_id = spec.trial_id.clone();
        let mut ctx = Context::in_process(&spec, events.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("trial-{trial_id}"))
            .spawn(move || {
                // Created here, not in the driver's loop: the loop never waits on the disk.
                if let Err(e) = std::fs::create_dir_all(ctx.trial_dir()) {
                    let msg = format!("cannot create {}: {e}", ctx.trial_dir().display());
                    let _ = events.send(Event { trial_id, kind: EventKind::Exited(ExitOutcome::Failed(msg)) });
                    return;
                }
                let outcome = match catch_unwind(AssertUnwindSafe(|| func(&mut ctx))) {
                    Ok(Ok(())) => ExitOutcome::Completed,
                    Ok(Err(e)) => match e.downcast_ref::<ReportError>() {
                        Some(ReportError::Stopped) => {
                            if *stop.borrow() > crate::StopLevel::Run {
                                ExitOutcome::Stopped
                            } else {
                                ExitOutcome::Completed
                            }
                        }
                        _ => ExitOutcome::Failed(error_chain(&*e)),
                    },
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        ExitOutcome::Failed(format!("the training function panicked: {msg}"))
                    }
                };
                drop(ctx);
                // The driver may already be gone (second Ctrl-C); nothing to tell then.
                let _ = events.send(Event { trial_id, kind: EventKind::Exited(outcome) });
            })
            .map_err(|source| LaunchError::Spawn { program: "trial thread".into(), source })?;
        Ok(handle)
    }
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
