//! examples/docs/worker.rs: a worker program of its own, one process per rank (`trainer.command`).
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut ctx = trainer::Context::from_env()?;
    let lr: f64 = ctx.param("lr")?;
    // A run restarted after a failure resumes from its last checkpoint.
    let mut w: f64 = match ctx.checkpoint() {
        Some(dir) => std::fs::read_to_string(dir.join("w"))?.parse()?,
        None => 0.0,
    };
    for _epoch in 1..=10 {
        w -= lr * 2.0 * (w - 3.0); // one step of gradient descent on (w - 3)^2
        let ckpt: PathBuf = ctx.trial_dir().join(format!("rank-{}", ctx.world_rank()));
        std::fs::create_dir_all(&ckpt)?;
        std::fs::write(ckpt.join("w"), w.to_string())?;
        ctx.report([("loss", (w - 3.0).powi(2))], Some(&ckpt))?; // Err(Stopped) when the trial must stop
    }
    Ok(())
}
