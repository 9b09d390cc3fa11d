"""scripts/chat.py in a real pseudo-terminal: replies stream, Ctrl-C stops the current reply and the chat goes on,
the history is trimmed to the context with one notice, /reset and /quit work; a base model is refused."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from test_chat_data import CHARS

from conftest import ROOT
from gpt import GPT, GPTConfig
from gpt.data.chat import with_chat_tokens
from gpt.errors import UserError
from gpt.inference.chat import ChatCommandConfig, load_chat_model
from gpt.inference.chat_template import Renderer
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import checkpoint


def endless_chat_model(path: Path) -> Path:
    """A chat checkpoint whose replies never end: every position gives the same logits, <|im_end|>'s far below."""
    tokenizer = with_chat_tokens(CharTokenizer(CHARS))
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=tokenizer.vocab_size,
                       tie_head=False)
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)  # the head sees ones: logits are its rows' sums
        model.lm_head.weight.normal_(std=0.01)
        for name in ("<|im_start|>", "<|im_end|>"):
            model.lm_head.weight[tokenizer.special_tokens[name]] = -10.0
    checkpoint.save({"model": model.state_dict(), "model_config": config.to_dict(),
                     "tokenizer": tokenizer.to_meta()}, path)
    return path


class Terminal:
    """A process on the far side of a pseudo-terminal: what it wrote so far, what we type."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the script, with this checkout first on the path
            os.environ["PYTHONPATH"] = str(ROOT)
            os.execv(sys.executable, [sys.executable, str(ROOT / "scripts" / "chat.py"), *args])
        self.seen = ""

    def expect(self, pattern: str, timeout: float = 120) -> str:
        """Read until ``pattern`` appears after what was matched before; returns the text up to its end."""
        deadline = time.time() + timeout
        while not re.search(pattern, self.seen):
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                raise AssertionError(f"no {pattern!r} within {timeout} s; the terminal shows:\n{self.seen[-2000:]}")
            try:
                self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")
            except OSError:  # the child has ended
                raise AssertionError(f"the chat ended before {pattern!r}:\n{self.seen[-2000:]}") from None
        match = re.search(pattern, self.seen)
        done, self.seen = self.seen[: match.end()], self.seen[match.end():]
        return done

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 30) -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the chat did not end")


@pytest.mark.slow
def test_a_chat_in_a_terminal_streams_stops_on_ctrl_c_trims_resets_and_quits(tmp_path):
    ckpt = endless_chat_model(tmp_path / "chat.pt")
    term = Terminal(f"ckpt={ckpt}", "device=cpu", "max_new_tokens=1000000", "temperature=1.0")
    try:
        assert "64-token context" in term.expect("you> ")
        transcript = ""
        for message in ("hi", "Sort cab", "what next?"):
            term.type(message + "\r")
            transcript += term.expect("assistant> ")
            transcript += term.expect(r"[^\s]{20}")  # the reply streams (it would never end by itself)
            term.type("\x03")  # Ctrl-C, as the terminal sends it: SIGINT to the foreground process group
            transcript += term.expect(r"\[stopped\]\r?\n") + term.expect("you> ")
        assert transcript.count("the oldest turns are dropped") == 1  # said once, at the first trim
        term.type("/reset\r")
        term.expect(r"\(the conversation is cleared\)")
        term.expect("you> ")
        term.type("/quit\r")
        assert term.wait() == 0
    finally:
        try:
            os.kill(term.pid, signal.SIGKILL)
            os.waitpid(term.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(term.fd)


def test_a_model_without_a_chat_template_is_refused_in_one_line(tmp_path):
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=len(CHARS))
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": CharTokenizer(CHARS).to_meta()}, tmp_path / "base.pt")
    renderer = Renderer()
    try:
        with pytest.raises(UserError, match=r"base\.pt has no chat template \(it is a base model\)"):
            load_chat_model(ChatCommandConfig(ckpt=str(tmp_path / "base.pt")), renderer)
    finally:
        renderer.close()
