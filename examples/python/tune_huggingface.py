"""Ray Train's Hugging Face pattern (a transformers.Trainer inside a
TorchTrainer's training function, RayTrainReportCallback, prepare_trainer),
swept by a Tuner with ASHA, with only its imports changed:

    from ray import train, tune                                ->  from nestor import train, tune
    from ray.train.huggingface.transformers import ...         ->  from nestor.train.huggingface.transformers import ...
    from ray.train.torch import TorchTrainer                   ->  from nestor.train.torch import TorchTrainer

Each trial trains a 2-layer GPT-2 built from its config (random weights:
nothing is downloaded) on 2 workers, evaluating and saving every 4 steps;
the best checkpoint loads with from_pretrained.

    pip install "./python[huggingface]" && python examples/python/tune_huggingface.py
"""

import os

import torch
import transformers

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler

VOCAB, LENGTH = 64, 16


class Sequences(torch.utils.data.Dataset):
    """Token ids that count up from a random start (mod VOCAB): a language
    model learns to predict the next one."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train_func(config):
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    args = transformers.TrainingArguments(
        output_dir="hf-output",
        learning_rate=config["lr"],
        per_device_train_batch_size=8,
        per_device_eval_batch_size=32,
        max_steps=config["steps"],
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="steps",
        save_steps=4,
        logging_steps=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(512, 0), eval_dataset=Sequences(64, 1))
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.train()


trainer = TorchTrainer(
    train_func,
    train_loop_config={"steps": 16},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 3e-2)}},
    tune_config=tune.TuneConfig(
        metric="eval_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-huggingface"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best eval_loss: {best.metrics['eval_loss']:.4f} at step {best.metrics['step']:.0f}")
with best.checkpoint.as_directory() as d:
    model = transformers.GPT2LMHeadModel.from_pretrained(os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    print(f"best checkpoint: {best.checkpoint.path} ({model.num_parameters()} parameters)")
