"""The server's standard error without the Rust tokenizers library's panic notes.

A prompt that makes a tokenizer's split pattern give up (Oniguruma's retry limit) makes the library panic; the server
answers that request with a 400 and logs it in one access-log line, but Rust's panic hook has already written its
own note to file descriptor 2 (``thread '...' panicked at ...``, the message, ``note: run with RUST_BACKTRACE=1``),
where Python cannot catch it. :func:`dropping_panic_notes` routes descriptor 2 through a pipe whose reader thread
copies every line through as it comes, except those notes.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HEADER = re.compile(rb"^thread '[^']*'(?: \(\d+\))? panicked at ")
NOTE = b"note: run with `RUST_BACKTRACE=1`"


@contextmanager
def dropping_panic_notes() -> Iterator[None]:
    """While the block runs, descriptor 2 is a pipe copied to the real standard error without panic notes; the
    copy is complete when the block ends (processes still holding the pipe are given 2 s to let it go)."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    copier = threading.Thread(target=copy_lines, args=(read_end, real), name="stderr", daemon=True)
    copier.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # the pipe's last writer here closed: the copier reads to its end
        copier.join(timeout=2)
        if not copier.is_alive():
            os.close(real)


def copy_lines(read_end: int, real: int) -> None:
    """Copy whole lines from ``read_end`` to ``real``, dropping each panic note: the blank line Rust writes before
    it, its header line, the message line after it and the note line that may follow."""
    pending, skip, blank = b"", 0, False  # skip: 2 after a header (its message next), 1 after it (maybe the note)
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = []
            for line in lines:
                if skip == 1 and line.startswith(NOTE):
                    skip = 0
                elif skip == 2:
                    skip = 1
                elif HEADER.match(line):
                    skip, blank = 2, False
                elif not line and not blank:
                    skip, blank = 0, True  # held until the next line says whether a note follows
                else:
                    kept.append(b"\n" * blank + line + b"\n")
                    skip, blank = 0, False
            if kept:
                os.write(real, b"".join(kept))
        os.write(real, b"\n" * blank + pending)
