"""Graceful stop on SIGINT/SIGTERM (Ctrl-C, a preempted job): the first asks, the second insists."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Installs handlers for SIGINT and SIGTERM while active (a context manager).

    The first signal only sets ``requested``: the loop finishes its step, saves and exits. A second
    signal exits at once with status 128 + signal number (the last saved checkpoint stays as it is).
    """

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log
        self.requested: str | None = None  # name of the first signal received
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = name
            print(f"\n{name} received: finishing this step and saving (send it again to quit at once)",
                  file=sys.stderr, flush=True)
            return
        print(f"\n{name} received again: exiting now without saving", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def __enter__(self) -> "StopRequest":
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
