//! A nestor worker process: trains the wine-quality MLP with the config
//! in its run plan (`NESTOR_RUN`) and reports over gRPC. Run it through
//! `nestor run examples/wine.toml`.

fn main() -> anyhow::Result<()> {
    let mut ctx = trainer::Context::from_env()?;
    let data = nestor_examples::WineData::load()?;
    match nestor_examples::train(&mut ctx, &data) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.downcast_ref::<trainer::ReportError>(), Some(trainer::ReportError::Stopped)) => Ok(()),
        Err(e) => Err(anyhow::anyhow!(e)),
    }
}
