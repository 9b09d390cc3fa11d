"""format=hf for every design: the transformers architecture that computes a model's forward exactly, and the folder
it is written as; and the way back, which reads weights and this project's own config only (never code).

Four targets, tried in order: GPT-2 (gpt.interop.hf: GPT2LMHeadModel), Starcoder2 (RoPE with grouped-query heads and a
sliding window: Starcoder2ForCausalLM), GPT-Neo for a layout whose kinds differ only by window (gpt.interop.gptneo:
GPTNeoForCausalLM), and remote code (GPTAttentionForCausalLM: gpt/interop/modeling/core.py
plus each design's registered part, ``Design.modeling``, loaded with ``trust_remote_code=True``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.interop import gptneo, hf
from gpt.model import design as designs
from gpt.model.config import GPTConfig
from gpt.model.state import model_config_from

MODELING = "modeling_gpt_attention.py"  # the remote-code export's modeling file
DESIGN_FILE = "design_{}.py"  # each active design's part beside it
STARCODER2_ACT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu", "relu2": "relu2"}  # transformers' ACT2FN names
ROPE_THETA = 10000.0  # gpt.designs.rope's base
WHAT = {"gpt2": "transformers GPT2LMHeadModel (standard architecture)",
        "starcoder2": "transformers Starcoder2ForCausalLM (standard architecture)", "gptneo": gptneo.WHAT,
        "remote": f"remote code: {MODELING} in the folder, load with trust_remote_code=True"}


def starcoder2_mismatch(config: GPTConfig) -> str | None:
    """Why Starcoder2 does not compute this model exactly (None: it does): RoPE must be the only design."""
    if config.norm != "layernorm":
        return f"Starcoder2 normalises with LayerNorm, this model with model.norm={config.norm}"
    names = [d.name for d in designs.active(config)]
    if names != ["rope"]:
        return f"Starcoder2 is RoPE alone, this model has designs {names or 'none'}"
    return None


def choose(config: GPTConfig) -> str:
    """The target that computes this model exactly: gpt2, starcoder2, gptneo (layouts) or remote; a one-line
    UserError if none does."""
    if not getattr(config, "mlp", True):  # every target's blocks, the remote code's too, have an MLP
        raise UserError("model.mlp=false (attention-only blocks) has no Hugging Face layout",
                        hint="pass format=native for this project's own layout")
    if config.layers is not None:  # GPT-2's and Starcoder2's layers are all alike
        if gptneo.mismatch(config) is None:
            return "gptneo"
    else:
        try:
            hf.check_representable(config)
            return "gpt2"
        except UserError:
            pass
        if starcoder2_mismatch(config) is None:
            return "starcoder2"
    scaled = next((kind for kind in config.kinds().values() if rope_scaling(kind) is not None), None)
    if scaled is not None:  # the remote-code core rotates unscaled
        where = ("model.design_options.rope.scaling" if scaled.kind is None
                 else f"model.layer_kinds.{scaled.kind}.options.rope.scaling")
        raise UserError(f"{where} ({rope_scaling(scaled)['rope_type']}) cannot be exported for transformers here: "
                        "only Starcoder2 (a uniform model, RoPE alone, LayerNorm) carries it, and the remote-code "
                        "export does not", hint="pass format=native")
    missing = [(kind, d) for kind in config.kinds().values() for d in designs.active(kind) if not d.modeling]
    if missing:
        kind, d = missing[0]
        where = "" if kind.kind is None else f"model.layer_kinds.{kind.kind}: "
        raise UserError(f"{where}{d.setting(kind)} cannot be exported for transformers: no standard architecture "
                        f"holds design {d.name} and it registers no modeling source (Design.modeling)",
                        hint="pass format=native, or give the design a modeling file (docs/designs.md)")
    for d in designs.active_anywhere(config):
        if not Path(d.modeling).is_file():
            raise UserError(f"design {d.name}'s modeling source {d.modeling} does not exist",
                            hint="fix Design.modeling, or pass format=native")
    return "remote"


def rope_scaling(config: GPTConfig) -> dict[str, Any] | None:
    """The (kind's) config's RoPE scaling (model.design_options.rope.scaling); None without one or without RoPE."""
    return config.design_options.get("rope", {}).get("scaling")


def meta(config: GPTConfig, tokenizer: dict[str, Any], target: str) -> dict[str, Any]:
    """This project's own description in config.json (hf.META_KEY): what the project reads back."""
    return {"format": "gpt-attention/1", "target": target, "model_config": config.to_dict(),
            "tokenizer": hf.reference(tokenizer)}


def common(config: GPTConfig, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    eot = hf.eot_id(tokenizer)
    return {"vocab_size": config.vocab_size, "tie_word_embeddings": config.tie_head, "bos_token_id": eot,
            "eos_token_id": eot, "dtype": str(dtype).removeprefix("torch."), "use_cache": True}


# --- Starcoder2 ---------------------------------------------------------------------------------------------------

def starcoder2_config(config: GPTConfig, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    return {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", **common(config, tokenizer, dtype),
            "hidden_size": config.n_embd, "intermediate_size": 4 * config.n_embd, "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head, "num_key_value_heads": config.n_kv_head,
            "hidden_act": STARCODER2_ACT[config.activation], **rope_parameters(config),
            "norm_epsilon": hf.LAYER_NORM_EPS,
            "sliding_window": config.window, "use_bias": config.bias, "attention_dropout": config.dropout,
            "residual_dropout": config.dropout, "embedding_dropout": config.dropout}


def rope_parameters(config: GPTConfig) -> dict[str, Any]:
    """rope_parameters and max_position_embeddings in transformers' form: its dynamic NTK counts the growth from
    max_position_embeddings, so there it is the original length; linear and dynamic take no original length key."""
    scaling = rope_scaling(config)
    if scaling is None:
        return {"max_position_embeddings": config.block_size,
                "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}}
    params = {k: v for k, v in scaling.items() if v is not None}
    original = params["original_max_position_embeddings"]
    if scaling["rope_type"] in ("linear", "dynamic"):
        del params["original_max_position_embeddings"]
    length = original if scaling["rope_type"] == "dynamic" else config.block_size
    return {"max_position_embeddings": length, "rope_parameters": {**params, "rope_theta": ROPE_THETA}}


def to_starcoder2(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Starcoder2ForCausalLM's state dict: c_attn split into q/k/v, LayerNorm biases (zero for bias=false)."""
    C, kv = config.n_embd, config.n_kv_head * config.head_dim
    out = {"model.embed_tokens.weight": state["transformer.wte.weight"]}
    if not config.tie_head:
        out["lm_head.weight"] = state["lm_head.weight"]
    renames = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_proj": "self_attn.o_proj",
               "mlp.c_fc": "mlp.c_fc", "mlp.c_proj": "mlp.c_proj"}
    for i in range(config.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if ours + f"attn.c_attn.{kind}" in state:
                q, k, v = state[ours + f"attn.c_attn.{kind}"].split([C, kv, kv])
                out.update({theirs + f"self_attn.{n}_proj.{kind}": t for n, t in zip("qkv", (q, k, v))})
            for a, b in renames.items():
                if ours + f"{a}.{kind}" in state:
                    out[theirs + f"{b}.{kind}"] = state[ours + f"{a}.{kind}"]
        for ln in ("input_layernorm", "post_attention_layernorm"):
            out.setdefault(theirs + f"{ln}.bias", torch.zeros(C, dtype=out[theirs + f"{ln}.weight"].dtype))
    out["model.norm.weight"] = state["transformer.ln_f.weight"]
    out["model.norm.bias"] = state.get("transformer.ln_f.bias", torch.zeros_like(state["transformer.ln_f.weight"]))
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def from_starcoder2(tensors: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """The inverse of to_starcoder2 for a model whose config (this project's, from config.json) is known."""
    state = {"transformer.wte.weight": tensors["model.embed_tokens.weight"]}
    names = {"input_layernorm": "ln_1", "post_attention_layernorm": "ln_2", "self_attn.o_proj": "attn.c_proj",
             "mlp.c_fc": "mlp.c_fc", "mlp.c_proj": "mlp.c_proj"}
    kinds = ("weight", "bias") if config.bias else ("weight",)
    for i in range(config.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for kind in kinds:
            state[ours + f"attn.c_attn.{kind}"] = torch.cat([tensors[theirs + f"self_attn.{n}_proj.{kind}"]
                                                             for n in "qkv"])
            for b, a in names.items():
                state[ours + f"{a}.{kind}"] = tensors[theirs + f"{b}.{kind}"]
    state["transformer.ln_f.weight"] = tensors["model.norm.weight"]
    if config.bias:
        state["transformer.ln_f.bias"] = tensors["model.norm.bias"]
    state["lm_head.weight"] = state["transformer.wte.weight"] if config.tie_head else tensors["lm_head.weight"]
    return state


# --- remote code --------------------------------------------------------------------------------------------------

def remote_config(config: GPTConfig, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    auto = {"AutoConfig": f"{MODELING[:-3]}.GPTAttentionConfig",
            "AutoModelForCausalLM": f"{MODELING[:-3]}.GPTAttentionForCausalLM"}
    return {"architectures": ["GPTAttentionForCausalLM"], "model_type": "gpt_attention", "auto_map": auto,
            **common(config, tokenizer, dtype), "max_position_embeddings": config.block_size,
            "n_positions": config.block_size, "model_config": config.to_dict(),
            "designs": [d.name for d in designs.active(config)], **remote_layout(config)}


def remote_layout(config: GPTConfig) -> dict[str, Any]:
    """A layout's layers for the remote-code core: each layer's kind, and each kind's config, designs (hook order)
    and per-layer design settings (RoPE's base); nothing for a uniform model, whose export is as before."""
    if config.layers is None:
        return {}
    kinds = {name: {"model_config": kind.to_dict(), "designs": [d.name for d in designs.active(kind)],
                    "options": kind.design_options} for name, kind in config.kinds().items()}
    return {"layer_kinds": [config.kind_of(i) for i in range(config.n_layer)], "kinds": kinds}


def remote_files(config: GPTConfig) -> dict[str, str]:
    """modeling_gpt_attention.py (the core, its DESIGN_PARTS filled in) and each active design's part file."""
    core = Path(designs.modeling_file("core")).read_text()
    active = designs.active_anywhere(config)
    lines = [f"from .{DESIGN_FILE.format(d.name)[:-3]} import Part as _{d.name}" for d in active]
    table = "DESIGN_PARTS: dict = {" + ", ".join(f'"{d.name}": _{d.name}' for d in active) + "}"
    marker = re.search(r"^DESIGN_PARTS: dict = \{\}.*$", core, flags=re.M)
    files = {MODELING: core[:marker.start()] + "\n".join([*lines, table]) + core[marker.end():]}
    for d in active:
        files[DESIGN_FILE.format(d.name)] = Path(d.modeling).read_text()
    return files


def remote_state(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """The project's own names; a tied head stored once (transformers ties it back)."""
    return {k: v.detach().cpu().contiguous() for k, v in state.items() if k != "lm_head.weight" or not config.tie_head}


def write(target: str, state: dict[str, Tensor], config: GPTConfig, tokenizer: dict[str, Any], out: Path) -> None:
    """Write a starcoder2, gptneo or remote export folder (GPT-2's is gpt.interop.formats.export's)."""
    dtype = state["transformer.wte.weight"].dtype
    if target == "gptneo":
        tensors, cfg = gptneo.to_neo(state, config), gptneo.neo_config(config, common(config, tokenizer, dtype))
    else:
        tensors = to_starcoder2(state, config) if target == "starcoder2" else remote_state(state, config)
        cfg = (starcoder2_config if target == "starcoder2" else remote_config)(config, tokenizer, dtype)
    cfg[hf.META_KEY] = meta(config, tokenizer, target)
    files = {**hf.tokenizer_files(tokenizer, config.block_size),
             "generation_config.json": json.dumps(hf.generation_config(config, tokenizer), indent=1),
             **(remote_files(config) if target == "remote" else {}),
             "config.json": json.dumps(cfg, indent=1, ensure_ascii=False)}
    hf.write_folder(out, tensors, {"format": "pt"}, files)


# --- reading back: weights and this project's config.json entry, never the modeling file --------------------------

def is_folder(path: str | Path) -> bool:
    """A starcoder2, gptneo or remote-code export written here: config.json with our description, and weights."""
    path = Path(path)
    if not (path.is_dir() and (path / "config.json").is_file() and (path / hf.WEIGHTS).is_file()):
        return False
    try:
        cfg = hf.read_json(path / "config.json")
    except UserError:
        return False
    own = isinstance(cfg.get(hf.META_KEY), dict)
    return cfg.get("model_type") in ("starcoder2", "gpt_neo", "gpt_attention") and own


def read_folder(path: str | Path) -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any], str]:
    """The project's GPTConfig, state dict, tokenizer description and target of such a folder."""
    folder = Path(path)
    cfg = hf.read_json(folder / "config.json")
    own = cfg[hf.META_KEY]
    if not isinstance(own.get("model_config"), dict) or own.get("target") not in ("starcoder2", "gptneo", "remote"):
        raise UserError(f"{folder / 'config.json'}: {hf.META_KEY} must name a target and hold a model_config object",
                        hint="the file was edited or damaged: export the model again")
    config = model_config_from(own["model_config"], folder / "config.json")
    tensors = hf.load_safetensors(folder / hf.WEIGHTS)
    if own["target"] in ("starcoder2", "gptneo"):
        try:
            state = (from_starcoder2 if own["target"] == "starcoder2" else gptneo.from_neo)(tensors, config)
        except KeyError as err:
            raise UserError(f"{folder / hf.WEIGHTS} has no tensor {err}", hint="export the model again") from None
        except RuntimeError as err:  # q, k, v projections whose shapes do not stack
            raise UserError(f"{folder / hf.WEIGHTS}: {str(err).splitlines()[0]}",
                            hint="the file was edited or damaged: export the model again") from None
    else:
        state = dict(tensors)
        if config.tie_head and "transformer.wte.weight" in state:
            state["lm_head.weight"] = state["transformer.wte.weight"]
    return config, state, hf.attach(own.get("tokenizer"), folder), own["target"]
