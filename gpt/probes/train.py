"""One probe run: a design's model trained from scratch on a task at each learning rate of the sweep, the rate with
the best validation accuracy kept, then scored on a held-out test set at each of the task's lengths (MAD's
protocol). Loss and accuracy read the answer positions alone (the corpus task: every position, in bits per byte).

Every draw follows the run's seed: the model's initialisation (torch), and three numpy streams, for training,
validation and test batches; every design and learning rate of a seed sees the same sequences.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpt.errors import ConfigError
from gpt.model.config import GPTConfig
from gpt.probes.tasks import IGNORE, Task
from gpt.train.config import TrainConfig
from gpt.train.optim import learning_rate, make_optimizer, set_learning_rate

TRAIN, VAL, TEST = 0, 1, 2  # the numpy streams of a seed
BUILDING = threading.Lock()


class Stopped(Exception):
    """A stop signal arrived during a run: it is not recorded, and runs again when the command does."""


def stream(seed: int, which: int) -> np.random.Generator:
    return np.random.default_rng([seed, which])


def schedule(lr: float, steps: int) -> TrainConfig:
    """AdamW with the project's training defaults (weight decay 0.1 on matrices, betas 0.9/0.95, clipping at 1),
    a tenth of the steps warming up, cosine decay to lr / 10."""
    return TrainConfig(learning_rate=lr, max_iters=steps, warmup_iters=steps // 10, batch_size=1)


def fit(task: Task, config: GPTConfig, seed: int, lr: float, steps: int, batch_size: int, device: torch.device,
        stop: Callable[[], bool]) -> torch.nn.Module:
    """A fresh model of ``config`` (initialised from ``seed``) trained ``steps`` steps on the task's training
    stream at length task.length."""
    from gpt.model.gpt import GPT

    with BUILDING:  # the global RNG, seeded and drawn by one thread at a time: the same weights with any workers
        torch.manual_seed(seed)
        model = GPT(config).to(device)
    cfg = schedule(lr, steps)
    optimizer = make_optimizer(model, cfg, device)
    rng = stream(seed, TRAIN)
    model.train()
    for step in range(steps):
        if stop():
            raise Stopped
        inputs, targets = (torch.from_numpy(a).to(device) for a in task.sample(rng, batch_size))
        set_learning_rate(optimizer, learning_rate(step, cfg), cfg)
        _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    return model


@torch.no_grad()
def accuracy(model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray, device: torch.device,
             batch_size: int) -> float:
    """The fraction of answer positions (targets != IGNORE) whose argmax is the target."""
    model.eval()
    right = total = 0
    for start in range(0, len(inputs), batch_size):
        x = torch.from_numpy(inputs[start:start + batch_size]).to(device)
        y = torch.from_numpy(targets[start:start + batch_size]).to(device)
        logits, _ = model(x)
        scored = y != IGNORE
        right += int((logits.argmax(-1) == y)[scored].sum())
        total += int(scored.sum())
    if not total:
        raise ConfigError("a probe's examples hold no answer position at these settings",
                          hint="a longer probes.seq_len or more probes.examples")
    return right / total


def measure(task: Task, model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray, device: torch.device,
            batch_size: int) -> float:
    """The task's own score where it has one (the corpus: bits per byte), else accuracy on the answer positions."""
    scorer = getattr(task, "score", None)
    return scorer(model, inputs, targets, device, batch_size) if scorer else \
        accuracy(model, inputs, targets, device, batch_size)


def probe(task: Task, config: GPTConfig, seed: int, lrs: list[float], steps: int, batch_size: int,
          examples: int, device: torch.device, stop: Callable[[], bool]) -> dict[str, Any]:
    """The run's result: the best learning rate (by the validation score at the training length: the highest
    accuracy, the lowest bits per byte), its validation score, every rate's, and the kept model's test score per
    metric (a length each), params, seconds."""
    started = time.time()
    task.constants(seed)
    val = task.held_out(stream(seed, VAL), examples)
    tests = {name: task.held_out(stream(seed, TEST), examples, length) for name, length in task.metrics().items()}
    best: tuple[float, float, torch.nn.Module] | None = None
    sweep = {}
    for lr in lrs:
        model = fit(task, config, seed, lr, steps, batch_size, device, stop)
        score = measure(task, model, *val, device, batch_size)
        sweep[f"{lr:g}"] = score
        if best is None or (score < best[0] if task.lower_is_better else score > best[0]):
            best = (score, lr, model)
    assert best is not None
    score, lr, model = best
    metrics = {name: measure(task, model, *data, device, batch_size) for name, data in tests.items()}
    return {"metrics": metrics, "lr": lr, "val": score, "sweep": sweep,
            "params": model.num_params(non_embedding=False), "train_s": time.time() - started}
