//! The examples' real model and data: a small multi-layer perceptron (candle)
//! that predicts red-wine quality from 11 physico-chemical measurements (the
//! UCI wine-quality set, 1,599 samples, shipped in `linfa-datasets`).
//!
//! [`train`] is one trial: it reads its hyperparameters from the trial's
//! context, trains, reports validation RMSE every epoch, and checkpoints the
//! weights. The same function runs in-process (`quickstart`) and as a worker
//! process (`wine-worker`, driven by `wine.toml`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW};
use search::{Domain, Space};
use trainer::{Context, ReduceOp, ReportError, TrainResult};

/// Number of input features.
pub const FEATURES: usize = 11;

/// The data set, standardised with the training split's statistics.
pub struct WineData {
    x_train: Tensor,
    y_train: Tensor,
    x_val: Tensor,
    y_val: Tensor,
    n_train: usize,
}

/// A tiny deterministic RNG (splitmix64), so training is reproducible.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

impl WineData {
    /// Loads the shipped data set and splits it 80/20 (fixed shuffle).
    pub fn load() -> Result<Self> {
        let ds = linfa_datasets::winequality();
        let records = ds.records();
        let targets = ds.targets();
        let n = records.nrows();
        let mut idx: Vec<usize> = (0..n).collect();
        Rng(2024).shuffle(&mut idx);
        let n_train = n * 8 / 10;
        let (train, val) = idx.split_at(n_train);
        let mut mean = [0f64; FEATURES];
        let mut sd = [0f64; FEATURES];
        for &i in train {
            for f in 0..FEATURES {
                mean[f] += records[[i, f]] / n_train as f64;
            }
        }
        for &i in train {
            for f in 0..FEATURES {
                sd[f] += (records[[i, f]] - mean[f]).powi(2) / n_train as f64;
            }
        }
        let sd: [f64; FEATURES] = sd.map(|v| v.sqrt().max(1e-9));
        let dev = Device::Cpu;
        let build = |rows: &[usize]| -> Result<(Tensor, Tensor)> {
            let x: Vec<f32> = rows.iter().flat_map(|&i| (0..FEATURES).map(move |f| ((records[[i, f]] - mean[f]) / sd[f]) as f32)).collect();
            let y: Vec<f32> = rows.iter().map(|&i| targets[i] as f32).collect();
            Ok((Tensor::from_vec(x, (rows.len(), FEATURES), &dev)?, Tensor::from_vec(y, (rows.len(), 1), &dev)?))
        };
        let (x_train, y_train) = build(train)?;
        let (x_val, y_val) = build(val)?;
        Ok(Self { x_train, y_train, x_val, y_val, n_train })
    }

    /// Number of training samples.
    pub fn n_train(&self) -> usize {
        self.n_train
    }
}

/// A one-hidden-layer perceptron.
struct Mlp {
    vars: Vec<Var>,
}

const NAMES: [&str; 4] = ["w1", "b1", "w2", "b2"];

impl Mlp {
    fn new(hidden: usize, seed: u64) -> Result<Self> {
        let mut rng = Rng(seed);
        let mut init = |rows: usize, cols: usize, fan_in: usize| -> Result<Var> {
            let bound = (1.0 / fan_in as f32).sqrt();
            let v: Vec<f32> = (0..rows * cols).map(|_| (rng.uniform() * 2.0 - 1.0) * bound).collect();
            let t = Tensor::from_vec(v, (rows, cols), &Device::Cpu)?;
            Ok(Var::from_tensor(&t)?)
        };
        let w1 = init(hidden, FEATURES, FEATURES)?;
        let b1 = init(1, hidden, FEATURES)?;
        let w2 = init(1, hidden, hidden)?;
        let b2 = init(1, 1, hidden)?;
        Ok(Self { vars: vec![w1, b1, w2, b2] })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let l1 = Linear::new(self.vars[0].as_tensor().clone(), Some(self.vars[1].as_tensor().flatten_all()?));
        let l2 = Linear::new(self.vars[2].as_tensor().clone(), Some(self.vars[3].as_tensor().flatten_all()?));
        Ok(l2.forward(&l1.forward(x)?.relu()?)?)
    }

    /// Gradients of the squared error summed over `part`, divided by `global`
    /// (zeros when `part` is empty).
    fn local_grads(&self, data: &WineData, part: &[u32], global: usize) -> Result<GradStore> {
        let ids = Tensor::new(if part.is_empty() { &[0u32][..] } else { part }, &Device::Cpu)?;
        let x = data.x_train.index_select(&ids, 0)?;
        let y = data.y_train.index_select(&ids, 0)?;
        let scale = if part.is_empty() { 0.0 } else { 1.0 / global as f64 };
        let loss = ((self.forward(&x)? - y)?.sqr()?.sum_all()? * scale)?;
        Ok(loss.to_dtype(DType::F32)?.backward()?)
    }

    fn save(&self, path: &Path) -> Result<()> {
        let map: HashMap<String, Tensor> = NAMES.iter().zip(&self.vars).map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect();
        candle_core::safetensors::save(&map, path)?;
        Ok(())
    }

    fn load(&self, path: &Path) -> Result<()> {
        let map = candle_core::safetensors::load(path, &Device::Cpu)?;
        for (n, v) in NAMES.iter().zip(&self.vars) {
            let t = map.get(*n).with_context(|| format!("checkpoint {} has no `{n}`", path.display()))?;
            v.set(t)?;
        }
        Ok(())
    }
}

fn rmse(model: &Mlp, x: &Tensor, y: &Tensor) -> Result<f64> {
    let d = (model.forward(x)? - y)?;
    Ok(f64::from(d.sqr()?.mean_all()?.to_scalar::<f32>()?).sqrt())
}

/// The search space the examples tune (the same as `examples/wine.toml`).
pub fn space(epochs: u64) -> Space {
    Space::builder()
        .param("lr", Domain::loguniform(1e-4, 3e-2))
        .param("hidden", Domain::choice([8, 16, 32, 64]))
        .param("batch_size", Domain::choice([16, 32, 64]))
        .param("weight_decay", Domain::loguniform(1e-5, 1e-1))
        .constant("epochs", epochs)
        .build()
        .unwrap_or_default()
}

/// One worker of a trial: trains with the context's config, reporting
/// `val_rmse` and `train_rmse` every epoch and checkpointing every
/// `[checkpoint] frequency` epochs (else the config's `checkpoint_every`,
/// default 5) and at the last. Resumes from the context's checkpoint.
///
/// Data-parallel: each global batch of `batch_size` samples is split across
/// the trial's ranks, and the gradients are summed with `all_reduce` before
/// every rank takes the same optimizer step, so N workers compute what one
/// worker computes on the whole batch. Rank 0 writes the checkpoint (the
/// ranks' weights are identical); every rank resumes from it.
pub fn train(ctx: &mut Context, data: &WineData) -> TrainResult {
    let lr: f64 = ctx.param("lr")?;
    let hidden: usize = ctx.param("hidden")?;
    let batch: usize = ctx.param("batch_size")?;
    let weight_decay: f64 = ctx.param("weight_decay")?;
    let epochs: u64 = ctx.param("epochs")?;
    let checkpoint_every: u64 = match ctx.checkpoint_frequency() {
        0 => ctx.param("checkpoint_every").unwrap_or(5),
        n => n,
    };
    let (rank, world) = (ctx.world_rank() as usize, ctx.world_size() as usize);
    let model = Mlp::new(hidden, 7)?;
    let mut opt = AdamW::new(model.vars.clone(), ParamsAdamW { lr, weight_decay, ..Default::default() })?;
    let mut start = 0;
    if let Some(dir) = ctx.checkpoint() {
        model.load(&dir.join("model.safetensors"))?;
        let state: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("state.json"))?)?;
        start = state["epoch"].as_u64().unwrap_or(0);
    }
    // Written here, then copied by `report` into the trial's checkpoint_NNNNNN.
    let scratch = ctx.trial_dir().join(format!("scratch-rank-{rank}"));
    std::fs::create_dir_all(&scratch)?;
    let mut order: Vec<u32> = (0..data.n_train as u32).collect();
    let mut rng = Rng(11);
    for _ in 0..start {
        rng.shuffle(&mut order);
    }
    let mut flat: Vec<f32> = Vec::new();
    let result = (|| -> TrainResult {
        for epoch in start + 1..=epochs {
            rng.shuffle(&mut order);
            for chunk in order.chunks(batch) {
                // This rank's share of the global batch; the loss is scaled by the
                // global batch size, so the summed gradients are the global mean's.
                let part = &chunk[chunk.len() * rank / world..chunk.len() * (rank + 1) / world];
                let mut grads = model.local_grads(data, part, chunk.len())?;
                if world > 1 {
                    flat.clear();
                    for v in &model.vars {
                        let g = grads.get(v.as_tensor()).context("a parameter has no gradient")?;
                        flat.extend(g.flatten_all()?.to_vec1::<f32>()?);
                    }
                    ctx.all_reduce(&mut flat, ReduceOp::Sum)?;
                    let mut offset = 0;
                    for v in &model.vars {
                        let n = v.as_tensor().elem_count();
                        let g = Tensor::from_slice(&flat[offset..offset + n], v.as_tensor().shape(), &Device::Cpu)?;
                        grads.insert(v.as_tensor(), g);
                        offset += n;
                    }
                }
                opt.step(&grads)?;
            }
            let val = rmse(&model, &data.x_val, &data.y_val)?;
            let train = rmse(&model, &data.x_train, &data.y_train)?;
            let ckpt = if rank == 0 && (epoch % checkpoint_every == 0 || epoch == epochs) {
                model.save(&scratch.join("model.safetensors"))?;
                std::fs::write(scratch.join("state.json"), serde_json::json!({ "epoch": epoch }).to_string())?;
                Some(scratch.as_path())
            } else {
                None
            };
            ctx.report([("val_rmse", val), ("train_rmse", train)], ckpt)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    match result {
        Err(e) if matches!(e.downcast_ref::<ReportError>(), Some(ReportError::Stopped)) => Err(e),
        other => other,
    }
}
