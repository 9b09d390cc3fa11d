"""Untrusted checkpoint files never run code, and broken ones end in a clear message."""

import os

import pytest
import torch

from conftest import dotted_global_pickle, run_inline, run_script, save_char_model
from gpt import files
from gpt.errors import UserError
from gpt.weights import checkpoint


class Payload:
    """Unpickling this calls os.mkdir(marker): what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def valid_checkpoint(path):
    save_char_model(path, "abc\n", n_layer=1, n_head=2, n_embd=8, block_size=8)


def pickled_code_checkpoint(folder):
    """A ckpt.pt whose unpickling would create folder/pwned; returns that marker path."""
    marker = folder / "pwned"
    torch.save({"model": {}, "model_config": {}, "evil": Payload(str(marker))}, folder / "ckpt.pt")
    return marker


def test_a_checkpoint_with_pickled_code_is_refused_without_running_it(tmp_path):
    marker = pickled_code_checkpoint(tmp_path)
    with pytest.raises(UserError, match="refusing to load it"):
        checkpoint.load(tmp_path / "ckpt.pt")
    assert not marker.exists()


@pytest.mark.slow
def test_generate_refuses_a_checkpoint_with_pickled_code_in_one_line(tmp_path):
    marker = pickled_code_checkpoint(tmp_path)
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


@pytest.mark.slow
def test_generate_on_an_empty_run_directory(tmp_path):
    result = run_inline("generate", f"ckpt={tmp_path}", "device=cpu")
    assert result.returncode == 2 and "no checkpoint in" in result.stderr and "Traceback" not in result.stderr


def archive_with_pickle(path, pickled: bytes) -> None:
    """A torch archive (zip) whose data.pkl is ``pickled``: what a crafted ckpt.pt or meta.pt can hold."""
    import io
    import zipfile

    buffer = io.BytesIO()
    torch.save({}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(path, "w") as out:
        for item in src.infolist():
            out.writestr(item, pickled if item.filename.endswith("data.pkl") else src.read(item))


@pytest.mark.parametrize("name", ["ckpt.pt", "meta.pt"])
def test_a_dotted_global_in_an_archive_is_refused_without_running_it(tmp_path, name):
    marker = tmp_path / "pwned"
    path = tmp_path / name
    archive_with_pickle(path, dotted_global_pickle("torch.serialization", "os.mkdir", str(marker)))
    with pytest.raises(UserError, match="refusing to load it"):
        files.load_archive(path)
    assert not marker.exists()
