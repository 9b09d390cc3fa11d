"""format=hf's GPT-Neo target (GPTNeoForCausalLM): a layout whose kinds differ only by their window, both ways.

GPT-Neo is GPT-2 with a per-layer attention type ("global", or "local": query i sees keys i - window_size < j <= i,
this project's sliding-window rule), learned positions, LayerNorm and the same MLP. Two differences are bridged or
refused: its attention does not scale scores by 1/sqrt(head_dim), so the scale is folded into q_proj's weight (in
float64, then cast back); and its q/k/v projections have no bias, so only a model.bias=false model is held.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gpt.interop import hf
from gpt.model import design as designs
from gpt.model.config import GPTConfig

ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu2": "relu2"}  # transformers' ACT2FN names
WHAT = "transformers GPTNeoForCausalLM (standard architecture)"


def mismatch(config: GPTConfig) -> str | None:
    """Why GPT-Neo does not compute this layout exactly (None: it does)."""
    if config.layers is None:
        return "GPT-Neo is chosen for layouts (model.layers) only"
    core = {"model.bias=true": (config.bias, "GPT-Neo's q/k/v projections have no bias (train with model.bias=false)"),
            f"model.norm={config.norm}": (config.norm != "layernorm", "GPT-Neo normalises with LayerNorm"),
            f"model.n_kv_head={config.n_kv_head}": (config.n_kv_head != config.n_head,
                                                    "GPT-Neo has one key/value head per head")}
    for setting, (bad, why) in core.items():
        if bad:
            return f"{setting}: {why}"
    for name, kind in config.kinds().items():
        active = [d.name for d in designs.active(kind)]
        if active:
            return f"kind {name} has designs {active}; GPT-Neo's layers differ only by window (learned positions)"
    windows = sorted({k.window for k in config.kinds().values() if k.window is not None})
    if len(windows) > 1:
        return f"the local kinds have windows {windows}; GPT-Neo has one window_size"
    return None


def attention_types(config: GPTConfig) -> list[str]:
    return ["global" if config.layer(i).window is None else "local" for i in range(config.n_layer)]


def neo_config(config: GPTConfig, common: dict[str, Any]) -> dict[str, Any]:
    windows = [k.window for k in config.kinds().values() if k.window is not None]
    return {"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", **common,
            "hidden_size": config.n_embd, "num_layers": config.n_layer, "num_heads": config.n_head,
            "attention_types": [[attention_types(config), 1]], "window_size": windows[0] if windows else 256,
            "max_position_embeddings": config.block_size, "intermediate_size": None,
            "activation_function": ACT[config.activation], "layer_norm_epsilon": hf.LAYER_NORM_EPS,
            "resid_dropout": config.dropout, "embed_dropout": config.dropout, "attention_dropout": config.dropout}


def to_neo(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPTNeoForCausalLM's state dict: c_attn split into q/k/v (q times 1/sqrt(head_dim), in float64), zero biases
    where bias=false leaves ours out (GPT-Neo's out_proj, MLP and LayerNorms always have one)."""
    C, scale = config.n_embd, 1.0 / math.sqrt(config.head_dim)
    out = {"transformer.wte.weight": state["transformer.wte.weight"], "transformer.wpe.weight":
           state["transformer.wpe.weight"], "transformer.ln_f.weight": state["transformer.ln_f.weight"]}
    if not config.tie_head:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(config.n_layer):
        p = f"transformer.h.{i}."
        q, k, v = state[p + "attn.c_attn.weight"].split([C, C, C])
        out[p + "attn.attention.q_proj.weight"] = (q.double() * scale).to(q.dtype)
        out[p + "attn.attention.k_proj.weight"], out[p + "attn.attention.v_proj.weight"] = k, v
        for ours, theirs in (("attn.c_proj", "attn.attention.out_proj"), ("mlp.c_fc", "mlp.c_fc"),
                             ("mlp.c_proj", "mlp.c_proj"), ("ln_1", "ln_1"), ("ln_2", "ln_2")):
            out[p + theirs + ".weight"] = state[p + ours + ".weight"]
    for name, value in list(out.items()):
        if name.endswith(".weight") and not name.endswith(("wte.weight", "wpe.weight", "lm_head.weight",
                                                           "q_proj.weight", "k_proj.weight", "v_proj.weight")):
            out[name.removesuffix("weight") + "bias"] = torch.zeros(value.shape[0], dtype=value.dtype)
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def from_neo(tensors: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """The inverse of to_neo (q_proj times sqrt(head_dim), in float64: exact when head_dim is a power of 4, else
    within one rounding of the exported weights); the zero biases dropped, as bias=false has none."""
    scale = math.sqrt(config.head_dim)
    state = {k: tensors[k] for k in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight")}
    for i in range(config.n_layer):
        p, a = f"transformer.h.{i}.", f"transformer.h.{i}.attn.attention."
        q = tensors[a + "q_proj.weight"]
        state[p + "attn.c_attn.weight"] = torch.cat([(q.double() * scale).to(q.dtype), tensors[a + "k_proj.weight"],
                                                     tensors[a + "v_proj.weight"]])
        state[p + "attn.c_proj.weight"] = tensors[a + "out_proj.weight"]
        for name in ("mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2"):
            state[p + name + ".weight"] = tensors[p + name + ".weight"]
    state["lm_head.weight"] = state["transformer.wte.weight"] if config.tie_head else tensors["lm_head.weight"]
    return state
