//! examples/docs/sweep.rs: a sweep in Rust, every trial a 2-rank run.
use tuner::{AshaConfig, Domain, Mode, RunConfig, ScalingConfig, SchedulerConfig, Scope, Space, Stop, Trainable, TuneConfig, Tuner};

fn main() -> anyhow::Result<()> {
    let space = Space::builder()
        .param("lr", Domain::loguniform(1e-4, 1e-1))
        .param("batch_size", Domain::choice([32, 64, 128]))
        .nested("model", Space::builder().param("width", Domain::qrandint(64, 512, 64)))
        .build()?; // an impossible space is refused here

    let trainable = Trainable::function(|ctx| {
        let lr: f64 = ctx.param("lr")?;
        for step in 1..=20 {
            ctx.report([("loss", 1.0 / (step as f64 * lr))], None)?; // `?` ends the trial when told to stop
        }
        Ok(())
    })
    .scaling(ScalingConfig::workers(2)); // 2 ranks per trial (threads; collectives on ctx)

    let grid = Tuner::new(trainable, space)
        .tune_config(TuneConfig {
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            num_samples: 16,
            max_concurrent_trials: Some(4),
            seed: Some(42),
            scheduler: SchedulerConfig::Asha(AshaConfig { max_t: 20.0, ..Default::default() }),
            ..Default::default()
        })
        .run_config(RunConfig { name: "my-sweep".into(), stop: Stop::new().iterations(20), ..Default::default() })
        .fit()?;

    let best = grid.best_result(None, None, Scope::Last)?; // scopes: Last, Avg, LastAvg(5), All
    println!("{} {} {:?}", best.trial_id, best.config, best.checkpoint());
    Ok(())
}
