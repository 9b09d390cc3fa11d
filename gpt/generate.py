"""Sample from a trained model as text: the body of scripts/generate.py (loading is gpt.pretrained.load_model)."""

from __future__ import annotations

import codecs
import sys
from pathlib import Path
from typing import TextIO

import torch
from omegaconf import DictConfig

from gpt import tokenizer as tok
from gpt.decoding import prompt_ids, stream
from gpt.device import autocast, resolve_device, resolve_precision
from gpt.errors import UserError
from gpt.model import GPT
from gpt.pretrained import load_model
from gpt.sampling import check_sampling


class TextStream:
    """Turns tokens into text as they arrive: whole UTF-8 characters only, stop strings held back and cut."""

    def __init__(self, tokenizer: tok.Tokenizer, out: TextIO, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.out = out
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # generated text not yet written
        self.stopped = False

    def add(self, token: int) -> bool:
        """Take one token; returns False once a stop string has appeared (the text before it is written)."""
        if self.stopped:
            return False
        self.text += self.decoder.decode(self.tokenizer.token_bytes(token))
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._write(self.text[: min(hits)])
            self.text, self.stopped = "", True
            return False
        cut = len(self.text) - self.holdback
        if cut > 0:
            self._write(self.text[:cut])
            self.text = self.text[cut:]
        return True

    def close(self) -> None:
        if not self.stopped:
            self._write(self.text + self.decoder.decode(b"", final=True))
        self.text = ""

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def unescape(text: str) -> str:
    """\\n and \\t typed on the command line become a newline and a tab (Hydra cannot pass real ones)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def read_prompt(cfg: DictConfig) -> str:
    """The prompt from prompt_file (a path, or - for standard input) or from prompt (\\n and \\t unescaped)."""
    if cfg.prompt_file is not None:
        if cfg.prompt_file == "-":
            return sys.stdin.read()
        path = Path(cfg.prompt_file).expanduser()
        if not path.is_file():
            raise UserError(f"prompt_file {str(path)!r} does not exist",
                            hint="give a text file, or prompt_file=- for standard input")
        return path.read_text(encoding="utf-8", errors="replace")
    return unescape(cfg.prompt)


def sample_to(out: TextIO, model: GPT, tokenizer: tok.Tokenizer, prompt: str, cfg: DictConfig,
              generator: torch.Generator, ctx) -> None:
    """Write the prompt and then one sample to ``out`` as it is produced."""
    device = next(model.parameters()).device
    ids = prompt_ids(tokenizer, prompt)
    block_size = model.config.block_size
    if len(ids) > block_size:
        print(f"warning: the prompt has {len(ids)} tokens; keeping its last {block_size} (block_size)", file=sys.stderr)
        ids = ids[-block_size:]
    out.write(tokenizer.decode(ids) if prompt else "")
    text = TextStream(tokenizer, out, [unescape(s) for s in cfg.stop])
    start = torch.tensor([ids], device=device)
    with ctx:
        for token in stream(model, start, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                            top_p=cfg.top_p, generator=generator, stop_token=tokenizer.eot_token,
                            kv_cache=cfg.kv_cache, vocab_limit=tokenizer.vocab_size):
            token = int(token)
            if token == tokenizer.eot_token or not text.add(token):
                break
    text.close()
    out.write("\n")


def run(cfg: DictConfig) -> None:
    """scripts/generate.py: check the settings, load the model, print num_samples samples (or a prompt loop)."""
    if cfg.max_new_tokens <= 0:
        raise UserError(f"max_new_tokens must be positive, got {cfg.max_new_tokens}")
    if cfg.num_samples <= 0:
        raise UserError(f"num_samples must be positive, got {cfg.num_samples}")
    check_sampling(cfg.temperature, cfg.top_k, cfg.top_p)
    device = resolve_device(cfg.device.type)
    ctx = autocast(device, resolve_precision(cfg.precision, device))
    attention = cfg.attention or {}
    model, tokenizer = load_model(cfg.ckpt, device, attention.get("name"), attention.get("backend"), cfg.init_path)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    out = sys.stdout
    if cfg.interactive:
        while True:
            out.write("prompt> ")
            out.flush()
            line = sys.stdin.readline()
            if not line or not line.strip():
                return
            sample_to(out, model, tokenizer, unescape(line.rstrip("\n")), cfg, generator, ctx)
    prompt = read_prompt(cfg)
    for i in range(cfg.num_samples):
        sample_to(out, model, tokenizer, prompt, cfg, generator, ctx)
        if i < cfg.num_samples - 1:
            out.write("-" * 40 + "\n")
