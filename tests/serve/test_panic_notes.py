"""The server's standard error without the tokenizers library's panic notes (gpt.serve.panic_notes): every other
line copied through as written, whichever way the pipe cuts the writes. Through a real server:
test_hostile_server.py's prompt the split pattern gives up on, logged in one line."""

from __future__ import annotations

import os
import threading

import pytest

from gpt.serve.panic_notes import copy_lines

FIRST = (b"\nthread '<unnamed>' (15047) panicked at /root/.cargo/onig-6.5.3/src/lib.rs:647:23:\n"
         b"Onig: Regex search error: retry-limit-in-match over\n"
         b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n")
LATER = b"\nthread '<unnamed>' panicked at /root/.cargo/onig-6.5.3/src/lib.rs:647:23:\nOnig: retry-limit\n"


def copied(data: bytes, pieces: int) -> bytes:
    """What copy_lines writes for ``data`` written in ``pieces`` writes."""
    source_read, source_write = os.pipe()
    out_read, out_write = os.pipe()
    copier = threading.Thread(target=copy_lines, args=(source_read, out_write))
    copier.start()
    step = max(1, len(data) // pieces)
    for start in range(0, len(data), step):
        os.write(source_write, data[start : start + step])
    os.close(source_write)
    copier.join(timeout=10)
    os.close(out_write)
    with os.fdopen(out_read, "rb") as out:
        return out.read()


@pytest.mark.parametrize("pieces", [1, 7, 50, 10**6])
def test_panic_notes_are_dropped_and_every_other_line_kept(pieces):
    data = (b"INFO: started\n" + FIRST + b"INFO: 400\n\nINFO: after a blank line\n" + LATER
            + b"WARNING: kept\n\n\nthread 'x' is a word here\nno newline at the end")
    assert copied(data, pieces) == (b"INFO: started\nINFO: 400\n\nINFO: after a blank line\nWARNING: kept\n\n\n"
                                    b"thread 'x' is a word here\nno newline at the end")
