use tuner::{AshaConfig, Domain, Mode, RunConfig, SchedulerConfig, Scope, Space, Trainable, TuneConfig, Tuner};

fn main() -> anyhow::Result<()> {
    let space = Space::builder().param("lr", Domain::loguniform(1e-4, 1e-1)).build()?;
    let objective = Trainable::function(|ctx| {
        let lr: f64 = ctx.param("lr")?;
        for step in 0..20 {
            ctx.report([("loss", (lr - 0.01).powi(2) + 1.0 / (step as f64 + 1.0))], None)?;
        }
        Ok(())
    });
    let asha = AshaConfig { max_t: 20.0, ..Default::default() };
    let grid = Tuner::new(objective, space)
        .tune_config(TuneConfig {
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            num_samples: 16,
            scheduler: SchedulerConfig::Asha(asha),
            ..Default::default()
        })
        .run_config(RunConfig { name: format!("readme-sweep-{}", std::time::UNIX_EPOCH.elapsed()?.as_secs()), ..Default::default() })
        .fit()?;
    let best = grid.best_result(None, None, Scope::Last)?;
    println!("{} {:?} {:?}", best.config, best.metrics, best.checkpoint());
    Ok(())
}
