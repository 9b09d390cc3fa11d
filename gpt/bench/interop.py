"""The interop table of docs/interop.md, measured: for GPT-2 and every registered design, the largest |logit
difference| between this project's model and each place it is exported to (the native export read back here,
transformers' standard architecture, transformers' remote code, GGUF f32 / f16 / Q8_0 through transformers'
gguf_file= loader), on a tiny model with random weights, float32, one batch of two full-length sequences."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.interop import formats
from gpt.interop import targets as hf_targets
from gpt.model import design as registry
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import load as pretrained

CHARS = CharTokenizer([chr(c) for c in range(32, 127)] + ["\n"])
TINY = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=CHARS.vocab_size)
COLUMNS = ("native", "transformers standard", "transformers remote code", "GGUF f32", "GGUF f16", "GGUF Q8_0")


def rows() -> dict[str, dict]:
    """GPT-2, RoPE + grouped-query + window, then every registered design by its arena preset."""
    out = {"GPT-2 (no design)": {}, "rope + n_kv_head=2 + window=16": {"designs": ["rope"], "n_kv_head": 2,
                                                                       "window": 16}}
    out.update({name: registry.get(name).on_preset() for name in registry.available()})
    return out


def randomised(settings: dict, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **settings})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


def measure(model: GPT, work: Path) -> dict[str, str]:
    """Each column's largest difference (or why the target cannot hold the model)."""
    import transformers

    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(idx)[0]

    refusals: list[str] = []

    def diff(run: Callable[[], torch.Tensor]) -> str:
        try:
            with torch.no_grad():
                return f"{(run() - expected).abs().max().item():.1e}"
        except UserError as err:  # the target cannot hold the model: its one-line reason goes in the last column
            if run in runs[3:] and not refusals:
                refusals.append(str(err).split(": ", 1)[-1].removeprefix("llama.cpp "))
            return "—"

    state, config, meta = model.state_dict(), model.config, CHARS.to_meta()
    auto = transformers.AutoModelForCausalLM

    def native() -> torch.Tensor:
        formats.export(state, config, meta, work / "native", format="native")
        return pretrained.load_model(work / "native")[0](idx)[0]

    def standard() -> torch.Tensor:
        if hf_targets.choose(config) == "remote":
            raise UserError("none matches: no standard architecture")
        formats.export(state, config, meta, work / "hf")
        return auto.from_pretrained(work / "hf").eval()(idx).logits

    def remote() -> torch.Tensor:
        hf_targets.choose(config)  # refuses a design without a modeling file
        hf_targets.write("remote", state, config, meta, work / "remote")
        return auto.from_pretrained(work / "remote", trust_remote_code=True).eval()(idx).logits

    def gguf(kind: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            path = formats.export(state, config, meta, work / "gguf", format="gguf", gguf_type=kind)
            extra = {"n_positions": config.block_size} if "wpe" in model.transformer else {}
            return auto.from_pretrained(work / "gguf", gguf_file=path.name, **extra).eval()(idx).logits
        return run

    runs = (native, standard, remote, gguf("f32"), gguf("f16"), gguf("q8_0"))
    cells = dict(zip(COLUMNS, [diff(run) for run in runs]))
    return {**cells, "why no GGUF": refusals[0] if refusals else ""}


def table(log: Callable[[str], None] = print) -> str:
    """The markdown table, one row per design (each row logged as it is measured)."""
    import transformers

    transformers.logging.set_verbosity_error()
    columns = (*COLUMNS, "why no GGUF")
    lines = ["| design | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
    for name, settings in rows().items():
        with tempfile.TemporaryDirectory() as work:
            cells = measure(randomised(settings), Path(work))
        lines.append(f"| {name} | " + " | ".join(cells[c] for c in columns) + " |")
        log(lines[-1])
    return "\n".join(lines)
