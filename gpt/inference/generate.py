"""Sample from a trained model as text: the body of scripts/generate.py (loading is gpt.weights.load.load)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, TextIO

import torch

from gpt.device import PRECISIONS, DeviceConfig, autocast, resolve_device, resolve_precision
from gpt.errors import ConfigError, UserError, check_positive
from gpt.inference.decoding import check_sampling, prompt_ids, stream
from gpt.inference.text import TextStream, unescape
from gpt.inference.weight_layout import decode_layout
from gpt.model import GPT
from gpt.model.config import MISSING, AttentionConfig, ScriptConfig
from gpt.tokenizers import tokenizer as tok
from gpt.weights.load import load


@dataclass
class GenerateConfig(ScriptConfig):
    """scripts/generate.py's settings (configs/generate.yaml), checked as they are built."""

    ckpt: str = MISSING  # a run directory (best.pt, else ckpt.pt), a .pt file, an exported folder, or gpt2*
    init_path: Optional[str] = None  # with ckpt=gpt2*: a local Hugging Face GPT-2 folder or .safetensors file
    prompt: str = ""  # empty: start from a newline (character models) or end-of-text (GPT-2 BPE)
    prompt_file: Optional[str] = None  # read the prompt from a file; - for standard input
    interactive: bool = False  # a prompt loop on standard input
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0: greedy
    top_k: Optional[int] = 200
    top_p: Optional[float] = None  # nucleus sampling, in (0, 1]
    stop: list[str] = field(default_factory=list)  # stop before any of these strings
    kv_cache: bool = True  # false: recompute the whole context at every step
    num_samples: int = 1
    seed: int = 1337
    device: DeviceConfig = field(default_factory=DeviceConfig)
    model: Optional[AttentionConfig] = None  # attention=<kernel>: run the weights with it (None: as trained)
    window: Optional[int] = None  # sliding window for this run (None: as trained); with it decoding never ends
    sinks: Optional[int] = None  # StreamingLLM's sink tokens beside the window (the stream design; 0: none)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    onednn: bool = True  # a CPU at 2+ threads: large float32 Linears through oneDNN's packed copies (weight_layout)

    def __post_init__(self) -> None:
        check_positive(self, "max_new_tokens", "num_samples")
        check_positive(self, "window", optional=True)
        if self.sinks is not None and (isinstance(self.sinks, bool) or self.sinks < 0):
            raise ConfigError(f"sinks must be a non-negative integer or null, got {self.sinks!r}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")


def read_prompt(cfg: GenerateConfig) -> str:
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


def sample_to(out: TextIO, model: GPT, tokenizer: tok.Tokenizer, prompt: str, cfg: GenerateConfig,
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


def streaming(model: GPT, window: int | None, sinks: int | None) -> GPT:
    """The model with this run's window and sink tokens (the stream design, which adds no weight), else as it is.
    With a window shorter than block_size and RoPE, decoding goes on past block_size in constant memory."""
    if window is None and sinks is None:
        return model
    config = model.config if window is None else replace(model.config, window=window)
    if sinks is not None:
        names = [d for d in config.designs if d != "stream"] + (["stream"] if sinks else [])
        options = {k: v for k, v in config.design_options.items() if k != "stream"}
        config = replace(config, designs=names, design_options={**options, **({"stream": {"sinks": sinks}}
                                                                             if sinks else {})})
    streamed = GPT(config).to(next(model.parameters()).device)
    streamed.load_state_dict(model.state_dict())
    return streamed.eval()


def run(cfg: GenerateConfig) -> None:
    """scripts/generate.py: load the model, print num_samples samples (or a prompt loop)."""
    device = resolve_device(cfg.device.type)
    ctx = autocast(device, resolve_precision(cfg.precision, device))
    kernel, backend = (cfg.model.attention, cfg.model.attention_backend) if cfg.model else (None, None)
    model, tokenizer, _ = load(cfg.ckpt, device, kernel, backend, cfg.init_path)
    model = streaming(model, cfg.window, cfg.sinks)
    decode_layout(model, cfg.onednn)  # weights stored for a CPU's one-token steps (weight_layout)
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
