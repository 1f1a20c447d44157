"""The deep-learning frameworks on TorchTrainer, 2 ranks on gloo, for the
tests (tests/tests/frameworks.rs).

Usage: frameworks.py STORAGE MODE [ARGS]
  hf-stop            a Tuner of 2 Hugging Face trials (4 evaluations each) under ASHA(max_t=2)
  hf-run NAME        one Hugging Face run (12 steps, a save and evaluation every 3), max_failures=1;
                     $SLOW_S sleeps each step; $ACKS gets a line per acknowledged save
  pl-stop            a Tuner of 2 Lightning trials (6 epochs each) under ASHA(max_t=2)
  pl-run NAME        one Lightning run (5 epochs), max_failures=1; $SLOW_S, $ACKS as above
  fsdp NAME N [FROM] an FSDP run on N ranks (prepare_model(parallel_strategy="fsdp")), a sharded
                     checkpoint (torch.distributed.checkpoint) each epoch, max_failures=1; FROM: a
                     checkpoint to resume from; $EPOCHS (3), $SLOW_S sleeps each epoch
  fully-shard        fully_shard (FSDP2) called directly in the function, 2 ranks
  accelerate         an Accelerate loop (Accelerator().prepare) on 2 ranks
Each prints RESULT <json> lines.
"""

import json
import os
import sys
import tempfile
import time

import torch
from torch import nn

from nestor import train, tune
from nestor.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler

from fw_models import LENGTH, VOCAB, Sequences, lightning_regressor, make_data

storage, mode = sys.argv[1], sys.argv[2]
SCALING = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5})


def ack(line):
    if os.environ.get("ACKS") and train.get_context().get_world_rank() == 0:
        with open(os.environ["ACKS"], "a") as f:
            f.write(f"{line}\n")


def rank_line(**values):
    """A line of this rank's log the test reads."""
    print("RANK " + json.dumps({"rank": train.get_context().get_world_rank(), **values}), flush=True)


# Hugging Face: a 2-layer GPT-2 from its config, token ids that count up.
def hf_loop(config):
    import transformers

    from nestor.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    class Acks(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(float(os.environ.get("SLOW_S", "0")))

        def on_save(self, args, state, control, **kwargs):
            ack(state.global_step)

    rank_line(pid=os.getpid())
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    every = config["every"]
    args = transformers.TrainingArguments(
        output_dir="hf-output", learning_rate=config.get("lr", 5e-3), per_device_train_batch_size=8,
        per_device_eval_batch_size=32, max_steps=config["steps"], eval_strategy="steps", eval_steps=every,
        save_strategy="steps", save_steps=every, logging_steps=every, report_to=[], use_cpu=True,
        disable_tqdm=True, ddp_find_unused_parameters=False, seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(256, 0), eval_dataset=Sequences(64, 1))
    trainer.add_callback(RayTrainReportCallback())
    trainer.add_callback(Acks())
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            rank_line(resumed=sorted(os.listdir(os.path.join(d, "checkpoint"))))
            trainer.train(resume_from_checkpoint=os.path.join(d, "checkpoint"))
    else:
        trainer.train()
    rank_line(ended_at_step=trainer.state.global_step)


# Lightning: a small regression network.
def pl_loop(config):
    import lightning.pytorch as pl

    from nestor.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    Regressor = lightning_regressor(pl)

    class Acks(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            ack(trainer.current_epoch)

    rank_line(pid=os.getpid())
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=config["epochs"], devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback(), Acks()], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
    )
    trainer = prepare_trainer(trainer)
    model = Regressor(config.get("lr", 1e-2))
    loaders = (torch.utils.data.DataLoader(make_data(256, 0), batch_size=32, shuffle=True),
               torch.utils.data.DataLoader(make_data(64, 1), batch_size=64))
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            rank_line(resumed=sorted(os.listdir(d)))
            trainer.fit(model, *loaders, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.fit(model, *loaders)
    rank_line(ended_at_epoch=trainer.current_epoch)


# FSDP through prepare_model, with a sharded checkpoint.
def fsdp_loop(config):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import nestor.train.torch

    rank_line(pid=os.getpid())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    total = sum(p.numel() for p in model.parameters())
    model = nestor.train.torch.prepare_model(model, parallel_strategy="fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = nestor.train.torch.prepare_data_loader(torch.utils.data.DataLoader(make_data(256, 0), batch_size=32))

    def local(p):
        return p.to_local() if hasattr(p, "to_local") else p

    def full_sum():
        # Every rank's shards together: the whole model's parameters.
        s = torch.tensor(sum(float(local(p).double().sum()) for p in model.parameters()), dtype=torch.float64)
        torch.distributed.all_reduce(s)
        return float(s)

    held = sum(local(p).numel() for p in model.parameters())
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=d)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            with open(os.path.join(d, "epoch")) as f:
                start = int(f.read())
            rank_line(resumed_epoch=start, files=sorted(os.listdir(d)), loaded_sum=full_sum(), path=checkpoint.path)
    rank_line(held=held, total=total, world=torch.distributed.get_world_size())
    for epoch in range(start, config["epochs"]):
        time.sleep(float(os.environ.get("SLOW_S", "0")))
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as d:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=d)
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(d, "epoch"), "w") as f:
                    f.write(str(epoch + 1))
            saved = full_sum()
            rank_line(epoch=epoch + 1, saved_sum=saved, files=sorted(os.listdir(d)))
            train.report({"epoch": epoch + 1, "param_sum": saved, "held": held}, checkpoint=Checkpoint.from_directory(d))


def fully_shard_loop(config):
    """FSDP2 called directly, as a script written for Ray does: the process group is up."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    total = sum(p.numel() for p in model.parameters())
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    import nestor.train.torch

    loader = nestor.train.torch.prepare_data_loader(torch.utils.data.DataLoader(make_data(256, 0), batch_size=32))
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        held = sum(p.to_local().numel() for p in model.parameters())
        train.report({"epoch": epoch + 1, "held": held, "total": total})


def accelerate_loop(config):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(make_data(256, 0), batch_size=32)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
        weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach().reshape(1, -1))
        train.report({"epoch": epoch + 1, "process_index": accelerator.process_index, "num_processes": accelerator.num_processes,
                      "batches": len(loader), "in_sync": float(torch.equal(weights[0], weights[-1])),
                      "wrapped": type(model).__name__})


def result_line(result):
    print("RESULT " + json.dumps({"metrics": {k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str))},
                                  "iterations": [int(h["training_iteration"]) for h in result.metrics_history],
                                  "checkpoint": result.checkpoint.path if result.checkpoint else None}), flush=True)


def sweep(loop, config, metric):
    grid = tune.Tuner(
        TorchTrainer(loop, train_loop_config=config, scaling_config=SCALING),
        param_space={"train_loop_config": {"lr": tune.grid_search([5e-3, 1e-2])}},
        tune_config=tune.TuneConfig(metric=metric, mode="min", scheduler=ASHAScheduler(max_t=2, grace_period=1)),
        run_config=RunConfig(name=mode, storage_path=storage),
    ).fit()
    for result in grid:
        result_line(result)


def run(loop, config, name, workers=2, resume=None):
    trainer = TorchTrainer(loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
                           run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=1)),
                           resume_from_checkpoint=resume)
    result_line(trainer.fit())


if mode == "hf-stop":
    sweep(hf_loop, {"steps": 16, "every": 4}, "eval_loss")
elif mode == "hf-run":
    run(hf_loop, {"steps": 12, "every": 3}, sys.argv[3])
elif mode == "pl-stop":
    sweep(pl_loop, {"epochs": 6}, "val_loss")
elif mode == "pl-run":
    run(pl_loop, {"epochs": 5}, sys.argv[3])
elif mode == "fsdp":
    resume = Checkpoint(sys.argv[5]) if len(sys.argv) > 5 else None
    run(fsdp_loop, {"epochs": int(os.environ.get("EPOCHS", "3"))}, sys.argv[3], workers=int(sys.argv[4]), resume=resume)
elif mode == "fully-shard":
    run(fully_shard_loop, {}, "fully-shard")
elif mode == "accelerate":
    run(accelerate_loop, {}, "accelerate")
else:
    sys.exit(f"unknown mode {mode}")
