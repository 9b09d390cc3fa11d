"""Preparation at scale: document boundaries, fixed-size shards, resuming an interrupted run, cheap freshness."""

import json

import numpy as np
import pytest

from conftest import needs_gpt2
from gpt.data import prepare as prep
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.errors import ConfigError, UserError

QUIET = dict(log=lambda *_: None)


def corpus(folder, n: int = 40, empty: tuple[int, ...] = ()):
    """n text files of varied length (some empty), enough for the every-k-th validation rule."""
    folder.mkdir()
    for i in range(n):
        text = "" if i in empty else "".join(f"line {j} of file {i}: caf\u00e9 \u2713\n" for j in range(5 + i % 7))
        (folder / f"doc{i:03d}.txt").write_text(text)
    return folder


def stream(out, split: str) -> list[int]:
    return TokenData(out).splits[split][:].tolist()


def shard_bytes(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


@needs_gpt2
def test_gpt2_ends_every_nonempty_document_with_end_of_text(tmp_path):
    folder = corpus(tmp_path / "c", empty=(3, 17))
    out = prepare(DataConfig(name="g", source="path", path=str(folder), tokenizer="gpt2", root=str(tmp_path)), **QUIET)
    meta = json.loads((out / "meta.json").read_text())
    train, val = stream(out, "train"), stream(out, "val")
    assert train.count(50256) + val.count(50256) == 38  # 40 documents, 2 of them empty
    assert (train.count(50256), val.count(50256)) == (meta["splits"]["train"]["documents"],
                                                     meta["splits"]["val"]["documents"])
    assert train[-1] == val[-1] == 50256 and meta["source"]["empty_documents"] == 2
    # every 10th document is validation: doc009, doc019, ..., each followed by end-of-text
    data = TokenData(out)
    expected = "".join((folder / f"doc{i:03d}.txt").read_text() + "<|endoftext|>" for i in (9, 19, 29, 39))
    assert data.tokenizer.decode(val) == expected
    val_files = [folder / f"doc{i:03d}.txt" for i in (9, 19, 29, 39)]
    assert meta["splits"]["val"]["bytes"] == sum(len(p.read_bytes()) for p in val_files)


def test_char_tokenizer_joins_documents_with_nothing_between(tmp_path):
    folder = corpus(tmp_path / "c")
    out = prepare(DataConfig(name="c", source="path", path=str(folder), root=str(tmp_path)), **QUIET)
    data = TokenData(out)
    train = "".join((folder / f"doc{i:03d}.txt").read_text() for i in range(40) if i % 10 != 9)
    assert data.tokenizer.decode(stream(out, "train")) == train


@pytest.mark.parametrize("tokenizer", ["char", pytest.param("gpt2", marks=needs_gpt2)])
def test_shards_have_fixed_size_and_hold_the_same_stream(tmp_path, tokenizer):
    folder = corpus(tmp_path / "c")
    one = prepare(DataConfig(name="one", source="path", path=str(folder), root=str(tmp_path), tokenizer=tokenizer),
                  **QUIET)
    many = prepare(DataConfig(name="many", source="path", path=str(folder), root=str(tmp_path), tokenizer=tokenizer,
                              shard_tokens=500, num_proc=2), **QUIET)
    meta = json.loads((many / "meta.json").read_text())
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) > 3 and all(s["tokens"] == 500 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 500
    assert [s["file"] for s in shards] == [f"train_{i:06d}.bin" for i in range(len(shards))]
    assert sum(s["tokens"] for s in shards) == meta["splits"]["train"]["tokens"]
    for split in ("train", "val"):
        assert stream(many, split) == stream(one, split)
    # a window across a shard boundary reads the two shards as one stream
    data = TokenData(many)
    assert data.splits["train"][490:510].tolist() == stream(one, "train")[490:510]
    # training's positioned reads give the same tokens, within a shard, across one boundary or several, to the end
    train, whole = data.splits["train"], stream(one, "train")
    spans = [(0, 7), (490, 510), (499, 500), (500, 501), (20, 1700), (len(whole) - 9, len(whole)), (5, 5)]
    for start, stop in spans:
        assert train.read(start, stop).tolist() == whole[start:stop], (start, stop)
    train.files = None  # a system without os.pread copies from the memory maps
    assert train.read(490, 1700).tolist() == whole[490:1700]


def test_an_interrupted_preparation_continues_from_its_last_complete_shard(tmp_path, monkeypatch):
    folder = corpus(tmp_path / "c", n=200)
    cfg = DataConfig(name="r", source="path", path=str(folder), root=str(tmp_path), shard_tokens=2000)
    straight = prepare(DataConfig(**{**cfg.__dict__, "name": "straight"}), **QUIET)
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)  # many small batches, so that shards complete between them
    saved = []
    real = prep.save_progress

    def crash_after_three(staging, progress):
        real(staging, progress)
        saved.append(progress["documents_read"])
        if len(saved) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "save_progress", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, **QUIET)
    assert not (tmp_path / "r").exists() and (tmp_path / ".r.preparing" / "progress.json").exists()
    logs = []
    monkeypatch.setattr(prep, "save_progress", real)
    prepare(cfg, log=logs.append)
    assert any(f"continuing an interrupted preparation after {saved[-1]:,} documents" in line for line in logs)
    assert shard_bytes(tmp_path / "r") == shard_bytes(straight)
    meta, expected = (json.loads((d / "meta.json").read_text()) for d in (tmp_path / "r", straight))
    assert meta["splits"] == expected["splits"] and not (tmp_path / ".r.preparing").exists()


def test_a_changed_setting_restarts_instead_of_continuing(tmp_path, monkeypatch):
    folder = corpus(tmp_path / "c", n=200)
    cfg = DataConfig(name="r", source="path", path=str(folder), root=str(tmp_path), shard_tokens=2000)
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)
    real = prep.save_progress

    def crash(staging, progress):
        real(staging, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "save_progress", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, **QUIET)
    assert (tmp_path / ".r.preparing" / "progress.json").exists()
    monkeypatch.undo()
    logs = []
    prepare(DataConfig(**{**cfg.__dict__, "shard_tokens": 3000}), log=logs.append)
    assert not any("continuing" in line for line in logs)


def test_freshness_is_decided_without_reading_the_corpus(tmp_path, monkeypatch):
    folder = corpus(tmp_path / "c")
    cfg = DataConfig(name="f", source="path", path=str(folder), root=str(tmp_path))
    prepare(cfg, **QUIET)

    def no_reading(*args, **kwargs):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr("gpt.data.sources.read_documents", no_reading)
    assert prepare(cfg, **QUIET) == tmp_path / "f"
    (folder / "doc005.txt").write_text("changed")
    with pytest.raises(UserError, match="its files changed since"):
        prepare(cfg, **QUIET)


def test_a_different_validation_fraction_is_refused_by_name(tmp_path):
    folder = corpus(tmp_path / "c")
    prepare(DataConfig(name="v", source="path", path=str(folder), root=str(tmp_path)), **QUIET)
    with pytest.raises(UserError, match=r"prepared with data.val_fraction=0.1, not 0.2") as err:
        prepare(DataConfig(name="v", source="path", path=str(folder), root=str(tmp_path), val_fraction=0.2), **QUIET)
    assert "data.rebuild=true" in err.value.hint


def test_version_1_data_asks_to_be_re_prepared(tmp_path):
    folder = corpus(tmp_path / "c")
    old = tmp_path / "old"
    old.mkdir()
    np.arange(100, dtype=np.uint16).tofile(old / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(old / "val.bin")
    (old / "meta.json").write_text(json.dumps({"version": 1, "tokenizer": {"kind": "char", "chars": ["a"]},
                                               "dtype": "uint16", "train_tokens": 100, "val_tokens": 100}))
    cfg = DataConfig(name="old", source="path", path=str(folder), root=str(tmp_path))
    for attempt in (lambda: prepare(cfg, **QUIET), lambda: TokenData(old)):
        with pytest.raises(UserError, match="format version 1") as err:
            attempt()
        assert "data.rebuild=true" in err.value.hint
    prepare(DataConfig(**{**cfg.__dict__, "rebuild": True}), **QUIET)
    assert sorted(p.name for p in old.iterdir()) == ["meta.json", "train_000000.bin", "val_000000.bin"]


def test_few_documents_split_by_position_and_count_each_document_once(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    for i in range(3):
        (folder / f"d{i}.txt").write_text(chr(97 + i) * 100)
    out = prepare(DataConfig(name="p", source="path", path=str(folder), root=str(tmp_path)), **QUIET)
    meta = json.loads((out / "meta.json").read_text())["splits"]
    assert (meta["train"]["tokens"], meta["val"]["tokens"]) == (270, 30)
    assert (meta["train"]["documents"], meta["val"]["documents"]) == (2, 1)  # the cut document ends in val


@pytest.mark.parametrize("field, value, message", [
    ("source", "ftp", "unknown data.source"), ("format", "csv", "unknown data.format"),
    ("val_fraction", 1.0, "val_fraction"), ("num_proc", 0, "num_proc"), ("shard_tokens", 0, "shard_tokens"),
    ("sampling", "shuffle", "unknown data.sampling"), ("tokenizer", " ", "data.tokenizer is empty"),
])
def test_bad_data_settings_are_config_errors(field, value, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(**{field: value})


def test_a_failed_first_preparation_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """Nothing kept (no shard complete): the staging folder and the data.root folders the run created go too."""
    folder = corpus(tmp_path / "c")
    root = tmp_path / "new" / "root"
    cfg = DataConfig(name="f", source="path", path=str(folder), root=str(root), tokenizer="char")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prep, "encode_corpus", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        prepare(cfg, **QUIET)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
