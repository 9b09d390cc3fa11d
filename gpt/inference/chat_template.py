"""Chat templates: a checkpoint's Jinja template (its tokenizer description's ``chat_template``, the source string
transformers keeps in tokenizer_config.json) turns a conversation into the prompt text, and says how a reply ends.

The template is untrusted (it comes from a file): it is rendered in Jinja's immutable sandbox inside a process of
its own (gpt/inference/template_worker.py), with its memory capped and its time limited; the server only reads back the
text. Special tokens the tokenizer reserves (ChatML's <|im_start|> and <|im_end|>, end-of-text) are inserted by id
where the template writes them; a message holding one's text is refused, so no message can forge a turn.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpt.tokenizers.tokenizer import Tokenizer

MAX_SOURCE_CHARS = 64 * 1024  # a template is a few hundred to a few thousand characters
RENDER_SECONDS = 2.0  # one rendering takes about a millisecond; a runaway loop is stopped here
RENDER_MEMORY = 512 * 2**20  # the renderer process's address space
START_SECONDS = 60.0  # the renderer's start (a Python interpreter importing Jinja), however loaded the machine
END_OF_TURN = "<|im_end|>"  # ChatML's end of a message: a chat reply stops there
WORKER = Path(__file__).with_name("template_worker.py")
MAX_RENDERERS = 8  # renderings at once, each in its own process: a runaway one holds only its own
WAIT_SECONDS = RENDER_SECONDS + 1.0  # a request finding every renderer busy waits this long for one, then gets a 503
CROWDED_SECONDS = 0.5  # with every renderer busy and a request waiting, the oldest rendering past this is stopped


class ChatTemplateError(Exception):
    """The template is unusable, or refused this conversation (its raise_exception, a limit): a 400 for the client."""


class RenderersBusy(ChatTemplateError):
    """Every renderer was busy for WAIT_SECONDS, or none could be started: a 503, retry shortly."""


class RendererClosed(ChatTemplateError):
    """The renderer was closed (the server is shutting down) before or while this rendering ran: a 503."""


class Renderer:
    """Processes that render templates, one rendering each at a time: a rendering takes an idle process (one is
    kept started in advance), and one that overruns kills only its own process, so the other requests are served
    meanwhile. At most ``processes`` at once; a request that finds them all busy stops the oldest rendering that
    has run ``crowded`` s (a rendering takes milliseconds: that one is running away), or waits for one to end,
    refused after ``wait`` s. So runaway templates, however many, hold a normal one about ``crowded`` s."""

    def __init__(self, seconds: float = RENDER_SECONDS, memory: int = RENDER_MEMORY, processes: int = MAX_RENDERERS,
                 wait: float = WAIT_SECONDS, crowded: float = CROWDED_SECONDS) -> None:
        self.seconds, self.memory, self.processes, self.wait = seconds, memory, processes, wait
        self.crowded = min(crowded, seconds)
        self._idle: list[subprocess.Popen] = []
        self._busy: dict[subprocess.Popen, float] = {}  # rendering processes: when their rendering began
        self._stopped: set[subprocess.Popen] = set()  # busy ones stopped early for a waiting request
        self._live = 0  # processes started or starting, idle or busy
        self._closed = False
        self._cond = threading.Condition()  # re-entrant: close() may run in a signal handler

    def ask(self, request: dict[str, Any]) -> str:
        """Send one request and return the text of the answer (ChatTemplateError with the worker's message)."""
        process = self._take()
        line, crowded = "", False
        try:
            line = self._exchange(process, request)
        finally:
            crowded = self._give_back(process, healthy=bool(line))
        if not line:
            if self._closed:
                raise RendererClosed("the server is shutting down")
            if crowded:
                raise ChatTemplateError(f"the chat template ran longer than {self.crowded:g} s while other "
                                        "requests waited for a renderer, and was stopped")
            raise ChatTemplateError(f"the chat template ran longer than {self.seconds:g} s or exhausted its "
                                    "renderer's memory, and was stopped")
        answer = json.loads(line)
        if "error" in answer:
            raise ChatTemplateError(answer["error"])
        return answer["text"]

    def _exchange(self, process: subprocess.Popen, request: dict[str, Any]) -> str:
        """The worker's answer line, or "" when it overran its time, was stopped or died."""
        assert process.stdin is not None and process.stdout is not None
        with self._cond:
            self._busy[process] = time.monotonic()
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], self.seconds)
            return process.stdout.readline() if ready else ""
        except (OSError, ValueError):  # the worker died (a memory cap it could not even report), or close() ran
            return ""

    def _take(self) -> subprocess.Popen:
        """An idle process, a new one if none is idle and fewer than ``processes`` live, else the first to be
        given back within ``wait`` s (RenderersBusy if none is); while waiting, the oldest rendering past
        ``crowded`` s is stopped."""
        deadline = time.monotonic() + self.wait
        with self._cond:
            while not self._idle and self._live >= self.processes and not self._closed:
                now = time.monotonic()
                if now >= deadline:
                    raise RenderersBusy(f"all {self.processes} chat template renderers are busy; retry shortly")
                self._cond.wait(min(deadline, self._stop_oldest(now)) - now)
            if self._closed:
                raise RendererClosed("the server is shutting down")
            if self._idle:
                process = self._idle.pop()
                spare = not self._idle and self._live < self.processes
                self._live += spare
            else:
                process, spare = None, False
                self._live += 1
        if spare:  # the next request finds one started (a start takes about 0.4 s)
            threading.Thread(target=self._start_spare, daemon=True).start()
        return process if process is not None else self._start_counted()

    def _stop_oldest(self, now: float) -> float:
        """Kill the longest rendering if it has run ``crowded`` s (called holding the lock); when to look again."""
        candidates = [(began, id(p), p) for p, began in self._busy.items() if p not in self._stopped]
        if not candidates:
            return now + 0.05
        began, _, oldest = min(candidates)
        if now - began < self.crowded:
            return began + self.crowded
        self._stopped.add(oldest)
        oldest.kill()  # its select() sees the end of its output at once; its thread gives it back
        return now + 0.05

    def _start_counted(self) -> subprocess.Popen:
        """A new process for a place already counted in _live (given back if it fails to start)."""
        try:
            return start_worker(self.memory)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _start_spare(self) -> None:
        try:
            process = self._start_counted()
        except ChatTemplateError:  # the next request starts one itself, and says why if it cannot
            return
        self._give_back(process, healthy=True)

    def _give_back(self, process: subprocess.Popen, healthy: bool) -> bool:
        """An idle process again, or (overran, died, stopped, or the renderer closed) killed and its place freed.
        Whether it was stopped early for a waiting request."""
        with self._cond:
            self._busy.pop(process, None)
            stopped = process in self._stopped
            self._stopped.discard(process)
            keep = healthy and not stopped and not self._closed and process.poll() is None
            if keep:
                self._idle.append(process)
            else:
                self._live -= 1
            self._cond.notify_all()
        if not keep:
            kill(process)
        return stopped

    def close(self) -> None:
        """Kill the idle processes and stop the renderings in progress (each request is told the renderer closed);
        safe in a signal handler, as the lock is re-entrant."""
        with self._cond:
            self._closed, idle, self._idle = True, self._idle, []
            self._live -= len(idle)
            for process in self._busy:
                process.kill()  # its own thread reaps it (under the lock: not before this kill)
            self._cond.notify_all()
        for process in idle:
            kill(process)


def start_worker(memory: int) -> subprocess.Popen:
    """A worker process, waited for until it has imported Jinja (not part of any time limit)."""
    try:
        # -I: no user site, no PYTHON* variables, not this folder on the path. A session of its own: a terminal's
        # Ctrl-C goes to the foreground process group, and a renderer still starting (a spare) would die of it
        # with a traceback on the user's screen; its parent ends it, and it ends itself when its stdin closes.
        process = subprocess.Popen(
            [sys.executable, "-I", str(WORKER), str(memory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, encoding="utf-8", start_new_session=True)
    except OSError as err:  # no process to be had (a limit on processes, memory)
        said = f"could not start a chat template renderer ({err.strerror or err}); retry shortly"
        raise RenderersBusy(said) from None
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_SECONDS)
    if not ready or not process.stdout.readline():
        kill(process)
        raise ChatTemplateError("the chat template renderer did not start (is jinja2 installed?)")
    return process


def kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def special_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The tokens that stand for no text, by their text: the tokenizer's own list, or its end-of-text."""
    specials = getattr(tokenizer, "special_tokens", None)
    if specials:
        return dict(specials)
    eot = tokenizer.eot_token
    return {tokenizer.token_bytes(eot).decode("utf-8", "replace"): eot} if eot is not None else {}


class ChatTemplate:
    """A checkpoint's chat template (checked to compile), the variables it is rendered with, and how a reply ends:
    at end-of-text or ChatML's <|im_end|>, by token id where the tokenizer reserves them, else as stop strings."""

    def __init__(self, source: Any, tokenizer: Tokenizer, meta: dict[str, Any], renderer: Renderer) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("the checkpoint's chat_template is not a template string")
        if len(source) > MAX_SOURCE_CHARS:
            raise ChatTemplateError(f"the checkpoint's chat_template has {len(source):,} characters "
                                    f"(at most {MAX_SOURCE_CHARS:,})")
        self.source, self.tokenizer, self.renderer = source, tokenizer, renderer
        renderer.ask({"source": source})  # compiles it, or says why not
        self.specials = special_tokens(tokenizer)
        eot = tokenizer.eot_token
        eos = meta.get("eos_token") or (tokenizer.token_bytes(eot).decode("utf-8", "replace") if eot is not None
                                        else "")
        self.variables = {"bos_token": meta.get("bos_token") or eos, "eos_token": eos,
                          "special_tokens": sorted(self.specials)}
        ends = [t for t in (eos, END_OF_TURN) if t]
        self.stop_tokens = frozenset(self.specials[t] for t in ends if t in self.specials)
        self.stop = tuple(t for t in ends if t not in self.specials and t in source)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for these messages, ending where the assistant's reply begins. A message whose text holds
        a special token's text is refused: encode() would turn it into the token, letting text forge a turn."""
        for i, message in enumerate(messages):
            forged = [s for s in self.specials if s in message.get("content", "")]
            if forged:
                raise ChatTemplateError(f"messages.{i}.content holds the text of the special token {forged[0]}, "
                                        "which only the chat template may write")
        return self.renderer.ask({"source": self.source, "messages": messages, "variables": self.variables})

    def encode(self, text: str) -> list[int]:
        """Token ids of a rendered prompt: special tokens by id, the text between them by the tokenizer."""
        if not self.specials:
            return self.tokenizer.encode(text)
        pattern = "|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True))
        ids: list[int] = []
        for piece in re.split(f"({pattern})", text):
            if piece in self.specials:
                ids.append(self.specials[piece])
            elif piece:
                ids.extend(self.tokenizer.encode(piece))
        return ids
