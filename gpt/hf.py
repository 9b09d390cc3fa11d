"""The Hugging Face GPT-2 layout, both ways: tensor names and orientation, config.json, tokenizer files.

An export in this layout opens with ``transformers.GPT2LMHeadModel.from_pretrained`` (and everything built on
it); a folder in this layout (OpenAI's GPT-2, a fine-tune, one of our exports) loads back here. What GPT-2
cannot represent is refused by name, in both directions, instead of loading into wrong logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt.config import GPTConfig
from gpt.designs import registry as designs
from gpt.errors import UserError
from gpt.tokenizer import GPT2_ENCODING

# OpenAI's GPT-2 stores these as Conv1D weights, (in, out): the transpose of nn.Linear's (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which gpt.model uses (and GPT-2 too)
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for GPT-2's tanh-approximated GELU
GPT2_VOCAB = 50257
GPT2_TOKENIZER = {"kind": "gpt2", "vocab_size": GPT2_VOCAB, "encoding": GPT2_ENCODING}
EOT = "<|endoftext|>"
META_KEY = "gpt_attention"  # config.json key holding this project's own description (ignored by transformers)
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# Every file an export may write: what marks a folder as holding one, and what overwrite=true replaces.
EXPORT_FILES = ("config.json", WEIGHTS, INDEX, "generation_config.json", "vocab.json", "merges.txt",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


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
    heads, a window, another MLP activation, an untied head, or an attention design whose Design.exports leaves out
    "hf"."""
    core = {
        f"model.n_kv_head={config.n_kv_head}": (config.n_kv_head != config.n_head,
                                                "grouped-query attention (GPT-2 has one key/value head per head)"),
        f"model.window={config.window}": (config.window is not None,
                                          "a sliding attention window (GPT-2 attends to every earlier token)"),
        f"model.activation={config.activation}": (config.activation != "gelu_tanh", f"a {config.activation} MLP "
                                                  "(the exported GPT-2 config has the tanh GELU, gelu_new)"),
        "model.tie_head=false": (not config.tie_head,
                                 "an output head of its own (GPT-2's is the token embedding)"),
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
    eot = GPT2_VOCAB - 1 if tokenizer.get("kind") == "gpt2" else None
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "initializer_range": 0.02, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "use_cache": True, "bos_token_id": eot, "eos_token_id": eot, "dtype": str(dtype).removeprefix("torch."),
        META_KEY: {"format": format_tag, "model_config": config.to_dict(), "tokenizer": tokenizer},
    }


def generation_config(config: GPTConfig, tokenizer: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: end-of-text, and the padded ids (vocab_size > the tokenizer's) never generated."""
    eot = GPT2_VOCAB - 1 if tokenizer.get("kind") == "gpt2" else None
    gen: dict[str, Any] = {"bos_token_id": eot, "eos_token_id": eot}
    if config.vocab_size > tokenizer["vocab_size"]:
        gen["suppress_tokens"] = list(range(tokenizer["vocab_size"], config.vocab_size))
    return gen


# --- tokenizer files ----------------------------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (vocab.json and merges.txt spell tokens with it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def _merge_pair(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts BPE joins to make ``token``: run BPE on its bytes with the merges ranked before it."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        found = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if ranks.get(a + b, rank) < rank]
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def gpt2_bpe_files(block_size: int) -> dict[str, str]:
    """vocab.json, merges.txt and the tokenizer configs of GPT-2's BPE, derived offline from tiktoken's r50k_base."""
    from gpt.tokenizer import load_gpt2_encoding

    encoding = load_gpt2_encoding()
    ranks: dict[bytes, int] = encoding._mergeable_ranks  # token bytes -> id, in merge order: GPT-2's encoder.json
    table = bytes_to_unicode()
    spell = lambda token: "".join(table[b] for b in token)  # noqa: E731
    vocab = {spell(token): rank for token, rank in ranks.items()} | {EOT: encoding.eot_token}
    merges = [" ".join(map(spell, _merge_pair(token, rank, ranks)))
              for token, rank in sorted(ranks.items(), key=lambda item: item[1]) if len(token) > 1]
    special = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    tokenizer_config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": block_size, "add_prefix_space": False,
                        **special, "added_tokens_decoder": {str(encoding.eot_token): {
                            "content": EOT, "lstrip": False, "normalized": True, "rstrip": False,
                            "single_word": False, "special": True}}}
    return {"vocab.json": json.dumps(vocab, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
            "tokenizer_config.json": json.dumps(tokenizer_config, indent=1),
            "special_tokens_map.json": json.dumps(special, indent=1)}


def char_tokenizer_files(chars: list[str], block_size: int) -> dict[str, str]:
    """tokenizer.json for a character vocabulary: split into characters, one id each, joined back on decoding."""
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": False},
        "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": {ch: i for i, ch in enumerate(chars)}, "unk_token": "<unk>"},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size}
    return {"tokenizer.json": json.dumps(tokenizer, ensure_ascii=False), "tokenizer_config.json": json.dumps(config)}


def tokenizer_files(tokenizer: dict[str, Any], block_size: int) -> dict[str, str]:
    """The files that make ``AutoTokenizer.from_pretrained(folder)`` rebuild this model's tokenizer."""
    if tokenizer.get("kind") == "gpt2":
        return gpt2_bpe_files(block_size)
    if tokenizer.get("kind") == "char":
        return char_tokenizer_files(tokenizer["chars"], block_size)
    return {}


# --- import: a GPT-2 folder -> this project's model ---------------------------------------------------------------

def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is unreadable ({err})",
                        hint="it should be the JSON file transformers writes") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} does not hold a JSON object")
    return value


def is_folder(path: str | Path) -> bool:
    """A folder in the Hugging Face GPT-2 layout: config.json with model_type gpt2, and weights."""
    path = Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    if not ((path / WEIGHTS).is_file() or (path / INDEX).is_file()):
        return False
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type") == "gpt2"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def check_importable(hf: dict[str, Any], source: Path) -> None:
    """Refuse a GPT-2 config.json whose architecture differs from this model's, naming the field."""
    own = hf.get(META_KEY, {})
    if not isinstance(own, dict) or any(not isinstance(own.get(k, {}), dict) for k in ("model_config", "tokenizer")):
        raise UserError(f"{source / 'config.json'}: {META_KEY} must be an object whose model_config and tokenizer "
                        "are objects", hint="the file was edited or damaged: export the model again")
    n_embd = hf.get("n_embd", 768)
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


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """All tensors of a folder: model.safetensors, or every shard that model.safetensors.index.json names."""
    if (folder / WEIGHTS).is_file():
        return load_safetensors(folder / WEIGHTS)
    weight_map = read_json(folder / INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{folder / INDEX} has no weight_map", hint="it should be the index transformers writes")
    tensors: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (folder / shard).is_file():
            raise UserError(f"shard {shard} named by {folder / INDEX} is missing",
                            hint="copy every shard of the checkpoint")
        tensors.update(load_safetensors(folder / shard))
    missing = sorted(set(weight_map) - set(tensors))
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


def config_from_hf(hf: dict[str, Any], state: dict[str, Tensor], attention: str) -> tuple[GPTConfig, dict[str, Tensor]]:
    """GPTConfig from a GPT-2 config.json; with our own description (META_KEY) the export's exact config comes back.

    bias=false comes back when every bias is still zero (transformers may have trained them since).
    """
    sizes = dict(n_layer=hf.get("n_layer", 12), n_head=hf.get("n_head", 12), n_embd=hf.get("n_embd", 768),
                 block_size=hf.get("n_positions", 1024), vocab_size=hf.get("vocab_size", GPT2_VOCAB))
    own = hf.get(META_KEY, {}).get("model_config", {})
    extras = {k: own[k] for k in ("attention", "attention_backend") if k in own}
    config = GPTConfig(**{**sizes, "bias": True, "dropout": own.get("dropout", 0.0), "attention": attention, **extras})
    biases = [k for k in state if k.endswith(".bias")]
    if own.get("bias") is False and all(not state[k].any() for k in biases):
        state = {k: v for k, v in state.items() if k not in biases}
        config = GPTConfig(**{**config.to_dict(), "bias": False})
    return config, state


def check_shapes(state: dict[str, Tensor], config: GPTConfig, source: Path) -> None:
    """Refuse missing, unexpected or misshapen tensors with a one-line error (not load_state_dict's traceback)."""
    from gpt.model import GPT

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise UserError(f"{source}: tensor {name} is missing", hint="the weights do not match config.json")
        if tuple(state[name].shape) != shape:
            raise UserError(f"{source}: {name} has shape {tuple(state[name].shape)}, config.json implies {shape}",
                            hint="the weights do not match config.json")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise UserError(f"{source}: unexpected tensor {unexpected[0]}", hint="the weights do not match config.json")


def load_state(hf: dict[str, Any], tensors: dict[str, Tensor], source: Path,
               attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor]]:
    """GPTConfig and state dict from a GPT-2 config.json's values and its tensors, after every check."""
    check_importable(hf, source)
    config, state = config_from_hf(hf, from_hf_state(tensors), attention)
    check_shapes(state, config, source)
    return config, state


def load_folder(path: str | Path, attention: str = "sdpa") -> tuple[GPTConfig, dict[str, Tensor], dict[str, Any]]:
    """GPTConfig, state dict and tokenizer description of a folder in the Hugging Face GPT-2 layout."""
    folder = Path(path)
    hf = read_json(folder / "config.json")
    check_importable(hf, folder)  # before reading gigabytes of weights
    config, state = load_state(hf, read_tensors(folder), folder, attention)
    tokenizer = hf.get(META_KEY, {}).get("tokenizer")
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
    if (out / INDEX).is_file() and INDEX not in written:
        try:
            shards = set(json.loads((out / INDEX).read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            shards = set()
        stale += [out / s for s in sorted(shards) if "/" not in s and s not in written and (out / s).is_file()]
    return stale


def write_folder(out: Path, tensors: dict[str, Tensor], metadata: dict[str, str], files: dict[str, str]) -> None:
    """Write model.safetensors and the text files, each atomically; config.json last, so that a folder with a
    config.json is complete. The previous export's files that this one does not rewrite are removed."""
    from gpt.checkpoint import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    st = safetensors_torch()
    # safetensors writes to a path: the temporary file atomic_write opened (its fsync covers what was written).
    atomic_write(out / WEIGHTS, lambda f: st.save_file(tensors, f.name, metadata=metadata), what="weights",
                 hint="nothing of the previous export was replaced; free disk space or pick another out=")
    stale = _stale_files(out, {WEIGHTS, *files})
    for path in stale:
        path.unlink()
    for name in sorted(files, key=lambda name: name == "config.json"):
        atomic_write(out / name, lambda f, text=files[name]: f.write(text.encode("utf-8")), what=name)


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
