"""Time to loss: train recipes (configs/recipe/) on the same data and model over several seeds, each run a whole
``scripts/train.py`` process, and report for each the steps, tokens and seconds it took to reach a target validation
loss, its final loss and its tokens per second, as a table (time_to_loss.md, .csv) and a plot (time_to_loss.png).

The target is ``target=`` or, by default, the median final validation loss of the first recipe (the baseline): "how
much sooner does recipe B reach where recipe A ends?". Runs go seed by seed, the recipes interleaved, so a change in
the machine's load touches every recipe alike. A run whose folder already holds its summary is read, not rerun: an
interrupted benchmark continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpt import validate
from gpt.arena.runs import figure
from gpt.errors import ConfigError, UserError, check_positive
from gpt.files import atomic_write
from gpt.train import recipe as training_recipes

ROOT = Path(__file__).resolve().parent.parent.parent
MAX_RUNS = 1000  # training runs (recipes x seeds) one benchmark may plan: each is a whole training process
MAX_TIMEOUT_S = 10**7  # about 4 months: a wait beyond what a clock can count (1e300 s) raised OverflowError


@dataclass
class TimeToLossConfig:
    """scripts/time_to_loss.py (configs/time_to_loss.yaml)."""

    recipes: list[str] = field(default_factory=lambda: ["gpt2", "modern"])  # the first one sets the default target
    seeds: list[int] = field(default_factory=lambda: [1337, 1338, 1339])
    target: Optional[float] = None  # validation loss to reach; None: the first recipe's median final val loss
    eval_interval: int = 80  # evaluations every this many steps: the resolution of "steps to reach the target"
    overrides: list[str] = field(default_factory=list)  # key=value for every run (model=, data=, train.max_iters=...)
    out_dir: str = "runs/time_to_loss"
    timeout_s: float = 7200.0  # a run still going after this fails

    def __post_init__(self) -> None:
        check_positive(self, "eval_interval", "timeout_s")
        if self.timeout_s > MAX_TIMEOUT_S:
            raise ConfigError(f"timeout_s must be at most {MAX_TIMEOUT_S:,} s (about 4 months), got {self.timeout_s:g}",
                              hint="the default is 7200 (two hours a run)")
        if not self.recipes or not self.seeds:
            raise ConfigError("recipes and seeds must each name at least one", hint="e.g. recipes=[gpt2,modern]")
        for name in self.recipes:
            training_recipes.settings(name)
        if len(self.recipes) * len(self.seeds) > MAX_RUNS:
            runs = len(self.recipes) * len(self.seeds)
            raise ConfigError(f"{len(self.recipes)} recipes x {len(self.seeds):,} seeds is {runs:,} training runs, "
                              f"more than the {MAX_RUNS:,} this benchmark may plan",
                              hint="3 to 10 seeds separate most differences")
        if not all(0 <= seed < 2**31 for seed in self.seeds):
            raise ConfigError(f"seeds must be in [0, 2**31), got {[s for s in self.seeds if not 0 <= s < 2**31][0]}",
                              hint="e.g. seeds=[1337,1338,1339]")
        if len(set(self.recipes)) != len(self.recipes) or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"a recipe or seed is named twice: recipes={self.recipes}, seeds={self.seeds}")
        if self.target is not None and not (math.isfinite(self.target) and self.target > 0):
            raise ConfigError(f"target must be a positive loss or null, got {self.target!r}")
        for override in self.overrides:
            key = str(override).split("=", 1)[0].lstrip("+~")
            if "=" not in str(override) or key in ("recipe", "seed", "out_dir", "resume", "train.eval_interval"):
                raise ConfigError(f"overrides: {override!r} is not a key=value the benchmark leaves to each run",
                                  hint="recipe, seed, out_dir, resume and the evaluation interval are the benchmark's")


def run_dir(cfg: TimeToLossConfig, recipe: str, seed: int) -> Path:
    """A run's folder, absolute: this process and the training process it starts both find it."""
    return Path(cfg.out_dir).expanduser().absolute() / f"{recipe}-seed{seed}"


def train_one(cfg: TimeToLossConfig, recipe: str, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One whole training process (or the record of one that finished before); its summary and validation curve.
    The process runs in this one's folder, so relative paths in overrides mean what they mean here."""
    folder = run_dir(cfg, recipe, seed)
    record = folder / RECORD
    if record.is_file():
        log(f"{folder.name}: done before, read from {record}")
        return read_record(record, recipe, seed)
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), f"recipe={recipe}", f"seed={seed}",
               *cfg.overrides, f"train.eval_interval={cfg.eval_interval}", f"out_dir={folder}",
               f"resume={'true' if folder.exists() else 'false'}"]
    log(f"{folder.name}: training ({' '.join(command[2:])})")
    started = time.time()
    done, stopped_by = run_training(command, folder, cfg.timeout_s)
    if done.returncode != 0 and not stopped_by:
        said = [line[len("error: "):] for line in done.stderr.splitlines() if line.startswith("error: ")]
        last = (said or done.stderr.strip().splitlines() or ["no output"])[-1]  # one line: its error, or its last
        raise UserError(f"{folder.name} failed (exit {done.returncode}): {last[:400]}",
                        hint=f"run it alone to see why: {' '.join(command)}")
    record_of_run = validate.Record(lenient_json(folder / "summary.json"), str(folder / "summary.json"),
                                    hint=f"remove {folder} to run it again") if done.returncode == 0 else None
    if stopped_by or (record_of_run is not None and record_of_run.bool("interrupted", False)):
        raise KeyboardInterrupt(f"interrupted ({stopped_by or 'a stop signal reached the training process'}): "
                                f"{folder.name} stopped unfinished and keeps its last checkpoint, if it saved one; "
                                f"the runs finished before are kept in {folder.parent}: run the same command again "
                                "to resume")
    launched, curve = val_curve(folder, started)
    result = {"recipe": recipe, "seed": seed, "launched": launched, "summary": read_summary(record_of_run),
              "curve": curve}
    text = json.dumps(result)
    atomic_write(record, lambda f: f.write(text.encode()), what="the time-to-loss record")
    return result


def run_training(command: list[str], folder: Path, timeout_s: float) -> tuple[subprocess.CompletedProcess, str]:
    """The training process run to its end, and the stop signal this one received meanwhile ("" if none).

    Ctrl-C or SIGTERM here is passed on to the training process (a terminal's Ctrl-C reaches both: the trainer
    counts a repeat within a second once), which saves its checkpoint and stops; this one waits for that rather
    than killing it mid-save. A second one, later, makes the trainer quit at once, as in scripts/train.py."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, stopped_by = time.monotonic() + timeout_s, ""
    while True:
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            return subprocess.CompletedProcess(command, proc.returncode, out, err), stopped_by
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise UserError(f"{folder.name} still running after {timeout_s:g} s", hint="raise timeout_s") from None
        except KeyboardInterrupt as stop:
            stopped_by = stopped_by or ("SIGTERM" if str(stop) == "SIGTERM" else "Ctrl-C")
            proc.send_signal(signal.SIGTERM if str(stop) == "SIGTERM" else signal.SIGINT)


RECORD = "time_to_loss.json"
SUMMARY_FIGURES = ("tokens", "step", "final_val_loss", "tokens_per_sec", "wall_s", "peak_memory_bytes")


def lenient_json(path: Path) -> Any:
    """A JSON file this benchmark or a run wrote, with gpt.validate's limits; NaN reads as NaN (a loss may be)."""
    return validate.read_json(path, hint=f"remove {path.parent} to run it again", strict=False)


def read_record(path: Path, recipe: str, seed: int) -> dict[str, Any]:
    """A finished run's record, checked against what train_one writes (its own recipe and seed, numbers where
    numbers belong, the curve's (step, time, loss) triples), a UserError naming the file and the field otherwise."""
    record = validate.Record(lenient_json(path), str(path), hint=f"remove {path.parent} to run it again")
    unknown = sorted(set(record.value) - {"recipe", "seed", "launched", "summary", "curve"})
    if unknown:
        raise record.error(f"{validate.shown(unknown[0])} is not a field a time-to-loss record holds")
    if record.str("recipe") != recipe or record.int("seed", low=validate.INT64[0]) != seed:
        raise record.error(f"it records recipe {validate.shown(record.value['recipe'])} seed "
                           f"{validate.shown(record.value['seed'])}, not this folder's {recipe} seed {seed}")
    summary = read_summary(record.record("summary"))
    points = record.list("curve", of=list)
    if len(points) > summary["step"] + 1:
        raise record.error(f"curve holds {len(points):,} evaluations, more than the {summary['step'] + 1:,} steps "
                           "of its run")
    curve = []
    for i, point in enumerate(points):
        if len(point) != 3 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in point) \
                or not isinstance(point[0], int) or not 0 <= point[0] <= validate.INT64[1] \
                or not math.isfinite(point[1]) or not (point[2] >= 0 or math.isnan(point[2])):
            raise record.error(f"curve[{i}] must be [step, seconds, loss] (a whole step and a loss >= 0), "
                               f"got {validate.shown(point)}")
        curve.append(tuple(point))
    return {"recipe": recipe, "seed": seed, "launched": record.number("launched"), "summary": summary,
            "curve": curve}


def read_summary(summary: validate.Record) -> dict[str, Any]:
    """The figures of a run's summary.json this benchmark reports: counts whole, nothing negative, the final loss
    and the rate may be NaN (a diverged run), the seconds finite."""
    out = {key: figure(summary, key, whole=key in ("tokens", "step", "peak_memory_bytes")) for key in SUMMARY_FIGURES}
    if not math.isfinite(out["wall_s"]):
        raise summary.error(f"{summary.name('wall_s')} must be a finite number, got {out['wall_s']!r}")
    return out


def val_curve(folder: Path, started: float) -> tuple[float, list[tuple[int, float, float]]]:
    """The run's launch time and its (step, wall time, val loss) at every evaluation, from its TensorBoard scalars.

    ``started`` is when this process launched the training process. A run resumed after an interruption has
    evaluations from before it: they are moved later by the time the run stood stopped, and its launch is put as
    far before its first evaluation as the resumed process's first came after its start, so seconds to a loss count
    training, not the pause (they came out negative)."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    events.Reload()
    every = events.Scalars("val/loss")
    first: dict[int, Any] = {}
    for e in every:  # a step evaluated again after a resume: when it was first reached
        first.setdefault(e.step, e)
    earlier = [e.wall_time for e in every if e.wall_time < started]
    if not earlier:
        return started, [(step, e.wall_time, e.value) for step, e in sorted(first.items())]
    pause = started - max(earlier)
    startup = min((e.wall_time - started for e in every if e.wall_time >= started), default=0.0)
    curve = [(step, e.wall_time + (pause if e.wall_time < started else 0.0), e.value)
             for step, e in sorted(first.items())]
    return min(earlier) + pause - startup, curve


def reached(result: dict[str, Any], target: float) -> dict[str, float]:
    """Steps, tokens and seconds (from the process's launch) at the first evaluation at or below ``target``."""
    summary = result["summary"]
    tokens_per_step = summary["tokens"] / max(summary["step"], 1)
    for step, wall, loss in result["curve"]:
        if loss <= target:
            return {"steps": step, "tokens": step * tokens_per_step, "seconds": wall - result["launched"]}
    return {"steps": math.nan, "tokens": math.nan, "seconds": math.nan}


def rows(results: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """One row per run: the recipe, seed, figures to the target and the run's own final figures."""
    out = []
    for r in results:
        s = r["summary"]
        out.append({"recipe": r["recipe"], "seed": r["seed"], **reached(r, target),
                    "final_val_loss": s["final_val_loss"], "final_step": s["step"], "tokens_per_s": s["tokens_per_sec"],
                    "wall_s": s["wall_s"], "peak_mib": s["peak_memory_bytes"] / 2**20})
    return out


def medians(table: list[dict[str, Any]], recipes: list[str]) -> list[dict[str, Any]]:
    """Per recipe, the median of each figure over its seeds (NaN, not reached, counts as the largest)."""
    keys = ["steps", "tokens", "seconds", "final_val_loss", "tokens_per_s", "wall_s", "peak_mib"]
    out = []
    for recipe in recipes:
        mine = [row for row in table if row["recipe"] == recipe]
        med = {k: statistics.median([math.inf if math.isnan(row[k]) else row[k] for row in mine]) for k in keys}
        out.append({"recipe": recipe, "seeds": len(mine), "reached": sum(not math.isnan(r["steps"]) for r in mine),
                    **{k: math.nan if math.isinf(v) else v for k, v in med.items()}})
    return out


def run(cfg: TimeToLossConfig, log: Callable[[str], None] = print) -> str:
    """Every (seed, recipe) run in turn, then the report; returns the markdown it also writes."""
    from gpt.arena.time_to_loss_report import write_report

    results = [train_one(cfg, recipe, seed, log) for seed in cfg.seeds for recipe in cfg.recipes]
    target = cfg.target
    if target is None:
        target = statistics.median(r["summary"]["final_val_loss"] for r in results if r["recipe"] == cfg.recipes[0])
    table = rows(results, target)
    return write_report(Path(cfg.out_dir), cfg, results, table, medians(table, cfg.recipes), target)
