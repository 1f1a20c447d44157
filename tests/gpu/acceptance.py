"""nestor's GPU acceptance run: what only a GPU can show, each check
printing what it measured. Run it through tests/gpu/run.sh (it builds the
binary and the Python environment first).

    python tests/gpu/acceptance.py [--cpu] [CHECK ...]

Checks, in order (all by default):

  pool       the GPUs nestor finds through NVML are nvidia-smi's, and
             CUDA_VISIBLE_DEVICES narrows them
  share      4 trials of GPU = 0.25 run at once on one GPU, each seeing only
             it; their per-trial GPU figures against nvidia-smi's
  turns      2 trials of GPU = 1 on one GPU take turns, each seeing only it
  ddp        a TorchTrainer with use_gpu=True on NCCL, a rank per GPU, each
             on its own device
  fsdp       prepare_model(parallel_strategy="fsdp") is FullyShardedDataParallel;
             its sharded checkpoint restores into a second run
  hf         a Hugging Face Trainer trains on the GPU
  lightning  a Lightning Trainer trains on the GPU (RayDDPStrategy)
  deepspeed  Lightning's DeepSpeed ZeRO-2 (RayDeepSpeedStrategy(stage=2)),
             where deepspeed imports

``--cpu`` runs the same checks without a GPU (declared GPUs for the
scheduling checks, gloo for the collectives), to keep this script honest
where no GPU is; what needs a GPU is skipped and says so. The exit code is
1 when any check failed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NESTOR = os.environ.get("NESTOR_BIN") or os.path.join(REPO, "target", "release", "nestor")
CHECKS = ["pool", "share", "turns", "ddp", "fsdp", "hf", "lightning", "deepspeed"]


class Skip(Exception):
    """A check that cannot run here, and why."""


# The trial every scheduling check runs: where it ran, what it saw, a few
# seconds of matrix products on its GPU (sleep without one).
PROBE = r'''
import os
import time

import nestor

cfg = nestor.get_config()
start = time.time()
seen = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
count, allocated = 0, 0
try:
    import torch
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
except ImportError:
    cuda = False
if cuda and cfg["work_s"] > 0:
    x = torch.randn(8192, 8192, device="cuda")  # 256 MiB
    until = start + cfg["work_s"]
    while time.time() < until:
        y = x @ x
        torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated()
else:
    time.sleep(cfg["work_s"])
nestor.report({"start": start, "end": time.time(), "count": count, "allocated": allocated, **seen})
'''


def gpus():
    """nvidia-smi's GPUs: [(index, uuid)]; [] without a driver."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [(int(i), u.strip()) for i, u in (line.split(",") for line in out.stdout.strip().splitlines() if line.strip())]


class Smi(threading.Thread):
    """nvidia-smi's view while a check runs: each compute process's peak
    memory (MiB) and each GPU's mean utilisation, read every half second."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_mib, self.util, self.stop = {}, {}, threading.Event()

    def run(self):
        while not self.stop.is_set():
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True).stdout
            for line in apps.strip().splitlines():
                pid, mib = (v.strip() for v in line.split(","))
                if pid.isdigit() and mib.isdigit():
                    self.peak_mib[int(pid)] = max(self.peak_mib.get(int(pid), 0), int(mib))
            util = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True).stdout
            for line in util.strip().splitlines():
                i, u = (v.strip() for v in line.split(","))
                if i.isdigit() and u.isdigit():
                    self.util.setdefault(int(i), []).append(int(u))
            self.stop.wait(0.5)


def sweep(d, name, resources, trials, work_s, env=None, declared=None):
    """Runs the probe as a TOML sweep of `trials` trials at once; its trials (export --format trials)."""
    with open(os.path.join(d, "probe.py"), "w") as f:
        f.write(PROBE)
    node = f"\n[resources]\nCPU = 8\nGPU = {declared}\n" if declared is not None else ""
    with open(os.path.join(d, f"{name}.toml"), "w") as f:
        f.write(f'[experiment]\nname = "{name}"\nnum_samples = {trials}\nmax_concurrent_trials = {trials}\n\n'
                f'[space]\nwork_s = {work_s}\n\n[trainer]\ncommand = [{json.dumps(sys.executable)}, "probe.py"]\n'
                f"resources_per_worker = {resources}\n{'use_gpu = true' if 'GPU' in resources else ''}\n{node}")
    out = subprocess.run([NESTOR, "run", f"{name}.toml", "--storage", "runs", "--plain"], cwd=d, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=300)
    if out.returncode != 0:
        raise AssertionError(f"nestor run {name}.toml failed:\n{out.stderr[-3000:]}")
    exported = subprocess.run([NESTOR, "export", os.path.join("runs", name), "--format", "trials"], cwd=d, capture_output=True,
                              text=True, check=True).stdout
    return [json.loads(line) for line in exported.splitlines()], out.stderr


def node_gpus(stderr):
    """The GPU count in nestor's line about its node."""
    m = re.search(r"nestor: node \{[^}]*GPU: (\d+)", stderr)
    return int(m.group(1)) if m else None


def check_pool(d, gpu):
    found = gpus()
    _, said = sweep(d, "pool", "{ CPU = 1 }", 1, 0)
    seen = node_gpus(said)
    if not gpu:
        assert seen == 0, f"no GPU here, but nestor's node says {seen}:\n{said}"
        line = next((x for x in said.splitlines() if x.startswith("nestor: node")), "")
        raise Skip(f"no GPU; nestor says: {line}")
    assert seen == len(found), f"nestor found {seen} GPUs, nvidia-smi {len(found)}:\n{said}"
    first = str(found[0][0])
    _, narrowed = sweep(d, "pool-narrowed", "{ CPU = 1 }", 1, 0, env={"CUDA_VISIBLE_DEVICES": first})
    assert node_gpus(narrowed) == 1 and f"CUDA_VISIBLE_DEVICES={first}" in narrowed, narrowed
    return f"{seen} GPU(s) as nvidia-smi lists them; CUDA_VISIBLE_DEVICES={first} leaves 1"


def one_gpu(gpu):
    """How a check pins nestor to one GPU: (env, declared GPUs)."""
    if gpu:
        return {"CUDA_VISIBLE_DEVICES": str(gpus()[0][0])}, None
    return {}, 1


def overlaps(trials):
    spans = sorted((t["metrics"]["start"], t["metrics"]["end"]) for t in trials)
    return max(s for s, _ in spans) < min(e for _, e in spans)


def check_share(d, gpu):
    env, declared = one_gpu(gpu)
    smi = Smi() if gpu else None
    if smi:
        smi.start()
    trials, _ = sweep(d, "share", "{ CPU = 0.5, GPU = 0.25 }", 4, 6 if gpu else 2, env=env, declared=declared)
    if smi:
        smi.stop.set()
        smi.join()
    assert len(trials) == 4 and all(t["status"] == "TERMINATED" for t in trials), trials
    assert overlaps(trials), "the 4 trials of GPU = 0.25 did not run at once"
    visible = {t["metrics"]["visible"] for t in trials}
    assert len(visible) == 1 and "," not in next(iter(visible)) and next(iter(visible)) != "", f"each trial sees the one GPU: {visible}"
    lines = [f"4 trials at once on GPU {next(iter(visible))}"]
    if gpu:
        assert all(t["metrics"]["count"] == 1 for t in trials), [t["metrics"]["count"] for t in trials]
        for t in trials:
            m = t["metrics"]
            ours, theirs = m.get("gpu_memory_peak_bytes", 0) / 2**20, smi.peak_mib.get(int(m["pid"]), 0)
            util = m.get("gpu_util_mean_percent", 0)
            lines.append(f"{t['trial_id']}: memory peak {ours:.0f} MiB (nvidia-smi {theirs} MiB), utilisation mean {util:.0f}%, "
                         f"peak {m.get('gpu_util_peak_percent', 0):.0f}%")
            assert ours > 0 and util > 0, f"no GPU figures for {t['trial_id']}: {m}"
            # nvidia-smi names processes by the host's ids: in a container it may name none of ours.
            if theirs:
                assert abs(ours - theirs) <= max(0.15 * theirs, 128), f"{t['trial_id']}: nestor {ours:.0f} MiB against nvidia-smi {theirs} MiB"
        lines.append(f"nvidia-smi's utilisation of the GPU meanwhile: mean {sum(sum(v) for v in smi.util.values()) / max(1, sum(len(v) for v in smi.util.values())):.0f}%")
    return "; ".join(lines)


def check_turns(d, gpu):
    env, declared = one_gpu(gpu)
    trials, _ = sweep(d, "turns", "{ CPU = 0.5, GPU = 1 }", 2, 3 if gpu else 1, env=env, declared=declared)
    assert all(t["status"] == "TERMINATED" for t in trials), trials
    assert not overlaps(trials), "2 trials of GPU = 1 ran at once on one GPU"
    if gpu:
        assert all(t["metrics"]["count"] == 1 for t in trials), [t["metrics"]["count"] for t in trials]
    spans = sorted((t["metrics"]["start"], t["metrics"]["end"]) for t in trials)
    return f"one after the other ({spans[1][0] - spans[0][1]:.2f} s between them); each saw {trials[0]['metrics']['visible']!r}"


def framework(d, name, gpu, timeout=600):
    """Runs `acceptance.py --run NAME` (a TorchTrainer of that check) in a process of its own; the facts its ranks wrote."""
    facts = os.path.join(d, f"{name}.facts")
    os.makedirs(facts, exist_ok=True)
    args = [sys.executable, os.path.abspath(__file__), "--run", name, "--storage", os.path.join(d, "runs"), "--facts", facts]
    out = subprocess.run(args + ([] if gpu else ["--cpu"]), capture_output=True, text=True, timeout=timeout, cwd=d)
    if out.returncode == 3:
        raise Skip(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "skipped")
    if out.returncode != 0:
        raise AssertionError(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    found = {}
    for f in sorted(os.listdir(facts)):
        with open(os.path.join(facts, f)) as fh:
            found[f] = json.load(fh)
    return found, out.stdout


def check_ddp(d, gpu):
    facts, _ = framework(d, "ddp", gpu)
    n = len(facts)
    want = len(gpus()) if gpu else 2
    assert n == want, f"{n} ranks wrote facts, want {want}: {facts}"
    r0 = facts["rank-0.json"]
    assert r0["sum"] == n * (n + 1) / 2, r0
    assert r0["backend"] == ("nccl" if gpu else "gloo"), r0
    if gpu:
        devices = [f["device"] for f in facts.values()]
        assert len(set(devices)) == n and all(x.startswith("cuda") for x in devices), devices
    return f"{n} ranks on {r0['backend']}, all_reduce {r0['sum']:.0f}, devices {[f['device'] for f in facts.values()]}, {r0['step_ms']:.1f} ms a step"


def check_fsdp(d, gpu):
    facts, _ = framework(d, "fsdp", gpu)
    first, second = facts["rank-0-run-1.json"], facts["rank-0-run-2.json"]
    if gpu:
        assert first["wrapped"] == "FullyShardedDataParallel", first
    assert first["held"] < first["total"] or first["world"] == 1, f"each rank holds a shard: {first}"
    assert second["resumed_epoch"] == first["epochs"], f"the second run resumed at the first's end: {second}"
    assert abs(second["loaded_sum"] - first["saved_sum"]) < 1e-4 * max(1.0, abs(first["saved_sum"])), (first, second)
    return (f"{first['wrapped']} on {first['device']}, each rank holding {first['held']} of {first['total']} parameters; "
            f"the sharded checkpoint ({first['files']} files) restored at epoch {second['resumed_epoch']}, the same parameters")


def check_hf(d, gpu):
    facts, _ = framework(d, "hf", gpu)
    r0 = facts["rank-0.json"]
    if gpu:
        assert r0["device"].startswith("cuda") and r0["max_allocated"] > 0, r0
    return f"{len(facts)} ranks, device {r0['device']}, {r0['steps']} steps, loss {r0['loss']:.3f}, {r0['max_allocated'] / 2**20:.0f} MiB"


def check_lightning(d, gpu):
    facts, _ = framework(d, "lightning", gpu)
    r0 = facts["rank-0.json"]
    if gpu:
        assert r0["device"].startswith("cuda"), r0
    return f"{len(facts)} ranks, device {r0['device']}, {r0['epochs']} epochs, val_loss {r0['val_loss']:.3f}"


def check_deepspeed(d, gpu):
    if not gpu:
        raise Skip("DeepSpeed needs a GPU")
    facts, _ = framework(d, "deepspeed", gpu, timeout=900)
    r0 = facts["rank-0.json"]
    assert r0["stage"] == 2 and r0["device"].startswith("cuda"), r0
    return f"ZeRO stage {r0['stage']} on {len(facts)} ranks, device {r0['device']}, val_loss {r0['val_loss']:.3f}"


# What runs inside the trainers (``--run NAME``): each rank writes its facts as JSON.

def write_facts(facts_dir, name, **facts):
    with open(os.path.join(facts_dir, name + ".json"), "w") as f:
        json.dump(facts, f)


def run_framework(name, storage, facts_dir, gpu):
    import torch

    from nestor.train import Checkpoint, RunConfig, ScalingConfig
    from nestor.train.torch import TorchTrainer

    # The tests' model helpers (fw_models), for the ranks too.
    helpers = os.path.join(REPO, "tests", "py")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (helpers, os.environ.get("PYTHONPATH")) if p)
    workers = max(1, torch.cuda.device_count()) if gpu else 2
    scaling = ScalingConfig(num_workers=workers, use_gpu=gpu, resources_per_worker=None if gpu else {"CPU": 0.5})
    config = {"facts": facts_dir, "gpu": gpu}

    def fit(loop, run_name, extra=None, resume=None):
        return TorchTrainer(loop, train_loop_config={**config, **(extra or {})}, scaling_config=scaling,
                            run_config=RunConfig(name=run_name, storage_path=storage), resume_from_checkpoint=resume).fit()

    if name == "ddp":
        fit(ddp_loop, "ddp")
    elif name == "fsdp":
        first = fit(fsdp_loop, "fsdp-1", {"epochs": 2, "run": 1})
        fit(fsdp_loop, "fsdp-2", {"epochs": 3, "run": 2}, resume=Checkpoint(first.checkpoint.path))
    elif name == "hf":
        fit(hf_loop, "hf")
    elif name == "lightning":
        fit(pl_loop, "lightning", {"deepspeed": False})
    elif name == "deepspeed":
        try:
            import deepspeed  # noqa: F401
        except Exception as e:
            print(f"deepspeed does not import here: {e}")
            sys.exit(3)
        fit(pl_loop, "deepspeed", {"deepspeed": True})
    else:
        sys.exit(f"unknown check {name}")


def rank():
    from nestor import train

    return train.get_context().get_world_rank()


def ddp_loop(config):
    import torch
    import torch.distributed as dist

    import nestor.train.torch

    device = nestor.train.torch.get_device()
    t = torch.ones(1, device=device) * (rank() + 1)
    dist.all_reduce(t)
    model = nestor.train.torch.prepare_model(torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    steps, begun = 50, time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    step_ms = (time.perf_counter() - begun) / steps * 1e3
    write_facts(config["facts"], f"rank-{rank()}", sum=float(t.item()), backend=dist.get_backend(), device=str(device), step_ms=step_ms)
    from nestor import train

    train.report({"step_ms": step_ms})


def fsdp_loop(config):
    import tempfile as tf

    import torch
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import nestor.train.torch
    from nestor import train
    from nestor.train import Checkpoint

    from fw_models import make_data

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    total = sum(p.numel() for p in model.parameters())
    model = nestor.train.torch.prepare_model(model, parallel_strategy="fsdp")
    wrapped = type(model).__name__
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = nestor.train.torch.prepare_data_loader(torch.utils.data.DataLoader(make_data(256, 0), batch_size=32))

    def local(p):
        return p.to_local() if hasattr(p, "to_local") else p

    def full_sum():
        s = torch.tensor(sum(float(local(p).double().sum()) for p in model.parameters()), dtype=torch.float64,
                         device=nestor.train.torch.get_device())
        torch.distributed.all_reduce(s)
        return float(s)

    held = sum(local(p).numel() for p in model.parameters())
    facts = {"wrapped": wrapped, "total": total, "held": held, "device": str(nestor.train.torch.get_device()),
             "world": torch.distributed.get_world_size()}
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
        facts.update(resumed_epoch=start, loaded_sum=full_sum())
    for epoch in range(start, config["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with tf.TemporaryDirectory() as d:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=d)
            if rank() == 0:
                with open(os.path.join(d, "epoch"), "w") as f:
                    f.write(str(epoch + 1))
            facts.update(epochs=epoch + 1, saved_sum=full_sum(), files=len(os.listdir(d)))
            train.report({"epoch": epoch + 1}, checkpoint=Checkpoint.from_directory(d))
    write_facts(config["facts"], f"rank-{rank()}-run-{config['run']}", **facts)


def hf_loop(config):
    import torch
    import transformers

    from nestor.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    from fw_models import LENGTH, VOCAB, Sequences

    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    args = transformers.TrainingArguments(
        output_dir="hf-output", learning_rate=5e-3, per_device_train_batch_size=8, max_steps=16, eval_strategy="steps",
        eval_steps=8, save_strategy="steps", save_steps=8, logging_steps=8, report_to=[], use_cpu=not config["gpu"],
        disable_tqdm=True, ddp_find_unused_parameters=False, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(256, 0), eval_dataset=Sequences(64, 1))
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    out = trainer.train()
    allocated = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    write_facts(config["facts"], f"rank-{rank()}", device=str(trainer.args.device), steps=trainer.state.global_step,
                loss=float(out.training_loss), max_allocated=allocated)


def pl_loop(config):
    import lightning.pytorch as pl
    import torch

    from nestor.train.lightning import (RayDDPStrategy, RayDeepSpeedStrategy, RayLightningEnvironment, RayTrainReportCallback,
                                        prepare_trainer)

    from fw_models import lightning_regressor, make_data

    Regressor = lightning_regressor(pl)
    pl.seed_everything(0)
    strategy = RayDeepSpeedStrategy(stage=2) if config["deepspeed"] else RayDDPStrategy()
    trainer = pl.Trainer(max_epochs=3, devices="auto", accelerator="gpu" if config["gpu"] else "cpu", strategy=strategy,
                         plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = prepare_trainer(trainer)
    loaders = (torch.utils.data.DataLoader(make_data(256, 0), batch_size=32, shuffle=True),
               torch.utils.data.DataLoader(make_data(64, 1), batch_size=64))
    trainer.fit(Regressor(1e-2), *loaders)
    write_facts(config["facts"], f"rank-{rank()}", device=str(trainer.strategy.root_device), epochs=trainer.current_epoch,
                val_loss=float(trainer.callback_metrics.get("val_loss", float("nan"))),
                stage=getattr(strategy, "config", {}).get("zero_optimization", {}).get("stage") if config["deepspeed"] else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="*", choices=CHECKS + [[]], default=[])
    ap.add_argument("--cpu", action="store_true", help="no GPU: declared GPUs and gloo; what needs a GPU is skipped")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--facts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    gpu = not args.cpu
    if args.run:
        run_framework(args.run, args.storage, args.facts, gpu)
        return
    if gpu and not gpus():
        sys.exit("no GPU here (nvidia-smi lists none): run with --cpu to check the script alone")
    print(f"nestor GPU acceptance: {len(gpus())} GPU(s) {[u for _, u in gpus()]}; binary {NESTOR}", flush=True)
    failed = 0
    began = time.perf_counter()
    for name in args.checks or CHECKS:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            try:
                said = globals()[f"check_{name}"](d, gpu)
                status = "PASS"
            except Skip as e:
                said, status = str(e), "SKIP"
            except Exception as e:  # noqa: BLE001 (a check's failure, named, and the run goes on)
                said, status = f"{type(e).__name__}: {e}", "FAIL"
                failed += 1
        print(f"{status} {name} ({time.perf_counter() - t0:.1f} s): {said}", flush=True)
    print(f"{'FAILED' if failed else 'passed'}: {failed} of {len(args.checks or CHECKS)} checks failed, {time.perf_counter() - began:.0f} s in all")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
