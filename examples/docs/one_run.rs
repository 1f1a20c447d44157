//! examples/docs/one_run.rs: one data-parallel run without a sweep, as Ray Train's `trainer.fit()`.
use trainer::{ReduceOp, ScalingConfig, Trainer};

fn main() -> anyhow::Result<()> {
    let out = Trainer::function(|ctx| {
        let lr: f64 = ctx.param("lr")?;
        let mut w = 0.0f32;
        for _step in 1..=100 {
            // Each rank's gradient on its shard of the data; averaged across the ranks.
            let target = 3.0 + ctx.world_rank() as f32;
            let mut grad = [2.0 * (w - target)];
            ctx.all_reduce(&mut grad, ReduceOp::Mean)?;
            w -= lr as f32 * grad[0];
            ctx.report([("w", f64::from(w))], None)?;
        }
        Ok(())
    })
    .scaling(ScalingConfig::workers(2)) // or Trainer::command(["python", "train.py"])
    .config(serde_json::json!({ "lr": 0.1 }))
    .fit()?; // out.metrics, out.history, out.checkpoint, out.path
    let w = out.metrics.as_ref().and_then(|m| m.get("w")).copied().unwrap_or(f64::NAN);
    println!("w = {w:.3} after {} steps", out.history.len()); // the ranks' targets are 3 and 4: w goes to 3.5
    Ok(())
}
