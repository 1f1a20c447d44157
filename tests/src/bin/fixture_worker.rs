//! A worker process for nestor's integration tests, driven by its config:
//!
//! - `x` (float): the loss is `(x - 0.3)^2 + 1 / iteration`, deterministic;
//! - `steps` (int, default 5): iterations to run;
//! - `sleep_ms` (int, default 0): time per iteration;
//! - `checkpoint` (bool): save `{"step": n}` with every report and resume from it;
//! - `fail_at` (int): exit with code 3 at this iteration, after printing to stderr;
//! - `nan_at` (int): report NaN at this iteration;
//! - `omit_metric` (bool): report `other` instead of `loss`;
//! - `ignore_sigterm` (bool): ignore SIGTERM;
//! - `leak_child` (bool): start a `sleep 300` that outlives this process.

use std::path::PathBuf;
use std::time::Duration;

use trainer::{Context, ReportError};

fn main() -> anyhow::Result<()> {
    let mut ctx = Context::from_env()?;
    let x: f64 = ctx.param("x").unwrap_or(0.0);
    let steps: u64 = ctx.param("steps").unwrap_or(5);
    let sleep_ms: u64 = ctx.param("sleep_ms").unwrap_or(0);
    let checkpoint: bool = ctx.param("checkpoint").unwrap_or(false);
    let fail_at: Option<u64> = ctx.param("fail_at").ok();
    let nan_at: Option<u64> = ctx.param("nan_at").ok();
    let omit: bool = ctx.param("omit_metric").unwrap_or(false);
    if ctx.param::<bool>("ignore_sigterm").unwrap_or(false) {
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    if ctx.param::<bool>("leak_child").unwrap_or(false) {
        // Deliberately never waited for: nestor must clean it up.
        std::mem::forget(std::process::Command::new("sleep").arg("300").spawn()?);
    }
    let mut start = 0u64;
    if let Some(dir) = ctx.checkpoint() {
        let state: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("state.json"))?)?;
        start = state["step"].as_u64().unwrap_or(0);
        eprintln!("resumed from {} at step {start}", dir.display());
    }
    let scratch = std::env::temp_dir().join(format!("fixture-{}-{}", ctx.trial_id(), std::process::id()));
    for step in start + 1..=steps {
        std::thread::sleep(Duration::from_millis(sleep_ms));
        if fail_at == Some(step) {
            eprintln!("fixture: failing on purpose at step {step}");
            std::process::exit(3);
        }
        let loss = if nan_at == Some(step) { f64::NAN } else { (x - 0.3).powi(2) + 1.0 / step as f64 };
        let name = if omit { "other" } else { "loss" };
        let ckpt: Option<PathBuf> = if checkpoint {
            std::fs::create_dir_all(&scratch)?;
            std::fs::write(scratch.join("state.json"), serde_json::json!({ "step": step }).to_string())?;
            Some(scratch.clone())
        } else {
            None
        };
        match ctx.report([(name, loss), ("step", step as f64)], ckpt.as_deref()) {
            Ok(()) => eprintln!("acked step {step}"),
            Err(ReportError::Stopped) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
