"""Hugging Face and Lightning on TorchTrainer: the time to a 2-worker run's
first report and to its end, under nestor, against the same training
function started by hand as two ranks with torchrun's variables (no nestor
driver: nestor's callbacks report locally), and against Ray Train 2.60 on
the same function (``--ray``, with ``ray[train]`` importable).

    VENV=$(examples/torch_ddp/venv.sh)
    cargo build --release -p nestor-cli
    NESTOR_BIN=target/release/nestor "$VENV/bin/python" python/benches/frameworks.py --framework huggingface [--reps 5] [--ray]

The training function is the one of examples/python/tune_huggingface.py (a
2-layer GPT-2 from its config, 16 steps, a save and an evaluation every 4)
or of tune_lightning.py (6 epochs), one trial. "First report" is the
moment rank 0 is about to make its first report (a callback placed
before the report callback marks it); every side is timed from the start
of its process, interpreter and imports included.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def mark(what):
    if os.environ.get("RANK", "0") == "0" and os.environ.get("BENCH_MARKS"):
        with open(os.environ["BENCH_MARKS"], "a") as f:
            f.write(f"{what} {time.time()}\n")


def hf_loop(config):
    import torch
    import transformers

    if config["side"] == "ray":
        from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    else:
        from nestor.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    vocab, length = 64, 16

    class Sequences(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.ids = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(length)) % vocab

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class First(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 4:
                mark("first")

    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    args = transformers.TrainingArguments(
        output_dir="hf-output", learning_rate=1e-3, per_device_train_batch_size=8, per_device_eval_batch_size=32,
        max_steps=16, eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=4, logging_steps=4,
        report_to=[], use_cpu=True, disable_tqdm=True, ddp_find_unused_parameters=False,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(512, 0), eval_dataset=Sequences(64, 1))
    trainer.add_callback(First())
    trainer.add_callback(RayTrainReportCallback())
    prepare_trainer(trainer).train()


def pl_loop(config):
    import lightning.pytorch as pl
    import torch
    from torch import nn

    if config["side"] == "ray":
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    else:
        from nestor.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    def data(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 8, generator=g)
        return torch.utils.data.TensorDataset(x, (x @ torch.arange(1.0, 9.0)).unsqueeze(1))

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, _):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch, _):
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    class First(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            if trainer.current_epoch == 0:
                mark("first")

    pl.seed_everything(0)
    trainer = pl.Trainer(max_epochs=6, devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                         plugins=[RayLightningEnvironment()], callbacks=[First(), RayTrainReportCallback()],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data(512, 0), batch_size=32, shuffle=True),
                torch.utils.data.DataLoader(data(128, 1), batch_size=64))


LOOPS = {"huggingface": hf_loop, "lightning": pl_loop}


def one_run(framework, side, storage):
    """Inside a side's process: one 2-worker run."""
    loop = LOOPS[framework]
    if side == "ray":
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        from nestor.train import RunConfig, ScalingConfig
        from nestor.train.torch import TorchTrainer
    TorchTrainer(loop, train_loop_config={"side": side}, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="bench", storage_path=storage)).fit()


def timed(framework, side, python):
    with tempfile.TemporaryDirectory() as d:
        marks = os.path.join(d, "marks")
        env = {**os.environ, "BENCH_MARKS": marks}
        t0 = time.time()
        if side == "hand":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            base = {k: v for k, v in env.items() if not k.startswith("NESTOR_")}
            procs = []
            for r in (0, 1):
                rank_env = {**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                            "GROUP_RANK": "0", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "OMP_NUM_THREADS": "1"}
                procs.append(subprocess.Popen([python, HERE, "--rank", framework], cwd=d, env=rank_env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"{framework} by hand failed: {codes}")
        else:
            out = subprocess.run([python, HERE, "--run", framework, side, os.path.join(d, "runs")], cwd=d, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{framework} under {side} failed:\n{out.stdout[-3000:]}")
        end = time.time()
        with open(marks) as f:
            first = float(next(l for l in f if l.startswith("first")).split()[1])
        return first - t0, end - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=sorted(LOOPS), default="huggingface")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also Ray Train (ray[train] importable by --ray-python)")
    ap.add_argument("--ray-python", default=sys.executable)
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    ap.add_argument("--run", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        LOOPS[a.rank]({"side": "hand"})
        return
    if a.run:
        one_run(*a.run)
        return
    sides = [("nestor", sys.executable), ("hand", sys.executable)] + ([("ray", a.ray_python)] if a.ray else [])
    figures = {s: [] for s, _ in sides}
    for _ in range(a.reps):
        for side, python in sides:  # interleaved: a slow minute hits every side
            figures[side].append(timed(a.framework, side, python))
    report = {}
    for side, runs in figures.items():
        firsts, wholes = [r[0] for r in runs], [r[1] for r in runs]
        report[side] = {"first_report_s": round(statistics.median(firsts), 2), "first_range": [round(min(firsts), 2), round(max(firsts), 2)],
                        "whole_run_s": round(statistics.median(wholes), 2), "whole_range": [round(min(wholes), 2), round(max(wholes), 2)]}
    print(json.dumps({"framework": a.framework, "reps": a.reps, **report}, indent=1))


if __name__ == "__main__":
    main()
