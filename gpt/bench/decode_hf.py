"""Greedy decoding against transformers' GPT2LMHeadModel.generate on the same weights: GPT-2 124M's shape, random
weights (no hub access needed: the same tensors go into both through gpt.interop.hf's export mapping), fp32, batch 1, a
16-token prompt. The two take turns in every repeat, so a shared machine's load falls on both alike."""

from __future__ import annotations

import copy
import statistics
from functools import partial

import torch

from gpt import GPT
from gpt.bench.report import compile_step, first_call_seconds, interleaved, markdown_table, ratio, ratio_spread
from gpt.inference.weight_layout import decode_layout, gemv_layout
from gpt.model.config import GPTConfig

GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, dropout=0.0, bias=True)


FLOOR = "floor: reading every weight once a token"


def against_transformers(cfg, device: torch.device, shape: dict = GPT2_124M) -> str:
    """ms per token of this project's cached decoding (eager with its weights as the generate command stores them,
    decode_layout; with MKL's products only, gemv_layout; eager with nn.Linear's own storage; compiled with
    cfg.compile, on MKL's products) and of transformers' generate on a model of ``shape``, their ratio and whether
    the tokens agree, beside the memory's floor (read_weights); one line saying why not when transformers is
    missing."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape, attention=cfg.model.attention)).to(device).eval()
    twin = hf_twin(model)
    if twin is None:
        return "against transformers: skipped (transformers is not installed: pip install -e '.[dev]')"
    n = cfg.hf_new_tokens
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    linear = copy.deepcopy(model)  # nn.Linear's (out, in) storage, as transformers' lm_head keeps it
    mkl = copy.deepcopy(model)
    gemv_layout(mkl)  # MKL's products on (in, out) storage, nothing packed for oneDNN
    decode_layout(model)  # as the generate and chat commands load a model
    fns = {"ours, KV cache": partial(ours_greedy, model, prompt, n),
           "transformers generate": partial(hf_greedy, twin, prompt, n),
           "ours, KV cache, MKL only, (in, out) weights": partial(ours_greedy, mkl, prompt, n),
           "ours, KV cache, (out, in) weights": partial(ours_greedy, linear, prompt, n)}
    note = ""
    if cfg.compile:
        step = compile_step(device)
        fns["ours, compiled"] = partial(ours_compiled, mkl, prompt, n, step)
        note = f"\n\nours, compiled: first call {first_call_seconds(fns['ours, compiled'], device):.1f} s"
    tokens = {name: fn() for name, fn in fns.items()}
    weights = torch.ones(model.num_params(), device=device)  # the position table: one row a step, not counted
    fns[FLOOR] = partial(read_weights, weights, n)
    times = interleaved(fns, device, cfg.repeats)
    rows = [[name, f"{statistics.median(times[name]) / n * 1e3:.1f}",
             "1.00x" if name == "transformers generate" else ratio_spread(times, "transformers generate", name),
             "-" if name == FLOOR else "yes" if tokens[name] == tokens["transformers generate"] else "NO"]
            for name in fns]
    name = "GPT-2 124M shape" if shape == GPT2_124M else f"{shape['n_layer']} layers of {shape['n_embd']}"
    head = (f"against transformers {_version()}: {name} ({model.num_params() / 1e6:.1f}M parameters), "
            f"random weights in both, fp32, greedy, batch 1, 16-token prompt, {n} new tokens")
    floor, size = statistics.median(times[FLOOR]) / n, weights.numel() * 4
    del weights  # 495 MB for GPT-2: freed before the bf16 table's copies
    return (head + "\n\n" + markdown_table(["decoder", "ms per token", "speed vs transformers (lowest-highest repeat)",
                                         "same tokens"], rows)
            + note + f"\n\n{FLOOR}: a step reads all {size / 1e6:,.0f} MB of fp32 weights (the tied "
            f"head once); torch.sum over that many bytes took {floor * 1e3:.1f} ms here "
            f"({size / floor / 1e9:.1f} GB/s), so no fp32 decoder of this model takes less a token on "
            f"this machine at these threads: at most {ratio(times, 'transformers generate', FLOOR):.2f}x "
            f"transformers"
            + (bf16_table(cfg, linear, twin, prompt, tokens["transformers generate"]) if cfg.hf_bf16 else ""))


def bf16_table(cfg, model: GPT, twin, prompt: torch.Tensor, fp32_tokens: list[int]) -> str:
    """The same greedy decoding with both sides' weights in bfloat16 (a table of its own: bf16 is only ever compared
    with bf16): ms per token, the ratio to transformers' bf16 generate, whether the tokens agree with transformers'
    bf16 ones and with the fp32 ones, and bf16's memory floor (half the bytes)."""
    n = cfg.hf_new_tokens
    ours = copy.deepcopy(model).to(torch.bfloat16)
    gemv_layout(ours)
    theirs = copy.deepcopy(twin).to(torch.bfloat16)
    weights = torch.ones(model.num_params(), device=prompt.device, dtype=torch.bfloat16)
    fns = {"ours, KV cache, bf16": partial(ours_greedy, ours, prompt, n),
           "transformers generate, bf16": partial(hf_greedy, theirs, prompt, n)}
    tokens = {name: fn() for name, fn in fns.items()}
    fns[FLOOR + ", bf16"] = partial(read_weights, weights, n)
    times = interleaved(fns, prompt.device, cfg.repeats)
    base = "transformers generate, bf16"

    def agree(name: str, other: list[int]) -> str:
        if name not in tokens:
            return "-"
        mine = tokens[name]
        first = next((i for i, (a, b) in enumerate(zip(mine, other)) if a != b), None)
        return "yes" if first is None else f"NO (from token {first + 1})"

    rows = [[name, f"{statistics.median(times[name]) / n * 1e3:.1f}",
             "1.00x" if name == base else ratio_spread(times, base, name), agree(name, tokens[base]),
             agree(name, fp32_tokens)] for name in fns]
    floor = statistics.median(times[FLOOR + ", bf16"]) / n
    return (f"\n\nbf16 on both sides (torch.bfloat16 weights and activations; not comparable with the fp32 table "
            f"above): the same prompt, {n} new tokens, greedy\n\n"
            + markdown_table(["decoder", "ms per token", "speed vs transformers bf16 (lowest-highest repeat)",
                              "same tokens as transformers bf16", "same tokens as fp32"], rows)
            + f"\n\n{FLOOR}, bf16: {weights.numel() * 2 / 1e6:,.0f} MB read in {floor * 1e3:.1f} ms "
            f"({weights.numel() * 2 / floor / 1e9:.1f} GB/s): at most {ratio(times, base, FLOOR + ', bf16'):.2f}x "
            f"transformers' bf16")


def read_weights(weights: torch.Tensor, n: int) -> None:
    """What memory allows n one-token steps: a step reads every weight once, so none takes less than summing a
    tensor of their bytes (far larger than any cache: every read comes from memory)."""
    for _ in range(n):
        weights.sum()


def ours_compiled(model: GPT, prompt: torch.Tensor, n: int, step) -> list[int]:
    from gpt.inference.decoding import generate

    return generate(model, prompt, n, temperature=0.0, step=step)[0, prompt.size(1):].tolist()


def _version() -> str:
    import transformers

    return transformers.__version__


def hf_twin(model: GPT):
    """transformers' GPT2LMHeadModel with this model's weights (gpt.interop.hf's export mapping), or None without it."""
    try:
        import transformers
    except ImportError:
        return None
    from gpt.interop.hf import META_KEY, hf_config, to_hf_state

    values = hf_config(model.config, {"kind": "char", "vocab_size": model.config.vocab_size}, torch.float32, "proof")
    config = transformers.GPT2Config(**{k: v for k, v in values.items() if k != META_KEY})
    twin = transformers.GPT2LMHeadModel(config)
    twin.load_state_dict(to_hf_state(model.state_dict(), model.config), strict=False)
    twin.tie_weights()
    return twin.to(next(model.parameters()).device).eval()


def ours_greedy(model: GPT, prompt: torch.Tensor, n: int) -> list[int]:
    from gpt.inference.decoding import generate

    return generate(model, prompt, n, temperature=0.0)[0, prompt.size(1):].tolist()


@torch.no_grad()
def hf_greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(prompt))
    return out[0, prompt.size(1):].tolist()
