//! A sweep fed through `[datasets]`: a linear model of red-wine quality,
//! each trial a data-parallel run of 2 in-process Rust ranks that read
//! their shares of Parquet files with `dataset_shard` (nestor-data) (Arrow
//! record batches), reshuffled every epoch, and average their gradients
//! with `all_reduce`. Every rank reads as many rows an epoch, so every rank
//! takes as many steps and no collective waits on a rank that ran out.
//!
//! ```text
//! cargo run --release -p nestor-example-data [-- --trials N --epochs E --storage DIR]
//! ```
//!
//! It writes the data set as Parquet first (`DIR/wine-parquet/`: the
//! training rows in 4 files of row groups of 100, the validation rows in
//! one), then runs `examples/data/sweep.toml` with the trainable below.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Parser;
use data::arrow_array::{cast::AsArray, types::Float64Type, ArrayRef, Float64Array, RecordBatch};
use data::{DatasetShards as _, DatasetSpec, Paths};
use trainer::{Context, ReduceOp, TrainResult};
use tuner::{ExperimentFile, Mode, ScalingConfig, Scope, Trainable, Tuner};

/// The input columns.
const FEATURES: usize = 11;

/// Tune a linear model of red-wine quality fed through `[datasets]`.
#[derive(Parser, Debug)]
#[command(name = "wine-data")]
struct Args {
    /// How many configs to try [default: the file's].
    #[arg(long)]
    trials: Option<u64>,
    /// Epochs each trial trains at most [default: the file's].
    #[arg(long)]
    epochs: Option<u64>,
    /// Where the Parquet files and the experiment are written (the file's
    /// data set paths follow it).
    #[arg(long, default_value = "nestor-runs")]
    storage: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // The driver plans the data sets with nestor-data's readers.
    data::install();
    let file_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweep.toml");
    // --trials and --epochs as the nestor command's `--set key=value`.
    let mut sets = Vec::new();
    if let Some(n) = args.trials {
        sets.push(format!("experiment.num_samples={n}"));
    }
    if let Some(n) = args.epochs {
        sets.extend([format!("space.epochs={n}"), format!("scheduler.max_t={n}")]);
    }
    let mut file = ExperimentFile::read(&file_path, &sets)?;
    let storage = PathBuf::from(&args.storage);
    let rows = write_parquet(&storage.join("wine-parquet"))?;
    // The file's data sets lie below its storage: they follow --storage.
    for spec in file.datasets.values_mut() {
        if let DatasetSpec::Table(t) = spec {
            if let Paths::One(p) = &mut t.path {
                *p = p.replacen("nestor-runs/", &format!("{}/", args.storage), 1);
            }
        }
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let e = &mut file.experiment;
    e.name = format!("{}-{stamp}", e.name);
    e.storage = Some(args.storage.clone());
    println!("Tuning a linear model of red-wine quality through [datasets]: {} training rows in Parquet, 2 ranks a trial", rows.0);
    let trainable = Trainable::function(train).scaling(ScalingConfig::workers(2));
    let started = std::time::Instant::now();
    let grid = Tuner::from_file(file, file_path.display().to_string(), Some(trainable)).fit()?;
    let best = grid.best_result(None, None, Scope::Last)?;
    let metric = |k: &str| best.metrics.as_ref().and_then(|m| m.get(k)).copied().unwrap_or(f64::NAN);
    println!(
        "{} trials: {} terminated, {} errors in {:.1} s",
        grid.len(),
        grid.num_terminated(),
        grid.num_errors(),
        started.elapsed().as_secs_f64()
    );
    println!("Best trial: {}", best.trial_id);
    println!("  config:     {}", best.config);
    println!("  val_rmse:   {:.4}", metric("val_rmse"));
    println!("  rows:       {} training rows a rank an epoch", metric("rows"));
    let ckpt = best.best_checkpoint("val_rmse", Mode::Min).map(|c| c.uri.as_str());
    println!("  checkpoint: {}", ckpt.unwrap_or("none"));
    Ok(())
}

/// The wine-quality data set, standardised with the training rows'
/// statistics, as Parquet in `dir` (once): `train/part-{0..3}.parquet` and
/// `valid.parquet`. Returns the rows of each.
fn write_parquet(dir: &Path) -> Result<(usize, usize)> {
    let ds = linfa_datasets::winequality();
    let (records, targets) = (ds.records(), ds.targets());
    let n = records.nrows();
    // Every fifth row validates; the others train.
    let (train, valid): (Vec<usize>, Vec<usize>) = (0..n).partition(|i| i % 5 != 0);
    let mut mean = [0f64; FEATURES];
    let mut sd = [0f64; FEATURES];
    for &i in &train {
        for (f, m) in mean.iter_mut().enumerate() {
            *m += records[[i, f]] / train.len() as f64;
        }
    }
    for &i in &train {
        for (f, s) in sd.iter_mut().enumerate() {
            *s += (records[[i, f]] - mean[f]).powi(2) / train.len() as f64;
        }
    }
    let batch = |rows: &[usize]| -> Result<RecordBatch> {
        let mut columns: Vec<(String, ArrayRef)> = (0..FEATURES)
            .map(|f| {
                let values = rows.iter().map(|&i| (records[[i, f]] - mean[f]) / sd[f].sqrt().max(1e-9));
                (format!("x{f}"), Arc::new(Float64Array::from_iter_values(values)) as ArrayRef)
            })
            .collect();
        columns.push(("quality".into(), Arc::new(Float64Array::from_iter_values(rows.iter().map(|&i| targets[i] as f64)))));
        Ok(RecordBatch::try_from_iter(columns)?)
    };
    let write = |path: &Path, rows: &[usize]| -> Result<()> {
        if path.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(path.parent().context("a file has a directory")?)?;
        let b = batch(rows)?;
        let props = parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(100)).build();
        let tmp = path.with_extension("tmp");
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&tmp)?, b.schema(), Some(props))?;
        w.write(&b)?;
        w.close()?;
        std::fs::rename(tmp, path)?;
        Ok(())
    };
    for (k, part) in train.chunks(train.len().div_ceil(4)).enumerate() {
        write(&dir.join(format!("train/part-{k}.parquet")), part)?;
    }
    write(&dir.join("valid.parquet"), &valid)?;
    Ok((train.len(), valid.len()))
}

/// A batch's inputs (row-major) and targets.
fn columns(batch: &RecordBatch) -> Result<(Vec<f64>, Vec<f64>)> {
    let col = |name: &str| -> Result<&[f64]> {
        let c = batch.column_by_name(name).with_context(|| format!("no column {name}"))?;
        Ok(c.as_primitive_opt::<Float64Type>().with_context(|| format!("{name} is {}, not float64", c.data_type()))?.values())
    };
    let xs: Vec<&[f64]> = (0..FEATURES).map(|f| col(&format!("x{f}"))).collect::<Result<_>>()?;
    let x = (0..batch.num_rows()).flat_map(|r| xs.iter().map(move |c| c[r])).collect();
    Ok((x, col("quality")?.to_vec()))
}

/// One rank of a trial: mini-batch SGD on its share of `train`, the
/// gradients summed across the ranks each step; the validation RMSE on the
/// whole of `valid` each epoch. Rank 0 saves the weights every epoch.
fn train(ctx: &mut Context) -> TrainResult {
    let lr: f64 = ctx.param("lr")?;
    let weight_decay: f64 = ctx.param("weight_decay")?;
    let epochs: u64 = ctx.param("epochs")?;
    let world = ctx.world_size() as usize;
    // The global batch is the config's: each rank takes its part.
    let local_batch = (ctx.param::<usize>("batch_size")? / world).max(1);
    let mut w = vec![0f32; FEATURES + 1]; // the weights, then the bias
    if let Some(dir) = ctx.checkpoint() {
        w = serde_json::from_slice(&std::fs::read(dir.join("weights.json"))?)?;
    }
    let mut shard = ctx.dataset_shard("train")?;
    let mut valid = ctx.dataset_shard("valid")?;
    let scratch = ctx.trial_dir().join(format!("scratch-rank-{}", ctx.world_rank()));
    for epoch in ctx.start_iteration() + 1..=epochs {
        let mut grad = vec![0f32; FEATURES + 2];
        for batch in shard.iter_batches(local_batch) {
            let (x, y) = columns(&batch?)?;
            grad.iter_mut().for_each(|g| *g = 0.0);
            for (row, target) in x.chunks(FEATURES).zip(&y) {
                let err = predict(&w, row) - target;
                for (g, v) in grad.iter_mut().zip(row) {
                    *g += (err * v) as f32;
                }
                grad[FEATURES] += err as f32;
                grad[FEATURES + 1] += 1.0; // rows in the step
            }
            // Every rank takes the same number of steps: their shares are equal.
            ctx.all_reduce(&mut grad, ReduceOp::Sum)?;
            let rows = grad[FEATURES + 1].max(1.0);
            for (wi, g) in w.iter_mut().zip(&grad[..=FEATURES]) {
                *wi -= (lr * (f64::from(*g / rows) + weight_decay * f64::from(*wi))) as f32;
            }
        }
        let (mut sq, mut n) = (0f64, 0usize);
        for batch in valid.iter_batches(1024) {
            let (x, y) = columns(&batch?)?;
            for (row, target) in x.chunks(FEATURES).zip(&y) {
                sq += (predict(&w, row) - target).powi(2);
                n += 1;
            }
        }
        let checkpoint = if ctx.world_rank() == 0 {
            std::fs::create_dir_all(&scratch)?;
            std::fs::write(scratch.join("weights.json"), serde_json::to_vec(&w)?)?;
            Some(scratch.clone())
        } else {
            None
        };
        ctx.report(
            [("val_rmse", (sq / n.max(1) as f64).sqrt()), ("rows", shard.count() as f64), ("epoch", epoch as f64)],
            checkpoint.as_deref(),
        )?;
    }
    Ok(())
}

fn predict(w: &[f32], row: &[f64]) -> f64 {
    row.iter().zip(w).map(|(x, wi)| x * f64::from(*wi)).sum::<f64>() + f64::from(w[FEATURES])
}
