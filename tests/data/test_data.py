import json

import numpy as np
import pytest

from conftest import needs_gpt2
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare, token_dtype
from gpt.data.sources import stdlib_source
from gpt.errors import UserError
from gpt.tokenizers.tokenizer import CharTokenizer, GPT2Tokenizer

QUIET = dict(log=lambda *_: None)


def tokens(out, split: str) -> np.ndarray:
    """A prepared split's whole token stream, read from its shards."""
    data = TokenData(out)
    return np.asarray(data.splits[split][:])


def test_prepare_a_text_folder(text_dir, tmp_path):
    cfg = DataConfig(name="mine", source="path", path=str(text_dir), root=str(tmp_path / "data"))
    out = prepare(cfg, log=lambda *_: None)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"]["kind"] == "char" and meta["dtype"] == "uint16"
    assert meta["source"]["documents"] == 12 and meta["version"] == 2
    assert (meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"]) == (11, 1)
    tokenizer = CharTokenizer(meta["tokenizer"]["chars"])
    train, val = tokens(out, "train"), tokens(out, "val")
    assert (len(train), len(val)) == (meta["splits"]["train"]["tokens"], meta["splits"]["val"]["tokens"])
    assert meta["splits"]["val"]["bytes"] == (text_dir / "mod09.py").stat().st_size
    # 12 documents, every 10th held out: mod09 is the validation split, byte for byte.
    assert tokenizer.decode(val.tolist()) == (text_dir / "mod09.py").read_text()
    originals = "".join((text_dir / f"mod{i:02d}.py").read_text() for i in range(12) if i != 9)
    assert tokenizer.decode(train.tolist()) == originals


def test_prepare_is_skipped_when_up_to_date_and_refuses_to_replace_other_data(text_dir, tmp_path):
    cfg = DataConfig(name="mine", source="path", path=str(text_dir), root=str(tmp_path / "data"))
    logs = []
    out = prepare(cfg, log=logs.append)
    mtime = (out / "train_000000.bin").stat().st_mtime_ns
    prepare(cfg, log=logs.append)
    assert len([line for line in logs if line.startswith("preparing")]) == 1
    assert (out / "train_000000.bin").stat().st_mtime_ns == mtime
    (text_dir / "mod00.py").write_text("a brand new file ~~~\n" * 50)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UserError, match=r"was prepared from .* not from .* \(its files changed since\)") as err:
        prepare(cfg, log=logs.append)
    assert "data.rebuild=true" in err.value.hint
    with pytest.raises(UserError, match="with the char tokenizer, not from .* with the gpt2 tokenizer"):
        prepare(DataConfig(name="mine", source="path", path=str(text_dir), root=str(tmp_path / "data"),
                           tokenizer="gpt2"))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    prepare(DataConfig(**{**cfg.__dict__, "rebuild": True}), log=logs.append)
    assert len([line for line in logs if line.startswith("preparing")]) == 2
    assert "~" in json.loads((out / "meta.json").read_text())["tokenizer"]["chars"]


def test_a_single_file_is_split_by_position(tmp_path):
    source = tmp_path / "one.txt"
    source.write_text("".join(chr(97 + i % 26) for i in range(1000)))
    out = prepare(DataConfig(name="one", source="path", path=str(source), root=str(tmp_path)), log=lambda *_: None)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["splits"]["train"]["tokens"], meta["splits"]["val"]["tokens"]) == (900, 100)


def test_non_utf8_bytes_are_replaced_with_a_warning(tmp_path):
    source = tmp_path / "latin1.txt"
    source.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    with pytest.warns(UserWarning, match="not UTF-8"):
        out = prepare(DataConfig(name="l1", source="path", path=str(source), root=str(tmp_path)), log=lambda *_: None)
    assert "\ufffd" in json.loads((out / "meta.json").read_text())["tokenizer"]["chars"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no text files"),
        (lambda p: (p / "e.txt").write_text("") or p / "e.txt", "only empty files"),
        (lambda p: (p / "bin").write_bytes(b"\0\1" * 10) and p / "bin", "holds no text: 1 binary file"),
    ],
)
def test_bad_paths_are_user_errors(tmp_path, make, message):
    with pytest.raises(UserError, match=message):
        prepare(DataConfig(name="x", source="path", path=str(make(tmp_path)), root=str(tmp_path / "d")))


def test_token_dtype_never_overflows():
    assert token_dtype(256) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    assert token_dtype(100_000) == np.uint32


def test_batches_are_next_token_windows(text_dir, tmp_path):
    import torch

    out = prepare(DataConfig(name="b", source="path", path=str(text_dir), root=str(tmp_path)), log=lambda *_: None)
    data = TokenData(out)
    starts = data.random_starts("train", 4, 16, torch.Generator().manual_seed(0))
    x, y = data.windows("train", starts, 16, torch.device("cpu"))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(UserError, match="fewer than block_size"):
        data.check_block_size(10_000)


def test_stdlib_corpus_is_deterministic_and_has_no_tests():
    a, b = stdlib_source(), stdlib_source()
    names = [name for name, _, _ in a.manifest["files"]]
    assert len(names) > 300 and len(names) == a.total
    assert not any(name.startswith("test/") or "/tests/" in name for name in names)
    assert a.fingerprint() == b.fingerprint()
    assert sum(size for _, size, _ in a.manifest["files"]) > 5_000_000


def test_prepare_the_stdlib_corpus(tmp_path):
    out = prepare(DataConfig(root=str(tmp_path)), log=lambda *_: None)
    data = TokenData(out)
    splits = data.meta["splits"]
    assert splits["train"]["tokens"] > 5_000_000 and splits["val"]["tokens"] > 300_000
    assert "def " in data.tokenizer.decode(data.splits["val"][:20000].tolist())


@needs_gpt2
def test_gpt2_tokenizer_round_trip():
    tokenizer = GPT2Tokenizer()
    text = "def hello(world):\n    return 'héllo' + world  # ünïcode ✓"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.vocab_size == 50257 and tokenizer.eot_token == 50256
    assert tokenizer.encode("Hello world") == [15496, 995]  # GPT-2's published ids


@needs_gpt2
def test_prepare_with_the_gpt2_tokenizer(text_dir, tmp_path):
    cfg = DataConfig(name="bpe", source="path", path=str(text_dir), tokenizer="gpt2", root=str(tmp_path))
    data = TokenData(prepare(cfg, log=lambda *_: None))
    assert data.meta["dtype"] == "uint16" and data.tokenizer.vocab_size == 50257
    val = data.splits["val"][:].tolist()
    assert val[-1] == 50256 and val.count(50256) == 1  # the one validation document, then end-of-text
    assert data.tokenizer.decode(val[:-1]) == (text_dir / "mod09.py").read_text()


@needs_gpt2
def test_the_chunk_encoder_gives_encode_ordinary_ids_and_an_end_of_text_per_finished_document():
    from concurrent.futures import ThreadPoolExecutor

    from gpt.data.encode import GPT2Encoder

    tokenizer = GPT2Tokenizer()
    texts = ["def f():\n    return 'héllo'  # ✓", "literal <|endoftext|> is text here", "", "x" * 5000,
             "a lone surrogate \ud800 from a JSON escape", "the first piece of a cut document"]
    ends = [True, True, True, True, True, False]
    expected = []
    for text, end in zip(texts, ends):
        expected += tokenizer.encoding.encode_ordinary(text) + ([50256] if end else [])
    encoder = GPT2Encoder(tokenizer, np.dtype(np.uint16))
    with ThreadPoolExecutor(3) as pool:  # as preparation calls it: several threads, each its own encoding
        results = list(pool.map(lambda _: encoder.encode(texts, ends), range(6)))
    for ids in results:
        assert ids.dtype == np.uint16 and ids.tolist() == expected


def test_unreachable_gpt2_encoding_says_how_to_provide_it(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UserError, match="GPT-2 encoding") as err:
        GPT2Tokenizer()
    assert "TIKTOKEN_CACHE_DIR" in err.value.hint


def test_download_source_caches_the_file(tmp_path):
    page = tmp_path / "page.txt"
    page.write_text("hello from the web\n" * 100)
    cfg = DataConfig(name="web", source="url", url=page.as_uri(), root=str(tmp_path / "data"))
    out = prepare(cfg, log=lambda *_: None)
    assert (out / "source.txt").read_text() == page.read_text()
    page.unlink()  # prepared once: no second download needed
    assert prepare(cfg, log=lambda *_: None) == out


def test_a_failed_write_leaves_the_prepared_data_as_it_was(text_dir, tmp_path, monkeypatch):
    from gpt.data import prepare as prep

    cfg = DataConfig(name="mine", source="path", path=str(text_dir), root=str(tmp_path), rebuild=True)
    out = prepare(cfg, log=lambda *_: None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(path, write, **kwargs):  # as atomic_write reports a full disk, when writing meta.json
        raise UserError(f"could not write prepared data {path}: No space left on device")

    monkeypatch.setattr(prep, "atomic_write", disk_full)
    with pytest.raises(UserError, match="No space left on device"):
        prepare(cfg, log=lambda *_: None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "mine"]  # no staging folder left behind
