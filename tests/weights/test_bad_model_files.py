"""Damaged or foreign model files (exports, init_path weights, checkpoints) are refused with one line naming the file,
before any model is built from them."""

import json
import os
import shutil

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.interop import formats
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import load as pretrained

CONFIG = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=10)
TOKENIZER = CharTokenizer(list("abcdefghij")).to_meta()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A Hugging Face layout export and a native one of a tiny model."""
    root = tmp_path_factory.mktemp("exports")
    state = GPT(CONFIG).state_dict()
    return {fmt: formats.export(state, CONFIG, TOKENIZER, root / fmt, format=fmt) for fmt in ("hf", "native")}


def edit_config(folder, change) -> None:
    values = json.loads((folder / "config.json").read_text())
    change(values)
    (folder / "config.json").write_text(json.dumps(values))


def truncate(path) -> None:
    os.truncate(path, path.stat().st_size // 2)


EXPORT_DAMAGES = {
    "truncated weights": (lambda d: truncate(d / "model.safetensors"), "model.safetensors is not a readable"),
    "foreign weights": (lambda d: (d / "model.safetensors").write_bytes(os.urandom(999)),
                        "model.safetensors is not a readable .safetensors file"),
    "config.json invalid": (lambda d: (d / "config.json").write_text("{bad"), "config.json: not valid JSON"),
    "config.json missing": (lambda d: (d / "config.json").unlink(), "holds model.safetensors but no config.json"),
    "tokenizer incomplete": (lambda d: edit_config(d, lambda c: (c.get("gpt_attention", c))["tokenizer"].pop("chars")),
                             "chars must be a non-empty list"),
    "vocabulary cut": (lambda d: edit_config(d, lambda c: (c.get("gpt_attention", c))["tokenizer"].update(
        chars=list("abc"))), "vocab_size 10 differs from its 3 characters"),
}


@pytest.mark.parametrize("fmt", ["hf", "native"])
@pytest.mark.parametrize("damage", EXPORT_DAMAGES)
def test_a_damaged_export_is_refused_naming_the_file(exports, tmp_path, fmt, damage):
    folder = shutil.copytree(exports[fmt], tmp_path / "copy")
    spoil, message = EXPORT_DAMAGES[damage]
    spoil(folder)
    with pytest.raises(UserError, match=message) as err:
        pretrained.load_model(folder)
    assert str(folder) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.pop("model_config"), "model_config is missing"),
    (lambda c: c.update(tokenizer=[1]), "tokenizer must be a JSON object, got list"),
    (lambda c: c["model_config"].update(n_layer="two"), "model_config.n_layer must be an integer, got 'two'"),
    (lambda c: c["model_config"].update(n_layer=1.7), "model_config.n_layer must be an integer, got 1.7"),
    (lambda c: c["model_config"].update(n_layer=10**9), "n_layer is 1,000,000,000, the weights hold 1 layer"),
    (lambda c: c["model_config"].update(vocab_size=10**15), r"says \(1000000000000000, 16\) \(vocab_size"),
])
def test_a_native_export_with_wrong_entries_is_refused(exports, tmp_path, change, message):
    folder = shutil.copytree(exports["native"], tmp_path / "copy")
    edit_config(folder, change)
    with pytest.raises(UserError, match=message) as err:
        pretrained.load_weights(folder)
    assert str(folder) in str(err.value)


def test_a_hugging_face_export_with_a_wrong_description_is_refused(exports, tmp_path):
    folder = shutil.copytree(exports["hf"], tmp_path / "copy")
    edit_config(folder, lambda c: c.update(gpt_attention=[1]))
    with pytest.raises(UserError, match="gpt_attention must be an object"):
        pretrained.load_weights(folder)


@pytest.mark.parametrize("make", [lambda p: p.write_bytes(b"not weights"), truncate])
def test_gpt2_init_path_garbage_is_refused(exports, tmp_path, make):
    weights = tmp_path / "model.safetensors"
    shutil.copy(exports["hf"] / "model.safetensors", weights)
    make(weights)
    with pytest.raises(UserError, match=f"{weights} is not a readable .safetensors file"):
        pretrained.load_weights("gpt2", str(weights))


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("tokenizer"), "has no tokenizer entry"),
    (lambda p: p.update(model=[1]), "the model entry is not a dict of tensors"),
    (lambda p: p.update(tokenizer={"kind": "char"}), "chars must be a non-empty list"),
    (lambda p: p.update(tokenizer=CharTokenizer(list("abcdefghijkl")).to_meta()), "12 tokens, the model only 10"),
    (lambda p: p["model_config"].update(n_head=0), "n_head"),
])
def test_a_checkpoint_with_wrong_entries_is_refused_naming_it(tmp_path, change, message):
    payload = {"model": GPT(CONFIG).state_dict(), "model_config": CONFIG.to_dict(), "tokenizer": TOKENIZER}
    change(payload)
    torch.save(payload, tmp_path / "ckpt.pt")
    with pytest.raises(UserError, match=message) as err:
        pretrained.load_weights(tmp_path)
    assert str(tmp_path) in str(err.value)
