"""Running the probe cells and keeping their results, on the arena's record/resume machinery (gpt.arena.runs): a
cell's folder holds its configuration (arena_cell.json, written before it trains) and its result
(arena_result.json, written once it finished). A result read back is checked field by field: a damaged or edited one
is refused, naming the file and the field, never merged into the card.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpt import validate
from gpt.arena import runs as arena_runs
from gpt.probes.probe import Cell, ProbeConfig, effective
from gpt.probes.registry import build
from gpt.validate import shown

FIELDS = ("metrics", "lr", "val", "sweep", "params", "train_s")


def finished(cell: Cell, metrics: list[str], lrs: list[float], high: float = 1) -> dict[str, Any] | None:
    """A finished cell's result (None: not finished), refused when it is not what probe() writes: accuracies in
    [0, 1] (the corpus's bits per byte: from 0 up, ``high=math.inf``) for exactly the task's metrics, a learning rate of
    the sweep, finite figures, nothing else."""
    folder = Path(cell.folder)
    path = folder / arena_runs.RESULT_FILE
    if not path.exists():
        return None
    record = validate.Record(arena_runs.read_json(path), str(path), hint=f"remove {folder} to run that cell again")
    unknown = sorted(set(record.value) - set(FIELDS))
    if unknown:
        raise record.error(f"{shown(unknown[0])} is not a field a probe result holds")
    scores = record.record("metrics")
    if sorted(scores.value) != sorted(metrics):
        raise record.error(f"metrics must hold {', '.join(metrics)}, got {shown(sorted(scores.value))}")
    sweep = record.record("sweep")
    if sorted(sweep.value) != sorted(f"{lr:g}" for lr in lrs):
        raise record.error(f"sweep must hold the learning rates {lrs}, got {shown(sorted(sweep.value))}")
    lr = record.number("lr", low=0)
    if lr not in lrs:
        raise record.error(f"lr must be one of the sweep's {lrs}, got {shown(lr)}")
    return {"metrics": {k: scores.number(k, low=0, high=high) for k in metrics}, "lr": lr,
            "val": record.number("val", low=0, high=high),
            "sweep": {k: sweep.number(k, low=0, high=high) for k in sweep.value},
            "params": record.int("params", low=1), "train_s": record.number("train_s", low=0)}


def row(cell: Cell, result: dict[str, Any]) -> dict[str, Any]:
    """A per-seed row of the card: the cell's place, what it measured (or its error)."""
    return {**result, "task": cell.task, "design": cell.design, "spec": cell.spec, "seed": cell.seed}


def run_cells(cfg: ProbeConfig, cells: list[Cell], log: Callable[[str], None], data=None) -> list[dict[str, Any]]:
    """Each cell not finished already, ``probes.workers`` at a time (a thread each); the finished rows in plan
    order. A stop signal: no new cell starts, the running ones stop at their next step, unrecorded. ``data``: the
    corpus task's (gpt.probes.corpus.open_corpus)."""
    from gpt.arena.report import make_out_dir
    from gpt.device import resolve_device
    from gpt.probes.train import Stopped, probe
    from gpt.train.signals import SignalGuard

    s = effective(cfg.probes)
    tasks = {t.name: t for t in build(s.tasks, s, data)}
    make_out_dir(Path(cfg.out_dir))
    for cell in cells:  # before anything trains: a folder of another configuration is refused
        arena_runs.check_folder(Path(cell.folder), cell, Path(cfg.out_dir))
    rows: dict[int, dict[str, Any]] = {}
    for i, cell in enumerate(cells):
        task = tasks[cell.task]
        kept = finished(cell, list(task.metrics()), s.learning_rates, math.inf if task.lower_is_better else 1)
        if kept is not None:
            rows[i] = row(cell, kept)
    todo = [i for i in range(len(cells)) if i not in rows]
    log(f"{len(cells)} runs ({len(cells) - len(todo)} finished already in {cfg.out_dir}), "
        f"{s.workers} at a time")
    device = resolve_device(cfg.device.type)
    if s.workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // s.workers))

    def one(i: int, _: str) -> dict[str, Any]:
        cell = cells[i]
        arena_runs.start(Path(cell.folder), cell)
        task = build([cell.task.partition("@")[0]], s, data)
        task = next(t for t in task if t.name == cell.task)  # a private copy: memorisation's map is per seed
        try:
            return probe(task, cell.model, cell.seed, s.learning_rates, s.steps, s.batch_size, s.examples, device,
                         lambda: bool(signals.received))
        except Stopped:
            return {"stopped": True}

    def done(i: int, result: dict[str, Any]) -> bool:
        if "stopped" not in result:
            arena_runs.save(Path(cells[i].folder), result)
            rows[i] = row(cells[i], result)
            best = ", ".join(f"{k} {v:.3f}" for k, v in result["metrics"].items())
            log(f"  {cells[i].task} {cells[i].design} seed {cells[i].seed}: {best} (lr {result['lr']:g}, "
                f"{result['train_s']:.1f} s)")
        return bool(signals.received)

    with SignalGuard(verbose=False) as signals:
        arena_runs.run_all(todo, ["cpu"] * s.workers, one, done)
    return [rows[i] for i in sorted(rows)]


def composite(metrics: dict[str, float]) -> float:
    """The card's one number per run: the mean accuracy over its metrics."""
    return math.fsum(metrics.values()) / len(metrics)
