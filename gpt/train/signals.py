"""Graceful stop on SIGINT/SIGTERM (Ctrl-C, a preempted job): the first asks, the second insists."""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A repeat within this many seconds is the same request delivered twice: Ctrl-C under torchrun reaches a
# worker from the terminal and again from torchrun, which forwards the signal to its workers.
REPEAT_WINDOW_S = 1.0


class SignalGuard:
    """Installs handlers for SIGINT and SIGTERM while active (a context manager).

    The first signal only sets ``received``: the loop finishes its step, saves and exits. A second
    signal (after REPEAT_WINDOW_S) exits at once with status 128 + signal number; the last saved
    checkpoint stays as it is, since saves are atomic.
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose  # False on ranks > 0: rank 0 speaks for all
        self.received: str | None = None  # name of the first signal received
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.received is None:
            self.received, self._first_at = name, now
            if self.verbose:
                print(f"\n{name} received: finishing this step and saving (send it again to quit at once)",
                      file=sys.stderr, flush=True)
            return
        if now - self._first_at < REPEAT_WINDOW_S:
            return
        print(f"\n{name} received again: exiting now without saving", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def __enter__(self) -> SignalGuard:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
