"""Prepared data is checked when opened, a changed setting makes it stale, one preparation runs at a time, and an
interrupted preparation says what it kept and leaves the old data as it was."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from gpt.data import prepare as prep
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.lock import preparation_lock
from gpt.data.prepare import prepare
from gpt.errors import UserError

QUIET = dict(log=lambda *_: None)


def corpus(folder, n: int = 40, body: str = "line {j} of file {i}: caf\u00e9\n"):
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"doc{i:03d}.txt").write_text("".join(body.format(i=i, j=j) for j in range(5 + i % 7)))
    return folder


@pytest.fixture
def prepared(tmp_path):
    """A small prepared char data set (two train shards) and its config."""
    cfg = DataConfig(name="d", source="path", path=str(corpus(tmp_path / "c")), root=str(tmp_path / "data"),
                     shard_tokens=4000)
    return prepare(cfg, **QUIET), cfg


def edit_meta(out, change) -> None:
    meta = json.loads((out / "meta.json").read_text())
    change(meta)
    (out / "meta.json").write_text(json.dumps(meta))


def cut_vocabulary(meta, fix_size=True, forget_max=False):
    meta["tokenizer"]["chars"] = meta["tokenizer"]["chars"][:-3]
    if fix_size:
        meta["tokenizer"]["vocab_size"] -= 3
    if forget_max:
        for split in meta["splits"].values():
            split.pop("max_token")


DAMAGES = {
    "not an object": (lambda out: (out / "meta.json").write_text("[1, 2]"), "meta.json holds a JSON list"),
    "not JSON": (lambda out: (out / "meta.json").write_text("{\"version\": 2,"), "meta.json: not valid JSON"),
    "not UTF-8": (lambda out: (out / "meta.json").write_bytes(b"{\"version\": 2, \"x\": \"\xff\"}"),
                  "meta.json: not UTF-8 text"),
    "an integer of 5000 digits": (lambda out: (out / "meta.json").write_text(
        (out / "meta.json").read_text().replace('"version": 2', '"version": ' + "2" * 5000, 1)),
        "meta.json: an integer of 5000 digits"),
    "nested 100 deep": (lambda out: edit_meta(out, lambda m: m["source"].update(settings={"x": nested(100)})),
                        "meta.json: arrays or objects nested more than 32 deep"),
    "a count of 1.7": (lambda out: edit_meta(out, lambda m: m["splits"]["train"].update(bytes=1.7)),
                       "splits.train.bytes must be a non-negative integer, got 1.7"),
    "a null count": (lambda out: edit_meta(out, lambda m: m["splits"]["val"].update(documents=None)),
                     "splits.val.documents must be a non-negative integer, got None"),
    "shards as a string": (lambda out: edit_meta(out, lambda m: m["splits"]["val"].update(shards="val_000000.bin")),
                           "splits.val.shards must be a non-empty list, got 'val_000000.bin'"),
    "vocabulary cut": (lambda out: edit_meta(out, lambda m: cut_vocabulary(m, fix_size=False)),
                       "vocab_size .* differs from its .* characters"),
    "vocabulary cut, size fixed": (lambda out: edit_meta(out, cut_vocabulary), r"max_token must be an integer in \[0"),
    "vocabulary cut, no max recorded": (lambda out: edit_meta(out, lambda m: cut_vocabulary(m, forget_max=True)),
                                        r"train_000000.bin holds token id \d+, outside the"),
    "dtype changed": (lambda out: edit_meta(out, lambda m: m.update(dtype="uint32")), "dtype uint32 is not the uint16"),
    "unknown dtype": (lambda out: edit_meta(out, lambda m: m.update(dtype="float64")),
                      "dtype must be one of uint16, uint32, got 'float64'"),
    "no tokenizer": (lambda out: edit_meta(out, lambda m: m.pop("tokenizer")), "tokenizer entry is missing"),
    "splits not an object": (lambda out: edit_meta(out, lambda m: m.update(splits=[])),
                             "splits must be a JSON object, got list"),
    "shard count edited": (lambda out: edit_meta(out, lambda m: m["splits"]["train"]["shards"][0].update(tokens=7)),
                           "splits.train.tokens is .*, its shards hold"),
    "shard name outside": (lambda out: edit_meta(out, lambda m: m["splits"]["val"]["shards"][0].update(
        file="../x.bin")), r"splits.val.shards\[0\] must be"),
    "shard missing": (lambda out: (out / "train_000001.bin").unlink(), "train_000001.bin is missing"),
    "shard truncated": (lambda out: os.truncate(out / "train_000000.bin", 1001), "train_000000.bin holds 1001 bytes"),
    "id outside the vocabulary": (lambda out: poke(out / "val_000000.bin", 60000),
                                  "val_000000.bin holds token id 60000"),
}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def poke(path, value: int) -> None:
    ids = np.fromfile(path, dtype=np.uint16)
    ids[len(ids) // 2] = value
    ids.tofile(path)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_data_is_refused_when_opened_naming_the_file(prepared, damage):
    out, cfg = prepared
    spoil, message = DAMAGES[damage]
    spoil(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UserError, match=message) as err:
        TokenData(out)
    assert str(out) in str(err.value) and "data.rebuild=true" in err.value.hint
    assert "\n" not in str(err.value)
    if str(err.value).startswith(str(out / "meta.json")):  # refused by preparation too, touching nothing
        with pytest.raises(UserError, match=message):
            prepare(cfg, **QUIET)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    prepare(DataConfig(**{**cfg.__dict__, "rebuild": True}), **QUIET)  # the hint works
    assert len(TokenData(out).splits["train"]) > 0


def test_the_largest_token_id_is_recorded_and_sampling_finds_ids_anywhere(prepared, monkeypatch):
    out, _ = prepared
    data, meta = TokenData(out), json.loads((out / "meta.json").read_text())
    for split in ("train", "val"):
        assert meta["splits"][split]["max_token"] == int(data.splits[split][:].max())
    monkeypatch.setattr("gpt.data.meta.SAMPLE_TOKENS", 16)  # a sample smaller than a shard: evenly spaced slices
    ids = np.fromfile(out / "train_000000.bin", dtype=np.uint16)
    ids[-1] = 60000  # the last slice ends at the shard's last id
    ids.tofile(out / "train_000000.bin")
    with pytest.raises(UserError, match="token id 60000"):
        TokenData(out)


@pytest.mark.parametrize("change, message", [
    (dict(shard_tokens=5000), "data.shard_tokens=4000, not 5000"),
    (dict(val_fraction=0.25), "data.val_fraction=0.1, not 0.25"),
    (dict(source="files", format="text"), "was prepared from .* not from"),
])
def test_any_changed_preparation_setting_makes_the_data_stale(prepared, change, message):
    out, cfg = prepared
    with pytest.raises(UserError, match=message) as err:
        prepare(DataConfig(**{**cfg.__dict__, **change}), **QUIET)
    assert "data.rebuild=true" in err.value.hint


def test_a_changed_text_field_is_named(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}", "body": "b"}) + "\n"
                                                    for i in range(30)))
    cfg = DataConfig(name="j", source="files", path=str(tmp_path / "c"), root=str(tmp_path))
    prepare(cfg, **QUIET)
    with pytest.raises(UserError, match="data.text_field=text, not body"):
        prepare(DataConfig(**{**cfg.__dict__, "text_field": "body"}), **QUIET)


def test_a_second_preparation_waits_for_the_first_and_reuses_its_result(tmp_path):
    cfg = DataConfig(name="w", source="path", path=str(corpus(tmp_path / "c")), root=str(tmp_path / "data"))
    out, logs, done = tmp_path / "data" / "w", [], []
    with preparation_lock(out, log=logs.append) as waited:  # this test is the first process
        assert not waited
        second = threading.Thread(target=lambda: done.append(prepare(cfg, log=logs.append)))
        second.start()
        while not any("waiting for process" in line for line in logs):
            time.sleep(0.01)
        assert f"waiting for process {os.getpid()}, which is preparing {out}" in logs[0]
        prep.build(cfg, prep.load_source(cfg), out, log=logs.append)  # what the first one prepares
        assert second.is_alive()
    second.join(10)
    assert done == [out] and len([line for line in logs if line.startswith("preparing")]) == 1
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["w"]  # no lock file or staging left


def interrupt_after(count: int, monkeypatch, how) -> None:
    """Stop the preparation (by ``how``) right after its ``count``-th checkpoint."""
    real, saved = prep.save_progress, []

    def save_then_stop(staging, progress):
        real(staging, progress)
        saved.append(progress)
        if len(saved) == count:
            how()

    monkeypatch.setattr(prep, "save_progress", save_then_stop)
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)


@pytest.mark.parametrize("how, name", [(lambda: os.kill(os.getpid(), signal.SIGTERM), "SIGTERM"),
                                       (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "Ctrl-C")])
def test_an_interrupted_rebuild_says_what_it_kept_and_leaves_the_old_data(tmp_path, monkeypatch, how, name):
    folder = corpus(tmp_path / "c", n=200)
    cfg = DataConfig(name="r", source="path", path=str(folder), root=str(tmp_path), shard_tokens=2000)
    out = prepare(cfg, **QUIET)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (folder / "doc000.txt").write_text("changed\n")
    interrupt_after(2, monkeypatch, how)
    with pytest.raises(KeyboardInterrupt) as err:
        prepare(DataConfig(**{**cfg.__dict__, "rebuild": True}), **QUIET)
    assert str(err.value).startswith(f"preparation stopped ({name}); the ")
    assert f"shard file(s) completed so far are kept in {tmp_path / '.r.preparing'}" in str(err.value)
    assert f"{out} is as it was" in str(err.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_a_signal_during_the_final_renames_waits_for_them(tmp_path, monkeypatch):
    cfg = DataConfig(name="s", source="path", path=str(corpus(tmp_path / "c")), root=str(tmp_path))
    real = prep.commit

    def commit_interrupted_halfway(staging, data_dir, meta):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the renames
        real(staging, data_dir, meta)

    monkeypatch.setattr(prep, "commit", commit_interrupted_halfway)
    with pytest.raises(KeyboardInterrupt, match=f"preparation stopped \\(Ctrl-C\\) once complete: {tmp_path / 's'}"):
        prepare(cfg, **QUIET)
    monkeypatch.undo()
    assert len(TokenData(tmp_path / "s").splits["val"]) > 0  # complete and valid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "s"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
