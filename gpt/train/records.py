"""What a run shows and leaves behind besides checkpoints, behind one small interface.

Log lines (also appended to train.log), the progress bar or plain lines, TensorBoard scalars and
pictures, the config record in .hydra/ and summary.json. Only rank 0 records: on the other ranks every
method does nothing, so the training code never asks which rank it is on to log.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from gpt.errors import UserError
from gpt.files import atomic_write
from gpt.train import visuals

SUMMARY_FILE = "summary.json"


@dataclass
class Summary:
    """The outcome of one invocation of the training script (summary.json holds it, with the run's context)."""

    params: int
    step: int  # optimizer steps done
    tokens: int
    best_val_loss: float
    final_train_loss: float  # of the last evaluation
    final_val_loss: float
    tokens_per_sec: float  # over the training steps of this invocation, but its first
    peak_memory_bytes: int
    wall_s: float
    ckpt: Path
    interrupted: bool = False
    resume_command: str = ""
    final_val_ppl: float | None = None  # exp(final_val_loss)
    final_val_bpb: float | None = None  # final_val_loss in bits per UTF-8 byte (estimated from meta.json's counts)


def summary_writer(log_dir: Path, **kwargs: Any):
    """TensorBoard's SummaryWriter, imported late (it is slow to import) and without the cloud file systems its
    file layer would load when installed (boto3 for s3://, fsspec): runs are written to local folders, and those
    two cost about 10 MiB of resident memory and half a second for nothing."""
    blocked = [name for name in ("boto3", "botocore", "fsspec") if name not in sys.modules]
    try:
        sys.modules.update(dict.fromkeys(blocked))  # None: `import boto3` raises ImportError, which tensorboard expects
        from torch.utils.tensorboard import SummaryWriter
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return SummaryWriter(log_dir=str(log_dir), **kwargs)


def _quiet_event_thread(args: Any) -> None:
    """threading.excepthook while a run records: TensorBoard's writer thread, stopped by a full or read-only disk,
    prints no traceback (the main thread meets the same error at its next write and reports it in one line)."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    threading.__excepthook__(args)


def record_config(run_dir: Path, config: dict[str, Any], overrides: list[str], resumed: bool) -> None:
    """Save the resolved config and the command-line overrides in run_dir/.hydra/ (a resume in a subfolder).

    Written once the config has passed every check, rather than by Hydra at start-up: a mistyped
    command aimed at an existing run must not overwrite that run's record.
    """
    folder = run_dir / ".hydra"
    if resumed:
        folder = folder / time.strftime("resume-%Y-%m-%d_%H-%M-%S")
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in (("config.yaml", config), ("overrides.yaml", list(overrides))):
        text = yaml.safe_dump(value, sort_keys=False).encode()
        atomic_write(folder / name, lambda f, text=text: f.write(text), what="the run's config record")


class RunRecords:
    """Log lines, progress, TensorBoard and summary.json of a run; a no-op unless ``enabled`` (rank 0)."""

    def __init__(self, run_dir: Path, log: Callable[[str], None], enabled: bool) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self._log = log
        self._log_file: Path | None = None
        self.writer = None  # TensorBoard's SummaryWriter once open
        self.interactive = enabled and sys.stderr.isatty()
        self._bar: tqdm | None = None
        self._excepthook: Callable[[Any], Any] | None = None  # the one replaced while TensorBoard writes

    def open(self, config: dict[str, Any], overrides: list[str], resumed: bool, step: int, max_iters: int) -> None:
        """Once the run's checks have passed: record the config, start train.log, TensorBoard and the progress bar."""
        if not self.enabled:
            return
        record_config(self.run_dir, config, overrides, resumed)
        self._log_file = self.run_dir / "train.log"
        self._excepthook, threading.excepthook = threading.excepthook, _quiet_event_thread
        with self._events():
            # a resumed run rewrites what the interrupted one logged after its checkpoint: TensorBoard drops that
            self.writer = summary_writer(self.run_dir, purge_step=step + 1 if resumed else None)
            visuals.log_config(self.writer, config)
        self._bar = tqdm(total=max_iters, initial=step, disable=not self.interactive, unit="step", dynamic_ncols=True)

    def log(self, message: str) -> None:
        """A line for the console (and train.log once open)."""
        if not self.enabled:
            return
        self._log(message)
        if self._log_file is not None:
            try:
                with open(self._log_file, "a", encoding="utf-8") as f:
                    f.write(message + "\n")
            except OSError as err:
                raise UserError(f"could not write {self._log_file}: {err.strerror or err}",
                                hint="free disk space; the checkpoints written so far are unchanged") from None

    def say(self, message: str) -> None:
        """A line that must not tear the progress bar: above it when interactive, else a log line."""
        if self._bar is not None and self.interactive:
            self._bar.write(message)
        else:
            self.log(message)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """TensorBoard scalars at ``step`` (None values are left out)."""
        if self.writer is not None:
            with self._events():
                for tag, value in values.items():
                    if value is not None:
                        self.writer.add_scalar(tag, value, step)

    def pictures(self, draw: Callable[[Any], None]) -> None:
        """Let ``draw(writer)`` add texts and figures to TensorBoard (rank 0 only)."""
        if self.writer is not None:
            with self._events():
                draw(self.writer)

    @contextlib.contextmanager
    def _events(self) -> Iterator[None]:
        """TensorBoard's writes: a full or read-only disk (met by its writer thread, raised again on the next call)
        is one UserError, and the events file is written no further."""
        try:
            yield
        except OSError as err:
            self.writer = None
            raise UserError(f"could not write TensorBoard events in {self.run_dir}: {err.strerror or err}",
                            hint="free disk space; the checkpoints written so far are unchanged") from None

    def progress(self, line: str, **postfix: str) -> None:
        """A step's figures: on the progress bar when interactive, else as a log line."""
        if self.interactive and self._bar is not None:
            self._bar.set_postfix(refresh=False, **postfix)
        else:
            self.log(line)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self, summary: Summary | None = None, context: dict[str, Any] | None = None) -> None:
        """Close the bar and TensorBoard; write summary.json when given a summary."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                writer.close()
        except OSError as err:
            if summary is not None:  # a finishing run says so; a run already stopping by an error keeps its own
                self.writer = writer
                with self._events():
                    raise err
        finally:
            if self._excepthook is not None:
                threading.excepthook, self._excepthook = self._excepthook, None
        if self.enabled and summary is not None:
            text = json.dumps({**asdict(summary), "ckpt": str(summary.ckpt), **(context or {})}, indent=2) + "\n"
            atomic_write(self.run_dir / SUMMARY_FILE, lambda f: f.write(text.encode()), what="the run's summary")
