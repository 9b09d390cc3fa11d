"""Untrusted checkpoint files never run code, and broken ones end in a clear message."""

import os

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.tokenizer import CharTokenizer
from gpt import checkpoint

from conftest import run_script


class Payload:
    """Unpickling this calls os.mkdir(marker): what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def valid_checkpoint(path):
    config = GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=4)
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": CharTokenizer(list("abc\n")).to_meta()}, path)


def test_a_checkpoint_with_pickled_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": {}, "model_config": {}, "evil": Payload(str(marker))}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError, match="refusing to load it"):
        checkpoint.load(tmp_path / "ckpt.pt")
    result = run_script("generate", f"ckpt={tmp_path}", "device=cpu")
    assert result.returncode == 2 and "refusing to load it" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "random", "empty"])
def test_damaged_checkpoints_are_user_errors(tmp_path, damage):
    path = tmp_path / "ckpt.pt"
    valid_checkpoint(path)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "random": os.urandom(4096), "empty": b""}[damage])
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(path)


def test_generate_on_an_empty_run_directory(tmp_path):
    result = run_script("generate", f"ckpt={tmp_path}", "device=cpu")
    assert result.returncode == 2 and "no checkpoint in" in result.stderr and "Traceback" not in result.stderr
