"""benchmarks/vs_nanogpt.py: nanoGPT reads the very tokens this project trains on, and its config matches ours."""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from conftest import ROOT, write_corpus
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare

spec = importlib.util.spec_from_file_location("vs_nanogpt", ROOT / "benchmarks" / "vs_nanogpt.py")
vs_nanogpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vs_nanogpt)


def test_the_shards_become_nanogpts_files_token_for_token(tmp_path, monkeypatch, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    folder = prepare(DataConfig(name="text", source="path", path=str(corpus), root=str(tmp_path / "data"),
                                shard_tokens=5000), log=lambda message: None)
    data = TokenData(folder)
    assert len(data.meta["splits"]["train"]["shards"]) > 1  # several shards, joined in order
    nanogpt = tmp_path / "nanoGPT"
    nanogpt.mkdir()
    (nanogpt / "train.py").write_text("")
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["vs_nanogpt.py", "--nanogpt", str(nanogpt), "--data", str(folder),
                                     "--out", str(out), "--steps", "300"])
    vs_nanogpt.main()
    for split, stream in data.splits.items():
        written = np.fromfile(out / "data" / "text" / f"{split}.bin", dtype=np.uint16)
        assert np.array_equal(written, stream[0:len(stream)])
    meta = pickle.loads((out / "data" / "text" / "meta.pkl").read_bytes())
    chars = data.tokenizer.to_meta()["chars"]
    assert meta["vocab_size"] == len(chars) and meta["itos"][5] == chars[5] and meta["stoi"][chars[5]] == 5
    settings = {}
    exec((out / "config_vs.py").read_text(), settings)  # as nanoGPT's configurator reads it
    assert (settings["max_iters"], settings["eval_interval"], settings["lr_decay_iters"]) == (299, 299, 300)
    assert settings["dataset"] == str(out / "data" / "text") and not settings["compile"]
    assert "train.max_iters=300" in capsys.readouterr().out


def test_a_folder_without_nanogpt_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["vs_nanogpt.py", "--nanogpt", str(tmp_path)])
    with pytest.raises(vs_nanogpt.UserError, match="holds no train.py"):
        vs_nanogpt.main()
