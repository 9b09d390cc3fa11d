"""Damaged files, interrupted and concurrent preparations through the real scripts: exit code 2 (130 when
interrupted), one `error:` line naming the file, no traceback, every file already on disk byte for byte as it was."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_inline, run_script, save_char_model, write_corpus
from gpt.data.config import DataConfig
from gpt.data.prepare import prepare

pytestmark = pytest.mark.slow

TINY = ["model=tiny", "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "train.batch_size=2",
        "train.sample_tokens=0", "device=cpu"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(result: subprocess.CompletedProcess, *named: str, code: int = 2) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and all(name in error[0] for name in named), result.stderr


def cut_vocabulary(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer"]["chars"] = meta["tokenizer"]["chars"][:-1]
    (data / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("script, spoil, named", [
    ("train", lambda d: os.truncate(d / "train_000000.bin", 1001), "train_000000.bin holds 1001 bytes"),
    ("prepare", cut_vocabulary, "meta.json: the tokenizer's vocab_size"),
])
def test_damaged_prepared_data_is_refused_with_a_rebuild_hint(tmp_path, script, spoil, named):
    corpus = write_corpus(tmp_path / "corpus")
    data = prepare(DataConfig(name="text", source="path", path=str(corpus), root=str(tmp_path / "data")),
                   log=lambda *_: None)
    spoil(data)
    before = snapshot(tmp_path)
    args = ["data=text", f"data.path={corpus}", f"data.root={tmp_path / 'data'}"]
    run_as = run_script if script == "prepare" else run_inline  # one as a real process (train's: test_bad_inputs)
    result = run_as(script, *args, *(TINY + [f"out_dir={tmp_path / 'run'}"] if script == "train" else []))
    refused(result, str(data), named)
    assert "hint:" in result.stderr and "data.rebuild=true" in result.stderr
    assert all(snapshot(tmp_path).get(path) == digest for path, digest in before.items())


@pytest.mark.parametrize("case", ["export into a file", "init_path garbage", "model entry not a dict"])
def test_bad_model_files_are_refused(tmp_path, case):
    import torch

    save_char_model(tmp_path / "ckpt.pt", "abc\n", n_layer=1, n_head=1, n_embd=8, block_size=8)
    (tmp_path / "file").write_text("a file, not a folder")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 64)
    torch.save({**torch.load(tmp_path / "ckpt.pt"), "model": [1, 2]}, tmp_path / "bad.pt")
    before = snapshot(tmp_path)
    if case == "export into a file":
        result, named = run_script("export", f"ckpt={tmp_path / 'ckpt.pt'}", f"out={tmp_path / 'file'}"), "is a file"
    elif case == "init_path garbage":
        corpus = write_corpus(tmp_path / "corpus")
        before = snapshot(tmp_path)
        result = run_inline("train", *TINY, "data=text", f"data.path={corpus}", f"data.root={tmp_path / 'data'}",
                            "init_from=gpt2", f"init_path={tmp_path / 'garbage.safetensors'}",
                            f"out_dir={tmp_path / 'run'}")
        named = "garbage.safetensors is not a readable .safetensors file"
    else:
        result = run_inline("export", f"ckpt={tmp_path / 'bad.pt'}", f"out={tmp_path / 'out'}")  # a process: above
        named = "the model entry is not a dict"
    refused(result, named)
    assert all(snapshot(tmp_path).get(path) == digest for path, digest in before.items())


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """About 40 MB of text in 1000 files: several seconds of preparation, time enough to interrupt it."""
    folder = tmp_path_factory.mktemp("big") / "corpus"
    folder.mkdir()
    for i in range(1000):
        (folder / f"doc{i:04d}.txt").write_text("".join(f"line {j} of document {i}: some text\n" for j in range(1000)))
    return folder


def start_prepare(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "prepare.py"), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_an_interrupted_preparation_says_what_it_kept_and_a_rerun_continues(tmp_path, big_corpus, sig, name):
    root = tmp_path / "data"
    old = prepare(DataConfig(name="text", source="path", path=str(write_corpus(tmp_path / "small")), root=str(root)),
                  log=lambda *_: None)
    before = snapshot(old)
    args = ["data=text", f"data.path={big_corpus}", f"data.root={root}", "data.shard_tokens=200000"]
    proc = start_prepare(*args, "data.rebuild=true")
    deadline = time.monotonic() + 120
    while not (root / ".text.preparing" / "progress.json").exists():  # the first shards are checkpointed
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    refused(result, f"preparation stopped ({name})", "completed so far are kept in", f"{old} is as it was", code=130)
    assert snapshot(old) == before
    if sig == signal.SIGINT:  # the same command again continues from the kept shards
        logs = []
        prepare(DataConfig(name="text", source="path", path=str(big_corpus), root=str(root), shard_tokens=200000,
                           rebuild=True), log=logs.append)
        assert any("continuing an interrupted preparation" in line for line in logs)


def test_two_preparations_at_once_the_second_waits_and_reuses(tmp_path, big_corpus):
    args = ["data=text", f"data.path={big_corpus}", f"data.root={tmp_path}", "data.shard_tokens=200000"]
    procs = [start_prepare(*args) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    lines = "".join(out for out, _ in outputs).splitlines()
    assert [line.split()[0] for line in lines if line.startswith(("preparing", "ready:"))].count("preparing") == 1
    assert len([line for line in lines if line.startswith("ready:")]) == 2
    assert any(line.startswith("waiting for process") for line in lines)  # the second started while the first prepared
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]
