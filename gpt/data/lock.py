"""One preparation of a data set at a time (the signals that stop it cleanly: gpt.files).

``preparation_lock`` holds an exclusive flock on ``<root>/.<name>.lock`` (which names the holder's process)
while a data set is prepared: a second preparation of the same data waits for the first, saying for which
process, and then finds its result up to date instead of deleting the first one's staging folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from gpt.errors import UserError


@contextmanager
def preparation_lock(data_dir: Path, log: Callable[[str], None]) -> Iterator[bool]:
    """Hold the preparation lock of ``data_dir``, waiting for another process that holds it; yields whether it waited.

    The lock file is removed on release; the process's end (however it ends) releases the flock too."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield False
        return
    path = data_dir.with_name(f".{data_dir.name}.lock")
    made = [folder for folder in path.parents if not folder.exists()]  # data.root's folders, innermost first
    waited = False
    while True:
        file = open_lock_file(path)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "unknown"
            log(f"waiting for process {holder}, which is preparing {data_dir} (its result is then reused)")
            try:
                fcntl.flock(file, fcntl.LOCK_EX)  # blocks until the holder is done; Ctrl-C still interrupts
            except BaseException:
                file.close()
                raise
            waited = True
        if same_file(file, path):
            break
        file.close()  # the holder removed the file while this process waited: lock the new one
    with file:
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
        try:
            yield waited
        finally:
            path.unlink(missing_ok=True)  # while still locked: a waiter notices and locks a fresh file
            for folder in made:  # a preparation that kept nothing leaves no folder it made (rmdir: empty ones only)
                with contextlib.suppress(OSError):
                    folder.rmdir()


def open_lock_file(path: Path) -> TextIO:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a+", encoding="utf-8")
    except OSError as err:
        raise UserError(f"could not create the preparation lock {path}: {err.strerror or err}",
                        hint="data.root must be a writable folder to prepare data in it") from None


def same_file(file: TextIO, path: Path) -> bool:
    """Whether ``path`` still names the open ``file`` (not removed or replaced since it was opened)."""
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
