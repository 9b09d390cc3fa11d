"""format=gguf: one .gguf file that llama.cpp runs and transformers' GGUF loader (``gguf_file=``) reads, for the
architectures llama.cpp knows that compute a model here exactly: GPT-2, and Starcoder2 (RoPE alone, grouped-query
heads allowed, no window). Written with the ``gguf`` package in f32, f16 or Q8_0, the tokenizer inside.

Tensor names and metadata follow llama.cpp's convert_hf_to_gguf.py: weights in nn.Linear's (out, in) orientation,
1-D tensors (norms, biases) kept in float32, Q8_0 only where a row's length is a multiple of its 32-value block.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.files import atomic_write_all
from gpt.interop import hf
from gpt.interop import targets as hf_targets
from gpt.model import design as designs
from gpt.model.config import GPTConfig
from gpt.tokenizers import bpe
from gpt.tokenizers.files import eot_id, library_tokenizer, special_tokens

TYPES = ("f32", "f16", "q8_0")
SPACE = "\u2581"  # how SentencePiece spells a space
HINT = "format=hf exports it for transformers (GPT-2, Starcoder2 or remote code); format=native for this project"


def gguf_module():
    """The gguf package, or a UserError saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise UserError("format=gguf needs the gguf package", hint="pip install gguf") from None
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)  # its note names the temporary file, not out
    return gguf


def architecture(config: GPTConfig) -> str:
    """gpt2 or starcoder2: the llama.cpp architecture computing this model exactly; a one-line refusal otherwise."""
    if config.norm != "layernorm":
        raise UserError(f"format=gguf cannot hold model.norm={config.norm}: llama.cpp's gpt2 and starcoder2 "
                        "normalise with LayerNorm", hint=HINT)
    target = hf_targets.choose(config)
    if target == "remote":
        names = [d.setting(config) for d in designs.active(config)]
        why = f"design {names[0]}" if names else "grouped-query heads or a window with a learned position table"
        raise UserError(f"format=gguf cannot hold this model: llama.cpp has no architecture with {why}", hint=HINT)
    if config.window is not None:
        raise UserError(f"format=gguf cannot hold model.window={config.window}: llama.cpp's starcoder2 and "
                        "transformers' GGUF loader attend to every earlier token", hint=HINT)
    scaling = config.design_options.get("rope", {}).get("scaling")
    if scaling is not None:
        raise UserError(f"format=gguf cannot hold model.design_options.rope.scaling ({scaling['rope_type']}): this "
                        "exporter writes RoPE unscaled", hint="export it with format=hf (Starcoder2 carries the "
                        "scaling in rope_parameters) or format=native")
    if config.activation != "gelu_tanh":
        raise UserError(f"format=gguf cannot hold model.activation={config.activation}: llama.cpp's {target} "
                        "MLP is the tanh GELU", hint=HINT)
    return target


def gpt2_tensors(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """llama.cpp's GPT-2 names; bias=false as zero biases; the tied head written as output.weight too."""
    def bias(name: str, width: int) -> Tensor:
        return state.get(name, torch.zeros(width))

    C = config.n_embd
    out = {"token_embd.weight": state["transformer.wte.weight"],
           "position_embd.weight": state["transformer.wpe.weight"],
           "output_norm.weight": state["transformer.ln_f.weight"], "output_norm.bias": bias("transformer.ln_f.bias", C),
           "output.weight": state["lm_head.weight"]}
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(config.n_layer):
        for ours, theirs in parts.items():
            weight = state[f"transformer.h.{i}.{ours}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = weight
            out[f"blk.{i}.{theirs}.bias"] = bias(f"transformer.h.{i}.{ours}.bias", weight.shape[0])
    return out


def starcoder2_tensors(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """llama.cpp's Starcoder2 names, from transformers' (gpt.interop.targets.to_starcoder2); zero biases if
    bias=false."""
    theirs = hf_targets.to_starcoder2(state, config)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    out = {"token_embd.weight": theirs["model.embed_tokens.weight"], "output_norm.weight": theirs["model.norm.weight"],
           "output_norm.bias": theirs["model.norm.bias"]}
    if not config.tie_head:
        out["output.weight"] = theirs["lm_head.weight"]
    for i in range(config.n_layer):
        for a, b in names.items():
            weight = theirs[f"model.layers.{i}.{a}.weight"]
            out[f"blk.{i}.{b}.weight"] = weight
            out[f"blk.{i}.{b}.bias"] = theirs.get(f"model.layers.{i}.{a}.bias", torch.zeros(weight.shape[0]))
    return out


def token_list(meta: dict[str, Any], vocab_size: int) -> tuple[str, list[str], list[int], list[str]]:
    """GGUF's tokenizer: its model, each id's token, its type, the merges. A BPE is "gpt2" (byte-level: tokens in
    the byte alphabet, with its merges), and so is a character vocabulary of one-byte characters (no merges);
    one with wider characters is "llama" (SentencePiece: each character one piece, the space spelled U+2581, no
    merges, no prefix space), so that characters of any width keep one id each.
    Padded ids are unused tokens."""
    if meta["kind"] == "char" and all(len(ch.encode("utf-8")) == 1 for ch in meta["chars"]):
        table = bpe.bytes_to_unicode()  # one byte each: byte-level tokens without merges, as a "gpt2" BPE
        model, tokens, merges = "gpt2", ["".join(table[b] for b in ch.encode("utf-8")) for ch in meta["chars"]], []
    elif meta["kind"] == "char":
        if SPACE in meta["chars"]:
            raise UserError(f"format=gguf cannot hold this character vocabulary: it has {SPACE!r}, the character "
                            "SentencePiece writes spaces as", hint=HINT)
        model, tokens, merges = "llama", [SPACE if ch == " " else ch for ch in meta["chars"]], []
    else:
        spec = json.loads(library_tokenizer(meta).to_str())
        pre, bpe_model = spec.get("pre_tokenizer") or {}, spec["model"]
        if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
            raise UserError("format=gguf cannot hold this tokenizer: its pre-tokenizer is not GPT-2's byte-level "
                            "split, the only one GGUF's gpt2 tokenizer names", hint=HINT)
        by_id = {i: token for token, i in bpe_model["vocab"].items()}
        for token, i in special_tokens(meta).items():
            by_id[i] = token
        model, tokens = "gpt2", [by_id[i] for i in range(meta["vocab_size"])]
        merges = [m if isinstance(m, str) else " ".join(m) for m in bpe_model["merges"]]
    special = set(special_tokens(meta).values())
    types = [3 if i in special else 1 for i in range(len(tokens))]  # 3: control, 1: normal
    pad = vocab_size - len(tokens)
    return model, tokens + [f"[PAD{i}]" for i in range(pad)], types + [5] * pad, merges  # 5: unused


def tensor_data(gguf, name: str, value: Tensor, kind: str) -> tuple[np.ndarray, Any]:
    """The array written for one tensor and its GGML type: 1-D stays f32; Q8_0 where rows split in 32s, else f16."""
    array = value.detach().to(torch.float32).cpu().numpy()
    if kind == "f32" or array.ndim == 1:
        return array, gguf.GGMLQuantizationType.F32
    if kind == "q8_0" and array.shape[-1] % 32 == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(array, q8), q8
    return array.astype(np.float16), gguf.GGMLQuantizationType.F16


def writer_class(gguf) -> Any:
    """gguf's writer, able to write an empty array (GGUF has them; gguf-py's writer refuses them): a character
    vocabulary written as a "gpt2" BPE has no merges, and llama.cpp needs its merges key all the same."""
    class Writer(gguf.GGUFWriter):
        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
            if vtype != gguf.GGUFValueType.ARRAY or len(val) > 0:
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            prefix = self._pack("I", vtype) if add_vtype else b""
            return prefix + self._pack("I", sub_type or gguf.GGUFValueType.STRING) + self._pack("Q", 0)

    return Writer


def is_file_name(out: str | Path) -> bool:
    """Whether ``out=`` names the .gguf file itself (out=model.gguf), not the folder to write it in."""
    return Path(out).suffix.lower() == ".gguf"


def write(state: dict[str, Tensor], config: GPTConfig, tokenizer: dict[str, Any], out: Path, kind: str,
          overwrite: bool) -> Path:
    """Write <out>/model-<kind>.gguf, or ``out`` itself when it names a .gguf file (refused if there, unless
    overwrite); return the file's path."""
    gguf = gguf_module()
    if kind not in TYPES:
        raise UserError(f"gguf_type must be one of {', '.join(TYPES)}, got {kind!r}")
    arch = architecture(config)
    tokenizer_model, tokens, types, merges = token_list(tokenizer, config.vocab_size)
    tensors = (gpt2_tensors if arch == "gpt2" else starcoder2_tensors)(state, config)
    path = out if is_file_name(out) else out / f"model-{kind}.gguf"
    folder = path.parent
    if path.exists() and not overwrite:
        raise UserError(f"{path} already exists", hint="pass overwrite=true to replace it, or pick another out=")

    def write_file(f: BinaryIO) -> None:
        writer = writer_class(gguf)(f.name, arch)
        writer.add_name(folder.name if path.name.startswith("model-") else path.stem)
        writer.add_block_count(config.n_layer)
        writer.add_context_length(config.block_size)
        writer.add_embedding_length(config.n_embd)
        writer.add_feed_forward_length(4 * config.n_embd)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(hf.LAYER_NORM_EPS)
        if arch == "starcoder2":
            writer.add_head_count_kv(config.n_kv_head)
            writer.add_rope_freq_base(hf_targets.ROPE_THETA)
            writer.add_rope_dimension_count(config.head_dim)
        writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind])
        writer.add_tokenizer_model(tokenizer_model)
        if tokenizer_model == "gpt2":
            writer.add_tokenizer_pre("gpt-2")  # GPT-2's split before the byte-level BPE, by llama.cpp's name for it
        else:  # characters as they are: no space added in front, no begin-of-text token
            writer.add_add_space_prefix(False)
            writer.add_add_bos_token(False)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores([0.0] * len(tokens))  # BPE has no scores; readers that derive merges ask for them
        if merges or tokenizer_model == "gpt2":  # llama.cpp refuses a gpt2 vocabulary without the key, even empty
            writer.add_key_value(gguf.Keys.Tokenizer.MERGES, merges, gguf.GGUFValueType.ARRAY,
                                 sub_type=gguf.GGUFValueType.STRING)
        if eot_id(tokenizer) is not None:
            writer.add_bos_token_id(eot_id(tokenizer))
            writer.add_eos_token_id(eot_id(tokenizer))
        for name, value in tensors.items():
            data, dtype = tensor_data(gguf, name, value, kind)
            writer.add_tensor(name, data, raw_dtype=dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create {folder} for out={out}: {err.strerror or err}",
                        hint="pick a folder you can write to") from None
    atomic_write_all([(path, write_file)], what="the GGUF export", hint="free disk space or pick another out=")
    return path
