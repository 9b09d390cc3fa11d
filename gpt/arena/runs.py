"""Where the arena keeps each run's state, so that the same command run again resumes instead of starting over, and
how runs are spread over devices.

Each cell's folder (out_dir/<group>/seed<seed>/) is a normal training run plus two files: arena_cell.json, its
configuration, written before it trains, and arena_result.json, its measured row, written when it finished. Run
again, the arena reads the finished rows back, resumes an unfinished cell from its last checkpoint (or from step
0), and refuses a folder that holds another configuration's run, naming the first setting that differs.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from gpt import validate
from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write
from gpt.validate import shown

CELL_FILE = "arena_cell.json"
RESULT_FILE = "arena_result.json"
NUMBERS = ("params", "steps", "tokens", "val_loss", "val_bpb", "val_tokens", "tokens_per_s", "peak_mib",
           "kv_bytes_per_token", "decode_tok_s", "train_s")  # what a finished row must hold, as numbers
COUNTS = ("params", "steps", "tokens", "val_tokens")  # of those, the whole numbers
MAP_SIDE = 32  # tokens of the attention map a result holds, at most (gpt.arena.arena draws that many)
Job = TypeVar("Job")


def fingerprint(run: Any) -> dict[str, Any]:
    """A run's configuration as JSON values (what the cell file holds)."""
    return json.loads(json.dumps(asdict(run)))


def first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The first dotted key whose value differs between two JSON values (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if a == b else prefix.rstrip(".")


def read_json(path: Path, strict: bool = True) -> Any:
    """A JSON value the arena wrote, read with gpt.validate's limits (size, nesting, digits), or one UserError
    saying the file is damaged and what to do. ``strict=False``: NaN reads as NaN (a result's figures may be)."""
    return validate.read_json(path, hint=f"remove {path.parent} to run that cell again", strict=strict)


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds a training run's files (a checkpoint, its log or summary)."""
    from gpt.train.resume import RUN_FILES
    from gpt.weights import checkpoint

    return checkpoint.latest(folder) is not None or any((folder / name).exists() for name in RUN_FILES)


def check_folder(folder: Path, run: Any, out_dir: Path | None = None) -> None:
    """Refuse a cell folder that holds another configuration's run (or a run this arena did not start), and a cell
    inside a training run's folder (out_dir or a group's folder holding one): the arena never adopts or writes
    beside what it did not write."""
    inside = [p for p in folder.parents if out_dir is not None and (p == out_dir or out_dir in p.parents)]
    for parent in inside:  # the group's folder up to out_dir itself
        if holds_run(parent):
            raise ConfigError(f"{parent} holds a training run that this arena did not start",
                              hint="choose another out_dir for the arena")
    if (folder / CELL_FILE).exists():
        stored = read_json(folder / CELL_FILE)
        if not isinstance(stored, dict):
            raise UserError(f"{folder / CELL_FILE} is not a JSON object",
                            hint=f"remove {folder} to run that cell again")
        differs = first_difference(stored, fingerprint(run))
        if differs:
            raise ConfigError(f"{folder} holds an arena run of another configuration ({differs} differs)",
                              hint="run the same command as before to resume it, or choose another out_dir")
    elif holds_run(folder):
        raise ConfigError(f"{folder} already holds a run that this arena did not start",
                          hint="choose another out_dir (or remove that folder)")


def finished(folder: Path, max_points: int | None = None) -> dict[str, Any] | None:
    """A finished cell's row (None: not finished), checked against what save() writes: the figures of NUMBERS (the
    counts of COUNTS whole), the loss curve (at most ``max_points`` evaluations: one a step) and the attention map
    (weights in [0, 1]), nothing else (a row never names its own group, variant or seed: the plan does), each
    refusal naming the file and the field. NaN is allowed where a diverged run writes it; negatives nowhere."""
    path = folder / RESULT_FILE
    if not path.exists():
        return None
    record = validate.Record(read_json(path, strict=False), str(path),
                             hint=f"remove {folder} to run that cell again")
    unknown = sorted(set(record.value) - set(NUMBERS) - {"curve", "attention"})
    if unknown:
        raise record.error(f"{shown(unknown[0])} is not a field an arena result holds")
    row: dict[str, Any] = {k: figure(record, k, whole=k in COUNTS) for k in NUMBERS}
    curve = record.list("curve", of=dict, nonempty=True)
    if max_points is not None and len(curve) > max_points:
        raise record.error(f"curve holds {len(curve):,} evaluations, more than the {max_points:,} steps of its run")
    row["curve"] = [{k: figure(validate.Record(point, record.where, record.hint, f"curve[{i}]"), k,
                                whole=k == "tokens", low=-math.inf if k == "seconds" else 0.0)
                     for k in ("tokens", "seconds", "train", "val")} for i, point in enumerate(curve)]
    attention = record.list("attention", of=list, nonempty=True)
    if len(attention) > MAP_SIDE:
        raise record.error(f"attention must be at most {MAP_SIDE} x {MAP_SIDE} (the arena draws {MAP_SIDE} tokens), "
                           f"got {len(attention)} rows")
    for i, line in enumerate(attention):
        if len(line) != len(attention) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                              or not (0 <= v <= 1 or math.isnan(v)) for v in line):
            raise record.error(f"attention[{i}] must be {len(attention)} weights in [0, 1] (a square map), "
                               f"got {shown(line)}")
    row["attention"] = attention
    return row


def figure(record: validate.Record, key: str, whole: bool = False, low: float = 0.0) -> float:
    """A figure of a result: a number >= low (or NaN: a diverged run's loss), an integer within 64 bits if whole."""
    value = record.value.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, int) and not validate.INT64[0] <= value <= validate.INT64[1]):
        raise record.error(f"{record.name(key)} is missing or not a number, got {described(value)}")
    if (whole and not isinstance(value, int)) or value < low:
        raise record.error(f"{record.name(key)} must be {'an integer' if whole else 'a number'} >= {low:g}, "
                           f"got {shown(value)}")
    return value


def described(value: Any) -> str:
    """A value as an error shows it; a huge integer lenient parsing kept as digits by its length, not as text."""
    if isinstance(value, validate.Digits):
        return f"an integer of {len(value.lstrip('-')):,} digits (more than 64 bits)"
    return shown(value)


def start(folder: Path, run: Any) -> None:
    """Record the cell's configuration before it trains (what a resumed arena checks it against)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fingerprint(run), indent=1)
    atomic_write(folder / CELL_FILE, lambda f: f.write(text.encode()), what="the arena cell's configuration")


def save(folder: Path, row: dict[str, Any]) -> None:
    """Record a finished cell's row (Python's JSON keeps NaN as NaN)."""
    text = json.dumps(row)
    atomic_write(folder / RESULT_FILE, lambda f: f.write(text.encode()), what="an arena result")


def run_all(jobs: Sequence[Job], devices: Sequence[str], runner: Callable[[Job, str], dict[str, Any]],
            done: Callable[[Job, dict[str, Any]], bool]) -> None:
    """Every job on one of ``devices``, one job per device at a time, taken in order as devices come free.
    ``done(job, result)`` is called in this thread, one at a time; True stops the taking of new jobs (those
    running finish). One device: in this thread, one job after another."""
    if len(devices) <= 1:
        for job in jobs:
            if done(job, runner(job, devices[0] if devices else "cpu")):
                return
        return
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    results: queue.Queue = queue.Queue()
    stop = threading.Event()

    def worker(device: str) -> None:
        while not stop.is_set():
            try:
                job = todo.get_nowait()
            except queue.Empty:
                break
            results.put((job, runner(job, device)))
        results.put(None)  # this device is done

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
    for thread in threads:
        thread.start()
    running = len(threads)
    while running:
        item = results.get()
        if item is None:
            running -= 1
        elif done(*item):
            stop.set()
    for thread in threads:
        thread.join()
