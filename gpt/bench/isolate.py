"""One benchmark case per fresh process (CPU), and a peak-memory gauge that works on CPU and CUDA.

On CPU there is no allocator to ask for a peak, so each case runs in its own process, forked from
the benchmark's (which has imported torch but computed nothing, so no thread pool is copied), and
the gauge reads that process's peak resident set (VmHWM in /proc/self/status). A process of its own
also lets a case that runs too long be killed, and one that runs out of memory fail alone.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import torch

MIB = 2**20


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _status_kib(field: str) -> int | None:
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB; None where there is no such file (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Return freed heap to the OS and reset VmHWM to the current resident set (Linux >= 4.0)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory of the calls made after start(): CUDA allocator peak, or CPU resident-set growth.

    CUDA: torch.cuda.max_memory_allocated() (every live tensor counts). CPU: VmHWM - VmRSS at start(),
    i.e. the memory the calls added; callers add the bytes of the tensors that were live before.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline_kib: int | None = None
        self.reset_ok = False

    def start(self) -> None:
        """Forget earlier peaks (warm-up, compilation) so only what follows is measured."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.reset_ok = _reset_peak_rss()
            self.baseline_kib = _status_kib("VmRSS")

    def peak_bytes(self, live_bytes: int = 0) -> int | None:
        """CUDA: the allocator's peak. CPU: live_bytes + growth of the resident set since start()."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        if self.device.type != "cpu":
            return None  # e.g. mps: no peak to read
        hwm = _status_kib("VmHWM")
        if hwm is None or self.baseline_kib is None or not self.reset_ok:
            return None
        return live_bytes + max(0, hwm - self.baseline_kib) * 1024


def compile_here(device: torch.device) -> None:
    """Start from a clean torch.compile state; on CPU compile in this process (no worker pool competing for
    the cores)."""
    torch._dynamo.reset()
    if device.type == "cpu":
        from torch._inductor import config as inductor

        inductor.compile_threads = 1
    # The compiler's tqdm would make a multiprocessing lock, which a case's short-lived process then
    # leaks (a resource_tracker warning at exit); a thread lock does the same job here.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes held by these tensors' elements (the memory a case had live before its timed calls)."""
    return sum(t.numel() * t.element_size() for t in tensors)


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Inside, Ctrl-C raises KeyboardInterrupt and SIGTERM KeyboardInterrupt("SIGTERM"), whatever handler was in
    place (a SignalGuard that only notes the signal would let a case of hours run on after a Ctrl-C that came before
    the trainer's own guard); a stop that handler noted already raises at once. The handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    inherited = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, sigterm)
    try:
        noted = getattr(getattr(inherited[signal.SIGINT], "__self__", None), "received", None)  # a SignalGuard's
        if isinstance(noted, str):
            raise KeyboardInterrupt("SIGTERM" if noted == "SIGTERM" else "")
        yield
    finally:
        for sig, handler in inherited.items():
            signal.signal(sig, handler)


def interrupted(err: KeyboardInterrupt) -> dict:
    """The result of a case a stop signal ended (Ctrl-C reaches the whole process group: the parent says it)."""
    return {"error": f"interrupted ({str(err) or 'Ctrl-C'})", "stop": True}


def _child(conn: Connection, fn: Callable[..., dict], kwargs: dict) -> None:
    try:
        with stop_signals_raise():  # forked under the parent's handlers
            result = fn(**kwargs)
    except torch.OutOfMemoryError as err:
        result = {"error": f"out of memory ({first_line(err)[:80]})", "stop": True}
    except KeyboardInterrupt as err:
        result = interrupted(err)
    except Exception as err:  # noqa: BLE001  (a case that fails is a result, not a crash)
        result = {"error": first_line(err), "traceback": traceback.format_exc()}
    for sig in (signal.SIGINT, signal.SIGTERM):  # the result is sent whole: a second Ctrl-C is the parent's to say
        signal.signal(sig, signal.SIG_IGN)
    conn.send(result)
    conn.close()


_CONTEXT: Any = None


def _context():
    """fork on Linux (no second 2 s import of torch per case); elsewhere a forkserver that imports torch once."""
    global _CONTEXT
    if _CONTEXT is None:
        # torch._dynamo: autograd and FlexAttention import it (and sympy) lazily, ~2 s every case would repeat.
        import torch._dynamo  # noqa: F401

        if sys.platform == "linux":
            _CONTEXT = mp.get_context("fork")
        else:
            _CONTEXT = mp.get_context("forkserver")
            _CONTEXT.set_forkserver_preload(["__main__", "torch", "torch._dynamo"])
    return _CONTEXT


def run_isolated(fn: Callable[..., dict], kwargs: dict, timeout_s: float) -> dict:
    """fn(**kwargs) in a fresh process: its result dict, or {"error": why} (exception, crash, timeout).

    "stop": True marks failures that a larger case would only repeat (out of memory, timeout, killed).
    """
    ctx = _context()
    gc.freeze()  # the child's gc.collect() then skips everything imported here (~0.2 s a case)
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, kwargs), daemon=True)
    proc.start()
    send.close()
    try:
        if receive.poll(timeout_s):
            try:
                return receive.recv()
            except EOFError:
                pass  # the child died before answering
        else:
            proc.kill()
            proc.join()
            return {"error": f"timeout: still running after {timeout_s:g} s (timeout_s)", "stop": True}
        proc.join()
        code = proc.exitcode
        why = "killed (out of memory?)" if code == -9 else f"crashed (exit code {code})"
        return {"error": why, "stop": True}
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join()


def run_here(fn: Callable[..., dict], kwargs: dict) -> dict:
    """fn(**kwargs) in this process (CUDA: the allocator's peak needs no separate process)."""
    try:
        return fn(**kwargs)
    except torch.OutOfMemoryError as err:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"error": f"out of memory ({first_line(err)[:80]})", "stop": True}
    except Exception as err:  # noqa: BLE001
        return {"error": first_line(err)}


def run_here_stoppable(fn: Callable[..., dict], kwargs: dict) -> dict:
    """run_here, with Ctrl-C and SIGTERM ending the case as its result, as they do a case in its own process, even
    under a handler that only notes them (the arena's guard, around a cell trained on its one GPU)."""
    try:
        with stop_signals_raise():
            return run_here(fn, kwargs)
    except KeyboardInterrupt as err:
        return interrupted(err)
