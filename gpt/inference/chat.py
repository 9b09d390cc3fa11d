"""A chat in the terminal with a fine-tuned model: the body of scripts/chat.py.

Each turn renders the whole conversation with the checkpoint's own chat template (sandboxed,
gpt.inference.chat_template, as the server does), streams the reply with generate's sampling settings until the
template's end of turn, and keeps the history within the model's context by dropping the oldest turns (said once).
/reset forgets the conversation, /quit (or Ctrl-D) leaves, Ctrl-C stops the current reply and keeps the chat going.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, TextIO

import torch

from gpt.device import PRECISIONS, DeviceConfig, autocast, resolve_device, resolve_precision
from gpt.errors import ConfigError, UserError, check_positive
from gpt.inference.chat_template import ChatTemplate, ChatTemplateError, Renderer
from gpt.inference.decoding import check_sampling, stream
from gpt.inference.text import TextStream, unescape
from gpt.inference.weight_layout import decode_layout
from gpt.model import GPT
from gpt.model.config import MISSING, AttentionConfig, ScriptConfig
from gpt.weights.load import load

HELP = "type a message; /reset starts over, /quit (or Ctrl-D) leaves, Ctrl-C stops a reply"


@dataclass
class ChatCommandConfig(ScriptConfig):
    """scripts/chat.py's settings (configs/chat.yaml): the model, an optional system message, generate's sampling."""

    ckpt: str = MISSING  # a run directory (best.pt, else ckpt.pt), a .pt file or an export, with a chat template
    init_path: Optional[str] = None  # with ckpt=gpt2*: a local Hugging Face GPT-2 folder
    system: str = ""  # a system message that opens every conversation (\n and \t unescaped)
    max_new_tokens: int = 256  # per reply
    temperature: float = 0.8  # 0: greedy
    top_k: Optional[int] = 200
    top_p: Optional[float] = None
    seed: int = 1337
    device: DeviceConfig = field(default_factory=DeviceConfig)
    model: Optional[AttentionConfig] = None  # attention=<kernel>: run the weights with it (None: as trained)
    precision: str = "auto"
    onednn: bool = True  # a CPU at 2+ threads: large float32 Linears through oneDNN's packed copies (weight_layout)

    def __post_init__(self) -> None:
        check_positive(self, "max_new_tokens")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")


class Reply:
    """Where a reply's text goes: the terminal, as it streams, and the history."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.parts = out, []

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.parts.append(text)

    def flush(self) -> None:
        self.out.flush()

    @property
    def text(self) -> str:
        return "".join(self.parts)


class Chat:
    """One conversation with a model: its history, kept within the context, and the replies."""

    def __init__(self, model: GPT, template: ChatTemplate, cfg: ChatCommandConfig, out: TextIO) -> None:
        self.model, self.template, self.cfg, self.out = model, template, cfg, out
        self.device = next(model.parameters()).device
        self.autocast = autocast(self.device, resolve_precision(cfg.precision, self.device))
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        block = model.config.block_size
        self.room = block - min(cfg.max_new_tokens, block // 2)  # tokens a prompt may have: the rest is the reply's
        self.system = [{"role": "system", "content": unescape(cfg.system)}] if cfg.system else []
        self.history: list[dict[str, str]] = []
        self.told_trim = False

    def reset(self) -> None:
        self.history = []

    def prompt(self, message: str) -> list[int] | None:
        """The ids of the conversation with ``message`` added, the oldest turns dropped to fit (said once); None
        when the message alone does not fit."""
        self.history.append({"role": "user", "content": message})
        while True:
            ids = self.template.encode(self.template.render(self.system + self.history))
            if len(ids) <= self.room:
                return ids
            if len(self.history) == 1:
                self.history.pop()
                self.say(f"(that message is {len(ids)} tokens with the template; this model's context leaves "
                         f"{self.room} for a prompt: say it shorter)")
                return None
            self.history = self.history[2:] if len(self.history) > 2 else self.history[-1:]  # a user turn + reply
            if not self.told_trim:
                self.told_trim = True
                self.say(f"(the conversation is longer than this model's context of {self.model.config.block_size} "
                         "tokens: the oldest turns are dropped from here on)")

    def answer(self, message: str) -> None:
        """Stream the reply to ``message``; Ctrl-C stops it there (what was said is kept)."""
        ids = self.prompt(message)
        if ids is None:
            return
        reply = Reply(self.out)
        text = TextStream(self.template.tokenizer, reply, list(self.template.stop))
        ends = self.template.stop_tokens
        tokenizer = self.template.tokenizer
        try:
            with self.autocast:
                for token in stream(self.model, torch.tensor([ids], device=self.device), self.cfg.max_new_tokens,
                                    temperature=self.cfg.temperature, top_k=self.cfg.top_k, top_p=self.cfg.top_p,
                                    generator=self.generator, vocab_limit=tokenizer.vocab_size):
                    token = int(token)
                    if token in ends or token in tokenizer.special_tokens.values() or not text.add(token):
                        break
            text.close()
        except KeyboardInterrupt as err:
            if str(err) == "SIGTERM":
                raise
            self.out.write(" [stopped]")
        self.out.write("\n")
        self.history.append({"role": "assistant", "content": reply.text})

    def say(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()


def load_chat_model(cfg: ChatCommandConfig, renderer: Renderer) -> tuple[GPT, ChatTemplate]:
    """The model and its chat template (a UserError when it has none, or one that does not compile)."""
    kernel, backend = (cfg.model.attention, cfg.model.attention_backend) if cfg.model else (None, None)
    model, tokenizer, meta = load(cfg.ckpt, resolve_device(cfg.device.type), kernel, backend, cfg.init_path)
    if "chat_template" not in meta:
        raise UserError(f"{cfg.ckpt} has no chat template (it is a base model)",
                        hint="fine-tune it on conversations first: scripts/train.py init_from=... chat.data=... "
                             "(docs/chat.md)")
    try:
        template = ChatTemplate(meta["chat_template"], tokenizer, meta, renderer)
    except ChatTemplateError as err:
        raise UserError(f"{cfg.ckpt}: its chat template is unusable: {err}",
                        hint="the file is damaged or was not written by this framework") from None
    decode_layout(model, cfg.onednn)  # weights stored for a CPU's one-token steps (weight_layout)
    return model, template


def run(cfg: ChatCommandConfig, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
    """scripts/chat.py: load, then one turn per line until /quit or the end of input."""
    renderer = Renderer()
    try:
        model, template = load_chat_model(cfg, renderer)
        chat = Chat(model, template, cfg, out)
        chat.say(f"chatting with {cfg.ckpt} ({model.config.block_size}-token context); {HELP}")
        while True:
            try:
                line = input("you> ") if stdin is sys.stdin else (stdin.readline() or "/quit")
            except EOFError:
                line = "/quit"
            except KeyboardInterrupt as err:
                if str(err) == "SIGTERM":
                    raise
                chat.say("\n(" + HELP + ")")
                continue
            line = line.strip()
            if line in ("/quit", "/exit"):
                return
            if line == "/reset":
                chat.reset()
                chat.say("(the conversation is cleared)")
            elif line.startswith("/"):
                chat.say(f"(unknown command {line.split()[0]}; {HELP})")
            elif line:
                out.write("assistant> ")
                out.flush()
                try:
                    chat.answer(line)
                except ChatTemplateError as err:
                    chat.say(f"(the chat template refused this conversation: {err})")
                    chat.history.pop()
    finally:
        renderer.close()
