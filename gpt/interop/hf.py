"""The Hugging Face GPT-2 layout, both ways: tensor names and orientation, config.json, tokenizer files.

An export in this layout opens with ``transformers.GPT2LMHeadModel.from_pretrained`` (and everything built on
it); a folder in this layout (OpenAI's GPT-2, a fine-tune, one of our exports) loads back here. What GPT-2
cannot represent is refused by name, in both directions, instead of loading into wrong logits.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write_all
from gpt.model import design as designs
from gpt.model import renamed
from gpt.model.config import GPTConfig
from gpt.model.state import MAX_BLOCK_SIZE
from gpt.tokenizers.files import attach, eot_id, reference, tokenizer_files  # noqa: F401  (tokenizer_files: export's)
from gpt.tokenizers.tokenizer import GPT2_ENCODING
from gpt.validate import Record, dataclass_values, shown
from gpt.validate import read_json as read_json_file

# OpenAI's GPT-2 stores these as Conv1D weights, (in, out): the transpose of nn.Linear's (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which gpt.model uses (and GPT-2 too)
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for GPT-2's tanh-approximated GELU
GPT2_VOCAB = 50257
GPT2_TOKENIZER = {"kind": "gpt2", "vocab_size": GPT2_VOCAB, "encoding": GPT2_ENCODING}
META_KEY = "gpt_attention"  # config.json key holding this project's own description (ignored by transformers)
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# Every file an export may write: what marks a folder as holding one, and what overwrite=true replaces.
EXPORT_FILES = ("config.json", WEIGHTS, INDEX, "generation_config.json", "vocab.json", "merges.txt",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modeling_gpt_attention.py")
DESIGN_FILES = "design_*.py"  # a remote-code export's design parts (gpt.interop.targets)


def safetensors_torch():
    """safetensors.torch, or a UserError saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise UserError("reading or writing .safetensors needs the safetensors package",
                        hint="pip install safetensors") from None
    return safetensors.torch


def load_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of one .safetensors file; a truncated, empty or foreign file is a one-line UserError."""
    st = safetensors_torch()
    try:
        return st.load_file(str(path))
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError) for unreadable files
        raise UserError(f"{path} is not a readable .safetensors file ({str(err).splitlines()[0] if str(err) else ''})",
                        hint="it may be truncated or not a weights file: copy or export it again") from None


# --- export: this project's model -> GPT-2's layout -------------------------------------------------------------

def check_representable(config: GPTConfig) -> None:
    """Refuse, naming the setting, a model GPT-2's architecture cannot hold (format=native can): fewer key/value
    heads, a window, another MLP activation, RMSNorm, an untied head, or an attention design whose Design.exports
    leaves out "hf"."""
    core = {
        f"model.n_kv_head={config.n_kv_head}": (config.n_kv_head != config.n_head,
                                                "grouped-query attention (GPT-2 has one key/value head per head)"),
        f"model.window={config.window}": (config.window is not None,
                                          "a sliding attention window (GPT-2 attends to every earlier token)"),
        f"model.activation={config.activation}": (config.activation != "gelu_tanh", f"a {config.activation} MLP "
                                                  "(the exported GPT-2 config has the tanh GELU, gelu_new)"),
        f"model.norm={config.norm}": (config.norm != "layernorm",
                                      "RMSNorm in the blocks (GPT-2 normalises with LayerNorm)"),
        "model.tie_head=false": (not config.tie_head,
                                 "an output head of its own (GPT-2's is the token embedding)"),
        "model.mlp=false": (not getattr(config, "mlp", True), "attention-only blocks (GPT-2's have an MLP)"),
    }
    refused = [(setting, what) for setting, (on, what) in core.items() if on]
    refused += [(d.setting(config), d.about) for d in designs.active(config) if "hf" not in d.exports]
    for setting, what in refused:
        raise UserError(f"{setting} cannot be exported in the Hugging Face GPT-2 layout: it means {what}",
                        hint="pass format=native for this project's own layout")


def to_hf_state(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPT2LMHeadModel's state dict: Conv1D weights transposed, the tied head dropped, bias=false as zero biases."""
    out = {}
    for name, value in state.items():
        if name == "lm_head.weight":
            continue  # tied to transformer.wte.weight, as transformers saves it
        value = value.detach().cpu()
        out[name] = (value.t() if name.endswith(CONV1D_SUFFIXES) else value).contiguous()
    if not config.bias:  # every LayerNorm and Linear except the embeddings gets GPT-2's bias, zero: the same function
        for name, value in state.items():
            if name.endswith(".weight") and name not in ("transformer.wte.weight", "transformer.wpe.weight",
                                                         "lm_head.weight"):
                out[name.removesuffix("weight") + "bias"] = torch.zeros(value.shape[0], dtype=value.dtype)
    return out


def hf_config(config: GPTConfig, tokenizer: dict[str, Any], dtype: torch.dtype, format_tag: str) -> dict[str, Any]:
    """config.json: a complete GPT2Config, plus this project's own description under META_KEY (read back here)."""
    eot = eot_id(tokenizer)
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "initializer_range": 0.02, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "use_cache": True, "bos_token_id": eot, "eos_token_id": eot, "dtype": str(dtype).removeprefix("torch."),
        META_KEY: {"format": format_tag, "model_config": config.to_dict(), "tokenizer": reference(tokenizer)},
    }


def generation_config(config: GPTConfig, tokenizer: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: end-of-text, and the padded ids (vocab_size > the tokenizer's) never generated."""
    eot = eot_id(tokenizer)
    gen: dict[str, Any] = {"bos_token_id": eot, "eos_token_id": eot}
    if config.vocab_size > tokenizer["vocab_size"]:
        gen["suppress_tokens"] = list(range(tokenizer["vocab_size"], config.vocab_size))
    return gen


# --- import: a GPT-2 folder -> this project's model ---------------------------------------------------------------

JSON_HINT = "it should be the JSON file transformers writes (or an export's): copy or export it again"
MAX_LAYERS, MAX_WIDTH, MAX_VOCAB = 4096, 1 << 17, 1 << 32  # a config.json beyond these is refused before any build


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a Hugging Face folder (config.json, the index map), read with gpt.validate's limits."""
    return Record(read_json_file(path, JSON_HINT), str(path), JSON_HINT).value


def is_folder(path: str | Path) -> bool:
    """A folder in the Hugging Face GPT-2 layout: config.json with model_type gpt2, and weights."""
    path = Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    if not ((path / WEIGHTS).is_file() or (path / INDEX).is_file()):
        return False
    try:
        return read_json(path / "config.json").get("model_type") == "gpt2"
    except UserError:
        return False


def check_importable(hf: dict[str, Any], source: Path) -> None:
    """Refuse a GPT-2 config.json whose architecture differs from this model's, naming the field."""
    own = hf.get(META_KEY, {})
    if not isinstance(own, dict) or any(not isinstance(own.get(k, {}), dict) for k in ("model_config", "tokenizer")):
        raise UserError(f"{source / 'config.json'}: {META_KEY} must be an object whose model_config and tokenizer "
                        "are objects", hint="the file was edited or damaged: export the model again")
    n_embd = sizes_of(hf, source)["n_embd"]
    refused = {
        "model_type": (hf.get("model_type", "gpt2") != "gpt2", "only GPT-2 (model_type gpt2) imports"),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", True) is not True,
                                "an untied output head; this model ties lm_head to wte"),
        "activation_function": (hf.get("activation_function", "gelu_new") not in TANH_GELU,
                                "this model's MLP uses the tanh GELU (gelu_new)"),
        "layer_norm_epsilon": (hf.get("layer_norm_epsilon", LAYER_NORM_EPS) != LAYER_NORM_EPS,
                               f"this model's LayerNorms use epsilon {LAYER_NORM_EPS}"),
        "scale_attn_by_inverse_layer_idx": (bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
                                            "this model does not scale attention by 1 / (layer + 1)"),
        "scale_attn_weights": (hf.get("scale_attn_weights", True) is not True,
                               "this model scales attention scores by 1 / sqrt(head_dim)"),
        "n_inner": (hf.get("n_inner") not in (None, 4 * n_embd), f"this model's MLP is 4 x n_embd = {4 * n_embd} wide"),
        "add_cross_attention": (bool(hf.get("add_cross_attention", False)), "this model has no cross-attention"),
    }
    for field, (bad, why) in refused.items():
        if bad:
            raise UserError(f"{source / 'config.json'}: {field}={json.dumps(hf.get(field))} cannot be loaded: {why}",
                            hint="only checkpoints with GPT-2's exact architecture import into this model")


def sizes_of(hf: dict[str, Any], source: Path) -> dict[str, int]:
    """GPT-2's sizes from a config.json (GPT-2 small's where absent), each an integer within this project's
    limits: a config.json naming a billion layers is refused here, before a model is built."""
    record = Record(hf, str(source / "config.json"), "the file was edited or damaged: copy or export it again")
    return dict(n_layer=record.int("n_layer", 12, 1, MAX_LAYERS), n_head=record.int("n_head", 12, 1, MAX_WIDTH),
                n_embd=record.int("n_embd", 768, 1, MAX_WIDTH),
                block_size=record.int("n_positions", 1024, 1, MAX_BLOCK_SIZE),
                vocab_size=record.int("vocab_size", GPT2_VOCAB, 1, MAX_VOCAB))


def weight_map(folder: Path) -> dict[str, str]:
    """The index map of a sharded folder: tensor name -> shard file, each shard a plain file name in ``folder``."""
    index = Record(read_json(folder / INDEX), str(folder / INDEX), "it should be the index transformers writes")
    names = index.record("weight_map")
    if not names.value:
        raise index.error("weight_map is empty")
    for name, shard in names.value.items():
        if not isinstance(shard, str) or not shard or shard != Path(shard).name or shard in (".", ".."):
            raise index.error(f"weight_map[{name!r}] must name a shard file in the folder, got {shown(shard)}")
    return names.value


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """All tensors of a folder: model.safetensors, or every shard that model.safetensors.index.json names."""
    if (folder / WEIGHTS).is_file():
        return load_safetensors(folder / WEIGHTS)
    names = weight_map(folder)
    tensors: dict[str, Tensor] = {}
    for shard in sorted(set(names.values())):
        if not (folder / shard).is_file():
            raise UserError(f"shard {shard} named by {folder / INDEX} is missing",
                            hint="copy every shard of the checkpoint")
        tensors.update(load_safetensors(folder / shard))
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise UserError(f"{folder / INDEX} names {missing[0]} but no shard holds it")
    return tensors


def from_hf_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A GPT-2 state dict (prefixed or not) in this project's names and layout: Conv1D transposed, head tied.

    An lm_head.weight that differs from wte (an untied head the config did not declare) is refused.
    """
    state = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers, not weights
            continue
        if name == "lm_head.weight":
            continue  # tied to wte: checked below
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{name}"] = value.contiguous()
    head = tensors.get("lm_head.weight")
    wte = state.get("transformer.wte.weight")
    if head is not None and wte is not None and not torch.equal(head, wte):
        raise UserError("the checkpoint's lm_head.weight differs from its wte.weight (an untied output head): "
                        "tie_word_embeddings cannot be false here", hint="this model ties its output head to wte")
    if wte is not None:
        state["lm_head.weight"] = wte
    return state


def config_from_hf(hf: dict[str, Any], state: dict[str, Tensor], attention: str,
                   source: Path = Path(".")) -> tuple[GPTConfig, dict[str, Tensor]]:
    """GPTConfig from a GPT-2 config.json; with our own description (META_KEY) the export's exact config comes back.

    bias=false comes back when every bias is still zero (transformers may have trained them since).
    """
    sizes = sizes_of(hf, source)
    own = hf.get(META_KEY, {}).get("model_config", {})
    try:
        own = renamed.upgrade(own)  # an export from before the designs were named one way
    except ConfigError as err:
        raise UserError(f"{source / 'config.json'}: {err}", hint="the file was edited or damaged") from None
    own = dataclass_values(GPTConfig, own, f"{source / 'config.json'} ({META_KEY})",
                           "the file was edited or damaged: export the model again", prefix="model_config.")
    extras = {k: own[k] for k in ("attention", "attention_backend") if k in own}
    try:
        config = GPTConfig(**{**sizes, "bias": True, "dropout": own.get("dropout", 0.0), "attention": attention,
                              **extras})
    except ConfigError as err:
        raise UserError(f"{source / 'config.json'}: {err}", hint="the file was edited or damaged") from None
    biases = [k for k in state if k.endswith(".bias")]
    if own.get("bias") is False and all(not state[k].any() for k in biases):
        state = {k: v for k, v in state.items() if k not in biases}
        config = GPTConfig(**{**config.to_dict(), "bias": False})
    return config, state


def load_state(hf: dict[str, Any], tensors: dict[str, Tensor], source: Path,
               attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor]]:
    """GPTConfig and state dict from a GPT-2 config.json's values and its tensors, after every check of the
    config (the weights' shapes: gpt.model.state.check_model_state, the one shape check of every model source)."""
    check_importable(hf, source)
    return config_from_hf(hf, from_hf_state(tensors), attention, source)


def load_folder(path: str | Path, attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """GPTConfig, state dict and tokenizer description of a folder in the Hugging Face GPT-2 layout."""
    folder = Path(path)
    hf = read_json(folder / "config.json")
    check_importable(hf, folder)  # before reading gigabytes of weights
    config, state = load_state(hf, read_tensors(folder), folder, attention)
    tokenizer = attach(hf.get(META_KEY, {}).get("tokenizer"), folder)  # a trained BPE's text is in tokenizer.json
    if tokenizer is None:  # a plain GPT-2 checkpoint: GPT-2's tokenizer, if its vocabulary can hold it
        if config.vocab_size < GPT2_VOCAB:
            raise UserError(f"{folder} has vocab_size {config.vocab_size} < {GPT2_VOCAB} and no {META_KEY} tokenizer "
                            "description: its tokenizer is unknown", hint="export it with scripts/export.py")
        tokenizer = GPT2_TOKENIZER
    return config, state, tokenizer


# --- writing an export folder, publishing it ----------------------------------------------------------------------

def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse an out= that is a file, or a folder already holding an export unless overwrite=true."""
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out} is a file, not a folder", hint="give out= a folder path (it is created)")
    held = [name for name in EXPORT_FILES if (out / name).exists()] if out.is_dir() else []
    if held and not overwrite:
        raise UserError(f"out={out} already holds an export ({held[0]})",
                        hint="pass overwrite=true to replace it, or pick another out=")


def _stale_files(out: Path, written: set[str]) -> list[Path]:
    """The previous export's files this one does not rewrite: listed names, and the shards its index named."""
    stale = [out / name for name in EXPORT_FILES if name not in written and (out / name).is_file()]
    stale += [path for path in sorted(out.glob(DESIGN_FILES)) if path.name not in written and path.is_file()]
    if (out / INDEX).is_file() and INDEX not in written:
        try:
            shards = set(weight_map(out).values())
        except UserError:  # a damaged index: its shards are left where they are
            shards = set()
        stale += [out / s for s in sorted(shards) if s not in written and (out / s).is_file()]
    return stale


def write_folder(out: Path, tensors: dict[str, Tensor], metadata: dict[str, str], files: dict[str, str]) -> None:
    """Write model.safetensors and the text files as one replacement (gpt.files.atomic_write_all): all are
    written beside their targets first, then renamed with config.json last, so that a folder with a config.json is
    complete and an interrupted or failed export leaves the previous one as it was. The previous export's files
    that this one does not rewrite are removed afterwards."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create out={out}: {err.strerror or err}", hint="pick a folder you can write to") \
            from None
    st = safetensors_torch()

    def weights(f: BinaryIO) -> None:
        """safetensors writes to a path: the temporary file atomic_write_all opened (its fsync covers the write)."""
        try:
            st.save_file(tensors, f.name, metadata=metadata)
        except Exception as err:  # safetensors' own error type for a full disk: an OSError for the writer
            raise OSError(str(err).removeprefix("Error while serializing: ")) from None

    writes = [(out / WEIGHTS, weights)]
    writes += [(out / name, lambda f, text=files[name]: f.write(text.encode("utf-8")))
               for name in sorted(files, key=lambda name: name == "config.json")]
    stale = _stale_files(out, {WEIGHTS, *files})
    try:
        atomic_write_all(writes, what="the export", hint="the previous export is unchanged; free disk space or pick "
                                                          "another out=")
    except BaseException:
        if created:  # the folder this export made, empty again
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    for path in stale:
        path.unlink(missing_ok=True)


def push_to_hub(folder: Path, repo_id: str, private: bool = False, endpoint: str | None = None) -> str:
    """Upload an export folder to the Hugging Face Hub (created if needed); returns the repository's URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise UserError("push_to_hub needs the huggingface_hub package", hint="pip install -e '.[hf]'") from None
    try:
        api = HfApi(endpoint=endpoint)
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Export from gpt-attention")
    except Exception as err:  # network, authentication or hub errors of any kind
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise UserError(f"could not push {folder} to the Hugging Face Hub as {repo_id} ({type(err).__name__}"
                        + (f": {detail})" if detail else ")"),
                        hint=f"the export in {folder} is complete; check the network and `hf auth login` "
                        "(or HF_TOKEN), then push again") from None
    return str(url)
