"""Files that must never be torn or trusted blindly: the one atomic writer, the signals that must not cut a
replacement in half, and the safe archive reader.

Every file the project writes that must never be torn (checkpoints, prepared data, records, exports) goes through
:func:`atomic_write` (or :func:`atomic_write_all` for files that replace their targets together); every torch
archive it reads goes through :func:`load_archive` (no pickled code runs). JSON and YAML: gpt.validate.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import torch

from gpt.errors import ConfigError, UserError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], what: str = "file",
                 hint: str | None = None) -> None:
    """Stream ``write(f)`` into a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the folder.

    A crash at any moment leaves the old file or the new one, never a torn one. If writing fails (a full disk, a
    read-only folder) or is interrupted (Ctrl-C, SIGTERM under gpt.cli), the temporary file is removed, the old
    file stays, and a failure is a UserError naming ``what``. The temporary name is unique to the process, so two
    writers never write into one file.
    """
    atomic_write_all([(Path(path), write)], what, hint)


def atomic_write_all(files: list[tuple[Path, Callable[[BinaryIO], None]]], what: str = "file",
                     hint: str | None = None) -> None:
    """Write several files that replace their targets together: each into a temporary file beside its target,
    then, once all are written, every rename in the order given, with Ctrl-C and SIGTERM held until the renames
    are done. A failure or an interrupt while writing removes every temporary file and leaves every target as it
    was (an export's weights never sit beside the previous export's config.json)."""
    written: list[tuple[Path, Path]] = []
    stopped: list[int] = []  # stop signals that came while writing
    try:
        with signals_noted(stopped):
            for path, write in files:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                written.append((tmp, path))
                with open(tmp, "wb") as f:
                    write(f)
                    f.flush()
                    os.fsync(f.fileno())
            if stopped:  # a stop noted while writing whose KeyboardInterrupt something swallowed: no rename either
                raise interrupt(stopped[0])
        with signals_deferred():
            for tmp, path in written:
                os.replace(tmp, path)
            for folder in sorted({path.parent for _, path in written}):
                fsync_folder(folder)
    except BaseException as err:
        for tmp, _ in written:
            with suppress(OSError):  # a read-only folder refuses even the removal of what it never held
                tmp.unlink(missing_ok=True)
        if stopped and not isinstance(err, KeyboardInterrupt):  # a writer that turned the interrupt into its own
            raise interrupt(stopped[0]) from None  # error (torch.save: RuntimeError)
        if not isinstance(err, OSError):
            raise
        name = (written[-1][1] if written else Path(files[0][0])).name
        hint = hint or f"the previous {name} is unchanged; free disk space or write elsewhere"
        raise UserError(f"could not write {what} {written[-1][1] if written else files[0][0]}: "
                        f"{err.strerror or err}", hint=hint) from None


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt("SIGTERM") in the main thread while inside, so it stops like Ctrl-C: the
    writers above remove their temporary files and leave what was written as it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_noted(received: list[int]) -> Iterator[None]:
    """Ctrl-C and SIGTERM act as they would (each handler in place is called); those that stop the process (the
    handler raised, or the default action) are also appended to ``received``: a writer that turns the
    KeyboardInterrupt into an error of its own is still known to be stopped. A handler that returns (the trainer's
    SignalGuard: finish the step, save, then stop) lets the write finish."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def note(signum: int, frame: Any) -> None:
        handler = previous[signum]
        if callable(handler):
            try:
                handler(signum, frame)
            except BaseException:
                received.append(signum)
                raise
        elif handler == signal.SIG_DFL:  # what the signal would have done: Ctrl-C raises, SIGTERM ends the process
            received.append(signum)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, note)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (a few renames that must not be cut in half), then stop the
    process as they would have: a KeyboardInterrupt raised after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise interrupt(received[0])


def interrupt(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a stop signal raises: as Ctrl-C's own (no message) for SIGINT, else naming the signal,
    so every message says "Ctrl-C" or "SIGTERM" alike wherever the signal landed."""
    return KeyboardInterrupt("" if signum == signal.SIGINT else signal.Signals(signum).name)


def output_path(value: str | None, option: str, suffix: str | None = None, folder: bool = False) -> Path:
    """The file (or with ``folder``, the folder) an output option names, refused with a ConfigError naming ``option``
    when nothing could be written there as asked: an empty name, an existing folder where a file is wanted (or a
    file where a folder is), a name longer than the file system allows, a path below an existing file, or a file
    name without ``suffix`` (no other name is ever written in its place)."""
    text = "" if value is None else str(value)
    kind = "folder" if folder else "file"
    if not text.strip():
        raise ConfigError(f"{option} is empty", hint=f"give {option}=<a {kind} path>")
    path = Path(text).expanduser()
    for part in path.parts:
        if len(os.fsencode(part)) > 255:  # NAME_MAX of every common file system
            raise ConfigError(f"{option}: the name {part[:40]}... is {len(os.fsencode(part))} bytes, more than the "
                              "255 a file system allows", hint=f"give {option} a shorter name")
    try:
        if folder and path.exists() and not path.is_dir():
            raise ConfigError(f"{option}={text} is a file, not a folder", hint=f"give {option} a folder path")
        if not folder and (path.is_dir() or text.endswith(("/", os.sep))):
            raise ConfigError(f"{option}={text} is a folder",
                            hint=f"give {option} a file name, e.g. {option}={text.rstrip('/')}/out{suffix or ''}")
        below = next((parent for parent in path.parents if parent.exists()), None)
    except OSError as err:  # a path the system refuses to look at (too long as a whole, a loop of links)
        raise ConfigError(f"{option}={text[:80]} is not a usable {kind} path: {err.strerror or err}") from None
    if not folder and suffix and (path.suffix.lower() != suffix or path.name.lower() == suffix):
        raise ConfigError(f"{option} must name a {suffix} file, got {text!r}",
                          hint=f"e.g. {option}=results/out{suffix}")
    if below is not None and not below.is_dir():
        raise ConfigError(f"{option}={text} is below {below}, which is a file, not a folder",
                        hint=f"give {option} a path whose folders are folders")
    return path


def load_archive(path: str | Path, mmap: bool = False) -> Any:
    """torch.load with weights_only=True: tensors and plain values only; a damaged or foreign file is a UserError.
    ``mmap``: tensors stay on disk until used (for reading a checkpoint's small entries)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is damaged or foreign
        raise UserError(f"{path} is not a readable checkpoint (not a torch archive)",
                        hint="it may be truncated, empty or not a checkpoint at all")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = [line.strip() for line in str(err).splitlines() if "Unsupported global" in line]
        raise UserError(
            f"{path} holds objects other than tensors and plain values; refusing to load it"
            + (f" ({found[0]})" if found else ""),
            hint="this loader never runs code from a file; re-save the checkpoint with tensors and plain values only",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise UserError(f"{path} is not a readable checkpoint ({str(err).splitlines()[0]})",
                        hint="it may be truncated or not a checkpoint at all") from None
